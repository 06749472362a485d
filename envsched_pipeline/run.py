"""The training run a lake holds (``run.json``): its settings, typed and validated.

A lake holds one run. :func:`start_run` binds a lake to a run or checks that a resumed run asks
for the same settings; every step reads :func:`require_run`. Settings are validated before
anything is written, and unknown keys are refused with a message naming the key.
"""

from __future__ import annotations

import math
import re
import typing
import uuid
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from envsched_pipeline.errors import ConfigError, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.settings import BIG, check_settings

RUN_FILE = "run.json"
HALT_FILE = "halt.json"  # a stopped run's record (core/gates.py writes it; a resident worker reads it)
POLICIES = ("simulated", "neural", "hf-tiny", "hf", "vllm", "openai", "external")
# the policies whose per-step checkpoints the lake drops (step 0's, every KEEP_EVERY-th and the
# newest two stay) and whose steps record a checkpoint digest, so a dropped one can be made again
# (trainer.remake), and the file each one's checkpoint of a step is (checkpoints/step=<t>/<file>)
CHECKPOINT_FILES = {"simulated": "policy.json", "neural": "neural.pt"}
REMADE_CHECKPOINTS = tuple(CHECKPOINT_FILES)
# the policies with weights of their own that `envsched evaluate` scores from a checkpoint
EVALUATED_POLICIES = ("neural", "hf-tiny", "hf", "vllm")
TRAINERS = ("subprocess", "external")
# the most steps a selection may run ahead of the rollouts (RunSpec.select_lag): the lake keeps the
# scheduler states that many steps further back, and a staler selection is seldom what a trainer needs
MAX_SELECT_LAG = 4
# the max_steps of a run driven by its own trainer (`ExternalRun`, `envsched step select`): that
# trainer, not envsched, decides when the run ends, so the run is shown without an end
OPEN_ENDED_STEPS = 1_000_000
# a language model's step's numbers of the sampler correction (trainer.update.sampler_metrics), in
# its train_metrics row: what the trackers log, the drift check reads and the report plots
SAMPLER_METRICS = (
    "sampler_logprob_diff",
    "sampler_logprob_diff_max",
    "sampler_kl",
    "sampler_weight_mean",
    "sampler_corrected_fraction",
    "sampler_unknown_tokens",
)


def steps_of(done: int, max_steps: int, sep: str = " of ", unit: str = "") -> str:
    """How far a run is, for a person: ``"12 of 200"`` (``sep`` between, ``unit`` after), or
    ``"12, open-ended"`` for a run whose own trainer decides when it ends (``OPEN_ENDED_STEPS``)."""
    if max_steps >= OPEN_ENDED_STEPS:
        return f"{done}{unit}, open-ended"
    return f"{done}{sep}{max_steps}{unit}"


def check_types(obj, where: str) -> None:
    """Refuse values whose type does not match the dataclass annotation (a string is not a bool,
    a bool is not an int; an int is accepted where a float is asked)."""
    check_settings(obj, f"{where}.", error=ConfigError)


def floats_as_declared(values: dict, cls) -> dict:
    """``values`` (settings of dataclass ``cls``) with a whole number given for a float field as a
    float: the form recorded runs are keyed by, so ``{"dual_clip": 3}`` and ``{"dual_clip": 3.0}``
    find the same runs."""
    declared = cls.__dataclass_fields__
    return {
        k: float(v)
        if declared[k].type in ("float", float) and isinstance(v, int) and not isinstance(v, bool)
        else v
        for k, v in values.items()
    }


def from_mapping(cls, data: dict | None, where: str):
    """Build a config dataclass from a mapping, refusing unknown keys and wrong types."""
    data = dict(data or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
        )
    obj = cls(**data)
    check_types(obj, where)
    return obj


# what the GRPO loss averages over (docs/algorithm.md §8b): the informative episodes, or the whole batch
LOSS_DENOMINATORS = ("informative", "batch")
LEARNING_SIGNALS = ("std", "normalized")  # the simulated learner's (trainer/simulated.py)


def dual_clip_problem(value: float | None) -> str | None:
    """What is wrong with a dual-clip bound (None when it is unset, 0 = off, or > 1): one rule for
    the run's policy_config, the neural learner's and the LM trainer's settings."""
    if value is None or value == 0 or value > 1:
        return None
    return f"must be > 1 (or 0 = off), got {value}"


