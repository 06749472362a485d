"""``envsched sweep``: the paper's ablation on your own pool in one command.

Each scheduler runs at each seed in a lake of its own (``DIR/<scheduler>-s<seed>``; ``DIR`` a folder
or an object-store prefix, :class:`SweepDir`) through
``envsched train``, up to ``--jobs`` at once; the baseline's run of a seed goes first and every
other run of that seed names it (``train --against``), so each run's own report compares with it.
At the end the runs are judged over seeds, side by side (``envsched compare --runs ... --runs ...
--against ...``), over the runs that completed when some failed. Every run is checked before any
starts; the same command again resumes the runs that did not finish and leaves the finished ones as
they are. Ctrl-C or SIGTERM stops every run after its step, and so does ``kill -9`` of the sweep
(each run asks the kernel to be told, :func:`envsched_pipeline.cli.common.stop_with_parent`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from envsched_pipeline.cli import train
from envsched_pipeline.cli.analyze import print_comparison
from envsched_pipeline.cli.common import (
    COUNT,
    INDEX,
    STOP_WITH_ENV,
    HelpFormatter,
    Parser,
    UsageError,
    dagster_home,
    json_object,
    json_source,
    names,
    read_text_file,
    writable_dir,
)
from envsched_pipeline.core.build import check_run
from envsched_pipeline.core.gates import STALL_GATE, halted
from envsched_pipeline.errors import LakeError
from envsched_pipeline.lake import Lake, atomic_write_bytes, local_dir_for
from envsched_pipeline.run import RUN_FILE, load_run, resume_refusal, with_neural_defaults
from envsched_pipeline.scheduler.variants import resolve

SWEEP_FILE = "sweep.json"  # in DIR: the sweep's settings, so `envsched sweep --dir DIR` resumes it
RECORDED = ("schedulers", "seeds", "steps", "baseline", "train_flags")
OPTIONAL = ("baseline", "train_flags")  # a new sweep may leave them out
# what the sweep sets for each run itself, so a train flag after `--` may not
SET_BY_SWEEP = ("--scheduler", "--seed", "--steps", "--max-steps", "--against", "--lake")
# train flags the sweep records in a form that holds wherever and whenever it is resumed: a settings
# file's JSON inlined (the runs not started yet keep the settings the sweep started with), a local
# folder made absolute (a URL is left as it is)
INLINED = {"--scheduler-config": '{"rho": 0.25}', "--policy-config": '{"epochs": 2}'}  # (examples)
ABSOLUTE = ("--model-path", "--prior-lake")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PROGRESS_EVERY = 30.0  # seconds between the lines that say how far the running runs are
LOG_LINES = 5  # of a failed run's log, shown with the failure


@dataclass
class Planned:
    """One run of the sweep: its scheduler, seed, lake and the `envsched train` arguments."""

    scheduler: str
    seed: int
    steps: int
    lake: str  # a folder on this machine or an s3:// URL
    argv: list[str]
    baseline: bool
    log: Path
    base: str  # the folder of its seed's baseline run
    result: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.scheduler} s{self.seed}"


@dataclass
class SweepDir:
    """Where a sweep keeps its lakes: a folder on this machine or an object-store prefix
    (``s3://bucket/prefix``). Its record (``sweep.json``) sits beside the lakes; its logs and its
    table's page always on this machine (for a prefix, under the lakes' local folder)."""

    root: str
    remote: bool

    @classmethod
    def of(cls, given: str, write: bool = False) -> SweepDir:
        """``--dir``: a URL is checked as a lake's root would be; a folder, with ``write``, must be
        one this command can write into (checked, not made)."""
        text = str(given)
        if "://" in text:
            try:
                return cls(str(Lake(text).root).rstrip("/"), True)
            except LakeError as exc:
                raise UsageError(f"--dir: {str(exc).removeprefix('lake ')}") from exc
        folder = writable_dir("--dir", text) if write else Path(text)
        return cls(str(folder.resolve()), False)

    def join(self, name: str) -> str:
        return f"{self.root}/{name}" if self.remote else str(Path(self.root) / name)

    @property
    def local(self) -> Path:
        """This machine's folder for the sweep's logs and page."""
        return local_dir_for(self.root) if self.remote else Path(self.root)

    def read_record(self) -> str | None:
        """``sweep.json`` as text, None when there is none."""
        if self.remote:
            data = Lake(self.root).read_bytes(SWEEP_FILE)
            if data is None:
                return None
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{self.join(SWEEP_FILE)}: not UTF-8 text (byte {exc.start})") from exc
        path = Path(self.root) / SWEEP_FILE
        return read_text_file("--dir", path) if path.is_file() else None

    def write_record(self, data: bytes) -> None:
        if self.remote:
            Lake(self.root).write_bytes(SWEEP_FILE, data)
        else:
            atomic_write_bytes(Path(self.root) / SWEEP_FILE, data)


def seed_list(text: str) -> list[int]:
    """An argparse type: seeds as ``0,1,2`` or ranges ``0-4`` (mixed, in order, repeats dropped)."""
    seeds: list[int] = []
    for part in names(text):
        lo, sep, hi = part.partition("-")
        try:
            first, last = INDEX(lo), INDEX(hi) if sep else INDEX(lo)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{part!r}: {exc}") from None
        if last < first:
            raise argparse.ArgumentTypeError(f"{part!r}: a range goes up (e.g. 0-4)")
        seeds += [s for s in range(first, last + 1) if s not in seeds]
    if not seeds:
        raise argparse.ArgumentTypeError("names no seed")
    return seeds


def add_parser(sub) -> None:
    sw = sub.add_parser(
        "sweep",
        help="each scheduler at each seed, one lake per run, then the table over seeds",
        description="Run each of --schedulers at each of --seeds through `envsched train` (one lake "
        "per run under --dir, up to --jobs at once; the baseline's runs first, every other run "
        "compared with its seed's baseline run), then judge them over seeds side by side, as `envsched "
        "compare` does. Flags after `--` go to every `envsched train` (pool, policy, B, G, held-out "
        "settings...). Every run is checked before any starts; the same command again, or `envsched sweep "
        "--dir DIR` alone (the sweep is recorded in DIR/sweep.json), resumes what did not finish.",
        formatter_class=HelpFormatter,
    )
    sw.add_argument(
        "--dir",
        required=True,
        help="folder of the sweep's lakes (DIR/<scheduler>-s<seed>), or s3://bucket/prefix for lakes on an "
        "object store (logs and the table's page then stay on this machine)",
    )
    sw.add_argument(
        "--schedulers",
        help="comma-separated schedulers or named variants (e.g. envsched@success+adaptive+covsampled+lr,mopps); "
        "the baseline is added when not named (default: the sweep recorded in DIR)",
    )
    sw.add_argument(
        "--seeds",
        type=seed_list,
        help="seeds: 0,1,2 or 0-4, two at least (default: the sweep recorded in DIR)",
    )
    sw.add_argument("--steps", type=COUNT, help="steps per run (default: the sweep recorded in DIR)")
    sw.add_argument(
        "--baseline",
        help="the scheduler every other is judged against (default: the sweep recorded in DIR, else random)",
    )
    sw.add_argument("--jobs", type=COUNT, default=1, help="runs at once (each takes a core or more)")
    sw.add_argument(
        "--effect", type=float, default=None, help="plan for this held-out difference (compare --effect)"
    )
    sw.add_argument("--out", default=None, help="the table's page (default DIR/comparison)")
    sw.add_argument("--json", action="store_true", help="the table as JSON")
    sw.add_argument(
        "--dry-run",
        action="store_true",
        help="check every run and print what would run (each run's lake and `envsched train` command, the "
        "runs already done), then stop: nothing is written or started",
    )
    sw.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then flags for every `envsched train`")
    sw.set_defaults(func=cmd_sweep)


def slug(scheduler: str) -> str:
    """A scheduler or variant name as a folder name (``envsched@a+b`` -> ``envsched_a_b``)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", scheduler).strip("_")


