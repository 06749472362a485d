"""Where batch-mode episodes run: a local :class:`~envs.sandbox.SandboxPool` (default) or Ray actors
that each host one (``ENVSCHED_ROLLOUT_BACKEND=ray``).

    with episode_pool(workers=4) as pool:
        results = pool.map_episodes([(spec, actions), ...], progress=cb)

Ray: ``ENVSCHED_RAY_ADDRESS`` (e.g. ``auto`` or ``ray://head:10001``) joins a cluster; unset, a
local Ray is started for the step and stopped after it. Each actor owns a local sandbox pool, so
untrusted code keeps the same isolation (fresh interpreters, memory/CPU/time limits) on every node,
and the failure semantics stay per rollout: a timeout or crash inside an actor's sandbox is that
rollout's ``timeout`` / ``env_crash``; an actor that dies (node lost, OOM-killed) turns only the
episodes it held into ``infra`` failures and is replaced for the next chunk. Results come back in job
order, so a run gives the same rewards on either backend for the same seeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict

from envs.sandbox import Limits, SandboxPool, _failure

BACKENDS = ("local", "ray")


def backend_name() -> str:
    name = os.environ.get("ENVSCHED_ROLLOUT_BACKEND", "local").strip().lower() or "local"
    if name not in BACKENDS:
        raise ValueError(
            f"ENVSCHED_ROLLOUT_BACKEND={name!r} is not a rollout backend; choose one of {', '.join(BACKENDS)}"
        )
    return name


def episode_pool(workers: int = 2, limits: Limits | None = None, backend: str | None = None):
    """A pool with ``map_episodes`` on the configured backend (a context manager)."""
    name = backend or backend_name()
    if name == "ray":
        return RayEpisodePool(workers=workers, limits=limits)
    return SandboxPool(workers=workers, limits=limits)


class _EpisodeActor:
    """Ray actor body: one local sandbox pool, episodes run in chunks."""

    def __init__(self, workers: int, limits: dict):
        self.pool = SandboxPool(workers=workers, limits=Limits(**limits))

    def run(self, jobs: list[tuple]) -> list[dict]:
        return self.pool.map_episodes(jobs)

    def close(self) -> None:
        self.pool.close()


class RayEpisodePool:
    """``map_episodes`` over Ray actors (``actors`` of them, ``workers_per_actor`` sandboxes each)."""

    def __init__(
        self,
        workers: int = 2,
        limits: Limits | None = None,
        actors: int | None = None,
        workers_per_actor: int = 1,
        chunk: int = 8,
        address: str | None = None,
    ):
        import ray  # the deploy extra; only when this backend is chosen

        self.ray = ray
        self.limits = limits or Limits()
        self.chunk = max(1, int(chunk))
        self._owns_ray = False
        if not ray.is_initialized():
            address = address or os.environ.get("ENVSCHED_RAY_ADDRESS") or None
            kwargs = {"address": address} if address else {"num_cpus": max(1, int(workers))}
            ray.init(
                **kwargs,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                runtime_env={"env_vars": {"ENVSCHED_ROLLOUT_BACKEND": "local"}},
            )
            self._owns_ray = True
        self.size = max(1, int(actors or workers))
        self._per_actor = max(1, int(workers_per_actor))
        self._remote = ray.remote(num_cpus=1)(_EpisodeActor)
        self._actors = [self._new_actor() for _ in range(self.size)]
        self.stats = {"episodes": 0, "actor_failures": 0, "actors": self.size}

    def _new_actor(self):
        return self._remote.remote(self._per_actor, asdict(self.limits))

    def map_episodes(
        self, jobs: Iterable[tuple], progress: Callable[[int, int], None] | None = None
    ) -> list[dict]:
        ray = self.ray
        jobs = [tuple(j) for j in jobs]
        out: list[dict | None] = [None] * len(jobs)
        chunks = [list(range(i, min(i + self.chunk, len(jobs)))) for i in range(0, len(jobs), self.chunk)]
        pending: dict = {}  # object ref -> (actor slot, job indices)
        free = list(range(self.size))
        done = 0
        t0 = time.perf_counter()
        while chunks or pending:
            while chunks and free:
                slot, idx = free.pop(), chunks.pop(0)
                ref = self._actors[slot].run.remote([jobs[i] for i in idx])
                pending[ref] = (slot, idx)
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                slot, idx = pending.pop(ref)
                try:
                    results = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
                    self.stats["actor_failures"] += 1
                    self._actors[slot] = self._new_actor()
                    why = f"rollout actor died ({type(exc).__name__})"
                    results = [_failure("infra", why) for _ in idx]
                for i, r in zip(idx, results, strict=True):
                    out[i] = r
                free.append(slot)
                done += len(idx)
                self.stats["episodes"] += len(idx)
                if progress:
                    progress(done, len(jobs))
        self.stats["seconds"] = time.perf_counter() - t0
        return out  # type: ignore[return-value]

    def close(self) -> None:
        ray = self.ray
        for a in self._actors:
            try:
                ray.get(a.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to close
                pass
            ray.kill(a)
        self._actors = []
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
