"""One config dataclass for the scheduler, with the paper's defaults.

Fields marked (paper) are the EnvSched paper's constants; (ours) are our reconstruction, each a
named field so the benchmark can compare alternatives. The config is serialized into every
manifest (``config_hash``) so a selection says exactly what produced it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace

from envsched_pipeline.settings import BIG, check_settings

EXPLOIT_SAMPLING = ("greedy", "proportional")
TARGETS = ("variance", "success", "success-sampled")
COVERAGE_PICKS = ("fewest", "score", "sampled")
ENV_PRIORS = ("decayed", "task")
SPREAD_MODELS = ("none", "logistic", "boosted")
SPREAD_FEATURES = ("base", "streak")


@dataclass(frozen=True)
class SchedulerConfig:
    batch_size: int = 64  # B tasks per step (paper)
    group_size: int = 8  # G rollouts per task (paper)
    rho: float = 0.5  # coverage share of the batch (paper)
    h_long: float = 8.0  # half-life of own history, steps (paper)
    h_short: float = 2.0  # half-life of the short s2 EMA (paper)
    lambda_g: float = 2.0  # shrinkage of the neighbour mean towards the environment (paper)
    lambda_s: float = 2.0  # shrinkage of own history towards the prior (paper)
    k_within: int = 6  # within-environment neighbours (paper)
    k_cross: int = 12  # cross-environment neighbours (paper)
    c0: float = 16.0  # exposure discount constant (paper)
    eta: float = 0.5  # recent-decline guard strength (paper)
    lambda_sim: float = 0.08  # MMR similarity penalty (paper)
    cap_env_step: int = 4  # C1: tasks per environment per step (paper)
    cap_env_window: int = 11  # C3: tasks per environment over steps t-2..t (paper)
    consecutive_cap: int = 2  # a task picked at t-1 and t-2 is ineligible at t (paper); 0 turns it off
    # ---- (ours)
    dispersion_bonus: float = 0.5  # u = s2_hat + bonus * d_hat * recent realized s2
    # what u measures: "variance" (the paper: predicted reward variance, above); "success": the
    # pass/fail variance of the predicted mean, u = d_hat * 4 m_hat (1 - m_hat) (under std-normalized
    # advantages every group with spread weighs the same, so how much variance matters less than
    # whether there is spread and how much of the task is left to learn); "success-sampled": the
    # same with m drawn from a Beta posterior around m_hat (Thompson sampling, as MoPPS does)
    target: str = "variance"
    # success targets only: u = d_hat * (floor + 4 m_hat (1 - m_hat)) / (1 + floor); above 0, a group
    # with spread is worth something however near solved its task is (0: the pass/fail variance alone;
    # large: the chance of spread alone)
    success_floor: float = 0.0
    # success targets only: u = (spread_floor + (1 - spread_floor) d_hat) * (the above); 0: the chance
    # of spread weighs fully; 1: the success rate alone ranks tasks, spread or not (as MoPPS does: a
    # task stuck at partial credit with no spread yet is still at the frontier)
    spread_floor: float = 0.0
    # success targets only: the chance of spread enters as d_hat ** spread_power; above 1, a task
    # whose recent groups mostly had no spread falls further behind one that keeps showing spread
    # (late in a run most of the pool is solved and the success rate alone ranks the many nearly
    # solved tasks; variant envsched@success+adaptive+covscore+spread2)
    spread_power: float = 1.0
    # success targets only: the success rate at which the pass/fail term peaks, w(m) = (m / c)^(2c)
    # ((1 - m) / (1 - c))^(2 (1 - c)), c = success_peak; 0.5 is 4 m (1 - m). Below 0.5 the nearly
    # solved tasks weigh less: on the default learner the groups a schedule spends without spread are
    # almost all solved ones (the recommended form: 0.28 of its groups all solved, 0.002 all failed),
    # and the zero-variance share is what its held-out gain goes with (bench/RESULTS.md, "What in a
    # schedule goes with its held-out gain")
    success_peak: float = 0.5
    calibrate: bool = True  # isotonic calibration of u on realized s2
    calib_window: int = 8  # steps of pairs used for calibration and the recent mean
    retire_window: int = 3  # groups all solved / all failed in a row before retirement
    retire_on: str = "mean"  # mean: all solved / all failed | dispersion: all zero-variance groups
    retire_solved: float = 0.999
    retire_failed: float = 0.001
    return_prob: float = 0.1  # chance per step that a retired task becomes eligible again
    return_rule: str = "any-neighbour"  # a retired task returns when any observed neighbour's predicted
    # variance exceeds the recent mean | "neighbour-mean": when its neighbours' weighted mean variance does
    hack_retire: float = 0.5  # retire a task whose decayed hack rate exceeds this
    cold_mean: float = 0.5
    cold_var: float = 0.03
    cold_dispersion: float = 0.5
    exposure_unit: str = "groups"  # n_i in the exposure discount counts groups | rollouts (bench: groups 1.54x vs rollouts 1.22x random)
    quarantine_rate: float = 0.5  # infra-error share (decayed) that quarantines an environment
    quarantine_min_rollouts: float = 8.0  # ... once at least this many (decayed) rollouts were spent
    quarantine_steps: int = 3  # steps a quarantined environment is skipped before it is probed again
    infra_half_life: float = 2.0  # half-life (steps) of the environment infra-error rate
    cost_aware: bool = False  # opt-in: score per unit of predicted rollout cost (seconds)
    cost_floor: float = 0.25  # a slow task keeps at least this share of its score (no starvation)
    adaptive_rho: bool = (
        False  # shrink the coverage share when the coverage half yields less than the exploit half
    )
    rho_min: float = 0.125  # ... never below this share
    # above 0: the coverage half takes one task from each environment not picked in the last
    # stale_after steps (the stalest first), at most rho B (or the adaptive share); the rest of the
    # batch goes to exploitation. 0: the coverage half always takes rho B (paper)
    stale_after: int = 0
    # which task the coverage half takes from each environment it visits: "fewest" = the fewest rollouts
    # spent (ties: higher score, then random; paper); "score" = the highest score (ties random), so the
    # half still spreads the batch over the least recently served environments but never spends a slot
    # on a task its prediction calls solved or hopeless; "sampled" = drawn in proportion to the score
    # (uniform where every score is 0): likely-informative tasks, but a different one each visit, so
    # the run keeps seeing more distinct tasks
    coverage_pick: str = "fewest"
    use_graph: bool = True  # graph prior (False: environment prior only)
    use_env_prior: bool = True
    # exploitation half: "greedy" takes the highest score - similarity penalty (paper); "proportional"
    # draws each pick with probability proportional to that value (clipped at 0), so the half spreads
    # over many likely-informative tasks instead of always the top ones
    exploit_sampling: str = "greedy"
    # "proportional" only: draw in proportion to value ** exploit_power (below 1 flattens the draw
    # towards uniform over the eligible tasks with a positive value, above 1 sharpens it towards greedy)
    exploit_power: float = 1.0
    # an observed task's own history never weighs less than this many groups: its decayed sums are
    # scaled up to that weight, keeping their means (0: plain decay, paper). With an 8-step half-life
    # a task last seen 20 steps ago keeps 0.18 of a group, and its prediction is the prior's
    own_floor: float = 0.0
    # the environment prior: "decayed" = the environment's decayed sums over its decayed weight, so
    # the tasks the scheduler picked recently and often dominate it (paper); "task" = the mean of its
    # observed tasks' own estimates, each task once, so the prior is not pulled towards what the
    # scheduler chose to pick (late in a run it picks tasks with spread, and the decayed prior then
    # credits every forgotten task of the environment with their chance of spread)
    env_prior: str = "decayed"
    # the chance of spread d_hat: "none" = the shrunk decayed estimate above (paper); "logistic" = a
    # logistic regression fitted every step on the run's own history of picks (features the state
    # had when each was picked: first look or not, the last group's spread and mean, steps since,
    # groups so far, the shrunk estimates and their prior; label: the group had spread), which then
    # predicts every task's chance at the coming step. The decayed estimate forgets a task within a
    # few half-lives, and an all-solved group and a group stuck at one partial credit look alike to
    # it; the fitted model learns from the run how much each still says (docs/algorithm.md §4);
    # "boosted": gradient-boosted trees on the same rows and features instead of the straight line
    spread_model: str = "none"
    spread_model_rows: int = 4096  # "logistic"/"boosted": the most recent picks it is fitted on
    spread_model_min_rows: int = 256  # ... and the fewest (before: the decayed estimate)
    # "logistic" / "boosted": what the model sees of each task. "base": the 11 columns of
    # docs/algorithm.md §4; "streak": those and 4 more from the task's last three groups: how many of
    # them in a row had no spread, how many in a row sat at the last one's mean, and those two counts
    # times log steps since the last (a task stuck at one partial credit tends to stay stuck while it
    # is picked again and again, and to come unstuck when left alone while the policy moves on)
    spread_features: str = "base"
    # above 0 (bench only, the neural learner): every that many steps the bench evaluates the policy
    # on a validation slice (environments of the unseen family that neither the pool nor the held-out
    # split contains) and hands the score to the scheduler (state.extra["validation"]). With
    # adaptive_rho, the coverage share falls back to rho while the validation score has stopped
    # rising (the mean of its last validation_window scores not above the mean of the window before):
    # the exploitation half keeps its slots only while training still generalizes (issue 17's
    # "held-out progress on a small validation slice"; docs/algorithm.md §6)
    validation_every: int = 0
    validation_window: int = 3
    # above 0: a useful-breadth quota, C3 counted over informative groups instead of picks (issue 17's
    # "quotas counted over informative groups"). An environment's groups with spread at steps t-1 and
    # t-2, plus this step's picks in it counted by their predicted chance of spread, may not reach
    # informative_cap x the fair share (the informative groups of those steps per step, x 3, over the
    # pool's environments). The pick quotas spread picks, not signal: late in a recorded run of the
    # recommended form one environment held about 9 of a window's informative groups against a fair
    # share of about 2. Relaxed together with C3 (docs/algorithm.md §6)
    informative_cap: float = 0.0

    def __post_init__(self):
        check_settings(self, "scheduler_config.", BOUNDS, CHOICES)

    def to_dict(self) -> dict:
        return asdict(self)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def with_overrides(self, **kw) -> SchedulerConfig:
        known = {f.name for f in fields(self)}
        bad = sorted(set(kw) - known)
        if bad:
            raise ValueError(f"scheduler_config: unknown scheduler config field(s): {', '.join(bad)}")
        return replace(self, **kw)

    @classmethod
    def from_dict(cls, d: dict) -> SchedulerConfig:
        return cls().with_overrides(**{k: v for k, v in (d or {}).items()})


CHOICES = {
    "exploit_sampling": EXPLOIT_SAMPLING,
    "target": TARGETS,
    "coverage_pick": COVERAGE_PICKS,
    "env_prior": ENV_PRIORS,
    "spread_model": SPREAD_MODELS,
    "spread_features": SPREAD_FEATURES,
    "retire_on": ("mean", "dispersion"),
    "return_rule": ("any-neighbour", "neighbour-mean"),
    "exposure_unit": ("groups", "rollouts"),
}
# every numeric field: (lower bound, is the lower bound allowed, upper bound). Thresholds that a
# value past the rate's range turns off (retire_failed -1: never retire as failed) reach beyond [0, 1]
BOUNDS = {
    "batch_size": (1, True, BIG),
    "group_size": (2, True, BIG),
    "rho": (0, True, 1),
    "h_long": (0, False, BIG),
    "h_short": (0, False, BIG),
    "lambda_g": (0, True, BIG),
    "lambda_s": (0, True, BIG),
    "k_within": (0, True, 1000),
    "k_cross": (0, True, 1000),
    "c0": (0, False, BIG),
    "eta": (0, True, 1),
    "lambda_sim": (0, True, 100),
    "cap_env_step": (1, True, BIG),
    "cap_env_window": (1, True, BIG),
    "consecutive_cap": (0, True, 1000),
    "dispersion_bonus": (0, True, 100),
    "success_floor": (0, True, 100),
    "spread_floor": (0, True, 1),
    "spread_power": (0, False, 16),
    "success_peak": (0, False, 0.99),
    "calib_window": (1, True, BIG),
    "retire_window": (1, True, 1000),
    "retire_solved": (-1, True, 2),
    "retire_failed": (-1, True, 2),
    "return_prob": (0, True, 1),
    "hack_retire": (0, True, 2),
    "cold_mean": (0, True, 1),
    "cold_var": (0, True, 1),
    "cold_dispersion": (0, True, 1),
    "quarantine_rate": (0, True, 2),
    "quarantine_min_rollouts": (0, True, BIG),
    "quarantine_steps": (0, True, BIG),
    "infra_half_life": (0, False, BIG),
    "cost_floor": (0, True, 1),
    "rho_min": (0, True, 1),
    "stale_after": (0, True, 1000),
    "exploit_power": (0, False, 16),
    "own_floor": (0, True, 100),
    "spread_model_rows": (1, True, BIG),
    "spread_model_min_rows": (2, True, BIG),
    "validation_every": (0, True, BIG),
    "validation_window": (1, True, 1000),
    "informative_cap": (0, True, 100),
}
