"""The neural learner: the pointer policy acting in real sandboxed environments, trained with the
project's GRPO functions (``group_advantages``, ``grpo_loss``, AdamW) on the rewards of the real
checklist verifiers.

    learner = NeuralLearner(envs, seed=0)                 # envs: env_id -> environment row
    learner.warm_start(bc_tasks)                          # behaviour cloning on a disjoint pool
    out = learner.rollout(tasks, group_size=8, seed=...)  # rewards (n, G), trajectories
    learner.learn(out)                                    # one GRPO update from those groups
    learner.evaluate(tasks, samples=16)                   # expected reward with a standard error

Nothing about the learning dynamics is set by hand: transfer, interference and memorisation come
from the shared parameters of one small network. Deterministic given the seeds (one torch thread).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from envs.sandbox import SandboxPool
from envsched_pipeline.run import (
    CHANGED_NEURAL_DEFAULTS,
    DEFAULT_CLIP_EPS,
    LOSS_DENOMINATORS,
    POLICY_BOUNDS,
    clip_high_problem,
    dual_clip_problem,
    floats_as_declared,
    overrun_penalty_problem,
)
from envsched_pipeline.settings import BIG, check_settings
from trainer.grpo import group_advantages, overrun_rewards
from trainer.heldout import summarize
from trainer.loss import clipped_step, grpo_loss
from trainer.neural.policy import PointerPolicy, PolicyConfig, parameter_count
from trainer.neural.text import (
    PAD,
    Candidate,
    EpisodeText,
    Tool,
    convert,
    episode_text,
    parse_tools,
    read_output,
)

MAX_PARAMS = 3
MAX_WORDS = 6


# every numeric setting (dual_clip and overrun_penalty have their own rules): those a run's
# policy_config also sets keep its ranges, so a value the run accepts the learner accepts
NEURAL_BOUNDS = {
    **{
        k: POLICY_BOUNDS[k]
        for k in (
            "lr",
            "weight_decay",
            "clip_eps",
            "clip_eps_high",
            "grad_clip",
            "minibatches",
            "max_actions",
            "temperature",
            "warm_start_steps",
            "workers",
        )
    },
    "warm_start_batch": (1, True, BIG),
    "warm_start_lr": (0, False, 10),
}
POLICY_SIZES = {
    "dim": (1, True, 4096),
    "layers": (1, True, 64),
    "heads": (1, True, 64),
    "vocab": (2, True, BIG),
}


@dataclass(frozen=True)
class NeuralConfig:
    """The neural learner's settings (the model's own sizes are :class:`PolicyConfig`)."""

    lr: float = 3e-4
    weight_decay: float = 0.0
    clip_eps: float = DEFAULT_CLIP_EPS
    clip_eps_high: float | None = None  # the upper clip range alone (DAPO's clip-higher); None = clip_eps
    # dual-clip PPO bound c (> 1) on the surrogate of a negative advantage; 0 = off (trainer.loss)
    dual_clip: float = 0.0
    grad_clip: float = 1.0
    minibatches: int = 2  # optimizer steps per training step (ratio != 1 from the second on)
    # what the decision-mean loss divides by: "informative" = the decisions of the episodes with a
    # non-zero advantage (zero-advantage groups do not dilute the step); "batch" = every decision of
    # the step's batch, zero-advantage episodes included (a whole-batch token mean: a batch with
    # fewer informative groups takes a proportionally smaller step)
    loss_denominator: str = "informative"
    max_actions: int = 8  # tool calls per episode before it is stopped and verified
    # whether the stop that ends an episode at the max_actions cap is trained on like a decision
    # the policy made. It is forced, not sampled, so nothing stops a negative advantage from pushing
    # its log-probability down in every capped episode; trained, it sinks all run and late updates
    # blow up (docs/algorithm.md §8b). Off by default since 2026-12 (RECORD_BASELINE keeps the runs
    # recorded with it on findable)
    train_forced_stop: bool = CHANGED_NEURAL_DEFAULTS["train_forced_stop"][0]
    # subtracted from the reward GRPO trains on (and the scheduler sees) for an episode the
    # max_actions cap stopped, floored at 0: DAPO's overlong penalty, counted in actions; 0 = off.
    # The checklist verifiers only read the final state, so without it nothing charges for acting
    # past the task's end. Held-out evaluation always reports the verifiers' reward
    overrun_penalty: float = 0.0
    temperature: float = 1.0
    warm_start_steps: int = 60  # behaviour-cloning gradient steps on the warm-start pool
    warm_start_batch: int = 64
    warm_start_lr: float = 1e-3
    workers: int = 2  # sandbox workers
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self):
        if problem := dual_clip_problem(self.dual_clip):
            raise ValueError(f"neural learner setting dual_clip: {problem}")
        if problem := overrun_penalty_problem(self.overrun_penalty):
            raise ValueError(f"neural learner setting overrun_penalty: {problem}")
        check_settings(
            self, "neural learner setting ", NEURAL_BOUNDS, {"loss_denominator": LOSS_DENOMINATORS}
        )
        if problem := clip_high_problem(self.clip_eps, self.clip_eps_high):
            raise ValueError(f"neural learner setting clip_eps_high: {problem}")
        check_settings(self.policy, "neural learner setting policy.", POLICY_SIZES)

    @classmethod
    def from_dict(cls, d: dict) -> NeuralConfig:
        d = dict(d or {})
        pol = PolicyConfig(**d.pop("policy", {}))
        known = set(cls.__dataclass_fields__) - {"policy"}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(
                f"unknown neural learner setting(s): {', '.join(bad)}; known: {', '.join(sorted(known))}"
            )
        return cls(policy=pol, **d)


# Defaults changed after runs were first recorded, with the value they had then. Recorded bench
# runs are keyed by their settings that differ from the defaults of that time (record_settings), so
# a changed default leaves every record meaning what it meant.
RECORD_BASELINE = {k: before for k, (_now, before) in CHANGED_NEURAL_DEFAULTS.items()}


def record_settings(config: dict | None) -> dict:
    """The settings a recorded run is keyed by: those of the resolved ``config`` that differ from
    the defaults as they stood when runs were first recorded (RECORD_BASELINE), a whole number of a
    float setting as a float. So a run given a default explicitly, or run after that default
    changed, finds the runs recorded with the same learner, and no others (ValueError on settings
    the learner refuses)."""
    got = asdict(NeuralConfig.from_dict(config or {}))
    base = asdict(NeuralConfig()) | RECORD_BASELINE

    def differing(values: dict, defaults: dict, cls) -> dict:
        return floats_as_declared(
            {k: v for k, v in values.items() if k != "policy" and v != defaults[k]}, cls
        )

    out = differing(got, base, NeuralConfig)
    policy = differing(got["policy"], base["policy"], PolicyConfig)
    return out | ({"policy": policy} if policy else {})


@dataclass
class Trace:
    """One episode as the policy lived it: what it saw and what it chose."""

    text: EpisodeText
    tool_choice: list[int] = field(default_factory=list)  # per action: 0 = stop, j + 1 = tool j
    arg_choice: list[list[int]] = field(default_factory=list)  # per action: candidate indices
    out_words: list[list[int]] = field(default_factory=list)  # per executed action
    logp: list[list[float]] = field(default_factory=list)  # per action: the sampled decisions' log-probs
    calls: list[dict] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    result: dict = field(default_factory=dict)
    done: bool = False

    def candidates_at(self, k: int) -> list[Candidate]:
        """Candidates visible at action k (0-based): the instruction + outputs of actions 1..k."""
        return [c for c in self.text.candidates if c.source <= k]


def one_torch_thread(fn):
    """Run ``fn`` with one torch thread. The learner's results must not depend on the caller's
    thread setting or the machine's cores (a float sum split over two threads rounds differently,
    and one rounding difference changes every sampled episode after it); a model this small gains
    nothing from more threads."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


