"""The envsched Dagster code location: the one ``defs`` object."""

import dagster as dg

from envsched_pipeline.assets import features, graph, manifest, pool, report, topologies, training
from envsched_pipeline.orchestration.checks import ALL_CHECKS
from envsched_pipeline.orchestration.console import LOGGERS
from envsched_pipeline.orchestration.jobs import pool_job, report_job, select_job, train_job
from envsched_pipeline.orchestration.rewind import rewind_job
from envsched_pipeline.orchestration.schedules import ALL_SCHEDULES
from envsched_pipeline.orchestration.sensors import training_loop_sensor
from envsched_pipeline.resources.lake import LakeResource
from envsched_pipeline.resources.llm import LLMResource
from envsched_pipeline.resources.trainer import TrainerLauncher

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([pool, topologies, features, graph, manifest, training, report]),
    asset_checks=ALL_CHECKS,
    jobs=[select_job, train_job, pool_job, report_job, rewind_job],
    sensors=[training_loop_sensor],
    schedules=ALL_SCHEDULES,
    loggers=LOGGERS,
    resources={"lake": LakeResource(), "trainer": TrainerLauncher(), "llm": LLMResource()},
)