def recorded(args) -> None:
    """Fill the settings the command left out (--schedulers, --seeds, --steps, --baseline, the train
    flags) from the sweep recorded in ``DIR/sweep.json``, so ``envsched sweep --dir DIR`` alone
    resumes it; a new sweep names the first three. A damaged record is a UsageError naming the file
    and the field."""
    missing = [k for k in RECORDED if getattr(args, k) in (None, [])]
    if not missing:
        return
    where = SweepDir.of(args.dir)
    path = where.join(SWEEP_FILE)
    text = where.read_record()
    if text is None:
        if set(missing) - set(OPTIONAL):
            raise UsageError(
                f"--schedulers, --seeds and --steps name a new sweep ({path} records none to resume)"
            )
        args.baseline = args.baseline or "random"
        return
    try:
        found = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}: not JSON ({exc.msg} at line {exc.lineno}); name the sweep's settings"
        ) from exc
    kinds = {"schedulers": str, "seeds": list, "steps": int, "baseline": str, "train_flags": list}
    words = {str: "a string", list: "a list", int: "an integer"}
    for key, kind in kinds.items():
        value = found.get(key) if isinstance(found, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UsageError(f"{path}: field {key!r} missing or not {words[kind]}")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in found["seeds"]):
        raise UsageError(f"{path}: field 'seeds' must list seeds (integers >= 0)")
    if not all(isinstance(x, str) for x in found["train_flags"]):
        raise UsageError(f"{path}: field 'train_flags' must list strings")
    for key in missing:
        setattr(args, key, found[key])