DEFAULT_CLIP_EPS = 0.2  # PPO's clip range, the neural learner's and the LM trainer's default
AGGREGATIONS = ("token-mean", "seq-mean")  # what the LM trainer's loss averages its tokens by
# how the LM trainer corrects for the sampler drawing tokens a little off its own policy (trainer.loss
# sampler_weights): truncated importance weights (default), tokens outside a band masked, or none
SAMPLER_CORRECTIONS = ("truncate", "mask", "off")
DEFAULT_SAMPLER_CAP = 2.0  # the importance weights' cap (truncate) or band [1/cap, cap] (mask)


def clip_high_problem(clip_eps: float | None, clip_eps_high: float | None) -> str | None:
    """What is wrong with an upper clip range (clip-higher) beside the lower one (the default
    DEFAULT_CLIP_EPS when unset): it may widen the clip above, never narrow it. One rule for the
    run's policy_config, the neural learner's and the LM trainer's settings (checked after their
    types and ranges)."""
    low = DEFAULT_CLIP_EPS if clip_eps is None else clip_eps
    if clip_eps_high is None or clip_eps_high >= low:
        return None
    return f"{clip_eps_high} must be at least clip_eps ({low}): it widens the clip above, never narrows it"


def overrun_penalty_problem(value) -> str | None:
    """What is wrong with an overrun penalty (None when it is unset or a number in [0, 1]: the
    verifiers' rewards lie in [0, 1], so a larger charge would outweigh the whole task)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number in [0, 1], got {value!r}"
    if not 0.0 <= value <= 1.0:  # NaN fails both comparisons
        return f"must be in [0, 1], got {value}"
    return None


# Neural-policy settings whose default changed, as (the default now, the default before). The
# neural learner takes its default from here; a run states these in its spec from the start
# (start_run), and a spec written before it did is read with the old default (load_run), so a
# resumed run keeps the learner it started with. Recorded bench runs are keyed against the old
# defaults (trainer.neural.learner.record_settings).
CHANGED_NEURAL_DEFAULTS = {
    # the stop the max_actions cap forces, trained like a decision until 2026-12 (docs/algorithm.md §8b)
    "train_forced_stop": (False, True),
}


def with_neural_defaults(spec: RunSpec, former: bool = False) -> RunSpec:
    """``spec`` with each changed neural default it leaves unset filled in: today's (a run being
    started), or with ``former`` the one before the change (a spec written before runs stated them)."""
    if spec.policy != "neural" or spec.trainer == "external":
        return spec
    missing = {
        k: before if former else now
        for k, (now, before) in CHANGED_NEURAL_DEFAULTS.items()
        if k not in spec.policy_config
    }
    return replace(spec, policy_config={**spec.policy_config, **missing}) if missing else spec


def with_lr_horizon(spec: RunSpec) -> RunSpec:
    """``spec`` with the length of a decaying learning-rate schedule stated: its ``max_steps`` when
    ``lr_decay_steps`` is not given, so a later ``--steps`` that makes the run longer leaves the
    rate of every step it trained (and of a step done again) as it was."""
    pc = spec.policy_config
    if pc.get("lr_schedule") in ("linear", "cosine") and pc.get("lr_decay_steps") is None:
        return replace(spec, policy_config={**pc, "lr_decay_steps": spec.max_steps})
    return spec


# held-out evaluation (trainer/heldout.py): what a run measures, not how it trains, so a resumed run
# may change them without --allow-config-change (the change is still recorded)
EVAL_SETTINGS = ("eval_every", "eval_tasks", "eval_samples", "eval_temperature", "eval_patience")
# how a step runs, never what it trains (the same weights, to float rounding: tests/test_resident.py,
# and for the update's memory settings tests/test_update_settings.py; checkpoints are written, not
# read, by training): a resumed run may change them, as the held-out ones, without
# --allow-config-change (recorded), e.g. after the update ran out of GPU memory
EXECUTION_SETTINGS = (
    "resident",
    "activation_checkpointing",
    "micro_batch",
    "checkpoint_every",
    "keep_checkpoints",
)
# the learning rate over a run (PolicyConfig.lr_at; neural and LM policies)
LR_SETTINGS = ("lr_warmup_steps", "lr_schedule", "lr_decay_steps", "lr_min_ratio")
LR_SCHEDULES = ("constant", "linear", "cosine")
LR_MIN_RATIO = 0.1  # the floor a decaying schedule ends at, as a share of lr, when not given
# the GRPO update's settings both trained policies read (neural and LM)
UPDATE_SETTINGS = ("clip_eps", "clip_eps_high", "weight_decay", "grad_clip")
# what the language-model policies (hf-tiny, and hf / vllm with their model_path) read
LM_SETTINGS = (
    "workers",
    "lr",
    *LR_SETTINGS,
    *UPDATE_SETTINGS,
    "kl_coef",
    "epochs",
    "micro_batch",
    "aggregation",
    "loss_denominator",
    "dual_clip",
    "overrun_penalty",
    "sampler_correction",
    "sampler_cap",
    "max_new_tokens",
    "max_context",
    "activation_checkpointing",
    "temperature",
    "max_actions",
    "checkpoint_every",
    "keep_checkpoints",
    "resident",
    "deepspeed",
    *EVAL_SETTINGS,
)


@dataclass(frozen=True)
class PolicyConfig:
    """Settings of the policy being trained. ``None`` means "the component's own default" (each
    component documents it); a key set for a policy that does not use it is refused."""

    workers: int | None = None  # sandbox worker processes for rollouts (every policy; default 2)
    # simulated learner (trainer/simulated.py)
    mode: str | None = None  # latent | real (gold actions corrupted, run by the real runtime)
    skill_lr: float | None = None
    familiarity_lr: float | None = None
    env_skill_share: float | None = None
    memorization: float | None = None
    learning_signal: str | None = None
    # neural learner (trainer/neural)
    warm_start_steps: int | None = None
    temperature: float | None = None
    max_actions: int | None = None
    # neural and LM policies (trainer/neural, trainer/update.py)
    lr: float | None = None  # learning rate
    # the learning rate of step t (lr_at): a linear warmup over the first lr_warmup_steps steps, then
    # constant, or a linear or cosine decay that reaches lr_min_ratio x lr at step lr_decay_steps
    # (a run that names a decay without its length states its max_steps at the start) and stays there
    lr_warmup_steps: int | None = None
    lr_schedule: str | None = None
    lr_decay_steps: int | None = None
    lr_min_ratio: float | None = None
    # the GRPO update (neural and LM policies unless marked): PPO's clip range, an upper one of its
    # own (DAPO's clip-higher; default clip_eps), AdamW's weight decay, the gradient-norm clip
    clip_eps: float | None = None
    clip_eps_high: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None
    # LM policies: KL to a frozen copy of the initial policy (0 = off, no copy), passes over the
    # batch per step, sequences per forward/backward (gradient accumulation: what fits the GPU),
    # token-mean or seq-mean aggregation of the loss
    kl_coef: float | None = None
    epochs: int | None = None
    micro_batch: int | None = None
    aggregation: str | None = None
    # neural policy: optimizer steps per training step (the batch split in this many minibatches)
    minibatches: int | None = None
    # informative | batch: what the GRPO loss averages over (neural and LM policies; docs/algorithm.md §8b)
    loss_denominator: str | None = None
    # dual-clip PPO bound c > 1 on a negative advantage's surrogate, 0 = off (neural and LM policies)
    dual_clip: float | None = None
    # neural: train on the stop the max_actions cap forces (true) or leave it out (false, the default
    # since 2026-12; a run states it in its spec from the start: CHANGED_NEURAL_DEFAULTS)
    train_forced_stop: bool | None = None
    # neural and LM policies: reward subtracted for an episode the max_actions cap (LM: or the
    # context) stopped (0 = off; docs/algorithm.md §8b)
    overrun_penalty: float | None = None
    # LM policies: how the update corrects for the sampler's log-probabilities differing from its own
    # (SAMPLER_CORRECTIONS; default truncate) and the weights' cap (default DEFAULT_SAMPLER_CAP)
    sampler_correction: str | None = None
    sampler_cap: float | None = None
    # LM policies (trainer/policy_step.py, trainer/engines.py; docs/architecture.md §7 has them all)
    model_path: str | None = None
    max_new_tokens: int | None = None
    # an episode's tokens (prompt, turns, tool results): one that has no room for another turn ends
    # there, verified as it stands (default 16384)
    max_context: int | None = None
    # recompute each layer's activations in the backward pass instead of keeping them: the update's
    # memory for long agent contexts, for one more forward pass of the layers (default false)
    activation_checkpointing: bool | None = None
    checkpoint_every: int | None = None
    # LM policies: the periodic checkpoints kept on disk, the newest N (default: all); `latest` and
    # `best` are kept besides. A model and its optimizer state are GBs each for a real model
    keep_checkpoints: int | None = None
    resident: bool | None = None  # keep model, optimizer and engine in one worker process across steps
    deepspeed: bool | None = None  # DeepSpeed ZeRO-2 with a config generated from the trainer's (GPU)
    base_url: str | None = None  # openai: any OpenAI-compatible server
    model: str | None = None
    api_key_env: str | None = None  # openai: name of the environment variable holding the key
    # held-out evaluation (trainer/heldout.py; neural and LM policies): every N steps and at the last
    # step, 0 = off (default 10); tasks per split (default: all for neural, B for LM policies);
    # sampled episodes per task (default 8 for neural, 2 for LM policies)
    eval_every: int | None = None
    eval_tasks: int | None = None
    eval_samples: int | None = None
    # LM policies: the evaluation's sampling temperature (default: the training one; 0 = greedy,
    # one episode per task)
    eval_temperature: float | None = None
    # stop the run early once this many evaluations in a row have not beaten the best mean held-out
    # score (core/gates.py, heldout_stall); 0 or unset = never
    eval_patience: int | None = None

    USED_BY: typing.ClassVar[dict[str, tuple[str, ...]]] = {
        "simulated": (
            "workers",
            "mode",
            "skill_lr",
            "familiarity_lr",
            "env_skill_share",
            "memorization",
            "learning_signal",
        ),
        "neural": (
            "workers",
            "lr",
            *LR_SETTINGS,
            *UPDATE_SETTINGS,
            "minibatches",
            "loss_denominator",
            "dual_clip",
            "train_forced_stop",
            "overrun_penalty",
            "warm_start_steps",
            "temperature",
            "max_actions",
            "resident",
            "eval_every",
            "eval_tasks",
            "eval_samples",
            "eval_patience",
        ),
        "hf-tiny": LM_SETTINGS,
        "hf": LM_SETTINGS + ("model_path",),
        "vllm": LM_SETTINGS + ("model_path",),
        "openai": (
            "workers",
            "base_url",
            "model",
            "api_key_env",
            "max_new_tokens",
            "temperature",
            "max_actions",
            *EVAL_SETTINGS,
        ),
        "external": (),
    }

    def set_values(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def validate(self, policy: str) -> None:
        extra = sorted(set(self.set_values()) - set(self.USED_BY.get(policy, ())))
        if extra:
            raise ConfigError(f"policy {policy!r} does not use {', '.join(extra)}")
        if problem := dual_clip_problem(self.dual_clip):
            raise ConfigError(f"policy_config.dual_clip {problem}")
        if problem := overrun_penalty_problem(self.overrun_penalty):
            raise ConfigError(f"policy_config.overrun_penalty {problem}")
        check_settings(self, "policy_config.", POLICY_BOUNDS, POLICY_CHOICES, error=ConfigError)
        if problem := self.lr_problem():
            raise ConfigError(problem)
        if problem := clip_high_problem(self.clip_eps, self.clip_eps_high):
            raise ConfigError(f"policy_config.clip_eps_high: {problem}")
        if policy in ("hf", "vllm") and not self.model_path:
            raise ConfigError(
                f"policy {policy} needs model_path (a local Qwen3 checkpoint); use hf-tiny for a random-init one"
            )
        if policy == "openai" and not self.base_url:
            raise ConfigError(
                "policy openai needs base_url (an OpenAI-compatible server, e.g. http://host:8000/v1)"
            )

    def decays(self) -> bool:
        """Whether the learning rate decays after its warmup (a linear or cosine schedule)."""
        return (self.lr_schedule or "constant") != "constant"

    def lr_problem(self) -> str | None:
        """What is wrong with the learning-rate schedule's settings taken together, if anything."""
        if not self.decays():
            given = [k for k in ("lr_decay_steps", "lr_min_ratio") if getattr(self, k) is not None]
            if given:
                return (
                    f"policy_config.{given[0]} is used only by a decaying schedule (lr_schedule linear or "
                    f"cosine); lr_schedule is {self.lr_schedule or 'constant'}"
                )
            return None
        warmup = self.lr_warmup_steps or 0
        if self.lr_decay_steps is not None and self.lr_decay_steps <= warmup:
            return (
                f"policy_config.lr_decay_steps: {self.lr_decay_steps} must be more than lr_warmup_steps "
                f"({warmup}): the decay runs from the end of the warmup to that step (a run that does not "
                "give it decays until its max_steps)"
            )
        return None

    def lr_at(self, step: int, base: float) -> float:
        """The learning rate of step ``step`` (0-based) for a trainer whose own is ``base`` (``lr``
        when set): ``base x (step + 1) / lr_warmup_steps`` during the warmup, then ``base`` (constant)
        or a linear or cosine decay from ``base`` to ``lr_min_ratio x base`` at ``lr_decay_steps``,
        and that floor from there on. A pure function of the step: a resumed, redone or rewound
        step trains at the rate it had the first time."""
        lr = base if self.lr is None else self.lr
        warmup = self.lr_warmup_steps or 0
        if step < warmup:
            return lr * (step + 1) / warmup
        if not self.decays():
            return lr
        if self.lr_decay_steps is None:
            raise ValueError("a decaying learning-rate schedule needs lr_decay_steps (start_run states it)")
        floor = LR_MIN_RATIO if self.lr_min_ratio is None else self.lr_min_ratio
        done = min(1.0, (step - warmup) / (self.lr_decay_steps - warmup))
        left = 1.0 - done if self.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return lr * (floor + (1.0 - floor) * left)


