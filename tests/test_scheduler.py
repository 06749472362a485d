"""EnvSched mechanisms against hand-computed values, and properties that must always hold."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.hack import flag_trajectory, is_identifier, replay
from envsched_pipeline.scheduler import SCHEDULERS, make_scheduler
from envsched_pipeline.scheduler.config import SchedulerConfig
from envsched_pipeline.scheduler.constraints import BatchConstraints
from envsched_pipeline.scheduler.envsched import EnvSched, _pass_fail_variance, _pass_fail_weight
from envsched_pipeline.scheduler.graph import TaskGraph
from envsched_pipeline.scheduler.state import Observations, SchedulerState, align_state
from envsched_pipeline.scheduler.update import update_state


def make_state(n_envs=3, per_env=4):
    ids = [f"e{e}-t{j}" for e in range(n_envs) for j in range(per_env)]
    envs = [f"e{e}" for e in range(n_envs) for _ in range(per_env)]
    return SchedulerState.new(ids, envs)


def observe(state, step, groups: dict[int, list[float]], config=SchedulerConfig(), pred=None):
    idx = list(groups)
    obs = Observations.from_groups(step, idx, [np.array(groups[i]) for i in idx])
    return update_state(state, obs, config, predicted_u=pred)


def empty_graph(n):
    return TaskGraph(
        np.array([str(i) for i in range(n)]),
        np.full((n, 0), -1),
        np.zeros((n, 0), np.float32),
        np.full((n, 0), -1),
        np.zeros((n, 0), np.float32),
    )


# ---------------------------------------------------------------------------- §2 decay
def test_decayed_own_history_half_life():
    cfg = SchedulerConfig(h_long=8.0)
    st_ = make_state()
    observe(st_, 0, {0: [0.0, 1.0]}, cfg)  # s2 = 0.25, m = 0.5, d = 1
    observe(st_, 8, {1: [1.0, 1.0]}, cfg)  # 8 steps later: task 0's weight halves
    a = st_.arrays
    assert a["W"][0] == pytest.approx(0.5)
    assert a["Xs2"][0] / a["W"][0] == pytest.approx(0.25)  # own mean unchanged by decay
    observe(st_, 9, {0: [1.0, 1.0]}, cfg)  # s2 = 0
    g = 2 ** (-1 / 8)
    w_old = 0.5 * g
    assert a["Xs2"][0] / a["W"][0] == pytest.approx(0.25 * w_old / (w_old + 1.0))


# ---------------------------------------------------------------------------- §4 prior + blend
def test_prior_and_blend_hand_computed():
    cfg = SchedulerConfig(k_within=6, k_cross=12, lambda_g=2.0, lambda_s=2.0)
    st_ = make_state(n_envs=2, per_env=2)  # tasks 0,1 in e0; 2,3 in e1
    n = 4
    # task 0's within neighbour is task 1 (sim 0.5); its cross neighbour is task 2 (sim 1.0)
    wi = np.array([[1], [0], [3], [2]])
    ws = np.array([[0.5], [0.5], [0.5], [0.5]], np.float32)
    xi = np.array([[2], [3], [0], [1]])
    xs = np.array([[1.0], [1.0], [1.0], [1.0]], np.float32)
    g = TaskGraph(np.array(["a", "b", "c", "d"]), wi, ws, xi, xs)
    observe(st_, 0, {1: [0.0, 1.0], 2: [0.0, 0.0, 1.0, 1.0]}, cfg)  # s2: task1 .25, task2 .25
    observe(st_, 1, {3: [1.0, 1.0]}, cfg)  # task 3: s2 = 0
    sched = EnvSched(cfg, g)
    p = sched.predict(st_)
    gam = 2 ** (-1 / 8)
    W1 = W2 = gam  # observed at step 0, decayed once
    w_w = 0.5 * W1 / (W1 + 1)
    w_x = 1.0 * W2 / (W2 + 1)
    x_nb = (0.25 + 0.25) / 2  # mean of the within and cross neighbour means
    x_env = 0.25  # e0's only observed task is task 1
    prior = ((w_w + w_x) * x_nb + 2.0 * x_env) / (w_w + w_x + 2.0)
    assert p["prior_s2"][0] == pytest.approx(prior)
    assert p["hat_s2"][0] == pytest.approx(prior)  # never tried: pure prior
    # an observed task blends own history with its prior
    own3 = 0.0
    assert p["hat_s2"][3] == pytest.approx((1.0 * own3 + 2.0 * p["prior_s2"][3]) / (1.0 + 2.0))
    assert n == st_.n_tasks


def test_cold_prior_without_any_history():
    st_ = make_state()
    p = EnvSched(SchedulerConfig()).predict(st_)
    assert np.allclose(p["hat_s2"], SchedulerConfig().cold_var)
    assert np.allclose(p["hat_m"], 0.5)


# ---------------------------------------------------------------------------- §5 calibration
def test_calibration_is_monotone_in_u():
    st_ = make_state(n_envs=4, per_env=10)
    rng = np.random.default_rng(0)
    for t in range(4):
        idx = rng.choice(40, 12, replace=False)
        groups = {
            int(i): list(rng.choice([0.0, 0.5, 1.0], size=8, p=[0.2 + 0.01 * i, 0.3, 0.5 - 0.01 * i]))
            for i in idx
        }
        pred = rng.random(len(idx))
        observe(st_, t, groups, pred=pred)
    sched = EnvSched(SchedulerConfig())
    pred = sched.predict(st_)
    inf = sched.informativeness(st_, pred)
    assert bool(inf["is_calibrated"][0])
    order = np.argsort(inf["u"])
    assert np.all(np.diff(inf["calibrated"][order]) >= -1e-12)


def test_exposure_discount_and_decline_guard():
    cfg = SchedulerConfig(c0=16.0, eta=0.5, exposure_unit="groups")
    st_ = make_state()
    observe(st_, 0, {0: [0.0, 1.0] * 4, 1: [0.0, 1.0] * 4}, cfg)
    observe(st_, 1, {1: [1.0] * 8}, cfg)  # task 1's variance just collapsed
    sched = EnvSched(cfg)
    inf = sched.informativeness(st_, sched.predict(st_))
    assert inf["exposure"][0] == pytest.approx(16 / 17)
    assert inf["exposure"][1] == pytest.approx(16 / 18)
    assert inf["decline"][0] == pytest.approx(1.0)
    assert inf["decline"][1] < 1.0


# ---------------------------------------------------------------------------- §6 constraints
def test_relaxation_order_when_one_env_cannot_fill_the_batch():
    cfg = SchedulerConfig(batch_size=8, cap_env_step=4, cap_env_window=11)
    st_ = make_state(n_envs=1, per_env=10)
    observe(st_, 0, {i: [0.0, 1.0] for i in range(10)}, cfg)
    sched = EnvSched(cfg)
    sel = sched.select(st_, 8, np.random.default_rng(0), 1)
    picks = sel.picks
    assert len(picks) == 8 and len({p.task_id for p in picks}) == 8
    # C1 = 4 per env per step forces relaxation; the order is fixed
    assert sel.relaxations == ["consecutive cap", "C3 window cap", "C1 per-step cap"]


def test_task_picked_at_two_previous_steps_is_ineligible():
    cfg = SchedulerConfig()
    st_ = make_state(n_envs=2, per_env=5)
    observe(st_, 0, {0: [0.0, 1.0], 5: [0.0, 1.0]}, cfg)
    observe(st_, 1, {0: [0.0, 1.0], 6: [0.0, 1.0]}, cfg)
    cons = BatchConstraints(st_, cfg, step=2)
    ok = cons.eligible()
    assert not ok[0] and ok[5] and ok[6]
    # consecutive_cap = 0 turns the rule off: the same task stays eligible every step
    assert BatchConstraints(st_, cfg.with_overrides(consecutive_cap=0), step=2).eligible()[0]


def test_every_named_variant_is_a_valid_config_that_changes_something_and_fills_a_batch():
    from envsched_pipeline.scheduler.variants import VARIANTS  # only these tests need it

    default = SchedulerConfig(batch_size=6)
    for name, overrides in VARIANTS.items():
        cfg = default.with_overrides(**overrides)  # an unknown or invalid field raises here
        assert cfg.hash() != default.hash(), name
        st_ = make_state(n_envs=3, per_env=6)
        sched = EnvSched(cfg)
        for t in range(3):
            picks = sched.select(st_, 6, np.random.default_rng(t), t).picks
            assert len({p.task_id for p in picks}) == 6, name
            observe(st_, t, {p.index: [0.0, 1.0, 1.0, 0.0] for p in picks}, cfg)


def test_a_runs_scheduler_label_names_its_variant_and_the_overrides_beyond_it():
    from envsched_pipeline.scheduler.variants import scheduler_label as label  # only this test needs it

    form = {"target": "success", "adaptive_rho": True, "coverage_pick": "sampled", "spread_model": "logistic"}
    assert label("envsched", form) == "envsched@success+adaptive+covsampled+lr (the recommended form)"
    # the variant covering most of the overrides wins (exposure4 = the form + c0), the rest listed
    assert label("envsched", {**form, "c0": 4.0, "rho": 0.25}) == (
        "envsched@success+adaptive+covsampled+lr+exposure4 + rho=0.25"
    )
    assert label("envsched", {}) == "envsched (the paper's constants)"
    assert label("envsched", {"rho": 0.25}) == "envsched@rho0.25"  # a variant of its own
    assert label("envsched", {"rho": 0.3}) == "envsched + rho=0.3"
    assert label("greso", {}) == "greso"
    assert label("random", {"target": "success"}) == "random + target=success"  # not envsched's variant


def test_stale_coverage_takes_one_task_per_stale_environment():
    cfg = SchedulerConfig(batch_size=8, stale_after=2)  # rho B = 4 coverage slots at most
    st_ = make_state(n_envs=6, per_env=4)
    observe(st_, 0, {4 * e: [0.0, 1.0] for e in range(5)}, cfg)  # e5 never picked
    observe(st_, 1, {1: [0.0, 1.0], 5: [0.0, 1.0]}, cfg)
    observe(st_, 2, {2: [0.0, 1.0]}, cfg)
    sched = EnvSched(cfg)
    # at step 3: e0 seen at 2, e1 at 1 (fresh); e2..e4 last at 0 and e5 never (stale)
    assert sched.stale_envs(st_, 3).tolist() == [False, False, True, True, True, True]
    picks = sched.select(st_, 8, np.random.default_rng(0), 3).picks
    cov = [p.env_id for p in picks if p.half == "coverage"]
    assert len(picks) == 8 and len(cov) == 4 and len(set(cov)) == 4 and set(cov) <= {"e2", "e3", "e4", "e5"}
    # fewer stale environments than slots: one pick each, the rest goes to exploitation
    st2 = make_state(n_envs=6, per_env=4)
    observe(st2, 0, {4 * e: [0.0, 1.0] for e in range(6)}, cfg)
    observe(st2, 1, {4 * e + 1: [0.0, 1.0] for e in range(4)}, cfg)
    picks = sched.select(st2, 8, np.random.default_rng(0), 3).picks
    assert sorted(p.env_id for p in picks if p.half == "coverage") == ["e4", "e5"]
    assert sum(p.half == "exploit" for p in picks) == 6
    # the paper's rule (stale_after=0) always gives coverage rho B
    picks = EnvSched(cfg.with_overrides(stale_after=0)).select(st2, 8, np.random.default_rng(0), 3).picks
    assert sum(p.half == "coverage" for p in picks) == 4
    with pytest.raises(ValueError, match="stale_after"):
        cfg.with_overrides(stale_after=-1)


def test_env_window_cap_counts_previous_two_steps():
    cfg = SchedulerConfig(cap_env_window=4, cap_env_step=4)
    st_ = make_state(n_envs=2, per_env=5)
    observe(st_, 0, {0: [0, 1], 1: [0, 1]}, cfg)
    observe(st_, 1, {2: [0, 1]}, cfg)
    cons = BatchConstraints(st_, cfg, step=2)
    assert cons.eligible()[3:5].all()  # env 0 has 3 of its 4 over t-2..t
    cons.take(3)  # env 0 now has 4 over t-2..t
    assert not cons.eligible()[:5].any()
    assert cons.eligible()[5:].all()


def test_informative_cap_counts_an_environments_groups_with_spread_not_its_picks():
    cfg = SchedulerConfig(informative_cap=1.0)
    st_ = make_state(n_envs=3, per_env=6)  # env 0: tasks 0-5, env 1: 6-11, env 2: 12-17
    observe(st_, 0, {0: [0, 1], 1: [0, 1], 2: [1, 0], 6: [1, 1], 7: [1, 1], 12: [0, 1]}, cfg)
    observe(st_, 1, {3: [0, 1], 8: [0, 0]}, cfg)
    # groups with spread at t-1, t-2: env 0 four, env 1 none (three picks, all flat), env 2 one;
    # the fair share over a 3-step window is 3 x (5 / 2 steps) / 3 environments = 2.5
    cons = BatchConstraints(st_, cfg, step=2)
    assert cons.inf_cap == pytest.approx(2.5)
    ok = cons.eligible()
    assert not ok[:6].any() and ok[9:12].all() and ok[13:].all()
    assert BatchConstraints(st_, cfg.with_overrides(informative_cap=0.0), step=2).eligible()[4]  # off
    assert cons.eligible(level=2)[4]  # relaxed together with C3
    # this step's picks count by their chance of spread: env 2 reaches the cap after two sure picks,
    # env 1's hopeless picks leave it open
    cons.chance = np.where(st_.env == 2, 1.0, 0.0)
    for i in (13, 14):
        assert cons.take(i)["env_informative_window"] == pytest.approx(1.0 + (i - 13))
    assert not cons.eligible()[15:].any()
    for i in (9, 10, 11):
        cons.take(i)
    assert cons.eligible()[6] and cons.eligible()[7]
    # kept with the state, and forgotten once the steps leave the window
    back = SchedulerState.from_bytes(st_.to_bytes())
    assert BatchConstraints(back, cfg, step=2).inf_cap == pytest.approx(2.5)
    assert BatchConstraints(back, cfg, step=4).inf_cap is None
    # a whole batch keeps every environment under the cap unless it relaxed C3
    sel = EnvSched(cfg.with_overrides(batch_size=6)).select(st_, 6, np.random.default_rng(0), 2)
    assert "C3 window cap" not in sel.relaxations
    for p in sel.picks:
        c = p.reason["constraints"]
        assert c["env_informative_window"] < c["informative_cap"] == pytest.approx(2.5), p.task_id
    assert not {p.index for p in sel.picks} & set(range(6))


def test_proportional_exploitation_draws_by_score_and_records_the_propensity():
    with pytest.raises(ValueError, match="exploit_sampling: 'softmax'"):
        SchedulerConfig(exploit_sampling="softmax")
    st_ = make_state(n_envs=4, per_env=6)
    # half the tasks of each environment had spread, the other half were solved
    observe(st_, 0, {i: ([0.0, 1.0, 0.0, 1.0] if i % 6 < 3 else [1.0] * 4) for i in range(24)})
    spread = np.array([i % 6 < 3 for i in range(24)])
    seen = {}
    for sampling in ("greedy", "proportional"):
        sched = EnvSched(SchedulerConfig(rho=0.0, exploit_sampling=sampling, lambda_sim=0.0))
        counts = np.zeros(24)
        for seed in range(40):
            picks = sched.select(st_, 4, np.random.default_rng(seed), 1).picks
            assert all(p.half == "exploit" for p in picks)
            props = [p.propensity for p in picks]
            assert all(0 < q <= 1 for q in props) and (sampling == "proportional" or props == [1.0] * 4)
            counts[[p.index for p in picks]] += 1
        seen[sampling] = counts
    assert (seen["greedy"] > 0).sum() == 4 and seen["greedy"][~spread].sum() == 0  # the same top four
    prop = seen["proportional"]
    assert (prop > 0).sum() > 8  # spread over many tasks, most often over those with spread
    # (the solved ones keep some score from the shrinkage towards their environment's prior)
    assert prop[spread].sum() > 1.5 * prop[~spread].sum()
    # a power below 1 flattens the draw: the solved tasks get a larger share than at power 1
    flat = EnvSched(
        SchedulerConfig(rho=0.0, exploit_sampling="proportional", exploit_power=0.25, lambda_sim=0.0)
    )
    counts = np.zeros(24)
    for seed in range(40):
        counts[[p.index for p in flat.select(st_, 4, np.random.default_rng(seed), 1).picks]] += 1
    assert counts[~spread].sum() > prop[~spread].sum() and counts[spread].sum() > counts[~spread].sum()
    for bad in (0.0, -1.0, "2", float("nan"), True, 17.0):
        with pytest.raises(ValueError, match="exploit_power"):
            SchedulerConfig(exploit_power=bad)


def test_success_target_scores_the_pass_fail_variance_of_the_predicted_mean():
    with pytest.raises(ValueError, match="target: 'entropy'"):
        SchedulerConfig(target="entropy")
    st_ = make_state(n_envs=2, per_env=4)
    # 0: half solved; 1: nearly solved with a little spread; 2: solved; 3: a steady half score
    groups = {0: [0.0, 1.0] * 4, 1: [1.0] * 7 + [0.8], 2: [1.0] * 8, 3: [0.5] * 8}
    for t in range(3):  # with predictions logged, so the variance target has pairs to calibrate on
        observe(st_, t, groups, pred=np.array([0.3, 0.1, 0.05, 0.2]))
    sched = EnvSched(SchedulerConfig(target="success", rho=0.0))
    pred = sched.predict(st_)
    inf = sched.informativeness(st_, pred)
    m, d = pred["hat_m"], pred["hat_d"]
    assert np.allclose(inf["u"], d * 4 * m * (1 - m))
    assert not bool(inf["is_calibrated"][0]) and np.array_equal(inf["calibrated"], inf["u"])
    u = inf["u"]
    assert u[0] > u[3] and u[0] > u[1] > u[2]  # spread without a near-certain outcome ranks first
    # a floor keeps some worth for any spread: u = d (f + 4 m (1 - m)) / (1 + f)
    floored = EnvSched(SchedulerConfig(target="success", success_floor=1.0)).informativeness(st_, pred)["u"]
    assert np.allclose(floored, d * (1 + 4 * m * (1 - m)) / 2)
    assert floored[1] / floored[0] > u[1] / u[0]
    for bad in (-0.5, "1", True, float("nan"), 101.0):
        with pytest.raises(ValueError, match="success_floor"):
            SchedulerConfig(success_floor=bad)
    # a spread floor: u = (g + (1 - g) d) 4 m (1 - m); g = 1 ranks by the success rate alone, so
    # the steady half score (task 3, no spread) comes level with the half-solved task 0
    for g in (0.5, 1.0):
        got = EnvSched(SchedulerConfig(target="success", spread_floor=g)).informativeness(st_, pred)["u"]
        assert np.allclose(got, (g + (1 - g) * d) * 4 * m * (1 - m))
    assert got[3] / got[0] > u[3] / u[0] and np.isclose(got[3], 4 * m[3] * (1 - m[3]))
    for bad in (-0.1, 1.5, "1", True, float("nan")):
        with pytest.raises(ValueError, match="spread_floor"):
            SchedulerConfig(spread_floor=bad)
    # a spread power: u = d^p 4 m (1 - m); p = 2 puts the task with little chance of spread (2) further
    # behind the one that keeps showing it (1)
    sq = EnvSched(SchedulerConfig(target="success", spread_power=2.0)).informativeness(st_, pred)["u"]
    assert np.allclose(sq, np.clip(d, 0, 1) ** 2 * 4 * m * (1 - m))
    assert sq[2] / sq[1] < u[2] / u[1]
    for bad in (0, -1.0, 17, "2", True, float("nan")):
        with pytest.raises(ValueError, match="spread_power"):
            SchedulerConfig(spread_power=bad)
    # a success peak below 0.5 weighs nearly solved tasks less: w(m) = (m/c)^(2c) ((1-m)/(1-c))^(2(1-c));
    # at 0.5 it is 4 m (1 - m) to the last bit
    half = EnvSched(SchedulerConfig(target="success", success_peak=0.5)).informativeness(st_, pred)["u"]
    assert np.array_equal(half, u)
    low = EnvSched(SchedulerConfig(target="success", success_peak=0.35)).informativeness(st_, pred)["u"]
    mm = np.clip(m, 0, 1)
    assert np.allclose(low, d * (mm / 0.35) ** 0.7 * ((1 - mm) / 0.65) ** 1.3)
    grid = np.array([0.2, 0.35, 0.5, 0.8, 0.9])
    w = _pass_fail_weight(grid, 0.35)
    assert w[1] == pytest.approx(1.0) and w.argmax() == 1
    assert w[3] < 0.7 * _pass_fail_variance(grid)[3] and w[0] > _pass_fail_variance(grid)[0]
    assert _pass_fail_weight(np.array([0.0, 1.0]), 0.35).tolist() == [0.0, 0.0]
    for bad in (0, 1.0, -0.2, "0.3", True, float("nan")):
        with pytest.raises(ValueError, match="success_peak"):
            SchedulerConfig(success_peak=bad)
    # the variance target with the same history is calibrated on realized variance
    assert bool(EnvSched(SchedulerConfig()).informativeness(st_, pred)["is_calibrated"][0])
    # Thompson: deterministic given the generator, different draws across generators, in [0, 1]
    ts = EnvSched(SchedulerConfig(target="success-sampled", rho=0.0))
    a, b = (ts.informativeness(st_, pred, np.random.default_rng(s))["u"] for s in (1, 1))
    c = ts.informativeness(st_, pred, np.random.default_rng(2))["u"]
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert ((a >= 0) & (a <= 1)).all()
    with pytest.raises(ValueError, match="random generator"):
        ts.informativeness(st_, pred)
    # an unobserved task's draw is wider than a well-observed one's
    draws = np.array([ts._success(st_, pred, np.random.default_rng(s)) for s in range(200)])
    assert draws[:, 7].std() > 2 * draws[:, 0].std()
    picks = ts.select(st_, 3, np.random.default_rng(0), 5).picks
    assert len({p.index for p in picks}) == 3


# ---------------------------------------------------------------------------- §5.6 retirement
def test_retirement_after_three_solved_groups_and_return():
    cfg = SchedulerConfig(return_prob=0.0)
    st_ = make_state(n_envs=1, per_env=6)
    for t in range(3):
        observe(st_, t, {0: [1.0] * 8}, cfg)
    assert st_.arrays["retired"][0] == 1
    sched = EnvSched(cfg)
    picks = sched.select(st_, 4, np.random.default_rng(0), 3).picks
    assert "e0-t0" not in {p.task_id for p in picks}
    back = EnvSched(cfg.with_overrides(return_prob=1.0))
    picks = back.select(st_, 6, np.random.default_rng(0), 3).picks
    assert "e0-t0" in {p.task_id for p in picks}


def test_retired_task_with_spread_comes_back():
    cfg = SchedulerConfig()
    st_ = make_state(n_envs=1, per_env=3)
    for t in range(3):
        observe(st_, t, {0: [0.0] * 8}, cfg)
    assert st_.arrays["retired"][0] == 1
    observe(st_, 3, {0: [0.0, 1.0] * 4}, cfg)
    assert st_.arrays["retired"][0] == 0


def test_solved_side_retirement_variant():
    from envsched_pipeline.scheduler.variants import VARIANTS  # only this test needs it

    cfg = SchedulerConfig(return_prob=0.0).with_overrides(**VARIANTS["envsched@solved1"])
    st_ = make_state(n_envs=1, per_env=6)
    observe(st_, 0, {0: [1.0] * 8, 1: [0.0] * 8, 2: [0.5] * 8, 3: [0.0, 1.0] * 4}, cfg)
    # one all-solved group retires; all-failed, partial-credit-without-spread and spread do not
    assert st_.arrays["retired"][:4].tolist() == [1, 0, 0, 0]
    for t in range(1, 4):
        observe(st_, t, {1: [0.0] * 8}, cfg)
    assert st_.arrays["retired"][1] == 0
    picks = EnvSched(cfg).select(st_, 5, np.random.default_rng(0), 4).picks
    assert "e0-t0" not in {p.task_id for p in picks} and "e0-t1" in {p.task_id for p in picks}


# ---------------------------------------------------------------------------- §5.7 hack guard
def test_identifier_shapes():
    assert is_identifier("BO-104") and is_identifier("m_003") and is_identifier("E7013")
    assert is_identifier("123e4567-e89b-12d3-a456-426614174000")
    assert not is_identifier("15") and not is_identifier("available") and not is_identifier(15)


def test_hack_detector_on_crafted_trajectories():
    init = {"books": {"BO-100": {"status": "available"}}, "members": {"ME-101": {}}}
    honest = [
        {"name": "get_book", "arguments": {"book_id": "BO-100"}, "output": {"id": "BO-100"}},
        {
            "name": "assign_book",
            "arguments": {"book_id": "BO-100", "member_id": "ME-101"},
            "output": {"ok": True},
        },
    ]
    invented = [
        {"name": "create_book", "arguments": {"book_id": "BO-999", "name": "x"}, "output": {"ok": True}}
    ]
    learned = [
        {"name": "list_books", "arguments": {}, "output": [{"id": "BO-555"}]},
        {"name": "delete_book", "arguments": {"book_id": "BO-555"}, "output": {"ok": True}},
    ]
    assert not flag_trajectory(honest, init)
    assert flag_trajectory(invented, init)
    assert not flag_trajectory(invented, init, instruction="Register a new book BO-999")
    assert not flag_trajectory(learned, init)  # seen in an earlier tool output
    import json

    rows = [
        {"task_id": "t", "reward": 1.0, "trajectory": json.dumps({"tool_calls": invented})},
        {"task_id": "t", "reward": 1.0, "trajectory": json.dumps({"tool_calls": honest})},
        {"task_id": "t", "reward": 0.0, "trajectory": json.dumps({"tool_calls": invented})},
    ]
    rep = replay(rows, {"t": init})
    assert rep["rewarded"] == 2 and rep["flagged"] == 1 and rep["flag_rate"] == 0.5


def test_hack_rate_discounts_and_retires():
    cfg = SchedulerConfig()
    st_ = make_state(n_envs=1, per_env=4)
    obs = Observations.from_groups(
        0, [0, 1], [np.array([1.0, 0.0] * 4), np.array([1.0, 0.0] * 4)], hack_flags=[4.0, 1.0]
    )
    update_state(st_, obs, cfg)
    sched = EnvSched(cfg)
    inf = sched.informativeness(st_, sched.predict(st_))
    assert inf["hack"][0] == pytest.approx(1.0) and inf["hack"][1] == pytest.approx(0.25)
    assert st_.arrays["retired"][0] == 1 and st_.arrays["retired"][1] == 0


# ---------------------------------------------------------------------------- cold start, state io
def test_cold_start_covers_environments_and_is_seeded():
    st_ = make_state(n_envs=8, per_env=5)
    a = EnvSched(SchedulerConfig()).select(st_, 8, np.random.default_rng(3), 0).picks
    b = EnvSched(SchedulerConfig()).select(st_, 8, np.random.default_rng(3), 0).picks
    assert [p.task_id for p in a] == [p.task_id for p in b]
    assert len({p.env_id for p in a}) == 8 and all(p.half == "cold" for p in a)


def test_state_roundtrip_bytes():
    st_ = make_state()
    observe(st_, 0, {0: [0.0, 1.0]}, pred=np.array([0.1]))
    observe(st_, 1, {2: [0.5, 1.0]}, pred=np.array([0.2]))
    back = SchedulerState.from_bytes(st_.to_bytes())
    assert back.step == 1 and back.env_ids == st_.env_ids
    for k in st_.arrays:
        if st_.arrays[k].dtype.kind in "US":
            assert (back.arrays[k] == st_.arrays[k]).all(), k
        else:
            assert np.allclose(back.arrays[k], st_.arrays[k], equal_nan=True), k
    assert len(back.calib_u) == 2 and len(back.recent_picks) == 2


def test_every_scheduler_returns_distinct_picks_with_reasons():
    st_ = make_state(n_envs=5, per_env=8)
    rng = np.random.default_rng(0)
    for name in SCHEDULERS:
        s = make_scheduler(name, SchedulerConfig(batch_size=10))
        state = make_state(n_envs=5, per_env=8)
        for t in range(4):
            picks = s.select(state, 10, np.random.default_rng(t), t).picks
            ids = [p.task_id for p in picks]
            assert len(ids) == 10 == len(set(ids)), name
            assert all(p.reason.get("half") for p in picks), name
            groups = [rng.choice([0.0, 0.5, 1.0], size=4) for _ in picks]
            s.update(state, Observations.from_groups(t, [p.index for p in picks], groups))
    assert st_.n_tasks == 40


# ---------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_envs=st.integers(1, 7),
    per_env=st.integers(1, 9),
    batch=st.integers(1, 24),
    steps=st.integers(1, 5),
    rho=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    seed=st.integers(0, 10_000),
    sampling=st.sampled_from(["greedy", "proportional"]),
)
def test_batches_never_repeat_and_respect_caps_unless_relaxed(
    n_envs, per_env, batch, steps, rho, seed, sampling
):
    cfg = SchedulerConfig(batch_size=batch, rho=rho, exploit_sampling=sampling)
    state = make_state(n_envs, per_env)
    sched = EnvSched(cfg)
    rng = np.random.default_rng(seed)
    history: list[list[int]] = []
    for t in range(steps):
        sel = sched.select(state, batch, np.random.default_rng([seed, t]), t)
        picks = sel.picks
        idx = [p.index for p in picks]
        assert len(idx) == len(set(idx)) == min(batch, state.n_tasks)
        relax = set(sel.relaxations)
        per_env_now = np.bincount(state.env[idx], minlength=state.n_envs)
        if "C1 per-step cap" not in relax:
            assert per_env_now.max() <= cfg.cap_env_step
        if "C3 window cap" not in relax and "C1 per-step cap" not in relax:
            window = per_env_now.copy()
            for prev in history[-2:]:
                window += np.bincount(state.env[prev], minlength=state.n_envs)
            assert window.max() <= cfg.cap_env_window
        if "consecutive cap" not in relax and len(history) >= 2:
            assert not (set(idx) & set(history[-1]) & set(history[-2]))
        history.append(idx)
        groups = [rng.choice([0.0, 0.5, 1.0], size=4) for _ in idx]
        sched.update(
            state, Observations.from_groups(t, idx, groups), predicted_u=np.array([p.pred_var for p in picks])
        )


def test_coverage_pick_score_takes_the_best_scored_task_instead_of_the_least_exposed():
    cfg = SchedulerConfig(batch_size=2, target="success")  # rho B = 1 coverage slot
    st_ = make_state(n_envs=1, per_env=4)
    for t in range(3):  # task 0 half solved three times, tasks 1-2 solved three times, task 3 never seen
        observe(st_, t, {0: [0.0, 1.0, 0.0, 1.0], 1: [1.0] * 4, 2: [1.0] * 4}, cfg)
    observe(st_, 3, {1: [1.0] * 4}, cfg)  # task 0 rests a step (the consecutive cap would bar it)
    fewest = EnvSched(cfg).select(st_, 2, np.random.default_rng(0), 5).picks
    assert [p.task_id for p in fewest if p.half == "coverage"] == [
        "e0-t3"
    ]  # the paper's rule: never seen first
    best = (
        EnvSched(cfg.with_overrides(coverage_pick="score")).select(st_, 2, np.random.default_rng(0), 5).picks
    )
    assert [p.task_id for p in best if p.half == "coverage"] == ["e0-t0"]  # predicted spread beats novelty
    assert best[0].score > next(p.score for p in fewest if p.task_id == "e0-t3")
    with pytest.raises(ValueError, match="coverage_pick"):
        cfg.with_overrides(coverage_pick="newest")


def test_coverage_pick_sampled_draws_in_proportion_to_the_score():
    """coverage_pick="sampled": each visited environment's coverage pick is drawn in proportion to
    the score, and its propensity is that probability: the likely-informative tasks take most picks,
    a different one from visit to visit, and the nearly solved ones are drawn rarely."""
    cfg = SchedulerConfig(batch_size=2, target="success", coverage_pick="sampled")
    st_ = make_state(n_envs=1, per_env=4)
    for t in range(3):  # tasks 0 and 3 half solved, tasks 1-2 solved
        observe(st_, t, {0: [0.0, 1.0, 0.0, 1.0], 1: [1.0] * 4, 2: [1.0] * 4, 3: [1.0, 0.0, 1.0, 0.0]}, cfg)
    sched = EnvSched(cfg)
    score = sched.informativeness(st_, sched.predict(st_))["score"]
    assert score[0] == score[3] > 5 * max(score[1], score[2]) > 0
    counts: dict[str, int] = {}
    for seed in range(200):
        picks = sched.select(st_, 2, np.random.default_rng(seed), 5).picks
        (cov,) = [p for p in picks if p.half == "coverage"]
        counts[cov.task_id] = counts.get(cov.task_id, 0) + 1
        i = int(cov.task_id.split("-t")[1])
        # propensity = score share among the candidates (the four tasks, or those the caps leave)
        assert (
            score[i] / score.sum() - 1e-9 <= cov.propensity <= score[i] / (score.sum() - 2 * score[1]) + 1e-9
        )
    assert counts.get("e0-t0", 0) > 50 and counts.get("e0-t3", 0) > 50
    assert counts.get("e0-t0", 0) + counts.get("e0-t3", 0) >= 0.8 * 200


def test_own_floor_keeps_a_forgotten_task_s_own_evidence_and_the_task_prior_counts_each_task_once():
    """own_floor: an observed task's decayed sums are scaled up to at least that many groups (its
    means kept), so a task seen long ago is not predicted from the prior alone. env_prior="task":
    the environment prior is the mean of its observed tasks' own estimates, each task once, instead
    of decayed sums that the most recently and most often picked tasks dominate."""
    cfg = SchedulerConfig(use_graph=False, h_long=8.0, lambda_s=2.0)
    st_ = make_state(n_envs=1, per_env=4)
    observe(st_, 0, {0: [1.0] * 8}, cfg)  # task 0: solved once, 20 steps ago
    for t in range(17, 21):  # task 1: spread, four times lately; task 2: never seen; task 3: solved lately
        observe(st_, t, {1: [0.0, 1.0] * 4, 3: [1.0] * 8}, cfg)
    a = st_.arrays
    w0 = 2.0 ** (-20 / 8)
    assert np.isclose(a["W"][0], w0)
    base = EnvSched(cfg).predict(st_)
    env_d = a["Xd"].sum() / a["W"].sum()  # decayed: task 1's four groups with spread dominate
    assert np.isclose(base["prior_d"][0], env_d) and np.isclose(base["hat_d"][0], 2 * env_d / (w0 + 2))
    floored = EnvSched(cfg.with_overrides(own_floor=1.0)).predict(st_)
    # task 0 keeps one group's worth of "no spread"; tasks with more weight than the floor are unchanged
    assert np.isclose(floored["W"][0], 1.0) and np.isclose(floored["own_d"][0], 0.0)
    assert np.allclose(floored["W"][[1, 3]], a["W"][[1, 3]]) and floored["W"][2] == 0.0
    env_d_floor = a["Xd"][1] / (1.0 + a["W"][1] + a["W"][3])
    assert np.isclose(floored["hat_d"][0], 2 * env_d_floor / (1.0 + 2))
    assert floored["hat_d"][0] < base["hat_d"][0]
    per_task = EnvSched(cfg.with_overrides(env_prior="task")).predict(st_)
    # three observed tasks, each once: d = 0 (task 0), 1 (task 1), 0 (task 3)
    assert np.isclose(per_task["prior_d"][2], 1.0 / 3) and np.isclose(per_task["hat_d"][2], 1.0 / 3)
    assert np.isclose(per_task["prior_m"][2], (1.0 + 0.5 + 1.0) / 3)
    # defaults are the paper's rule, float for float
    same = EnvSched(cfg.with_overrides(own_floor=0.0, env_prior="decayed")).predict(st_)
    assert all(np.array_equal(same[k], base[k], equal_nan=True) for k in base)
    with pytest.raises(ValueError, match="env_prior"):
        cfg.with_overrides(env_prior="uniform")
    for bad in (-1.0, "1", True, float("nan")):
        with pytest.raises(ValueError, match="own_floor"):
            cfg.with_overrides(own_floor=bad)


def test_spread_model_learns_from_the_run_what_the_decayed_estimate_cannot_tell_apart():
    """spread_model="logistic": each update keeps the features the state had for the picked tasks and
    whether their group had spread; predict fits a logistic regression on those rows. In this history
    the odd tasks alternate between a group stuck at one partial credit and a group with spread, the
    even ones are always solved: after a partial group comes spread, after spread or solved none. The
    shrunk estimate sees an odd task as half spread whichever its last group was; the model tells."""
    cfg = SchedulerConfig(
        use_graph=False, target="success", spread_model="logistic", spread_model_min_rows=64
    )
    sched, st_ = EnvSched(cfg), make_state(n_envs=2, per_env=40)
    rng = np.random.default_rng(0)
    last: dict[int, str] = {}
    for step in range(30):
        if step == 3:  # below spread_model_min_rows: the shrunk estimate, unchanged
            early = sched.predict(st_)
            assert "base_d" not in early and len(st_.model_rows) == 48
        groups = {}
        for i in rng.choice(80, 16, replace=False).tolist():
            kind = "solved" if i % 2 == 0 else ("spread" if last.get(i) == "partial" else "partial")
            groups[i] = {"solved": [1.0] * 8, "partial": [0.5] * 8, "spread": [0.0, 1.0] * 4}[kind]
            last[i] = kind
        sched.update(
            st_, Observations.from_groups(step, list(groups), [np.array(g) for g in groups.values()])
        )
    assert st_.model_rows.shape == (480, 12)  # 11 features and the outcome per pick
    pred = sched.predict(st_)
    after_partial = [i for i, k in last.items() if k == "partial"]
    after_spread = [i for i, k in last.items() if k == "spread"]
    after_solved = [i for i, k in last.items() if k == "solved"]
    assert pred["hat_d"][after_partial].min() > 0.8
    assert pred["hat_d"][after_spread].max() < 0.2 and pred["hat_d"][after_solved].max() < 0.2
    # the shrunk estimate ranks the two kinds of odd task the other way round (the last group with
    # spread raised it); it stays available as base_d
    assert pred["base_d"][after_partial].mean() < pred["base_d"][after_spread].mean()
    # the rows persist with the state, survive re-keying onto the same pool, and are bounded
    back = SchedulerState.from_bytes(st_.to_bytes())
    assert np.array_equal(back.model_rows, st_.model_rows)
    assert np.allclose(EnvSched(cfg).predict(back)["hat_d"], pred["hat_d"])
    aligned, _ = align_state(st_, st_.task_ids, [st_.env_ids[e] for e in st_.env], st_.task_ids)
    assert np.array_equal(aligned.model_rows, st_.model_rows)
    small = EnvSched(cfg.with_overrides(spread_model_rows=100))
    st2 = make_state(n_envs=2, per_env=40)
    for step in range(10):
        small.update(st2, Observations.from_groups(step, list(range(16)), [np.array([0.0, 1.0])] * 16))
    assert st2.model_rows.shape == (100, 12)
    # off (the default): no rows kept, the paper's estimate
    plain = EnvSched(cfg.with_overrides(spread_model="none"))
    st3 = make_state(n_envs=2, per_env=40)
    plain.update(st3, Observations.from_groups(0, [0, 1], [np.array([0.0, 1.0])] * 2))
    assert st3.model_rows.size == 0 and "base_d" not in plain.predict(st3)
    with pytest.raises(ValueError, match="spread_model"):
        cfg.with_overrides(spread_model="forest")


def test_boosted_spread_model_bends_where_a_straight_line_cannot():
    """spread_model="boosted": gradient-boosted trees on the logistic model's rows. In this history a
    group stuck at 0.25 or 0.75 is followed by one with spread, a group stuck at 0.5 by another at
    0.5; solved stays solved and spread is followed by none: spread depends on the last mean in a
    way no monotone score follows. The trees separate the kinds fully, the straight line by less;
    the chances do not depend on the thread count."""
    from threadpoolctl import threadpool_limits

    def run(model):
        cfg = SchedulerConfig(use_graph=False, target="success", spread_model=model, spread_model_min_rows=64)
        sched, st_ = EnvSched(cfg), make_state(n_envs=2, per_env=40)
        rng = np.random.default_rng(0)
        last: dict[int, str] = {}
        for step in range(40):
            groups = {}
            for i in rng.choice(80, 16, replace=False).tolist():
                if i % 4 == 0:
                    kind = "solved"
                elif last.get(i) in ("p25", "p75"):
                    kind = "spread"
                else:
                    kind = ("p25", "p50", "p75")[i % 4 - 1]
                credit = {"solved": 1.0, "p25": 0.25, "p50": 0.5, "p75": 0.75}
                groups[i] = [0.0, 1.0] * 4 if kind == "spread" else [credit[kind]] * 8
                last[i] = kind
            sched.update(
                st_, Observations.from_groups(step, list(groups), [np.array(g) for g in groups.values()])
            )
        yes = [i for i, k in last.items() if k in ("p25", "p75")]
        no = [i for i, k in last.items() if k in ("p50", "solved", "spread")]
        return sched, st_, yes, no

    gaps = {}
    for model in ("logistic", "boosted"):
        sched, st_, yes, no = run(model)
        d = sched.predict(st_)["hat_d"]
        assert yes and no and "base_d" in sched.predict(st_)
        gaps[model] = d[yes].min() - d[no].max()
        if model == "boosted":
            assert d[yes].min() > 0.9 and d[no].max() < 0.1
            with threadpool_limits(limits=2):
                assert np.array_equal(sched.predict(st_)["hat_d"], d)
    assert gaps["boosted"] > gaps["logistic"] + 0.3


def test_streak_features_tell_a_task_stuck_three_times_from_one_stuck_once():
    """spread_features="streak": the model also sees how many of a task's last three groups in a row
    had no spread and sat at one credit. In this history the odd tasks cycle partial, partial,
    partial, spread (the fourth group has spread only after three stuck ones), the even ones are
    always solved. The base features only approximate the streak (through the decayed estimates and
    the count of groups), and rank some tasks stuck once above some stuck three times; with the
    streak columns the ranking is exact."""
    cfg = SchedulerConfig(
        use_graph=False,
        target="success",
        spread_model="logistic",
        spread_model_min_rows=64,
        spread_features="streak",
    )
    rng = np.random.default_rng(0)
    runs = {}
    for kind in ("streak", "base"):
        sched, st_ = EnvSched(cfg.with_overrides(spread_features=kind)), make_state(n_envs=2, per_env=40)
        stuck: dict[int, int] = {}  # odd task -> partial groups in a row so far
        for step in range(60):
            groups = {}
            for i in rng.choice(80, 16, replace=False).tolist():
                if i % 2 == 0:
                    groups[i] = [1.0] * 8
                elif stuck.get(i, 0) >= 3:
                    groups[i], stuck[i] = [0.0, 1.0] * 4, 0
                else:
                    groups[i], stuck[i] = [0.5] * 8, stuck.get(i, 0) + 1
            sched.update(
                st_, Observations.from_groups(step, list(groups), [np.array(g) for g in groups.values()])
            )
        runs[kind] = (sched.predict(st_), dict(stuck), st_)
    pred, stuck, st_ = runs["streak"]
    assert st_.model_rows.shape[1] == 16  # 15 features and the outcome
    three = [i for i, k in stuck.items() if k == 3]
    fewer = [i for i, k in stuck.items() if k in (1, 2)]
    assert three and fewer
    assert pred["hat_d"][three].min() > 0.7 and pred["hat_d"][fewer].max() < 0.3
    base = runs["base"][0]  # the same kind of history without the streak: the two kinds overlap
    base_three = [i for i, k in runs["base"][1].items() if k == 3]
    base_fewer = [i for i, k in runs["base"][1].items() if k in (1, 2)]
    assert base["hat_d"][base_three].min() < base["hat_d"][base_fewer].max()
    # rows kept under one feature set are not fitted under the other: the model waits for new rows
    other = EnvSched(cfg.with_overrides(spread_features="base"))
    assert "base_d" not in other.predict(st_)
    with pytest.raises(ValueError, match="spread_features"):
        cfg.with_overrides(spread_features="history")


def test_the_probe_oracle_trains_on_the_most_varied_of_its_fresh_look():
    """The neural learner's oracle (bench only): each step one fresh group of `candidates` distinct
    random tasks, and the batch is the most varied of them, never a task it did not look at; the
    same step seed gives the same look, another seed another set."""
    from envsched_pipeline.scheduler.baselines import ProbeOracle

    st_ = make_state(n_envs=4, per_env=10)
    looked: list[list[str]] = []

    def probe(ids, seed):
        looked.append(list(ids))
        # task j of an environment: j/10 of its 8 episodes solved, so spread grows towards j = 4..5
        return np.array(
            [[1.0 if k < int(t.split("-t")[1]) * 8 // 10 else 0.0 for k in range(8)] for t in ids]
        )

    sched = ProbeOracle(SchedulerConfig(), probe=probe, candidates=12)
    sel = sched.select(st_, 5, np.random.default_rng([0, 3]), 3)
    (seen,) = looked
    assert len(seen) == len(set(seen)) == 12
    var = {t: float(np.var(r)) for t, r in zip(seen, probe(seen, 0), strict=True)}
    picked = [p.task_id for p in sel.picks]
    assert len(picked) == 5 and set(picked) <= set(seen)
    assert min(var[t] for t in picked) >= max(var[t] for t in seen if t not in picked)
    assert all(p.half == "oracle" and p.pred_var == var[p.task_id] for p in sel.picks)
    assert all(p.p_nonzero == float(var[p.task_id] > 0) for p in sel.picks)
    again = [p.task_id for p in sched.select(st_, 5, np.random.default_rng([0, 3]), 3).picks]
    assert again == picked and looked[-1] == seen
    sched.select(st_, 5, np.random.default_rng([0, 4]), 4)
    assert looked[-1] != seen

    # a look wider than the pool is the whole pool; a batch wider than the look is the look
    def batch(candidates):
        sel = ProbeOracle(SchedulerConfig(), probe=probe, candidates=candidates).select(
            st_, 5, np.random.default_rng(1), 0
        )
        return len(sel.picks)

    assert batch(99) == 5 and len(looked[-1]) == 40
    assert batch(3) == 3
    with pytest.raises(ValueError, match="probe"):
        ProbeOracle(SchedulerConfig())
    with pytest.raises(ValueError, match="at least one candidate"):
        ProbeOracle(SchedulerConfig(), probe=probe, candidates=0)
