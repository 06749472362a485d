"""TRL's GRPO trainer on envsched's batches (the trl extra: ``pip install -e ".[trl]"``).

    python examples/trl_grpo.py --lake /tmp/envsched-trl --steps 3
    torchrun --nproc_per_node 2 examples/trl_grpo.py --lake /tmp/envsched-trl2 --steps 3   # one per GPU

A random-init tiny Qwen3 on CPU, so it runs anywhere; point ``--model-path`` at a local Qwen3
checkpoint for a real policy (and run on a GPU). Without Triton (a CPU) TRL scores every prompt
position over the 151k vocabulary: with the tool schemas in the prompts (~1,200 tokens) a step of
the defaults takes minutes on 2 cores, ``--no-tools-in-prompt`` about a tenth of that. The rewards
are the synthetic pool's own checklist verifiers, run on each completion's tool calls in a sandbox;
envsched picks each step's tasks from them. With several processes each generates its share of a
step and process 0 hands the whole step to the run. Watch the run like any other: `envsched --lake
/tmp/envsched-trl status`, `... sql "select * from step_summary"`; its held-out scores
(``--heldout``) are the step table's ``ho_seen`` / ``ho_unseen`` columns.
"""

import argparse

from envsched_pipeline.api import ExternalRun
from envsched_pipeline.integrations.trl import grpo_trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lake", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4, help="B tasks per step")
    ap.add_argument("--group-size", type=int, default=4, help="G completions per task")
    ap.add_argument("--model-path", default=None, help="a local Qwen3 checkpoint (default: random-init tiny)")
    ap.add_argument(
        "--no-tools-in-prompt",
        action="store_true",
        help="leave the tool schemas out of the prompts (shorter)",
    )
    ap.add_argument(
        "--heldout",
        type=int,
        default=2,
        help="evaluate on this many tasks of each held-out split every --eval-every steps (0: off)",
    )
    ap.add_argument("--eval-every", type=int, default=2)
    args = ap.parse_args()

    from accelerate import PartialState  # TRL's dependency: which process this is
    from trl import GRPOConfig  # TRL and torch load after the arguments are read

    from trainer.model import load_policy, qwen3_tokenizer  # (torch, transformers)

    # TRL's data loader asks for a batch ahead: the run selects one step ahead of its rollouts.
    # Process 0 starts the run (and imports the pool); the others resume it.
    state = PartialState(cpu=args.model_path is None)  # the processes TRL's config will see
    with state.main_process_first():
        run = ExternalRun(
            pool="synthetic",
            lake=args.lake,
            batch_size=args.batch_size,
            group_size=args.group_size,
            select_lag=1,
        )
    processes = state.num_processes
    config = GRPOConfig(
        output_dir=f"{args.lake}/trl-out",
        num_generations=args.group_size,
        # one generation batch, over every process, is one envsched step
        per_device_train_batch_size=args.batch_size * args.group_size // processes,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_completion_length=64,
        max_steps=args.steps,
        learning_rate=1e-5,
        use_cpu=args.model_path is None,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        # held-out: TRL evaluates the pool's evaluation split, recorded in the run's evals
        eval_strategy="steps" if args.heldout else "no",
        eval_steps=args.eval_every,
        per_device_eval_batch_size=2 * args.group_size // processes,
    )
    trainer = grpo_trainer(
        run,
        load_policy(args.model_path),
        qwen3_tokenizer(),
        config,
        tools_in_prompt=not args.no_tools_in_prompt,
        heldout=args.heldout,
    )
    trainer.train()
    if state.is_main_process:
        print(f"done: steps 0..{run.next_step - 1} in {args.lake} (`envsched --lake {args.lake} status`)")


if __name__ == "__main__":
    main()