# the settings of PolicyConfig that name one of a few things
POLICY_CHOICES = {
    "mode": ("latent", "real"),
    "learning_signal": LEARNING_SIGNALS,
    "loss_denominator": LOSS_DENOMINATORS,
    "lr_schedule": LR_SCHEDULES,
    "aggregation": AGGREGATIONS,
    "sampler_correction": SAMPLER_CORRECTIONS,
}
# every numeric setting of PolicyConfig (the two PPO knobs are checked above)
POLICY_BOUNDS = {
    "workers": (1, True, 256),
    "skill_lr": (0, True, 10),
    "familiarity_lr": (0, True, 10),
    "env_skill_share": (0, True, 1),
    "memorization": (0, True, 1),
    "warm_start_steps": (0, True, BIG),
    "temperature": (0, True, 100),
    "max_actions": (1, True, 1000),
    "lr": (0, False, 10),
    "lr_warmup_steps": (0, True, BIG),
    "lr_decay_steps": (1, True, BIG),
    "lr_min_ratio": (0, True, 1),
    "clip_eps": (0, False, 10),
    "clip_eps_high": (0, False, 10),
    "weight_decay": (0, True, 10),
    "grad_clip": (0, False, math.inf),  # a huge value turns clipping off
    "kl_coef": (0, True, 10),
    "sampler_cap": (1, False, 1000),
    "epochs": (1, True, 100),
    "micro_batch": (1, True, BIG),
    "minibatches": (1, True, 1000),
    "max_new_tokens": (1, True, BIG),
    "max_context": (16, True, BIG),
    "checkpoint_every": (1, True, BIG),
    "keep_checkpoints": (1, True, BIG),
    "eval_every": (0, True, BIG),
    "eval_tasks": (1, True, BIG),
    "eval_samples": (1, True, 1024),
    "eval_temperature": (0, True, 100),
    "eval_patience": (0, True, BIG),
}