# ---------------------------------------------------------------------------- tensors
def _pad2(rows: list[list[int]], width: int | None = None, fill: int = 0) -> torch.Tensor:
    width = width or max([len(r) for r in rows] + [1])
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for j, r in enumerate(rows):
        r = r[:width]
        out[j, : len(r)] = r
    return torch.from_numpy(out)


def _tool_arrays(tools: list[Tool]) -> tuple[np.ndarray, np.ndarray]:
    """(T, W) tool-name words and (T, P, W) parameter-name words of one environment."""
    tw = np.zeros((len(tools), MAX_WORDS), dtype=np.int64)
    pw = np.zeros((len(tools), MAX_PARAMS, MAX_WORDS), dtype=np.int64)
    for j, tool in enumerate(tools):
        w = tool.words[:MAX_WORDS]
        tw[j, : len(w)] = w
        for p, (_, words, _) in enumerate(tool.params[:MAX_PARAMS]):
            pw[j, p, : len(words[:MAX_WORDS])] = words[:MAX_WORDS]
    return tw, pw


def _static(texts: list[EpisodeText]) -> dict[str, torch.Tensor]:
    """Instruction and tool tensors of a batch of episodes."""
    tokens = _pad2([t.tokens for t in texts])
    shapes = _pad2([t.shapes for t in texts])
    mask = _pad2([[1] * len(t.tokens) for t in texts]).bool()
    mask[~mask.any(1), 0] = True  # an empty instruction still has one (padding) position to attend to
    n_tools = max([len(t.tools) for t in texts] + [1])
    tw = np.zeros((len(texts), n_tools, MAX_WORDS), dtype=np.int64)
    pw = np.zeros((len(texts), n_tools, MAX_PARAMS, MAX_WORDS), dtype=np.int64)
    cache: dict[int, tuple] = {}
    for b, t in enumerate(texts):
        key = id(t.tools)
        if key not in cache:
            cache[key] = _tool_arrays(t.tools)
        a, p = cache[key]
        tw[b, : len(a)] = a
        pw[b, : len(p)] = p
    return {
        "tokens": tokens,
        "shapes": shapes,
        "mask": mask,
        "tool_words": torch.from_numpy(tw),
        "tool_mask": torch.from_numpy(tw[..., 0] > 0),
        "param_words": torch.from_numpy(pw),
    }


