"""Where the spread of a paired held-out difference over seeds comes from, environment by environment.

A bench run records its held-out per environment (``evals[*]["unseen_by_env"]``). For two schedulers
run at the same seeds, ``d[s, e]`` is the second's held-out minus the first's on environment ``e`` in
seed ``s``. The held-out set's environments come in domains (the unseen family has 12; a larger split
repeats each domain with other rules, ids and difficulty), and the difference is modelled as

    d[s, e] = mu + b[e] + a[s] + c[s, domain(e)] + eps[s, e]

``b``: what the scheduler does for environment ``e`` at every seed (part of the effect, not noise);
``a``: the run's share common to every environment of the seed; ``c``: the seed's share common to
one domain's environments; ``eps``: the rest (the evaluation's own sampling among it). The mean
difference over ``D`` domains x ``V`` environments each then varies over seeds with

    sd(D, V) = sqrt(var_a + var_c / D + var_eps / (D V))

so a larger held-out set shrinks only the last two terms: how much that buys depends on how large
``var_a`` is. Estimates are the balanced design's mean squares (method of moments), clipped at 0.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


def paired_components(d: np.ndarray, domains: list[str]) -> dict:
    """``d``: (seeds, environments) paired differences; ``domains``: each environment's domain
    (every domain with the same number of environments). Returns the three variances, the degrees
    of freedom behind each, the design's shape and the observed sd over seeds of the mean difference
    over all environments."""
    d = np.asarray(d, dtype=float)
    n_seeds, n_envs = d.shape
    if n_seeds < 2:
        raise ValueError(f"need at least 2 seeds (got {n_seeds})")
    if len(domains) != n_envs:
        raise ValueError(f"{len(domains)} domains for {n_envs} environments")
    names = sorted(set(domains))
    members = [[j for j, x in enumerate(domains) if x == n] for n in names]
    per = {len(m) for m in members}
    if len(per) != 1:
        raise ValueError(f"every domain needs as many environments (got {sorted(per)})")
    n_dom, n_var = len(names), per.pop()
    r = d - d.mean(axis=0, keepdims=True)  # the environments' own effects (b) removed
    by_dom = np.stack([r[:, m].mean(axis=1) for m in members], axis=1)  # (seeds, domains)
    seed_mean = r.mean(axis=1)
    var_eps = 0.0
    if n_var > 1:
        within = np.concatenate([r[:, m] - by_dom[:, [k]] for k, m in enumerate(members)], axis=1)
        var_eps = float((within**2).sum() / ((n_seeds - 1) * n_dom * (n_var - 1)))
    u = by_dom - seed_mean[:, None]
    ms_dom = float((u**2).sum() / ((n_seeds - 1) * (n_dom - 1))) if n_dom > 1 else 0.0
    var_c = max(ms_dom - var_eps / n_var, 0.0) if n_var > 1 else ms_dom  # with V = 1, c and eps are one
    ms_seed = float(np.var(seed_mean, ddof=1))
    var_a = max(ms_seed - ms_dom / n_dom, 0.0)
    return {
        "seeds": n_seeds,
        "domains": n_dom,
        "per_domain": n_var,
        "var_seed": var_a,
        "var_seed_domain": var_c,
        "var_within_domain": var_eps,
        "df": {
            "seed": n_seeds - 1,
            "seed_domain": (n_seeds - 1) * (n_dom - 1),
            "within_domain": (n_seeds - 1) * n_dom * (n_var - 1),
        },
        "observed_sd": float(np.std(d.mean(axis=1), ddof=1)),
        "mean": float(d.mean()),
    }


def predicted_sd(components: dict, domains: int, per_domain: int) -> float:
    """The sd over seeds of the mean paired difference over ``domains`` x ``per_domain``
    environments, by the fitted components."""
    c = components
    return math.sqrt(
        c["var_seed"] + c["var_seed_domain"] / domains + c["var_within_domain"] / (domains * per_domain)
    )


def two_draws(first: np.ndarray, second: np.ndarray) -> dict:
    """Two runs of one scheduler at the same seeds that differ only in their draw (their random
    stream): ``first[s]`` and ``second[s]`` are each run's paired difference against the baseline at
    seed ``s`` on the same held-out set. Modelled as ``d_k[s] = mu + g[s] + e_k[s]``: ``g`` the seed's
    share (which environments it holds out, its pool and warm start, common to both draws) and ``e``
    the run's own. Then ``var(e) = var(d_1 - d_2) / 2`` and ``var(g) = cov(d_1, d_2)``, each estimated
    without the per-environment records the fit above needs."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"two draws need one difference per seed each (got shapes {a.shape} and {b.shape})")
    if len(a) < 3:
        raise ValueError(f"need at least 3 seeds (got {len(a)})")
    total = (np.var(a, ddof=1) + np.var(b, ddof=1)) / 2
    run = float(np.var(a - b, ddof=1) / 2)
    seed = max(float(np.cov(a, b)[0, 1]), 0.0)
    return {
        "seeds": len(a),
        "sd": math.sqrt(total),
        "run_sd": math.sqrt(run),
        "seed_sd": math.sqrt(seed),
        "run_share": run / total if total > 0 else float("nan"),
        "correlation": float(np.corrcoef(a, b)[0, 1]),
        "positive": (int((a > 0).sum()), int((b > 0).sum())),
        "both_positive": int(((a > 0) & (b > 0)).sum()),
        "mean": (float(a.mean()), float(b.mean())),
    }


