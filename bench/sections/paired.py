"""Experiments run on one machine beside the recommended form re-run there (the AVX-512 records of
the main tables do not repeat on every CPU), paired seed by seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envsched_pipeline.analysis.bench import run_benchmark
from sections.common import BESIDE_ORACLE
from sections.records import mean_se_wins, recorded_kw, recorded_seeds, t_half

KINDS = ("seen", "unseen")


@dataclass
class Paired:
    """A variant and the form, both recorded in one folder, at the seeds both have."""

    form: str
    variant: str
    seeds: list[int]
    per: dict  # run_benchmark's per_seed: scheduler -> seed -> summary
    provenance: dict
    repeats: list[int]  # seeds where the form's re-run ends where its record does
    delta: dict  # kind -> [variant - form final held-out, per seed]
    random: dict  # seed -> random's record there (made on the records' machines), where it has one
    random_here: dict  # seed -> random re-run on this machine (in the same folder), where it was

    def heldout_cells(self, seed: int) -> list[str]:
        """form, variant and their difference, seen then unseen (final held-out)."""
        a, b = self.per[self.form][seed], self.per[self.variant][seed]
        cells = []
        for k in KINDS:
            x, y = a[f"heldout_{k}_final"], b[f"heldout_{k}_final"]
            cells += [f"{x:.4f}", f"{y:.4f}", f"{y - x:+.4f}"]
        return cells

    def over_random(self, name: str, kind: str, here: bool = False) -> str:
        """``name``'s final held-out of ``kind`` against random's records (``here``: against random
        re-run on this machine), mean ± s.e. (wins)."""
        base = self.random_here if here else self.random
        seeds = [s for s in self.seeds if s in base]
        d = [self.per[name][s][f"heldout_{kind}_final"] - base[s][f"heldout_{kind}_final"] for s in seeds]
        return mean_se_wins(d) if len(d) > 1 else "—"

    @property
    def random_at_every_seed(self) -> bool:
        """Whether random was re-run on this machine at every seed of the pair."""
        return all(s in self.random_here for s in self.seeds)

    def beside_random_here(
        self, label: str, section: str | None = "The top rows re-run on a CPU without AVX-512"
    ) -> str:
        """The form and the variant (``label``) against random re-run on this machine, a sentence
        naming the RESULTS ``section`` those runs of random come from (None: none to name); empty
        unless random was re-run at every seed of the pair."""
        if not self.random_at_every_seed:
            return ""
        where = f' (section "{section}")' if section else ""
        return (
            f"Against random re-run on this machine{where}: the form "
            f"{self.over_random(self.form, 'seen', here=True)} seen, "
            f"{self.over_random(self.form, 'unseen', here=True)} unseen; {label} "
            f"{self.over_random(self.variant, 'seen', here=True)} seen, "
            f"{self.over_random(self.variant, 'unseen', here=True)} unseen. "
        )

    def ratio(self, metric: str) -> float:
        """The variant's ``metric`` over the form's, averaged over seeds."""
        return float(
            np.mean([self.per[self.variant][s][metric] / self.per[self.form][s][metric] for s in self.seeds])
        )

    def verdict(self) -> str:
        """Kept only if ahead of the form on both kinds beyond the 95% t interval over seeds."""
        ahead = all(np.mean(d) - t_half(d) > 0 for d in (self.delta[k] for k in KINDS))
        return "kept" if ahead else "not kept"

    def summary(self, what: str) -> str:
        """'<what> against the form, mean ± s.e. over seeds (...): seen ..., unseen ...'."""
        return (
            f"{what} against the form, mean ± s.e. over seeds (seeds where it is ahead): seen "
            f"{mean_se_wins(self.delta['seen'])}, unseen {mean_se_wins(self.delta['unseen'])}"
        )

    def machine_sentence(self, folder: str) -> str:
        """Why the pair was run on one machine and where its runs are."""
        return (
            "The main tables' records were made on CPUs with AVX-512; this experiment ran where the "
            f"form's records do not repeat (at {len(self.repeats)} of its {len(self.seeds)} seeds the form "
            "re-run here ends where its record does), so both rows were run on one machine at seeds "
            f"{', '.join(map(str, self.seeds))} and are paired here, not against the records "
            f"(`bench/runs/{folder}/`). Final held-out (step 200)."
        )


def paired_with_form(
    runs: str, base_runs: str, variant: str, steps: int, learner_config: dict | None = None
) -> Paired | None:
    """``variant`` and the recommended form, both recorded in ``runs``, at the seeds both have (None
    when they share none); ``base_runs``: the form's own records, to say whether this machine
    repeats them; ``learner_config``: the learner setting the runs were made under (default: the
    default learner)."""
    form = BESIDE_ORACLE[-1]
    seeds = sorted(set(recorded_seeds(runs, form)) & set(recorded_seeds(runs, variant)))
    if not seeds:
        return None
    kw = recorded_kw(seeds, steps, learner_config)
    out = run_benchmark([form, variant], cache_dir=runs, **kw)
    per = out["per_seed"]
    here = run_benchmark(["random"], cache_dir=runs, **kw)["per_seed"].get("random", {})
    base = run_benchmark([form, "random"], cache_dir=base_runs, **kw)["per_seed"]
    rnd = {s: r for s, r in base.get("random", {}).items() if s in seeds}
    base = base.get(form, {})
    repeats = [
        s
        for s in seeds
        if s in base and base[s]["heldout_unseen_final"] == per[form][s]["heldout_unseen_final"]
    ]
    delta = {
        k: [per[variant][s][f"heldout_{k}_final"] - per[form][s][f"heldout_{k}_final"] for s in seeds]
        for k in KINDS
    }
    return Paired(form, variant, seeds, per, out["provenance"], repeats, delta, rnd, here)