def _candidates(cands: list[list[Candidate]]) -> dict[str, torch.Tensor]:
    n = max([len(c) for c in cands] + [1])
    arr = np.zeros((5, len(cands), n), dtype=np.int64)
    arr[4] = -1
    exists = np.zeros((len(cands), n), dtype=bool)
    for b, cs in enumerate(cands):
        if cs:
            arr[:, b, : len(cs)] = np.array(
                [(c.word, c.shape, c.key, c.source, c.position if c.source == 0 else -1) for c in cs],
                dtype=np.int64,
            ).T
            exists[b, : len(cs)] = True
    out = {k: torch.from_numpy(arr[j]) for j, k in enumerate(("word", "shape", "key", "source", "instr_pos"))}
    out["exists"] = torch.from_numpy(exists)
    return out


def _safe_log_softmax(logits: torch.Tensor, valid_rows: torch.Tensor) -> torch.Tensor:
    logits = torch.where(valid_rows.unsqueeze(-1), logits, torch.zeros_like(logits))
    all_masked = torch.isinf(logits).all(-1, keepdim=True)
    logits = torch.where(all_masked, torch.zeros_like(logits), logits)
    return torch.log_softmax(logits, -1)


def _age(source: torch.Tensor, k: int) -> torch.Tensor:
    return torch.where(source == 0, torch.zeros_like(source), k - source + 1)