def record(args, where: SweepDir) -> None:
    """The sweep's settings in ``DIR/sweep.json``, for ``envsched sweep --dir DIR`` to resume."""
    where.write_record(
        json.dumps(
            {
                "schedulers": args.schedulers,
                "seeds": args.seeds,
                "steps": args.steps,
                "baseline": args.baseline,
                "train_flags": args.train_flags,
            },
            indent=1,
        ).encode(),
    )


def train_options() -> list[str]:
    """Every option string of `envsched train` (its parser's own)."""
    sub = Parser(prog="envsched").add_subparsers()
    train.add_parser(sub)
    return [o for a in sub.choices["train"]._actions for o in a.option_strings]


def portable(flags: list[str]) -> list[str]:
    """The train flags with each settings file (``--policy-config @FILE``, ``--scheduler-config
    FILE.json``) replaced by its JSON and each local folder (``--model-path``, ``--prior-lake``) by
    its absolute path, the option named in full; an abbreviation counts as argparse reads it. A
    settings file that is missing or not a JSON object is a UsageError naming the flag and file."""
    options = train_options()
    out, i = [], 0
    while i < len(flags):
        token = flags[i]
        name, eq, value = token.partition("=")
        hits = [o for o in options if o == name] or [o for o in options if o.startswith(name)]
        full = hits[0] if token.startswith("--") and len(hits) == 1 else None
        if full not in (*INLINED, *ABSOLUTE) or (not eq and i + 1 == len(flags)):
            out.append(token)
            i += 1
            continue
        if not eq:
            value, i = flags[i + 1], i + 1
        if full in INLINED and json_source(value) is not None:
            value = json.dumps(json_object(full, value, INLINED[full]), separators=(",", ":"))
        elif full in ABSOLUTE and "://" not in value:
            value = str(Path(value).expanduser().resolve())
        out.append(f"{full}={value}")
        i += 1
    return out