@dataclass(frozen=True)
class RunSpec:
    """The training run a lake holds. Written once; every step reads it."""

    pool: str = "synthetic"
    policy: str = "simulated"
    scheduler: str = "envsched"
    seed: int = 0
    batch_size: int = 64
    group_size: int = 8
    max_steps: int = 20
    trainer: str = "subprocess"  # subprocess | external (rollouts ingested by an outside trainer)
    run_id: str = ""  # set when the run starts; part of every sensor run_key
    prior_lake: str = ""  # start the estimates from this lake's final scheduler state (cross-run prior)
    prior_discount: float = 0.5
    report_to: str = ""  # experiment trackers, comma-separated: tensorboard, wandb, mlflow (or none)
    # lakes of other runs on this pool (a baseline's, e.g. random's at this seed) that the run's
    # report compares with: the report at the run's end, `envsched report`, `run_report`
    against: list[str] = field(default_factory=list)
    scheduler_config: dict = field(default_factory=dict)
    policy_config: dict = field(default_factory=dict)
    # how many steps a selection may run ahead of the rollouts: manifest t is chosen from the
    # statistics after step t-1-select_lag, the picks of the manifests in between counted as spent
    # (core.select.selection_state). 0: after step t-1, the loop's own order; 1: a trainer that asks
    # for the next batch while the current one trains (one-step off-policy, a prefetching loader)
    select_lag: int = 0

    @classmethod
    def from_dict(cls, d: dict, where: str = "run") -> RunSpec:
        return from_mapping(cls, d, where)

    def to_dict(self) -> dict:
        return asdict(self)

    def policy_settings(self) -> PolicyConfig:
        return from_mapping(PolicyConfig, self.policy_config, "policy_config")

    def validate(self, schedulers: typing.Iterable[str] = ()) -> RunSpec:
        """Check every setting; raises :class:`ConfigError` naming the first bad one."""
        check_types(self, "run")
        schedulers = tuple(schedulers)
        if schedulers and self.scheduler not in schedulers:
            raise ConfigError(f"unknown scheduler {self.scheduler!r}; choose one of {', '.join(schedulers)}")
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.trainer not in TRAINERS:
            raise ConfigError(f"unknown trainer {self.trainer!r}; choose one of {', '.join(TRAINERS)}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")
        if self.group_size < 2:
            raise ConfigError(
                f"group size must be >= 2 (GRPO compares rollouts within a group), got {self.group_size}"
            )
        if self.max_steps < 1:
            raise ConfigError(f"max steps must be >= 1, got {self.max_steps}")
        if not 0 <= self.select_lag <= MAX_SELECT_LAG:
            raise ConfigError(f"select_lag must be in [0, {MAX_SELECT_LAG}], got {self.select_lag}")
        names = [n.strip() for n in self.report_to.split(",") if n.strip() and n.strip() != "none"]
        bad = [n for n in names if n not in ("tensorboard", "wandb", "mlflow")]
        if bad:
            raise ConfigError(
                f"unknown tracker(s) {', '.join(bad)}; choose from tensorboard, wandb, mlflow or none"
            )
        for i, path in enumerate(self.against):
            if not isinstance(path, str) or not path.strip():
                raise ConfigError(f"run.against[{i}]: expected a lake's path or URL, got {path!r}")
        if len(set(self.against)) < len(self.against):
            raise ConfigError(f"run.against: names a lake twice ({', '.join(self.against)})")
        if not 0.0 <= self.prior_discount <= 1.0:
            raise ConfigError(f"prior discount must be in [0, 1], got {self.prior_discount}")
        if not _is_name(self.pool):
            raise ConfigError(
                f"pool name {self.pool!r} is not a valid name (letters, digits, '_' and '-', "
                "starting with a letter or digit, at most 64 characters)"
            )
        if self.trainer != "external" and self.policy == "external":
            raise ConfigError(
                "policy 'external' is trained outside envsched: drive its run with `envsched step "
                "select` / `step ingest` or ExternalRun; envsched's own trainer runs "
                + ", ".join(p for p in POLICIES if p != "external")
            )
        if self.trainer != "external":
            self.policy_settings().validate(self.policy)
        return self


