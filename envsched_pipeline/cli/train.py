"""``envsched train``: the scheduled training loop, through the Dagster jobs, in-process."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from dataclasses import fields
from pathlib import Path

from envsched_pipeline.analysis.report import build_report, verdict_lines
from envsched_pipeline.cli.common import (
    COUNT,
    GROUP,
    INDEX,
    HelpFormatter,
    UsageError,
    dagster_home,
    from_source,
    json_object,
    json_source,
    lake_of,
    not_a_url,
)
from envsched_pipeline.core.build import asked_run, check_open, new_run, open_run, scheduler_config
from envsched_pipeline.core.gates import STALL_GATE, halt_message, halted
from envsched_pipeline.core.loop import step_summary
from envsched_pipeline.core.pools import ensure_pool, environment_kinds
from envsched_pipeline.errors import ConfigError, EnvschedError
from envsched_pipeline.lake import LATEST_REPORT, Lake
from envsched_pipeline.lease import Lease
from envsched_pipeline.run import (
    DEFAULT_CLIP_EPS,
    DEFAULT_SAMPLER_CAP,
    LOSS_DENOMINATORS,
    LR_MIN_RATIO,
    LR_SCHEDULES,
    POLICIES,
    SAMPLER_CORRECTIONS,
    PolicyConfig,
    RunSpec,
    environment_kinds_problem,
    load_run,
)
from envsched_pipeline.scheduler import SCHEDULERS
from envsched_pipeline.scheduler.variants import RECOMMENDED, scheduler_label

STEP_COLUMNS = (
    "step",
    "batch_variance",
    "zero_variance_fraction",
    "envs_touched",
    "mean_reward",
    "heldout_seen",
    "heldout_unseen",
    "trainer_s",
    "overhead_s",
)
HEADER = (
    "step",
    "batch_var",
    "zero_var",
    "envs",
    "mean_rew",
    "ho_seen",
    "ho_unseen",
    "trainer_s",
    "overhead_s",
)


def add_parser(sub) -> None:
    t = sub.add_parser(
        "train",
        help="run the scheduled training loop through the Dagster jobs, in-process",
        formatter_class=HelpFormatter,
        description="Start a run, or resume the lake's run: a flag left out keeps the run's own setting "
        "(a new run gets the value its help names), so `envsched train --steps 40` continues whatever run the "
        "lake holds; a flag that changes a resumed run is refused (see --allow-config-change).",
    )
    g_run = t.add_argument_group("the run")
    g_run.add_argument("--pool", default=None, help="task pool (`envsched pool list`); new run: synthetic")
    g_run.add_argument(
        "--policy",
        default=None,
        choices=tuple(p for p in POLICIES if p != "external"),  # an external trainer uses `step`
        help="what is trained: simulated / neural (CPU testbeds), hf-tiny, hf, vllm, openai; new run: "
        "simulated",
    )
    g_run.add_argument("--steps", type=COUNT, default=20, help="total steps the lake should hold (resumes)")
    g_run.add_argument(
        "--max-steps",
        type=COUNT,
        default=None,
        help="the run's length for the sensor (default --steps): `--steps 1 --max-steps 40` runs one "
        "step here and lets the loop sensor in `make ui` drive the rest",
    )
    g_run.add_argument(
        "--seed", type=INDEX, default=None, help="seed of the run (selection and rollouts); new run: 0"
    )
    g_run.add_argument("--batch-size", type=COUNT, default=None, help="B: tasks per step; new run: 64")
    g_run.add_argument(
        "--group-size", type=GROUP, default=None, help="G: rollouts per task (>= 2); new run: 8"
    )
    g_run.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume with another scheduler/policy config (recorded in run.json)",
    )
    g_sched = t.add_argument_group("the scheduler")
    g_sched.add_argument(
        "--scheduler",
        default=None,
        help=f"which scheduler picks batches: one of {', '.join(sorted(SCHEDULERS))}, or a named variant "
        "`<scheduler>@<variant>` (its config overrides; `envsched bench variants` lists them). New run: "
        f"{RECOMMENDED}, the recommended form (the best-supported on the neural learner's bench); "
        "`envsched` alone runs the paper's constants",
    )
    g_sched.add_argument(
        "--scheduler-config",
        default=None,
        help="scheduler config overrides as JSON, e.g. '{\"rho\": 0.25}', or a file of them "
        "(@overrides.json) (over a variant's; docs/algorithm.md names every field)",
    )
    g_sched.add_argument(
        "--cost-aware", action="store_true", help="score informativeness per predicted rollout second"
    )
    g_sched.add_argument(
        "--select-lag",
        type=INDEX,
        default=None,
        help="select step T from the rollouts up to T-1-N (new run: 0), as a trainer that asks for the "
        "next batch while one trains does: what a stale selection costs, measured on your learner",
    )
    g_sched.add_argument(
        "--prior-lake", default=None, help="start the estimates from another run's lake (cross-run prior)"
    )
    g_sched.add_argument(
        "--prior-discount",
        type=float,
        default=None,
        help="weight of the prior run's statistics; new run: 0.5",
    )
    g_pol = t.add_argument_group("the trained policy (docs/architecture.md §7 lists every setting)")
    g_pol.add_argument(
        "--policy-config",
        default=None,
        help='any setting of the trained policy as JSON, e.g. \'{"epochs": 2, "grad_clip": 0.5}\', or '
        "a file of them (@policy.json); a flag given beside it wins (docs/architecture.md §7 lists every "
        "setting)",
    )
    g_pol.add_argument(
        "--model-path", default=None, help="local Qwen3 checkpoint folder (hf / vllm policies)"
    )
    g_pol.add_argument(
        "--max-new-tokens", type=COUNT, default=None, help="tokens per assistant turn (LM policies)"
    )
    g_pol.add_argument(
        "--max-context",
        type=COUNT,
        default=None,
        help="LM policies: tokens an episode may hold; one with no room for another turn ends there, "
        "verified as it stands (default 16384)",
    )
    g_pol.add_argument(
        "--resident",
        action="store_true",
        help="neural and LM policies: one worker process keeps the policy, its optimizer and its "
        "environments or engine across steps (no per-step process start and reload)",
    )
    g_pol.add_argument(
        "--checkpoint-every",
        type=COUNT,
        default=None,
        help="LM policies: checkpoint every N steps and at the end (default 20, the paper's)",
    )
    g_pol.add_argument(
        "--keep-checkpoints",
        type=COUNT,
        default=None,
        help="LM policies: keep the newest N periodic checkpoints on disk, deleting older ones (default: "
        "all; the rolling latest and the best held-out one are kept besides). A rewind goes back to "
        "a step just after a kept one",
    )
    g_pol.add_argument(
        "--sim-mode",
        default="auto",
        choices=["auto", "latent", "real"],
        help="simulated policy: latent model of the checks (synthetic) or gold actions corrupted "
        "and run through the real runtime + verifier (default for package pools)",
    )
    g_pol.add_argument(
        "--overrun-penalty",
        type=float,
        default=None,
        help="neural and LM policies: reward taken off an episode the action cap (LM: or the context) "
        "ended, in [0, 1], 0 = off "
        "(docs/algorithm.md §8b)",
    )
    g_pol.add_argument(
        "--train-forced-stop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="neural policy: leave the stop the action cap forces out of the loss (default) or train "
        "on it like a decision the policy made (--train-forced-stop, the default until 2026-12: its "
        "log-probability falls all run and late updates can blow up; docs/algorithm.md §8b)",
    )
    g_pol.add_argument(
        "--base-url", default=None, help="openai policy: an OpenAI-compatible server, e.g. http://host/v1"
    )
    g_pol.add_argument("--model", default=None, help="openai policy: the model name the server serves")
    g_pol.add_argument(
        "--api-key-env", default=None, help="openai policy: environment variable that holds the API key"
    )
    g_upd = t.add_argument_group("the GRPO update (neural and LM policies)")
    g_upd.add_argument("--lr", type=float, default=None, help="learning rate (neural and LM policies)")
    g_upd.add_argument(
        "--lr-warmup-steps",
        type=INDEX,
        default=None,
        help="neural and LM policies: the learning rate rises linearly over the first N steps (step t "
        "trains at lr x (t+1)/N); new run: 0",
    )
    g_upd.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default=None,
        help="neural and LM policies: after the warmup the learning rate stays (constant, a new run's) "
        "or decays linearly or along a cosine to --lr-min-ratio x lr at step --lr-decay-steps",
    )
    g_upd.add_argument(
        "--lr-decay-steps",
        type=COUNT,
        default=None,
        help="the step a decaying schedule reaches its floor at (default: the run's --max-steps when it "
        "starts, kept when a later --steps makes the run longer)",
    )
    g_upd.add_argument(
        "--lr-min-ratio",
        type=float,
        default=None,
        help=f"the floor of a decaying schedule, as a share of lr, in [0, 1] (default {LR_MIN_RATIO})",
    )
    g_upd.add_argument(
        "--clip-eps",
        type=float,
        default=None,
        help=f"PPO clip range of the GRPO surrogate (neural and LM policies; default {DEFAULT_CLIP_EPS})",
    )
    g_upd.add_argument(
        "--clip-eps-high",
        type=float,
        default=None,
        help="the clip range above alone, >= --clip-eps: DAPO's clip-higher, e.g. 0.28 (neural and LM "
        "policies; default: --clip-eps)",
    )
    g_upd.add_argument(
        "--dual-clip",
        type=float,
        default=None,
        help="dual-clip PPO bound c > 1 on a negative advantage's surrogate, 0 = off (neural and LM "
        "policies; docs/algorithm.md §8b)",
    )
    g_upd.add_argument(
        "--loss-denominator",
        choices=LOSS_DENOMINATORS,
        default=None,
        help="what the GRPO loss averages over: the informative episodes (default) or the whole batch "
        "(neural and LM policies; docs/algorithm.md §8b)",
    )
    g_upd.add_argument(
        "--kl-coef",
        type=float,
        default=None,
        help="LM policies: weight of a KL penalty to a frozen copy of the initial policy (default 0: off, "
        "no copy kept)",
    )
    g_upd.add_argument(
        "--micro-batch",
        type=COUNT,
        default=None,
        help="LM policies: sequences per forward/backward pass, the step's gradient accumulated over "
        "them (lower it when the update runs out of GPU memory; default 4)",
    )
    g_upd.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="LM policies: recompute each layer's activations in the backward pass instead of keeping "
        "them (the update's memory for long agent contexts, for more update time; default off)",
    )
    g_upd.add_argument(
        "--sampler-correction",
        choices=SAMPLER_CORRECTIONS,
        default=None,
        help="LM policies: how the update corrects for the sampler (vLLM, or another precision) giving "
        "its tokens other log-probabilities than the trainer does: truncated importance weights "
        "(truncate, the default), tokens outside [1/cap, cap] left out (mask), or none (off)",
    )
    g_upd.add_argument(
        "--sampler-cap",
        type=float,
        default=None,
        help=f"LM policies: the sampler correction's cap on a token's weight (default {DEFAULT_SAMPLER_CAP})",
    )
    g_held = t.add_argument_group("held-out evaluation (neural and LM policies)")
    g_held.add_argument(
        "--eval-every",
        type=INDEX,
        default=None,
        help="neural and LM policies: held-out evaluation every N steps and at the last step, 0 = off "
        "(default 10; a resumed run may change it)",
    )
    g_held.add_argument(
        "--eval-tasks",
        type=COUNT,
        default=None,
        help="held-out tasks per split (seen / unseen environments), the same ones at every evaluation "
        "(default: all for neural, B for LM policies)",
    )
    g_held.add_argument(
        "--eval-samples",
        type=COUNT,
        default=None,
        help="sampled episodes per held-out task (default 8 for neural, 2 for LM policies)",
    )
    g_held.add_argument(
        "--eval-temperature",
        type=float,
        default=None,
        help="LM policies: sampling temperature of the held-out episodes (default: the training one; "
        "0 = greedy, one episode per task)",
    )
    g_held.add_argument(
        "--eval-patience",
        type=INDEX,
        default=None,
        help="stop the run early once N evaluations in a row have not beaten its best mean held-out "
        "score (`envsched resume` trains on); 0 = never (the default; a resumed run may change it)",
    )
    g_watch = t.add_argument_group("watching and comparing")
    g_watch.add_argument(
        "--report-to",
        default=None,
        help="experiment trackers: tensorboard,wandb,mlflow (offline; under <lake>/trackers) or none",
    )
    g_watch.add_argument(
        "--against",
        action="append",
        default=None,
        metavar="LAKE",
        help="a lake holding another scheduler's run of this pool, policy, B and G (random's at this "
        "seed, say; it may start later) that this run's report compares with: the report at the run's "
        "end (written to <lake>/reports/latest, its verdicts printed), the sensor's, `envsched report`; "
        "repeatable. A resumed run given --against replaces the list; `--against none` clears it",
    )
    t.set_defaults(func=run)


def policy_config(args) -> dict:
    pc: dict = {}
    if args.sim_mode != "auto":
        pc["mode"] = args.sim_mode
    if args.model_path:
        not_a_url("--model-path", args.model_path, "a checkpoint folder on this machine")
        pc["model_path"] = str(Path(args.model_path).resolve())
    if args.resident:
        pc["resident"] = True
    # every other setting of the policy with a flag of its own name: a flag added for one is read here
    for f in fields(PolicyConfig):
        value = None if f.name in ("mode", "model_path", "resident") else getattr(args, f.name, None)
        if value is not None:
            pc[f.name] = value
    return pc


def requested_run(args, current: RunSpec | None) -> RunSpec:
    """The run this command asks for: each flag given, over the lake's run when it holds one (a plain
    ``envsched train --steps N`` resumes it with its own pool, policy, scheduler and configs), over a
    new run's defaults when it does not. Whether a resumed run may change is open_run's to decide;
    a bad scheduler name or JSON is a UsageError naming the flag."""
    base = current or new_run()
    overrides = {}
    if args.scheduler_config:
        overrides.update(json_object("--scheduler-config", args.scheduler_config, '{"rho": 0.25}'))
    if args.cost_aware:
        overrides["cost_aware"] = True
    # another policy starts from its own defaults, not from the settings of the one it replaces
    kept = base.policy_config if args.policy in (None, base.policy) else {}
    if args.policy_config:
        kept = {**kept, **json_object("--policy-config", args.policy_config, '{"epochs": 2}')}
    try:
        spec = asked_run(
            base,
            args.scheduler,
            overrides,
            pool=args.pool,
            policy=args.policy,
            seed=args.seed,
            batch_size=args.batch_size,
            group_size=args.group_size,
            prior_lake=args.prior_lake,
            prior_discount=args.prior_discount,
            select_lag=args.select_lag,
            report_to=args.report_to,
            against=None if args.against is None else [a for a in args.against if a != "none"],
            policy_config={**kept, **policy_config(args)},
            max_steps=max(args.steps, args.max_steps or 0),
            trainer="subprocess",
        )
    except ValueError as exc:
        raise UsageError(f"--scheduler: {exc}") from exc
    if args.scheduler_config and json_source(args.scheduler_config) is not None:
        try:  # a file's bad field is named with the file (open_run checks it again)
            scheduler_config(spec)
        except ConfigError as exc:
            raise from_source("--scheduler-config", args.scheduler_config, exc) from exc
    return spec


def _fmt(v, width: int = 10, scientific: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(width)
    if isinstance(v, float):
        return (f"{v:.2e}" if scientific else f"{v:.4f}").rjust(width)
    return str(v).rjust(width)


TRAINING = (("loss", "loss"), ("grad_norm", "grad_norm"), ("approx_kl", "kl"), ("entropy", "entropy"))


# a language model's: the mean |log-probability| gap of its sampler and trainer at the trained tokens
SAMPLER_GAP = (("sampler_logprob_diff", "smp_gap"),)
SCIENTIFIC = {"lr", "sampler_logprob_diff"}  # columns printed as 1.23e-05


def training_columns(spec: RunSpec) -> tuple[tuple[str, str], ...]:
    """The update's columns of the step table (neural and LM policies): loss, grad norm, KL and
    entropy, the learning rate where the run's schedule moves it, and a language model's sampler
    gap (the update's sampler correction)."""
    if spec.policy == "simulated":
        return ()
    pc = spec.policy_settings()
    lr = (("lr", "lr"),) if pc.lr_warmup_steps or pc.decays() else ()
    return TRAINING + lr + (SAMPLER_GAP if spec.policy in ("hf-tiny", "hf", "vllm") else ())


def header(training: tuple[tuple[str, str], ...] = ()) -> str:
    """The step table's header, the update's columns (``training_columns``) last."""
    names = HEADER + tuple(short for _, short in training)
    return " ".join(n.rjust(10) for n in names)


def row(r: dict, wall: float | None = None, training: tuple[tuple[str, str], ...] = ()) -> str:
    """One step: its numbers, the trainer's seconds and the rest of the wall time (Dagster, scheduler,
    statistics, process starts), then the update's columns."""
    trainer = r.get("seconds")
    r = dict(
        r,
        trainer_s=trainer,
        overhead_s=(wall - trainer)
        if wall is not None and trainer == trainer and trainer is not None
        else None,
    )
    cols = STEP_COLUMNS + tuple(c for c, _ in training)
    return " ".join(_fmt(r.get(c), scientific=c in SCIENTIFIC) for c in cols)


def require_local_packages(spec: RunSpec) -> None:
    """`envsched train` runs the trainer on this machine, so what the run's policy imports must be
    here: the checkpoint folder of ``--model-path``, vLLM for ``--policy vllm``, DeepSpeed for
    ``deepspeed``. A missing one is refused before anything is written (it used to fail inside
    three retries of step 0 and halt the run)."""
    settings = spec.policy_settings()
    if settings.model_path and not Path(settings.model_path).is_dir():
        raise UsageError(f"--model-path: {settings.model_path} is not a folder (a local Qwen3 checkpoint)")
    need = ["vllm"] if spec.policy == "vllm" else []
    if settings.deepspeed:
        need.append("deepspeed")
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"policy {spec.policy} needs {' and '.join(missing)}, which this machine does not have: "
            "install the `gpu` extra on a CUDA machine (pip install -e '.[gpu]'), or run the trainer "
            "there (a GPU-backed Dagster agent, docs/deployment.md)"
        )