def plan(args) -> tuple[SweepDir, list[Planned]]:
    """Every run of the sweep, each checked as `envsched train` would check it (its settings, the
    run its lake already holds, its baseline's run where that exists), before any starts."""
    flags = list(args.train_flags)
    for flag in flags:
        if flag.split("=", 1)[0] in SET_BY_SWEEP:
            raise UsageError(
                f"-- {flag}: the sweep sets it for each run (--schedulers, --seeds, --steps, --dir; the "
                "baseline is named to every other run)"
            )
    chosen = names(args.schedulers)
    twice = sorted({n for n in chosen if chosen.count(n) > 1})
    if twice:
        raise UsageError(f"--schedulers: {', '.join(twice)} is named twice")
    schedulers = chosen if args.baseline in chosen else [args.baseline, *chosen]
    for flag, name in [("--baseline", args.baseline), *(("--schedulers", n) for n in chosen)]:
        try:
            resolve(name)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from exc
    if len(schedulers) < 2:
        raise UsageError(f"--schedulers: name a scheduler besides the baseline ({args.baseline})")
    folders = [slug(s) for s in schedulers]
    for i, f in enumerate(folders):
        if f in folders[:i]:
            raise UsageError(
                f"--schedulers: {schedulers[folders.index(f)]} and {schedulers[i]} would share the lakes "
                f"{f}-s<seed> (each is named once)"
            )
    if len(args.seeds) < 2:
        raise UsageError("--seeds: two seeds at least (the runs are judged over seeds)")
    where = SweepDir.of(args.dir, write=True)  # a file there, or a read-only place: refused now
    if Lake(where.root).exists(RUN_FILE):
        raise UsageError(
            f"--dir: {where.root} holds a run (it is a lake); name a folder for the sweep's lakes (each run "
            "gets one of its own in it)"
        )
    parser = Parser(prog="envsched")  # `envsched train`'s own options, to check each run's flags here
    train.add_parser(parser.add_subparsers())
    runs = []
    for scheduler, folder in zip(schedulers, folders, strict=True):
        for seed in args.seeds:
            lake = where.join(f"{folder}-s{seed}")
            base = f"{slug(args.baseline)}-s{seed}"
            argv = [
                "train",
                *flags,
                "--scheduler",
                scheduler,
                "--seed",
                str(seed),
                "--steps",
                str(args.steps),
            ]
            is_base = scheduler == args.baseline
            if not is_base:
                argv += ["--against", where.join(base)]
            log = where.local / "logs" / f"{folder}-s{seed}.log"
            runs.append(Planned(scheduler, seed, args.steps, lake, argv, is_base, log, base))
    for r in runs:
        try:
            parsed = parser.parse_args(r.argv)
        except UsageError as exc:
            raise UsageError(f"-- {' '.join(flags)}: {exc}") from exc
        asked = (parsed.scheduler, parsed.seed, parsed.steps, parsed.max_steps, parsed.against)
        if asked != (r.scheduler, r.seed, r.steps, None, None if r.baseline else [where.join(r.base)]):
            raise UsageError(  # an abbreviation argparse took for one of them (--sched, --again)
                f"-- {' '.join(flags)}: sets the scheduler, seed, steps or runs compared with, which the "
                "sweep sets for each run"
            )
        lake = Lake(r.lake)
        current = load_run(lake)
        spec = train.requested_run(parsed, current)
        check_run(lake, spec)
        if current is not None and lake.steps("manifests"):
            refusal = resume_refusal(lake, current, with_neural_defaults(spec), parsed.allow_config_change)
            if refusal:
                raise UsageError(f"{r.name}: {refusal}")
    return where, runs


