"""Every settings dataclass refuses, naming the field, a value of the wrong type, one outside its
range (NaN included) and one not among its choices, before anything runs."""

import math
import typing
from dataclasses import fields

import pytest

from envsched_pipeline.errors import ConfigError
from envsched_pipeline.run import POLICY_BOUNDS, PolicyConfig
from envsched_pipeline.scheduler.config import BOUNDS, CHOICES, SchedulerConfig
from trainer.neural.learner import NEURAL_BOUNDS, POLICY_SIZES, NeuralConfig
from trainer.neural.policy import PolicyConfig as PolicySizes
from trainer.simulated import SimLearnerConfig

SIM_BOUNDED = ("skill_lr", "familiarity_lr", "forget", "near_miss", "partial_stick", "saturation")
# settings with a rule of their own (tested with the learner): a value past them turns them off
OWN_RULES = {"dual_clip", "overrun_penalty"}


def numeric(cls) -> set[str]:
    hints = typing.get_type_hints(cls)
    return {
        f.name
        for f in fields(cls)
        if {int, float} & {hints[f.name], *typing.get_args(hints[f.name])} and f.name not in OWN_RULES
    }


def below(bound) -> float:
    lo, lo_ok, _hi = bound
    return lo - 1 if lo_ok else lo


# settings used only beside another: a decay's length and floor need a decaying schedule
NEEDS = {"lr_decay_steps": {"lr_schedule": "linear"}, "lr_min_ratio": {"lr_schedule": "linear"}}

CASES = [  # (make one with this field set, its bounds, what its errors are)
    (lambda k, v: SchedulerConfig(**{k: v}), BOUNDS, ValueError, "scheduler_config."),
    (lambda k, v: NeuralConfig(**{k: v}), NEURAL_BOUNDS, ValueError, "neural learner setting "),
    (lambda k, v: NeuralConfig(policy=PolicySizes(**{k: v})), POLICY_SIZES, ValueError, "setting policy."),
    (
        lambda k, v: PolicyConfig(**{k: v, **NEEDS.get(k, {})}).validate("neural"),
        POLICY_BOUNDS,
        ConfigError,
        "policy_config.",
    ),
]


def test_every_numeric_setting_has_a_range():
    assert numeric(SchedulerConfig) == set(BOUNDS)
    assert numeric(NeuralConfig) == set(NEURAL_BOUNDS)
    assert numeric(PolicySizes) == set(POLICY_SIZES)
    assert numeric(PolicyConfig) == set(POLICY_BOUNDS)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_setting_out_of_its_range_or_of_another_type_is_refused_by_name(case):
    make, bounds, error, where = CASES[case]
    for name, bound in bounds.items():
        if make is CASES[3][0] and name not in PolicyConfig.USED_BY["neural"]:
            continue  # another policy's setting: refused as unused first
        above = [] if math.isinf(bound[2]) else [bound[2] * 2 + 1]
        for bad in (below(bound), *above, math.nan, "1", True):
            with pytest.raises(error, match=f"{where}{name}: ") as exc:
                make(name, bad)
            assert repr(bad) in str(exc.value) or str(bad) in str(exc.value)
        make(name, bound[2])  # the upper bound itself is allowed


def test_the_simulated_learners_settings_are_checked_too():
    for name in SIM_BOUNDED:
        with pytest.raises(ValueError, match=f"simulated learner setting {name}: -1 must be"):
            SimLearnerConfig(**{name: -1})
    with pytest.raises(ValueError, match="learning_signal: 'loud' is not one of std, normalized"):
        SimLearnerConfig(learning_signal="loud")


def test_a_choice_outside_its_list_is_refused_by_name():
    for name, choices in CHOICES.items():
        with pytest.raises(ValueError, match=f"scheduler_config.{name}: 'nope' is not one of {choices[0]}"):
            SchedulerConfig(**{name: "nope"})