# what two runs must share to be compared (a run's `against`, `envsched report --against`, `envsched
# compare`), with why
COMPARABLE = (
    ("policy", "runs of different learners cannot be compared"),
    ("pool", "runs on different pools do not share tasks or held-out sets"),
    ("batch_size", "batch variance and zero-variance shares depend on the batch shape"),
    ("group_size", "batch variance and zero-variance shares depend on the batch shape"),
)


def check_partner(lake: Lake, spec: RunSpec, other: Lake, where: str) -> RunSpec | None:
    """The run in ``other``, checked as one that ``spec``'s run (in ``lake``) may be compared with,
    or None when ``other`` holds no run yet. Raises :class:`ConfigError` starting with ``where``
    (what named the lake) for this run's own lake or run, or a setting of ``COMPARABLE`` the two
    runs do not share."""
    if str(other.root) == str(lake.root):
        raise ConfigError(f"{where}: that is this run's own lake")
    theirs = load_run(other)
    if theirs is None:
        return None
    if theirs.run_id and theirs.run_id == spec.run_id:
        raise ConfigError(f"{where}: it holds this same run ({theirs.run_id}), not another one")
    for key, why in COMPARABLE:
        if getattr(spec, key) != getattr(theirs, key):
            raise ConfigError(
                f"{where}: its run's {key} is {getattr(theirs, key)!r}, this run's is {getattr(spec, key)!r} ({why})"
            )
    return theirs


