"""Plugging envsched into a TRL / verl style data pipeline (documentation-grade code, no heavy deps).

Both trainers pull prompts from a ``torch.utils.data.Sampler`` (TRL's GRPOTrainer through its
dataloader; verl through ``data.sampler`` / a custom sampler class). An envsched sampler yields,
per step, the dataset indices of the tasks envsched picked, each repeated G times (GRPO groups),
and a reward callback hands the rewards back after the step:

    sampler = EnvSchedSampler(dataset_task_ids, lake="warehouse/lake", group_size=8)
    trainer = GRPOTrainer(..., train_dataset=dataset)        # TRL
    trainer._get_train_sampler = lambda *a, **k: sampler      # or pass it to your DataLoader
    # after each step, from a TrainerCallback.on_step_end or your reward function:
    sampler.report(step, [(task_id, rollout_idx, reward), ...])

For ROLL (agentic pipelines with environment managers), call ``ExternalRun.manifest(step)`` in the
environment manager's reset to choose which (environment, task) pair each env worker resets to,
and ``ExternalRun.observe`` when the step's trajectories are scored.
"""

from __future__ import annotations

from collections.abc import Iterator

from envsched_pipeline.api import ExternalRun


class EnvSchedSampler:
    """Yields dataset indices: B tasks per step, each G times. Works as a torch Sampler (duck-typed)."""

    def __init__(
        self,
        dataset_task_ids: list[str],
        lake: str,
        pool: str = "synthetic",
        group_size: int = 8,
        batch_size: int = 64,
        steps: int = 1000,
        seed: int = 0,
    ):
        self.sched = ExternalRun(
            pool=pool, lake=lake, seed=seed, batch_size=batch_size, group_size=group_size
        )
        self.index_of = {t: i for i, t in enumerate(dataset_task_ids)}
        self.group_size, self.steps = group_size, steps
        self.current_step = self.sched.next_step

    def __iter__(self) -> Iterator[int]:
        for step in range(self.sched.next_step, self.steps):
            self.current_step = step
            for pick in self.sched.manifest(step):
                for _ in range(self.group_size):
                    yield self.index_of[pick["task_id"]]

    def __len__(self) -> int:
        return (self.steps - self.sched.next_step) * self.sched.spec.batch_size * self.group_size

    def report(self, step: int, results: list[tuple[str, int, float]]) -> dict:
        return self.sched.observe(step, [{"task_id": t, "rollout": r, "reward": x} for t, r, x in results])
