"""Where this process sits among data-parallel ranks, without importing torch.

``torchrun`` and the ``deepspeed`` launcher set ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without
them a process is the only rank. The collectives that use this live in ``trainer/ranks.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world > 1


def ranks() -> Ranks:
    """This process's place, from the launcher's environment (one rank when there is none)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return Ranks()
    return Ranks(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def group_slice(n_groups: int, rank: int, world: int) -> slice:
    """Contiguous groups of one rank; slice sizes differ by at most one, every group has one owner."""
    base, extra = divmod(n_groups, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))
