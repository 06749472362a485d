"""Benchmarks -> bench/RESULTS.md (tables) + bench/*.png (plots).

    python bench/run_all.py [--sections schedulers,rho,latency,graph] [--steps 200] [--seeds 3]

Each section of RESULTS.md is written between markers, so one section can be re-run without the
others; the sections live in ``bench/sections/`` (one module per kind: simulated learner, system
measurements, the neural learner's ablation, its learner-setting experiments, headroom and the
oracle, the unseen split, two draws per seed, held-out within a run, pick traces). Every table names the learner its
numbers come from.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sections.avx2 import section_avx2  # noqa: E402
from sections.common import (  # noqa: E402
    DENOMINATOR,
    DUALCLIP,
    NOFORCED,
    OVERRUN,
    RESULTS,
    machine,
    write_section,
)
from sections.draws import section_draws  # noqa: E402
from sections.experiments import learner_experiment, section_cliphigher, section_forced_stop  # noqa: E402
from sections.infcap import section_infcap  # noqa: E402
from sections.lag import section_pipeline_lag, section_select_lag  # noqa: E402
from sections.levers import section_levers  # noqa: E402
from sections.neural import section_neural, section_neural_seeds  # noqa: E402
from sections.oracle import section_headroom, section_oracle  # noqa: E402
from sections.passk import section_neural_passk  # noqa: E402
from sections.peak import section_peak, section_peak_overrun  # noqa: E402
from sections.pipeline import section_pipeline_neural  # noqa: E402
from sections.records import recorded_variants  # noqa: E402
from sections.simulated import (  # noqa: E402
    section_cost,
    section_graph,
    section_priors,
    section_replay,
    section_rho,
    section_schedulers,
    section_sim_sweep,
)
from sections.system import (  # noqa: E402
    section_backends,
    section_event_log,
    section_incremental,
    section_kernels,
    section_lake_bytes,
    section_lake_requests,
    section_latency,
    section_pools,
    section_resident,
    section_resident_neural,
    section_state_keep,
    section_step_views,
)
from sections.traces import section_traces  # noqa: E402
from sections.unseen import section_patterns, section_unseen_split  # noqa: E402
from sections.valslice import section_valslice  # noqa: E402
from sections.within import section_within_run  # noqa: E402

from envsched_pipeline.analysis.bench import blas_kernel  # noqa: E402

__all__ = [
    "machine",
    "write_section",
]  # bench/gpu_step.py and bench/kernel_audit.py write their sections with these


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--sections",
        default="schedulers,rho,cost,priors,replay,graph,pools,backends,latency,incremental,sim_sweep,neural,"
        "select_lag,pipeline_lag,step_views,lake_requests,lake_bytes,event_log,state_keep,pipeline_neural,neural_seeds,neural_denominator,neural_dualclip,neural_overrun,neural_overrun_seeds,neural_headroom,"
        "neural_oracle,neural_unseen_split,neural_patterns,neural_draws,neural_avx2,neural_levers,neural_within_run,neural_valslice,neural_infcap,neural_peak,neural_peak_overrun,kernels,neural_traces,neural_forced_stop,neural_noforced,"
        "neural_noforced_seeds,neural_cliphigher,neural_passk",
    )
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--sizes", default="2550,25000,250000")
    ap.add_argument("--inc-sizes", default="2550,25000")
    ap.add_argument("--neural-seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2, help="parallel neural runs")
    ap.add_argument("--cache", default=str(HERE / ".cache"), help="finished runs (resumable)")
    ap.add_argument(
        "--neural-runs",
        default=str(HERE / "runs" / "neural"),
        help="finished neural runs, one JSON per (scheduler, seed); committed, so more seeds or "
        "schedulers extend the table without re-running the others",
    )
    # recorded-run directories of the neural sections: (flag, directory under bench/runs, what it holds)
    for flag, folder, what in (
        (
            "--neural-batch-runs",
            "neural-batch",
            "recorded neural runs with the whole-batch loss denominator (section neural_denominator)",
        ),
        (
            "--neural-dualclip-runs",
            "neural-dualclip",
            "recorded neural runs with dual_clip=3 (section neural_dualclip)",
        ),
        (
            "--neural-overrun-runs",
            "neural-overrun",
            "recorded neural runs with overrun_penalty=0.1, train_forced_stop=false (section neural_overrun)",
        ),
        (
            "--neural-probe-runs",
            "neural-overrun-probe",
            "recorded overrun-learner runs with pool probes (section neural_headroom)",
        ),
        (
            "--neural-cliphigher-runs",
            "neural-cliphigher",
            "recorded neural runs of the default learner with clip_eps_high=0.28 (section neural_cliphigher)",
        ),
        (
            "--neural-noforced-runs",
            "neural-noforced",
            "recorded neural runs with train_forced_stop=false, the default since 2026-12 (sections "
            "neural_forced_stop, neural_noforced)",
        ),
        (
            "--neural-unseen-runs",
            "neural-noforced-unseen48",
            "default-learner runs with 48 unseen environments, held-out per environment (section "
            "neural_unseen_split)",
        ),
        (
            "--neural-patterns-runs",
            "neural-noforced-pertask",
            "default-learner runs with held-out per task and their traces (section neural_patterns)",
        ),
        (
            "--neural-draws-runs",
            "neural-noforced-draws",
            "default-learner runs of random and the recommended form with --draw 1 (section neural_draws)",
        ),
        (
            "--neural-every5-runs",
            "neural-noforced-every5",
            "default-learner runs of random and the recommended form with --eval-every 5 (section "
            "neural_within_run)",
        ),
        (
            "--neural-avx2-runs",
            "neural-noforced-avx2",
            "default-learner runs of random, the recommended form, its variants and rivals on one "
            "AVX2-only machine, with pick traces (sections neural_avx2, neural_valslice, neural_infcap, neural_peak)",
        ),
        (
            "--neural-overrun-avx2-runs",
            "neural-overrun-avx2",
            "overrun-learner runs of random, the recommended form and its success-peak variant on one "
            "AVX2-only machine (section neural_peak_overrun)",
        ),
        (
            "--neural-passk-runs",
            "neural-noforced-passk",
            "default-learner runs of random, the recommended form and other schedulers re-run with each "
            "held-out task's episodes kept, for pass@k and pass^k (section neural_passk)",
        ),
        (
            "--neural-updates-runs",
            "neural-updates",
            "forced-stop learner runs re-run to record their update statistics (section neural_forced_stop)",
        ),
    ):
        ap.add_argument(flag, default=str(HERE / "runs" / folder), help=what)
    ap.add_argument("--headroom-seeds", type=int, default=2, help="seeds of the headroom section")
    ap.add_argument(
        "--neural-traces",
        default=str(HERE / "runs" / "neural-overrun-traces"),
        help="pick traces of overrun-learner runs (section neural_traces)",
    )
    ap.add_argument(
        "--extra",
        default=None,
        help="extra neural scheduler variants, e.g. envsched@adaptive (run where missing); default: "
        "every variant with a run on record in a section's runs directory (rows from the records only)",
    )
    ap.add_argument(
        "--neural-recorded-only",
        action="store_true",
        help="neural section from the recorded runs only (each row over the seeds it has)",
    )
    args = ap.parse_args()
    sections = args.sections.split(",")
    named = None if args.extra is None else [x for x in args.extra.split(",") if x]

    def extra_for(runs: str) -> list[str]:  # the rows beyond the paper's eight in a section
        return named if named is not None else recorded_variants(runs)

    # the recorded runs were made under OpenBLAS's Haswell kernels (`make bench` asks for them): say
    # which ones this process runs
    print(
        f"run_all: BLAS kernels {blas_kernel()} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')!r})"
    )
    if "schedulers" in sections:
        section_schedulers(args.steps, args.seeds)
    if "rho" in sections:
        section_rho(args.steps, args.seeds)
    if "graph" in sections:
        section_graph()
    if "latency" in sections:
        section_latency([int(x) for x in args.sizes.split(",")])
    if "cost" in sections:
        section_cost(args.steps, args.seeds)
    if "priors" in sections:
        section_priors()
    if "replay" in sections:
        section_replay()
    if "pools" in sections:
        section_pools()
    if "incremental" in sections:
        section_incremental([int(x) for x in args.inc_sizes.split(",")])
    if "resident" in sections:
        section_resident()
    if "resident_neural" in sections:
        section_resident_neural()
    if "pipeline_neural" in sections:
        section_pipeline_neural()
    if "step_views" in sections:
        section_step_views()
    if "lake_requests" in sections:
        section_lake_requests()
    if "lake_bytes" in sections:
        section_lake_bytes()
    if "select_lag" in sections:
        section_select_lag()
    if "pipeline_lag" in sections:  # runs the seeds without a record (about 25 minutes a pair)
        section_pipeline_lag()
    if "event_log" in sections:
        section_event_log()
    if "state_keep" in sections:
        section_state_keep()
    if "backends" in sections:
        section_backends()
    if "sim_sweep" in sections:
        section_sim_sweep(args.steps, args.seeds)
    if "neural" in sections:
        section_neural(
            args.steps,
            args.neural_seeds,
            args.jobs,
            args.neural_runs,
            named,
            recorded_only=args.neural_recorded_only,
            extra_recorded=extra_for(args.neural_runs),
        )
    if "neural_seeds" in sections:
        section_neural_seeds(args.neural_runs, args.neural_seeds, args.steps, extra_for(args.neural_runs))
    if "neural_headroom" in sections:
        section_headroom(
            args.neural_probe_runs,
            args.neural_overrun_runs,
            args.headroom_seeds,
            args.steps,
            args.jobs,
            recorded_only=args.neural_recorded_only,
        )
    if "neural_oracle" in sections:
        section_oracle(
            args.neural_overrun_runs,
            args.steps,
            default_runs=args.neural_noforced_runs,
        )
    if "neural_unseen_split" in sections:
        section_unseen_split(
            args.neural_unseen_runs, args.neural_noforced_runs, args.steps, args.neural_patterns_runs
        )
    if "neural_patterns" in sections:
        section_patterns(args.neural_patterns_runs, args.neural_noforced_runs)
    if "neural_draws" in sections:
        section_draws(args.neural_draws_runs, args.neural_noforced_runs, args.steps)
    if "neural_avx2" in sections:
        section_avx2(args.neural_avx2_runs, args.neural_noforced_runs, args.neural_draws_runs, args.steps)
    if "neural_levers" in sections:
        section_levers(
            args.neural_noforced_runs,
            args.neural_draws_runs,
            args.neural_avx2_runs,
            args.neural_overrun_runs,
            args.steps,
        )
    if "neural_within_run" in sections:
        section_within_run(
            args.neural_every5_runs, args.neural_noforced_runs, args.neural_draws_runs, args.steps
        )
    if "neural_valslice" in sections:
        section_valslice(args.neural_avx2_runs, args.neural_noforced_runs, args.steps)
    if "neural_infcap" in sections:
        section_infcap(args.neural_avx2_runs, args.neural_noforced_runs, args.steps)
    if "neural_peak" in sections:
        section_peak(args.neural_avx2_runs, args.neural_noforced_runs, args.neural_draws_runs, args.steps)
    if "neural_peak_overrun" in sections:
        section_peak_overrun(args.neural_overrun_avx2_runs, args.neural_overrun_runs, args.steps)
    if "kernels" in sections:
        section_kernels()
    if "neural_forced_stop" in sections:
        section_forced_stop(args.neural_noforced_runs, args.neural_runs, args.neural_updates_runs, args.steps)
    if "neural_traces" in sections:
        section_traces(
            args.neural_traces,
            args.neural_overrun_runs,
            args.steps,
            args.jobs,
            recorded_only=args.neural_recorded_only,
        )
    for exp, runs in (
        (DENOMINATOR, args.neural_batch_runs),
        (DUALCLIP, args.neural_dualclip_runs),
        (OVERRUN, args.neural_overrun_runs),
        (NOFORCED, args.neural_noforced_runs),
    ):
        if exp.section in sections:
            learner_experiment(
                exp,
                runs=runs,
                baseline_runs=args.neural_runs,
                seeds=args.neural_seeds,
                steps=args.steps,
                extra=extra_for(runs),
            )
        if f"{exp.section}_seeds" in sections:
            section_neural_seeds(runs, args.neural_seeds, args.steps, extra_for(runs), exp=exp)
    if "neural_cliphigher" in sections:
        section_cliphigher(
            args.neural_cliphigher_runs, args.neural_noforced_runs, args.neural_seeds, args.steps
        )
    if "neural_passk" in sections:
        section_neural_passk(args.neural_passk_runs, args.neural_noforced_runs, args.steps)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