def several_draws(diffs) -> dict:
    """:func:`two_draws` for any number of runs of each seed: ``diffs[s][k]`` is run ``k``'s paired
    difference at seed ``s`` (every seed with the same runs, at least two). The same model, fitted
    as a one-way random-effects split: the run's variance is the mean variance of a seed's runs
    around their mean, the seed's is the variance of the seed means less the run's share of it
    (``var(e) / k``; 0 when that is negative). ``seed_means``: each seed's mean over its runs."""
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2 or d.shape[1] < 2:
        raise ValueError(f"several draws need one row per seed with two runs or more (got shape {d.shape})")
    if d.shape[0] < 3:
        raise ValueError(f"need at least 3 seeds (got {d.shape[0]})")
    k = d.shape[1]
    means = d.mean(axis=1)
    run = float(np.mean(np.var(d, axis=1, ddof=1)))
    seed = max(float(np.var(means, ddof=1)) - run / k, 0.0)
    return {
        "seeds": d.shape[0],
        "runs": k,
        "sd": math.sqrt(run + seed),
        "run_sd": math.sqrt(run),
        "seed_sd": math.sqrt(seed),
        "run_share": run / (run + seed) if run + seed > 0 else float("nan"),
        "mean": float(d.mean()),
        "seed_means": [float(m) for m in means],
        "positive_runs": int((d > 0).sum()),
        "positive_seed_means": int((means > 0).sum()),
    }


def every_seed_needs(sd: float, seeds: int = 10, chance: float = 0.9) -> float:
    """The mean paired effect at which all ``seeds`` seeds come out above the baseline with
    probability ``chance``, each seed's difference drawn from a normal with this ``sd``."""
    return sd * NormalDist().inv_cdf(chance ** (1 / seeds))


def every_seed_chance(mean: float, sd: float, seeds: int = 10) -> float:
    """The probability that all ``seeds`` seeds come out above the baseline, each seed's difference
    drawn from a normal with this ``mean`` and ``sd`` (a step at 0 when ``sd`` is 0)."""
    if sd <= 0:
        return float(mean > 0)
    return (0.5 * (1 + math.erf(mean / (sd * math.sqrt(2))))) ** seeds


def within_run(steps, values, since: int = 100, window: int = 20) -> dict:
    """How a held-out series (or a paired difference of two) moves inside one run, measured at
    ``steps`` (every few steps) from step ``since`` on. ``jitter_sd``: the fast part, which averaging
    a few nearby checkpoints would remove: each point's distance from a quadratic fitted to its
    neighbours within ``window`` steps (itself left out), scaled by that prediction's own error so
    that for independent noise it estimates the noise's sd. ``swing_sd``: the sd of the points
    around a straight line over the span: fast and slow parts together."""
    st, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if st.shape != y.shape or st.ndim != 1:
        raise ValueError(f"steps and values must be one series each (got shapes {st.shape} and {y.shape})")
    late = st >= since
    if late.sum() < 8:
        raise ValueError(f"need at least 8 points from step {since} on (got {int(late.sum())})")
    scaled = []
    for i in np.flatnonzero(late):
        near = (np.abs(st - st[i]) <= window) & (np.arange(len(st)) != i)
        if near.sum() < 4:
            raise ValueError(f"too few points within {window} steps of step {int(st[i])}")
        x = np.vander((st[near] - st[i]) / window, 3)  # centred on the point: its prediction is the intercept
        coef, *_ = np.linalg.lstsq(x, y[near], rcond=None)
        leverage = np.linalg.inv(x.T @ x)[2, 2]
        scaled.append((y[i] - coef[2]) / np.sqrt(1 + leverage))
    s, v = st[late], y[late]
    return {
        "points": int(late.sum()),
        "jitter_sd": float(np.std(scaled, ddof=1)),
        "swing_sd": float(np.std(v - np.polyval(np.polyfit(s, v, 1), s), ddof=1)),
        "low": float(v.min()),
        "high": float(v.max()),
        "positive": int((v > 0).sum()),
        "final": float(y[-1]),
        "late_mean": float(y[st >= st.max() - 50].mean()),
    }
