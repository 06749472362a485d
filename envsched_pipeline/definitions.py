"""The envsched Dagster code location: the one ``defs`` object."""

import dagster as dg

from envsched_pipeline.assets import features, graph, pool, selection, topologies, training
from envsched_pipeline.checks import ALL_CHECKS
from envsched_pipeline.jobs import pool_job, select_job, train_job
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.resources.llm import LLMResource
from envsched_pipeline.resources.trainer import TrainerLauncher
from envsched_pipeline.sensors import training_loop_sensor

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([pool, topologies, features, graph, selection, training]),
    asset_checks=ALL_CHECKS,
    jobs=[select_job, train_job, pool_job],
    sensors=[training_loop_sensor],
    resources={"lake": LakeResource(), "trainer": TrainerLauncher(), "llm": LLMResource()},
)