def require_fitting_pool(lake, spec: RunSpec) -> None:
    """The run's policy can act in every environment of its pool (the neural learner only in
    EnvScaler-style ones), else a UsageError naming the flag."""
    if problem := environment_kinds_problem(spec.policy, spec.pool, environment_kinds(lake, spec.pool)):
        raise UsageError(f"--policy {spec.policy}: {problem}")


def interrupted_line(stop, summary: list[dict], steps: int) -> str:
    """What Ctrl-C left: where it stopped, what the lake holds, and the command that continues."""
    where = (
        f"after step {stop.step} ({stop.kind})"
        if stop.done
        else f"at step {stop.step} ({stop.kind})"
        + (f"; its Dagster run {stop.dagster_run_id[:8]} is marked canceled" if stop.dagster_run_id else "")
    )
    held = f"the lake holds steps 0..{summary[-1]['step']}" if summary else "the lake holds no trained step"
    return f"envsched: interrupted {where}; {held}. `envsched train --steps {steps}` continues the run"


def run(args) -> int:
    lake = lake_of(args)
    spec = requested_run(args, load_run(lake))
    spec.validate(SCHEDULERS)  # a bad setting is named before what it needs is looked for
    require_local_packages(spec)
    imported = lake.has("tasks", pool=spec.pool)
    if imported:  # a pool already here: the policy must fit it before anything is written
        require_fitting_pool(lake, spec)
    dagster_home()  # before the run is written: a $DAGSTER_HOME that cannot be made stops it here
    # a refused setting or pool writes nothing, not even the lease; open_run checks again under the
    # lease, where no other command can change the lake between its check and its write
    check_open(lake, spec)
    # one driver per run, taken before the run is written: a second `envsched train` (other
    # settings included) is refused before it changes anything of a run another one drives
    with Lease(lake) as lease:
        return _train(args, lake, spec, imported, lease)