def _is_name(name: str) -> bool:

    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}", name or ""))


def valid_name(name: str, what: str = "pool") -> str:
    """A pool (or other lake-partition) name that cannot escape its folder."""
    if not _is_name(name):
        raise ConfigError(
            f"{what} name {name!r} is not a valid name (letters, digits, '_' and '-', starting with "
            "a letter or digit, at most 64 characters)"
        )
    return name


def load_run(lake: Lake) -> RunSpec | None:
    d = lake.read_json(RUN_FILE)
    if d is None:
        return None
    if not isinstance(d, dict):
        raise StepError(f"{lake.root / RUN_FILE}: expected a JSON object")
    d = {k: v for k, v in d.items() if k != "config_changes"}  # the record of allowed changes
    try:
        spec = RunSpec.from_dict(d, where=str(lake.root / RUN_FILE))
    except ConfigError as exc:
        raise StepError(str(exc)) from exc
    return with_neural_defaults(spec, former=True)  # a spec that does not state them ran with the former ones


def require_run(lake: Lake) -> RunSpec:
    spec = load_run(lake)
    if spec is None:
        raise StepError(f"no run in {lake.root}: start one with `envsched train` or `envsched step select`")
    return spec


FIXED = ("pool", "policy", "scheduler", "seed", "batch_size", "group_size", "trainer", "select_lag")


