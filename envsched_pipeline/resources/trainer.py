"""How ``training_step[t]`` gets its rollouts: a launcher resource.

* ``subprocess`` (default): the trainer (:mod:`trainer.step`) runs as its own process through
  Dagster Pipes; logs and metadata stream back into the run. Dagster code never imports torch.
* ``external``: an outside trainer (verl, TRL, your loop) ingests rollouts with
  ``envsched step ingest``; the asset only verifies and reports them.

On a GPU cluster swap the subprocess client for ``PipesK8sClient`` / a docker client with GPU
limits, or point a Dagster+ hybrid agent with GPUs at this code location: the command line
(``python -m trainer.step --lake ... --step ...``) stays the same.
"""

import shlex
import sys

import dagster as dg
from pydantic import Field


class TrainerLauncher(dg.ConfigurableResource):
    mode: str = Field(default="auto", description="auto (the run's setting) | subprocess | external")
    python: str = Field(default="", description="Interpreter for the trainer process (default: this one).")
    extra_args: str = Field(default="", description="Extra arguments for trainer.step.")

    def command(self, lake_root: str, step: int) -> list[str]:
        cmd = [self.python or sys.executable, "-m", "trainer.step", "--lake", lake_root, "--step", str(step)]
        return cmd + shlex.split(self.extra_args)

    def launch(self, context: dg.AssetExecutionContext, lake_root: str, step: int):
        """Run the trainer for one step through Pipes; returns the Pipes invocation."""
        client = dg.PipesSubprocessClient()
        return client.run(command=self.command(lake_root, step), context=context)