def decision_logprobs(
    model: PointerPolicy, traces: list[Trace]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced log-probabilities of every decision of every trace.

    Returns (logp (B, D), mask (B, D), tool entropy per trace (B,)), D = actions x (1 + MAX_PARAMS),
    laid out per action as [tool, argument 1, ..., argument MAX_PARAMS].
    """
    st = _static([t.text for t in traces])
    C = model.encode(st["tokens"], st["shapes"], st["mask"])
    h = model.initial_state(C, st["mask"])
    tool_vecs = model.bag(st["tool_words"])
    param_vecs = model.bag(st["param_words"])
    cand = _candidates([t.text.candidates for t in traces])
    base = model.candidate_base(C, cand["instr_pos"], cand["word"], cand["shape"], cand["key"])
    B, N = cand["exists"].shape
    K = max(len(t.tool_choice) for t in traces)
    tool_choice = _pad2([t.tool_choice for t in traces], K, fill=-1)
    arg_np = np.full((B, K, MAX_PARAMS), -1, dtype=np.int64)
    out_np = np.zeros((B, K, MAX_WORDS * 4), dtype=np.int64)
    for b, t in enumerate(traces):
        for k, args in enumerate(t.arg_choice):
            arg_np[b, k, : len(args[:MAX_PARAMS])] = args[:MAX_PARAMS]
        for k, w in enumerate(t.out_words):
            w = w[: MAX_WORDS * 4]
            out_np[b, k, : len(w)] = w
    arg_choice, out_words = torch.from_numpy(arg_np), torch.from_numpy(out_np)
    used = torch.zeros((B, N), dtype=torch.bool)
    lps, masks, ent = [], [], torch.zeros(B)
    rows = torch.arange(B)
    for k in range(K):
        valid = tool_choice[:, k] >= 0
        ctx = model.context(h, C, st["mask"])
        tl = _safe_log_softmax(model.tool_logits(h, ctx, tool_vecs, st["tool_mask"]), valid)
        lps.append(tl[rows, tool_choice[:, k].clamp_min(0)])
        masks.append(valid)
        with torch.no_grad():
            ent += torch.where(valid, -(tl.exp() * torch.nan_to_num(tl, neginf=0.0)).sum(-1), torch.zeros(B))
        j = (tool_choice[:, k] - 1).clamp_min(0)
        tvec = tool_vecs[rows, j]
        prev = torch.zeros_like(tvec)
        cv_k = model.candidate_vectors(base, _age(cand["source"], k))
        visible = cand["exists"] & (cand["source"] <= k)
        for p in range(MAX_PARAMS):
            choice = arg_choice[:, k, p]
            has = choice >= 0
            if not has.any():
                lps.append(torch.zeros(B))
                masks.append(has)
                continue
            cv = model.mark_used(cv_k, used)
            al = _safe_log_softmax(
                model.arg_logits(h, ctx, tvec, param_vecs[rows, j, p], prev, cv, visible), has
            )
            lps.append(al[rows, choice.clamp_min(0)])
            masks.append(has)
            prev = prev + cv[rows, choice.clamp_min(0)] * has.unsqueeze(-1).float()
            used = used | (torch.nn.functional.one_hot(choice.clamp_min(0), N).bool() & has.unsqueeze(-1))
        h_next = model.advance(h, tvec + prev, out_words[:, k])
        h = torch.where((tool_choice[:, k] > 0).unsqueeze(-1), h_next, h)
    logp = torch.stack(lps, 1)
    mask = torch.stack(masks, 1)
    return torch.where(mask, logp, torch.zeros_like(logp)), mask, ent / max(K, 1)


# ---------------------------------------------------------------------------- the learner
class NeuralLearner:
    def __init__(self, envs: dict[str, dict], config: NeuralConfig = NeuralConfig(), seed: int = 0):
        torch.manual_seed(seed)
        self.envs = {k: dict(v, kind=v.get("kind") or "envscaler") for k, v in envs.items()}
        self.config = config
        self.seed = seed
        self.model = PointerPolicy(config.policy)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.version = 0
        self._pool = None
        self.last: dict | None = None
        self.parameters = parameter_count(self.model)

    # ------------------------------------------------------------------ sandbox
    @property
    def pool(self):
        if self._pool is None:
            self._pool = SandboxPool(workers=self.config.workers)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def add_envs(self, envs: dict[str, dict]) -> None:
        for k, v in envs.items():
            self.envs[k] = dict(v, kind=v.get("kind") or "envscaler")

    # ------------------------------------------------------------------ acting
    def _tools(self, env_id: str, schemas: list[dict]) -> list[Tool]:
        """Parsed tools per environment (one list object per environment, shared by its episodes)."""
        cache = self.__dict__.setdefault("_tool_cache", {})
        if env_id not in cache:
            cache[env_id] = parse_tools(schemas)
        return cache[env_id]

    @one_torch_thread
    @torch.no_grad()
    def act(self, tasks: list[dict], seed: int, greedy: bool = False) -> list[Trace]:
        """Run one episode per task row (lock-step over all of them); returns their traces."""
        self.model.eval()
        gen = torch.Generator().manual_seed(int(seed) % (2**63))
        with self.pool.batch(self.envs, [(t["env_id"], t) for t in tasks]) as batch:
            firsts = batch.reset()
            traces = []
            for t, first in zip(tasks, firsts, strict=True):
                if first is None:
                    traces.append(Trace(text=episode_text("", []), done=True))
                else:
                    tools = self._tools(t["env_id"], first.get("tools") or [])
                    traces.append(Trace(text=episode_text(first.get("observation") or "", tools)))
            live = [b for b, t in enumerate(traces) if not t.done and t.text.tools]
            for b, t in enumerate(traces):
                t.done = b not in set(live)
            if live:
                self._act_loop(traces, live, batch, gen, greedy)
            results = batch.finish({b: None for b in range(len(tasks))})
        for b, t in enumerate(traces):
            t.result = results[b]
        return traces

    def _act_loop(self, traces: list[Trace], live: list[int], batch, gen, greedy: bool) -> None:
        model, c = self.model, self.config
        sub = [traces[b] for b in live]
        st = _static([t.text for t in sub])
        C = model.encode(st["tokens"], st["shapes"], st["mask"])
        h = model.initial_state(C, st["mask"])
        tool_vecs = model.bag(st["tool_words"])
        param_vecs = model.bag(st["param_words"])
        used: list[set[int]] = [set() for _ in sub]
        active = list(range(len(sub)))
        for k in range(c.max_actions + 1):
            if not active:
                break
            idx = torch.tensor(active)
            hk, Ck, mk = h[idx], C[idx], st["mask"][idx]
            ctx = model.context(hk, Ck, mk)
            tl = torch.log_softmax(model.tool_logits(hk, ctx, tool_vecs[idx], st["tool_mask"][idx]), -1)
            tool = (
                torch.zeros(len(active), dtype=torch.long)
                if k == c.max_actions
                else _sample(tl, gen, c.temperature, greedy)
            )
            rows = torch.arange(len(active))
            lp = torch.zeros((len(active), 1 + MAX_PARAMS))
            lp[:, 0] = tl[rows, tool]
            cands = [sub[a].candidates_at(k) for a in active]
            ct = _candidates(cands)
            cv_k = model.candidate_vectors(
                model.candidate_base(Ck, ct["instr_pos"], ct["word"], ct["shape"], ct["key"]),
                _age(ct["source"], k),
            )
            used_t = torch.zeros_like(ct["exists"])
            for r, a in enumerate(active):
                if used[a]:
                    used_t[r, list(used[a])] = True
            j = (tool - 1).clamp_min(0)
            tvec = tool_vecs[idx][rows, j]
            pvec = param_vecs[idx][rows, j]
            prev = torch.zeros_like(tvec)
            args: list[list[int]] = [[] for _ in active]
            n_params = [
                len(sub[a].text.tools[int(j[r])].params[:MAX_PARAMS]) if int(tool[r]) > 0 else 0
                for r, a in enumerate(active)
            ]
            # a parameter with no candidate to copy (nothing visible yet) is left out of the call
            # rather than sampled from an empty distribution
            can = ct["exists"].any(-1)
            for p in range(MAX_PARAMS):
                need = torch.tensor([n > p for n in n_params]) & can
                if not need.any():
                    break
                cv = model.mark_used(cv_k, used_t)
                al = model.arg_logits(hk, ctx, tvec, pvec[:, p], prev, cv, ct["exists"])
                al = torch.log_softmax(torch.where(need.unsqueeze(-1), al, torch.zeros_like(al)), -1)
                choice = _sample(al, gen, c.temperature, greedy)
                lp[:, 1 + p] = torch.where(need, al[rows, choice], torch.zeros(len(active)))
                prev = prev + cv[rows, choice] * need.unsqueeze(-1).float()
                used_t[rows[need], choice[need]] = True
                for r in torch.nonzero(need).flatten().tolist():
                    args[r].append(int(choice[r]))
            calls: dict[int, dict] = {}
            for r, a in enumerate(active):
                t = sub[a]
                t.tool_choice.append(int(tool[r]))
                t.arg_choice.append(args[r])
                t.logp.append(lp[r].tolist())
                if int(tool[r]) == 0:
                    continue
                spec = t.text.tools[int(tool[r]) - 1]
                cl = cands[r]
                call = {
                    "name": spec.name,
                    "arguments": {
                        pn: convert(cl[ci].text, ptype)
                        for (pn, _, ptype), ci in zip(spec.params, args[r], strict=False)
                    },
                }
                used[a].update(args[r])
                calls[live[a]] = call
                t.calls.append(call)
            outputs = batch.step(calls) if calls else {}
            out_words = np.zeros((len(active), MAX_WORDS * 4), dtype=np.int64)
            still = []
            for r, a in enumerate(active):
                t = sub[a]
                if int(tool[r]) == 0:
                    t.done = True
                    continue
                text = outputs.get(live[a], "")
                t.outputs.append(text[:2000])
                new, words = read_output(text, k + 1)
                t.text.candidates.extend(new)
                t.out_words.append(words)
                w = words[: MAX_WORDS * 4]
                out_words[r, : len(w)] = w
                still.append(a)
            h = h.clone()
            h[idx] = torch.where(
                (tool > 0).unsqueeze(-1), model.advance(hk, tvec + prev, torch.from_numpy(out_words)), hk
            )
            active = still

    # ------------------------------------------------------------------ the GRPO step
    def rollout(self, tasks: list[dict], group_size: int, seed: int) -> dict:
        """G episodes of each task row. Returns rewards (n, G) and per-rollout details."""
        t0 = time.perf_counter()
        traces, verified, capped, rewards = self._episodes(tasks, group_size, seed)
        n = len(tasks)
        seconds = time.perf_counter() - t0
        self.last = {"traces": traces, "rewards": rewards, "group_size": group_size}
        return {
            "reward": rewards,  # what GRPO trains on: the verifiers' reward less any overrun penalty
            "verifier_reward": verified,
            "capped": capped,
            **self._details(traces, verified, capped, group_size),
            "seconds": np.full((n, group_size), seconds / max(n * group_size, 1)),
            "rollout_seconds": seconds,
        }

    @staticmethod
    def _details(traces: list[Trace], verified: np.ndarray, capped: np.ndarray, group_size: int) -> dict:
        """What the verifier and the episode came to, per episode, shaped (tasks, group_size)."""
        n = len(traces) // group_size

        def shaped(values) -> np.ndarray:
            return np.array(values).reshape(n, group_size)

        return {
            "checks_passed": shaped(
                [sum(bool(c.get("passed")) for c in t.result.get("checks", [])) for t in traces]
            ),
            "n_checks": shaped([len(t.result.get("checks", [])) for t in traces]),
            "tool_calls": shaped([len(t.calls) for t in traces]),
            "error_class": shaped([t.result.get("error_class") or "none" for t in traces]),
            "error_message": shaped([str(t.result.get("error") or "")[:500] for t in traces]),
            "trajectory": shaped(
                [
                    json.dumps(
                        {
                            "engine": "neural",
                            "tool_calls": [
                                {**cl, "output": out[:500]}
                                for cl, out in zip(t.calls, t.outputs, strict=False)
                            ],
                            "checks": [
                                {k: c.get(k) for k in ("item", "passed", "error")}
                                for c in t.result.get("checks", [])
                            ],
                            "verifier_reward": float(v),
                            "stopped_by_cap": bool(c),
                        },
                        default=str,
                    )[:20000]
                    for t, v, c in zip(traces, verified.reshape(-1), capped.reshape(-1), strict=True)
                ]
            ),
        }

    def capped(self, trace: Trace) -> bool:
        """Whether the max_actions cap ended the episode (the stop was forced, not chosen)."""
        return len(trace.tool_choice) > self.config.max_actions

    @one_torch_thread
    def learn(self, out: dict | None = None) -> dict:
        """One GRPO update on the groups of the last rollout (zero-advantage episodes skipped)."""
        if self.last is None:
            raise RuntimeError("learn() needs a rollout() first")
        t0 = time.perf_counter()
        traces, rewards = self.last["traces"], self.last["rewards"]
        adv = group_advantages(rewards).reshape(-1)
        keep = [j for j in range(len(traces)) if abs(adv[j]) > 1e-8 and traces[j].tool_choice]
        # share of the batch's decisions that carry a gradient: the loss scale of the "batch" denominator
        decisions = [sum(len(step) for step in t.logp) for t in traces]
        share = sum(decisions[j] for j in keep) / max(sum(decisions), 1)
        scale = share if self.config.loss_denominator == "batch" else 1.0
        info = {
            "trained_groups": int((np.ptp(rewards, axis=1) > 1e-6).sum()),
            "trained_episodes": len(keep),
            "loss": float("nan"),
            "grad_norm": float("nan"),
            "clip_fraction": float("nan"),
            "kl": float("nan"),
            "entropy": float("nan"),
            "log_ratio_max": float("nan"),
            "negative_ratio_over3": float("nan"),
            "forced_stop_logp": float("nan"),
            "lr": self.optimizer.param_groups[0]["lr"],
            "informative_decision_share": share,
            "loss_scale": scale,
            "skipped_updates": 0,
            # episodes ended by the max_actions cap rather than by the policy's own stop
            "forced_stop_share": float(np.mean([self.capped(t) for t in traces])),
        }
        if keep:
            info.update(self._update([traces[j] for j in keep], adv[keep], scale))
        self.version += 1
        info["update_seconds"] = time.perf_counter() - t0
        self.last = None
        return info

    def _update(self, traces: list[Trace], adv: np.ndarray, scale: float = 1.0) -> dict:
        c, model = self.config, self.model
        # log-probabilities the decisions had when they were sampled (the "old" policy of the ratio)
        K = max(len(t.tool_choice) for t in traces)
        old_np = np.zeros((len(traces), K * (1 + MAX_PARAMS)), dtype=np.float32)
        for b, t in enumerate(traces):
            flat = [x for step in t.logp for x in step]
            old_np[b, : len(flat)] = flat
        old = torch.from_numpy(old_np)
        model.train()
        order = np.arange(len(traces))
        parts = [order[j :: c.minibatches] for j in range(c.minibatches) if len(order[j :: c.minibatches])]
        losses, norms, clips, kls, ents, tops, overs = [], [], [], [], [], [], []
        skipped = 0
        forced = c.max_actions * (1 + MAX_PARAMS)  # the tool decision of the capped action
        # log-probability the trained forced stops had when the cap imposed them (never sampled)
        stops = (
            [old_np[b, forced] for b, t in enumerate(traces) if self.capped(t)] if c.train_forced_stop else []
        )
        for part in parts:
            sub = [traces[j] for j in part]
            lp, mask, ent = decision_logprobs(model, sub)
            if not c.train_forced_stop and mask.shape[1] > forced:
                mask = mask.clone()
                mask[:, forced] = False
            idx = torch.as_tensor(part)
            loss, stats = grpo_loss(
                lp,
                old[idx][:, : lp.shape[1]],
                torch.as_tensor(adv[part], dtype=torch.float32),
                mask.float(),
                clip_eps=c.clip_eps,
                dual_clip=c.dual_clip,
                clip_eps_high=c.clip_eps_high,
            )
            self.optimizer.zero_grad(set_to_none=True)
            (loss * scale).backward()
            norm = clipped_step(self.optimizer, model.parameters(), c.grad_clip)
            if math.isfinite(norm):
                norms.append(norm)
            else:  # not applied: NaN weights would make the policy act as a constant from then on
                skipped += 1
            losses.append(float(loss.detach()))
            clips.append(stats["clip_fraction"])
            with torch.no_grad():
                log_ratio, on = lp - old[idx][:, : lp.shape[1]], mask.bool()
                d = log_ratio * mask
                kls.append(float(((torch.exp(-d) - 1 + d) * mask).sum() / mask.sum().clamp_min(1)))
                # how far a decision's probability moved since it was sampled (0 on the first
                # minibatch), and the share of decisions with a negative advantage whose ratio passed
                # 3: the unbounded side of the clipped surrogate (what dual clip would hold)
                tops.append(float(log_ratio.masked_fill(~on, -math.inf).max()))
                neg = torch.as_tensor(adv[part] < 0).unsqueeze(-1) & on
                overs.append(float((neg & (log_ratio > math.log(3.0))).sum() / mask.sum().clamp_min(1)))
            ents.append(float(ent.mean()))
        model.eval()
        return {
            "loss": float(np.mean(losses)),
            "grad_norm": float(np.mean(norms)) if norms else float("nan"),
            "skipped_updates": skipped,
            "clip_fraction": float(np.mean(clips)),
            "kl": float(np.mean(kls)),
            "entropy": float(np.mean(ents)),
            "log_ratio_max": float(np.max(tops)),
            "negative_ratio_over3": float(np.mean(overs)),
            "forced_stop_logp": float(np.mean(stops)) if stops else float("nan"),
        }

    # ------------------------------------------------------------------ warm start
    @one_torch_thread
    def warm_start(self, tasks: list[dict], envs: dict[str, dict] | None = None, log=None) -> dict:
        """Behaviour cloning on gold action sequences of a *disjoint* pool: the gold actions are run in
        the sandbox (so lookups see real outputs), each decision becomes a cross-entropy target."""
        if envs:
            self.add_envs(envs)
        traces = self.gold_traces(tasks)
        traces = [t for t in traces if t.tool_choice]
        c = self.config
        opt = torch.optim.AdamW(self.model.parameters(), lr=c.warm_start_lr)
        rng = np.random.default_rng(self.seed)
        losses = []
        self.model.train()
        for step in range(c.warm_start_steps):
            pick = rng.choice(len(traces), size=min(c.warm_start_batch, len(traces)), replace=False)
            lp, mask, _ = decision_logprobs(self.model, [traces[j] for j in pick])
            loss = -(lp * mask).sum() / mask.sum().clamp_min(1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clipped_step(opt, self.model.parameters(), c.grad_clip)
            losses.append(float(loss.detach()))
            if log and (step + 1) % max(1, c.warm_start_steps // 4) == 0:
                log(f"warm start {step + 1}/{c.warm_start_steps}: loss {np.mean(losses[-10:]):.3f}")
        self.model.eval()
        return {
            "warm_start_tasks": len(traces),
            "warm_start_steps": c.warm_start_steps,
            "warm_start_loss": float(np.mean(losses[-10:])) if losses else float("nan"),
        }

    def gold_traces(self, tasks: list[dict]) -> list[Trace]:
        """Traces that follow each task's gold actions (with the real tool outputs)."""
        golds = [json.loads(t.get("gold") or "[]") or [] for t in tasks]
        with self.pool.batch(self.envs, [(t["env_id"], t) for t in tasks]) as batch:
            firsts = batch.reset()
            traces = [
                Trace(text=episode_text((f or {}).get("observation") or "", (f or {}).get("tools") or []))
                for f in firsts
            ]
            ok = [
                f is not None and bool(g) and isinstance(g[0], dict)
                for f, g in zip(firsts, golds, strict=True)
            ]
            k = 0
            while True:
                calls = {}
                for b, (t, g) in enumerate(zip(traces, golds, strict=True)):
                    if not ok[b] or k >= len(g):
                        continue
                    mapped = _map_gold(t, g[k], k)
                    if mapped is None:
                        ok[b] = False
                        continue
                    t.tool_choice.append(mapped[0])
                    t.arg_choice.append(mapped[1])
                    calls[b] = g[k]
                    t.calls.append(g[k])
                if not calls:
                    break
                outs = batch.step(calls)
                for b, text in outs.items():
                    new, words = read_output(text, k + 1)
                    traces[b].text.candidates.extend(new)
                    traces[b].out_words.append(words)
                    traces[b].outputs.append(text)
                k += 1
            batch.finish({b: None for b in range(len(tasks))})
        out = []
        for b, t in enumerate(traces):
            if ok[b] and t.tool_choice and len(t.tool_choice) < self.config.max_actions + 1:
                t.tool_choice.append(0)  # then stop
                t.arg_choice.append([])
                out.append(t)
        return out

    def _episodes(self, tasks: list[dict], group_size: int, seed: int):
        """G sampled episodes of each task: (traces, verifier rewards, capped, trained rewards)."""
        rows = [t for t in tasks for _ in range(group_size)]
        traces = self.act(rows, seed)
        shape = (len(tasks), group_size)
        verified = np.array([float(t.result.get("reward", 0.0)) for t in traces]).reshape(shape)
        capped = np.array([self.capped(t) for t in traces]).reshape(shape)
        rewards = overrun_rewards(verified, capped, self.config.overrun_penalty)
        return traces, verified, capped, rewards

    def probe(self, tasks: list[dict], group_size: int, seed: int) -> np.ndarray:
        """The rewards (n, G) GRPO would train on, from G fresh episodes of each task, leaving the
        learner as it was: nothing is kept for ``learn`` (the bench's headroom probe)."""
        return self._episodes(tasks, group_size, seed)[3]

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, tasks: list[dict], samples: int, seed: int, episodes: bool = False) -> dict:
        """Expected reward over ``tasks`` (mean of task means over ``samples`` sampled episodes
        each) and its standard error from the within-task sampling noise, each task's episodes'
        rewards (``task_rewards``, for pass@k); with ``episodes``, also each episode's reward
        (``rewards``, tasks x samples) and details (``details``)."""
        if not tasks:
            return {"mean": float("nan"), "se": float("nan"), "tasks": 0}
        # r: the verifiers' reward, never the overrun penalty
        traces, r, capped, _ = self._episodes(tasks, samples, seed)
        task_means = r.mean(axis=1)
        by_env: dict[str, list[float]] = {}
        for t, m in zip(tasks, task_means, strict=True):
            by_env.setdefault(t["env_id"], []).append(float(m))
        return {
            **summarize(r),
            "by_env": {e: float(np.mean(v)) for e, v in sorted(by_env.items())},
            "by_task": {t["task_id"]: float(m) for t, m in zip(tasks, task_means, strict=True)},
            "task_rewards": {t["task_id"]: row.tolist() for t, row in zip(tasks, r, strict=True)},
            **({"rewards": r, "details": self._details(traces, r, capped, samples)} if episodes else {}),
        }

    # ------------------------------------------------------------------ checkpoint
    def state_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "version": self.version,
                "config": asdict(self.config),
            },
            buf,
        )
        return buf.getvalue()

    def digest(self) -> str:
        """A hash of what a checkpoint holds (the weights, the optimizer's state, the version), over
        the tensors' bytes rather than ``torch.save``'s archive: the step records it, so a
        checkpoint the lake no longer keeps can be made again and checked (:mod:`trainer.remake`)."""
        h = hashlib.sha256(str(self.version).encode())

        def add(name: str, value) -> None:
            h.update(name.encode())
            if isinstance(value, torch.Tensor):
                h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                h.update(repr(value).encode())

        for name, value in self.model.state_dict().items():
            add(name, value)
        opt = self.optimizer.state_dict()
        for key in sorted(opt["state"]):
            for name, value in sorted(opt["state"][key].items()):
                add(f"{key}.{name}", value)
        for i, group in enumerate(opt["param_groups"]):
            add(f"group{i}", sorted(group.items()))
        return h.hexdigest()

    def weight_bytes(self) -> bytes:
        """The policy's weights alone (what a warm start changes: it trains with an optimizer of
        its own)."""
        buf = io.BytesIO()
        torch.save(self.model.state_dict(), buf)
        return buf.getvalue()

    def load_weights(self, data: bytes) -> None:
        """Load weights written by :meth:`weight_bytes` (tensors only: nothing in the file runs)."""
        self.model.load_state_dict(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))
        self.model.eval()  # as a warm start leaves it

    def use_lr(self, lr: float) -> None:
        """Train the next updates at ``lr`` (the run's schedule gives each step its own rate)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def load_bytes(self, data: bytes) -> None:
        """Restore a checkpoint: weights, the optimizer's moments and the version. The learning rate
        and weight decay are this learner's settings, not the checkpoint's (the optimizer's state
        carries the ones it was saved with, so a run resumed with another `lr` kept training at
        the old one while its metrics reported the new)."""
        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        self.model.load_state_dict(blob["model"])
        self.optimizer.load_state_dict(blob["optimizer"])
        for group in self.optimizer.param_groups:
            group["lr"], group["weight_decay"] = self.config.lr, self.config.weight_decay
        self.version = int(blob["version"])


def _sample(logits: torch.Tensor, gen: torch.Generator, temperature: float, greedy: bool) -> torch.Tensor:
    if greedy or temperature <= 0:
        return logits.argmax(-1)
    if torch.isnan(logits).any():
        # never sample a stand-in action: a NaN here means non-finite weights, and a policy that
        # quietly always picks option 0 looks like a learning collapse in every metric
        raise FloatingPointError("the neural policy's logits are NaN (its weights are not finite)")
    probs = torch.softmax(logits / temperature, -1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _map_gold(trace: Trace, call: dict, k: int) -> tuple[int, list[int]] | None:
    """(tool choice, argument candidate indices) that reproduce a gold call, or None."""
    names = [t.name for t in trace.text.tools]
    if call.get("name") not in names:
        return None
    j = names.index(call["name"])
    spec = trace.text.tools[j]
    cands = trace.candidates_at(k)
    args = call.get("arguments") or {}
    chosen = []
    for pname, _, _ in spec.params[:MAX_PARAMS]:
        if pname not in args:
            return None
        want = str(args[pname])
        exact = [i for i, c in enumerate(cands) if c.text == want]
        if exact:  # prefer the instruction, then the most recent output
            instr = [i for i in exact if cands[i].source == 0]
            chosen.append(instr[0] if instr else max(exact, key=lambda i: cands[i].source))
            continue
        inside = [
            i
            for i, c in enumerate(cands)
            if c.text and c.shape != PAD and c.text.lower() in want.lower() and len(c.text) >= 3
        ]
        if not inside:
            return None
        chosen.append(max(inside, key=lambda i: len(cands[i].text)))
    return j + 1, chosen