def cmd_sweep(args) -> int:
    recorded(args)
    if args.train_flags[:1] == ["--"]:  # argparse keeps the `--` that starts them
        args.train_flags = args.train_flags[1:]
    args.train_flags = portable(args.train_flags)  # as recorded: resumable from anywhere, any time
    where, runs = plan(args)
    if args.dry_run:
        return print_plan(runs, args.jobs)
    out = writable_dir("--out", args.out) if args.out else None  # before hours of runs
    from envsched_pipeline.orchestration.driver import get_instance  # Dagster: once the runs are checked

    home = dagster_home()  # one instance for every run: they all show in the UI
    get_instance().dispose()  # its storage made here, once: runs starting together would race to make it
    (runs[0].log.parent).mkdir(parents=True, exist_ok=True)
    record(args, where)
    # with --json, stdout is the table's JSON alone: the progress goes to stderr
    say = functools.partial(print, file=sys.stderr if args.json else sys.stdout, flush=True)
    say(
        f"sweep: {len(runs)} runs ({len({r.scheduler for r in runs})} schedulers x {len(args.seeds)} seeds, "
        f"{args.steps} steps each), {args.jobs} at a time, in {where.root}; logs in {runs[0].log.parent}"
    )
    env = dict(os.environ, DAGSTER_HOME=str(home), PYTHONUNBUFFERED="1")
    env[STOP_WITH_ENV] = str(os.getpid())  # a run stops after its step if the sweep dies (kill -9)
    code = run_all(runs, args.jobs, env, say)
    if code == 130:
        return code
    groups, against, left_out = comparable(runs)
    if code:
        failed = [r for r in runs if r.result.get("rc")]
        print(
            f"{len(failed)} of {len(runs)} runs failed ({', '.join(r.name for r in failed)}); the same "
            "command runs them again (the finished runs are kept)",
            file=sys.stderr,
            flush=True,
        )
        if not groups:
            print(
                "no table: no scheduler has two seeds whose run and baseline run both completed",
                file=sys.stderr,
                flush=True,
            )
            return code
        say(f"the table over the runs that completed; left out: {'; '.join(left_out)}")
    print_comparison(groups, against, args.effect, out or where.local / "comparison", args.json)
    return code


def print_plan(runs: list[Planned], jobs: int) -> int:
    """``--dry-run``: each run the sweep would start, in the order it would start them, with its
    command; the runs an earlier sweep finished are named as done."""
    order = sorted(runs, key=lambda r: not r.baseline)
    done = {r.name: finished(r) for r in order}
    todo = [r for r in order if done[r.name] is None]
    print(
        f"sweep plan: {len(runs)} runs, {len(todo)} to run, {jobs} at a time (a seed's other runs once its "
        f"baseline run has ended); nothing started"
    )
    for r in order:
        if done[r.name] is not None:
            n = done[r.name]
            print(f"  done    {r.name}: {n} step{'s' * (n != 1)} in {r.lake}")
        else:
            print(f"  to run  {r.name}: envsched --lake {r.lake} {shlex.join(r.argv)}")
    return 0


def comparable(runs: list[Planned]) -> tuple[list[list[Lake]], list[Lake], list[str]]:
    """What the table can be made of: per scheduler its completed runs whose seed's baseline run
    completed too (a scheduler left with fewer than two is left out), the baseline's runs of those
    seeds, and what was left out and why (a line each)."""
    done = {(r.scheduler, r.seed) for r in runs if r.result.get("rc") == 0}
    base = next(r.scheduler for r in runs if r.baseline)
    left_out, groups, seeds_used = [], [], set()
    for scheduler in dict.fromkeys(r.scheduler for r in runs if not r.baseline):
        mine = [r for r in runs if r.scheduler == scheduler]
        ok = [r for r in mine if (scheduler, r.seed) in done and (base, r.seed) in done]
        for r in mine:
            if r not in ok:
                why = "failed" if (scheduler, r.seed) not in done else f"{base} s{r.seed} failed"
                left_out.append(f"{r.name} ({why})")
        if len(ok) < 2:
            if ok:
                left_out.append(f"{scheduler} (one seed left: a spread over seeds needs two)")
            continue
        groups.append([Lake(r.lake) for r in ok])
        seeds_used.update(r.seed for r in ok)
    against = [Lake(r.lake) for r in runs if r.baseline and r.seed in seeds_used]
    return groups, against, left_out


