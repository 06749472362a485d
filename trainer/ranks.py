"""Data-parallel ranks: each rank owns a disjoint, contiguous slice of the step's groups.

Launched by ``torchrun`` or the ``deepspeed`` launcher (they set ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``), every rank runs ``python -m trainer.step`` for the same step:

* rank r rolls out only the groups of ``group_slice(n, r, world)`` (whole groups: a GRPO advantage
  needs all G rollouts of its task on one rank);
* the update weights each rank's micro-batches by their share of the *global* policy-token count and
  sums gradients across ranks, so the step equals one update over the whole batch (the tests check
  the parameters against a single-process update to float precision); DeepSpeed does the reduction
  itself when it is on;
* rank 0 gathers the rollouts (in manifest order), writes the lake, saves checkpoints and talks to
  Dagster through Pipes; the other ranks write nothing.

Without those variables (the default) everything is one rank and nothing here does any work. Where a
process sits (``ranks()``, ``group_slice``) is in ``trainer/world.py``, which needs no torch.
"""

from __future__ import annotations

import atexit

import torch
import torch.distributed as dist

from trainer.world import Ranks, ranks


def init(device: str) -> Ranks:
    """Join the process group (NCCL on GPUs, gloo on CPUs) when launched with several ranks."""
    r = ranks()
    if r.parallel and not dist.is_initialized():
        if device.startswith("cuda"):
            torch.cuda.set_device(r.local_rank)
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        leave_at_exit()
    return r


_leaving = False


def leave_at_exit() -> None:
    """Leave the process group when the interpreter exits, while Python is still whole.

    A process that exits still in a gloo group can abort (SIGABRT, "terminate called without an
    active exception") when gloo's threads outlive the interpreter: a run that finished would end
    as a failed launch, now and then. Registered once per process; a group the program left itself
    is left alone."""
    global _leaving
    if not _leaving:
        _leaving = True
        atexit.register(_leave)


def _leave() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sync_parameters(model: torch.nn.Module) -> None:
    """Every rank starts the step from rank 0's weights."""
    if active():
        for p in model.parameters():
            dist.broadcast(p.data, src=0)


def sum_gradients(model: torch.nn.Module) -> None:
    """Sum gradients over ranks (a rank with no trainable sequence contributes zeros)."""
    if not active():
        return
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p.data)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def total(x: float) -> float:
    """Sum of a number over ranks."""
    if not active():
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def gather(obj):
    """Rank 0 gets the list of every rank's ``obj`` (in rank order); the others get None."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def barrier() -> None:
    if active():
        dist.barrier()