def start_run(
    lake: Lake, spec: RunSpec, schedulers: typing.Iterable[str] = (), allow_config_change: bool = False
) -> RunSpec:
    """Bind the lake to a run, or check that a resumed run asks for the same settings.

    Nothing is written unless the settings are valid. A resumed run may only extend ``max_steps``;
    a changed scheduler or policy config is refused unless ``allow_config_change`` (then the change
    is recorded in ``run.json`` under ``config_changes``). Returns the stored spec.
    """
    spec = with_lr_horizon(spec)  # stated before it is checked: its refusal names what it came from
    spec.validate(schedulers)
    spec = with_neural_defaults(spec)  # the run states them: a later default change cannot reach it
    current = load_run(lake)
    if current is not None and lake.steps("manifests"):
        refusal = resume_refusal(lake, current, spec, allow_config_change)
        if refusal:
            raise StepError(refusal)
        changed = _changed_configs(current, spec)
        record = lake.read_json(RUN_FILE) or {}
        spec = replace(
            spec,
            max_steps=max(current.max_steps, spec.max_steps),
            run_id=current.run_id,
            prior_lake=current.prior_lake,
            prior_discount=current.prior_discount,
        )
        if changed:
            record.setdefault("config_changes", []).append(
                {
                    "from_step": len(lake.steps("manifests")),
                    **{k: getattr(spec, k) for k in changed},
                    "was": {k: getattr(current, k) for k in changed},  # a state folded again before it
                }
            )
        lake.write_json(
            RUN_FILE,
            {
                **spec.to_dict(),
                **({"config_changes": record["config_changes"]} if "config_changes" in record else {}),
            },
        )
        return spec
    if current is not None and current.run_id:
        spec = replace(spec, run_id=current.run_id)
    if not spec.run_id:
        spec = replace(spec, run_id=uuid.uuid4().hex[:8])
    lake.write_json(RUN_FILE, spec.to_dict())
    return spec