def run_all(runs: list[Planned], jobs: int, env: dict, say=print) -> int:
    """Run ``runs`` (baselines first; another run of a seed once its baseline has ended), up to
    ``jobs`` at once, saying (``say``) what starts, ends and how far the running ones are. 0 when every run
    completed; 1 when one failed (the others still run); 130 on Ctrl-C or SIGTERM (the runs stop
    after their step)."""
    waiting = sorted(runs, key=lambda r: not r.baseline)
    running: dict[str, tuple[Planned, subprocess.Popen, float]] = {}
    ended: set[int] = set()  # seeds whose baseline run has ended
    for r in list(waiting):  # from an earlier sweep: no process to start (looked at once, here)
        done = finished(r)
        if done is not None:
            waiting.remove(r)
            r.result = {"rc": 0, "seconds": 0.0}
            ended.update([r.seed] if r.baseline else [])
            say(f"already done {r.name}: {done} steps")
    t0 = last_line = time.time()
    before = {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS}  # the runs inherit the default
    try:
        while waiting or running:
            for r in [r for r in waiting if r.baseline or r.seed in ended]:
                if len(running) >= jobs:
                    break
                waiting.remove(r)
                running[r.name] = (r, start(r, env), time.time())
                say(f"started {r.name} ({r.lake})")
            for name, (r, proc, started) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                if r.baseline:
                    ended.add(r.seed)
                r.result = {"rc": proc.returncode, "seconds": time.time() - started}
                say(ended_line(r))
            if running and time.time() - last_line >= PROGRESS_EVERY:
                last_line = time.time()
                say(progress_line(runs, [r for r, _, _ in running.values()], t0))
            time.sleep(0.5)
    except KeyboardInterrupt:
        # each run (a session of its own: Ctrl-C reaches this process only) is asked once to stop
        # after its step, as `envsched train` stops on Ctrl-C
        for _, proc, _ in running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, proc, _ in running.values():
            proc.wait()
        print("interrupted: the same command resumes the sweep", file=sys.stderr, flush=True)
        return 130
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if any(r.result.get("rc") for r in runs):
        return 1
    say(f"all {len(runs)} runs complete in {time.time() - t0:.0f}s")
    return 0


def _stop(signum, frame) -> None:
    """Ctrl-C or `kill` (SIGTERM) while the runs go: stop them after their step, whatever this
    process inherited (a sweep started in the background ignores SIGINT; SIGTERM would end it and
    leave its runs going, each in a session of its own)."""
    raise KeyboardInterrupt


def finished(r: Planned) -> int | None:
    """The steps ``r``'s lake holds when they are as many as the sweep asks for or more and the run
    is not halted, or when the run stopped early as its flags asked (`--eval-patience`): an earlier
    sweep finished it. Else None: the run has to be started."""
    lake = Lake(r.lake)
    done = len(lake.steps("statistics"))
    record = halted(lake)
    if record is not None and record["gate"] == STALL_GATE:
        return done
    return done if done >= r.steps and record is None else None


def start(r: Planned, env: dict) -> subprocess.Popen:
    with open(r.log, "a") as log:  # the child keeps its own handle
        log.write(f"$ envsched --lake {r.lake} {' '.join(r.argv)}\n")
        log.flush()
        return subprocess.Popen(
            [sys.executable, "-m", "envsched_pipeline.cli", "--lake", str(r.lake), *r.argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def ended_line(r: Planned) -> str:
    steps = len(Lake(r.lake).steps("statistics"))
    if r.result["rc"] == 0:
        return f"done {r.name}: {steps} steps in {r.result['seconds']:.0f}s"
    tail = r.log.read_text(errors="replace").strip().splitlines()[-LOG_LINES:]
    return (
        f"failed {r.name} (exit {r.result['rc']}) after {r.result['seconds']:.0f}s at {steps} steps; its log "
        f"{r.log} ends:\n" + "\n".join(f"    {line}" for line in tail)
    )


def progress_line(runs: list[Planned], running: list[Planned], t0: float) -> str:
    now = ", ".join(f"{r.name} step {len(Lake(r.lake).steps('statistics'))}/{r.steps}" for r in running)
    done = sum(1 for r in runs if r.result)
    return f"[{time.time() - t0:.0f}s] running: {now}; ended {done} of {len(runs)}"
