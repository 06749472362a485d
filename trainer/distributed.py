"""DeepSpeed ZeRO config generated from the trainer's own config: one source of truth.

    python -m trainer.distributed --world-size 8 --sequences 512      print the config a run would use

The micro-batch, the gradient accumulation, the clipping, the optimizer and bf16 all come from
:class:`trainer.update.GRPOConfig`, so the two can never disagree. The update accumulates a
*variable* number of micro-batches per training step (zero-advantage sequences are skipped), so
the engine is told where a step ends (``set_gradient_accumulation_boundary``) and the loss is not
rescaled by DeepSpeed (``scale_wrt_gas=False``: the trainer already weights each micro-batch by its
share of the step's policy tokens); ``gradient_accumulation_steps`` is the nominal count for a full
step, which DeepSpeed uses for its bookkeeping only.

Launch on several GPUs with torchrun or the DeepSpeed launcher, e.g.
``torchrun --nproc_per_node 8 -m trainer.step --lake L --step T`` (plain data parallel: gradients
summed over ranks) or ``deepspeed --num_gpus 8 -m trainer.step ...`` with ``deepspeed: true`` in
the run's policy config. Either way each rank rolls out a disjoint slice of whole groups and rank 0
writes the step (:mod:`trainer.ranks`). The data-parallel path is tested on CPU with two gloo
ranks (the update equals the single-process one); this repository has not run a multi-GPU job
(no GPU was available). Several nodes need the lake's checkpoint folder on shared storage.
"""

from __future__ import annotations

import argparse
import json
import math

from trainer.update import GRPOConfig


def zero_config(cfg: GRPOConfig, world_size: int = 1, sequences_per_step: int = 512, stage: int = 2) -> dict:
    per_rank = math.ceil(sequences_per_step / max(world_size, 1))
    gas = max(1, math.ceil(per_rank / cfg.micro_batch))
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": gas,
        "train_batch_size": cfg.micro_batch * gas * world_size,
        "gradient_clipping": cfg.grad_clip,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": stage,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": 50_000_000,
            "allgather_bucket_size": 50_000_000,
        },
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": cfg.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": cfg.weight_decay},
        },
        "steps_per_print": 1_000_000,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.distributed", description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--sequences", type=int, default=512, help="B x G rollouts per step")
    ap.add_argument("--micro-batch", type=int, default=GRPOConfig.micro_batch)
    ap.add_argument("--lr", type=float, default=GRPOConfig.lr)
    args = ap.parse_args(argv)
    cfg = GRPOConfig(micro_batch=args.micro_batch, lr=args.lr)
    print(json.dumps(zero_config(cfg, args.world_size, args.sequences), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