def _train(args, lake: Lake, spec: RunSpec, imported: bool, lease: Lease) -> int:
    from envsched_pipeline.orchestration.driver import (  # Dagster: only `train` needs it
        Interrupted,
        materialize_pool,
        run_loop,
    )

    spec = open_run(lake, spec, allow_config_change=args.allow_config_change)  # validates before writing
    if not imported:
        print(f"importing pool {spec.pool} into {lake.root} ...", flush=True)
        materialize_pool(spec.pool, lake)
        ensure_pool(lake, spec.pool)
        require_fitting_pool(lake, spec)  # before any step: not three failed tries of step 0
    shown = scheduler_label(spec.scheduler, spec.scheduler_config)
    print(
        f"run {spec.run_id}: pool={spec.pool} policy={spec.policy} scheduler={shown} "
        f"B={spec.batch_size} G={spec.group_size} steps={args.steps} lake={lake.root}"
        + (f" select_lag={spec.select_lag}" if spec.select_lag else ""),
        flush=True,
    )
    if spec.policy == "simulated":
        print("note: the policy is the SIMULATED learner (docs/algorithm.md), not a neural network.")
    elif spec.policy == "hf-tiny":
        print("note: hf-tiny is a random-init tiny Qwen3 (real agent loop + real GRPO update on CPU).")
    if (
        spec.policy not in ("simulated", "external")
        and spec.policy_settings().eval_every != 0
        and not lake.has("eval_tasks", pool=spec.pool)
    ):
        print(
            f"note: pool {spec.pool} has no held-out split, so nothing is evaluated; `envsched pool create "
            f"<kind> --name NAME --heldout-tasks K --heldout-envs M` makes a pool with one"
        )
    t0 = time.perf_counter()
    before = step_summary(lake)
    if before:
        bv = sum(r["batch_variance"] for r in before) / len(before)
        last = before[-1]["step"]
        if len(before) >= args.steps:
            print(
                f"the lake holds steps 0..{last} (mean batch variance {bv:.4f}), as many as --steps "
                f"{args.steps} asks for or more: nothing to do. `envsched train --steps {last + 2}` goes on; "
                "`envsched rewind --to K` takes the run back to step K"
            )
            return 0
        print(
            f"the lake holds steps 0..{last} (mean batch variance {bv:.4f}); continuing at step "
            f'{last + 1}: `envsched sql "select * from step_summary"` shows them all'
        )
    todo = max(0, args.steps - len(before))
    training = training_columns(spec)
    if todo:
        print(header(training))
    walls: list[float] = []

    def on_step(step: int, seconds: float) -> None:
        walls.append(seconds)
        rows = {r["step"]: r for r in step_summary(lake)}
        left = todo - len(walls)
        eta = f"  eta {sum(walls) / len(walls) * left:.0f}s" if left > 0 else ""
        if step in rows:
            print(row(rows[step], seconds, training) + eta, flush=True)

    try:
        run_loop(
            lake,
            args.steps,
            on_step=on_step,
            on_failure=lambda line: print(line, file=sys.stderr, flush=True),
            lease=lease,
        )
    except Interrupted as stop:
        print(interrupted_line(stop, step_summary(lake), args.steps), file=sys.stderr, flush=True)
        return 130
    record = halted(lake)
    if record is not None and record["gate"] == STALL_GATE:  # stopped early, as --eval-patience asked
        print(halt_message(record), flush=True)
    if spec.against:
        print(f"done in {time.perf_counter() - t0:.1f}s.", flush=True)
        return end_report(lake)
    print(
        f"done in {time.perf_counter() - t0:.1f}s. Next: `make ui` (Dagster UI on 127.0.0.1:3000), "
        f'`envsched sql "select * from step_summary"`, or `envsched report --out DIR` (add `--against LAKE` '
        "for another scheduler's run of this pool, e.g. random's)",
        file=sys.stdout,
    )
    return 0


def end_report(lake: Lake) -> int:
    """The finished run's report against the runs it names (`--against`), where the sensor's goes
    (``<lake>/reports/latest``), and its verdicts. A partner refused there (its tasks are not this
    pool's) is named on stderr: the run itself is complete either way."""
    try:
        index = build_report(
            lake, lake.local / LATEST_REPORT, log=lambda m: print(m, file=sys.stderr, flush=True)
        )
    except (EnvschedError, ValueError) as exc:
        print(f"the run is complete; its report was not written: {exc}", file=sys.stderr, flush=True)
        return 0
    print("\n".join(verdict_lines(json.loads((index.parent / "summary.json").read_text()))))
    print(f"report: {index} (`envsched report --out DIR` writes it again, later partners' steps included)")
    return 0