def config_changes(lake: Lake) -> list[dict]:
    """The scheduler and policy config changes the run was resumed with (``--allow-config-change``),
    each with the step it applies from and what it replaced, oldest first."""
    return (lake.read_json(RUN_FILE) or {}).get("config_changes", [])


def spec_at(spec: RunSpec, changes: list[dict], step: int) -> RunSpec:
    """The run as it did ``step``: each config changed after it taken back to the one it replaced
    (what a scheduler state folded again, or a policy checkpoint made again, was made with)."""
    for change in reversed(changes):
        if change.get("from_step", 0) > step:
            was = change.get("was") or {}
            spec = replace(spec, **{k: was[k] for k in ("scheduler_config", "policy_config") if k in was})
    return spec


def resume_refusal(
    lake: Lake, current: RunSpec, spec: RunSpec, allow_config_change: bool = False
) -> str | None:
    """Why ``spec`` may not resume ``current``, the run ``lake`` holds with steps: a setting of
    ``FIXED`` differs, or a scheduler or policy config that changes training, without
    ``allow_config_change``; None when it may (only ``max_steps`` grows, the rest is recorded)."""
    diff = [
        f"{k}: lake has {getattr(current, k)!r}, asked {getattr(spec, k)!r}"
        for k in FIXED
        if getattr(current, k) != getattr(spec, k)
    ]
    if diff:
        return (
            f"{lake.root} already holds a run with other settings ({'; '.join(diff)}). "
            "Use another lake (--lake DIR or ENVSCHED_LAKE) or the same settings to resume."
        )
    changed = _changed_configs(current, spec)
    if changed and not allow_config_change and _training_changes(current, spec):
        return (
            f"{lake.root}: the run was started with {', '.join(f'{k}={getattr(current, k)}' for k in changed)}; "
            f"this command asks for {', '.join(f'{k}={getattr(spec, k)}' for k in changed)}. "
            "Resume with the same settings, or allow the change explicitly (--allow-config-change)."
        )
    return None


def _changed_configs(current: RunSpec, spec: RunSpec) -> list[str]:
    return [k for k in ("scheduler_config", "policy_config") if getattr(current, k) != getattr(spec, k)]


def training_settings(policy_config: dict) -> dict:
    """The policy settings that act on training: all but the held-out evaluation's."""
    return {k: v for k, v in policy_config.items() if k not in EVAL_SETTINGS}


def _training_changes(current: RunSpec, spec: RunSpec) -> bool:
    """Whether ``spec`` changes what ``current`` trains: anything but its held-out evaluation and
    how its steps run (``EXECUTION_SETTINGS``)."""

    def acting(pc: dict) -> dict:
        return {k: v for k, v in training_settings(pc).items() if k not in EXECUTION_SETTINGS}

    return current.scheduler_config != spec.scheduler_config or acting(current.policy_config) != acting(
        spec.policy_config
    )


# policies that act only in some kinds of environment (the neural learner's pointer policy makes
# tool calls on a stateful EnvScaler-style class); the others run in every kind
POLICY_ENVIRONMENT_KINDS = {"neural": ("envscaler",)}


def environment_kinds_problem(policy: str, pool: str, kinds: typing.Iterable[str]) -> str | None:
    """Why ``policy`` cannot act in a pool whose environments (training and evaluation) are of
    ``kinds``, or None when it can."""
    allowed = POLICY_ENVIRONMENT_KINDS.get(policy)
    other = sorted(set(kinds) - set(allowed or ()))
    if allowed is None or not other:
        return None
    return (
        f"the {policy} learner acts in EnvScaler-style environments (tool calls on a stateful class); "
        f"pool {pool!r} has {other}: use --policy simulated or an LM policy"
    )


def step_rng(spec: RunSpec, step: int, salt: int = 0) -> np.random.Generator:
    """The randomness of one step (selection salt 0, rollouts salt 1): fixed by (seed, step)."""
    return np.random.default_rng([spec.seed, step, salt])
