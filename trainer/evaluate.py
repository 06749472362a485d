"""Held-out evaluation of a trained policy outside training (``envsched evaluate``).

The policy after step K, from its checkpoint (the neural learner's of any trained step, one the lake
dropped made again from the kept one before it; a language model's periodic ones, ``latest``, or
``best``), on the pool's held-out split: unseen tasks of the training environments (``seen``) and
tasks of environments never trained on (``unseen``), each the mean over tasks of the mean reward of
``samples`` episodes, with the standard error from the within-task sampling noise. With the run's
own settings it samples as the run's evaluation at that step did, so it repeats the recorded score;
more samples or tasks, or another sampling seed, give a second look. Nothing is written to the lake.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa

from envsched_pipeline.errors import StepError
from envsched_pipeline.lake import Lake, best_evaluated, heldout_scores
from envsched_pipeline.run import EVALUATED_POLICIES, RunSpec, require_run
from trainer.step import CHECKPOINT_FILES, checkpoint_rel


def evaluate(
    lake: Lake,
    step: int | None = None,
    best: bool = False,
    samples: int | None = None,
    tasks: int | None = None,
    seed: int | None = None,
    log=print,
    known: dict[int, bytes] | None = None,
    pool: str | None = None,
) -> dict:
    """The held-out scores of the policy after ``step`` (default: the newest kept) or of the best
    one (``best``: a language model's kept copy; the neural learner's best evaluated step):
    ``{"policy", "step", "checkpoint", "splits": [{"split", "tasks", "samples", "mean", "se"}],
    "recorded": {split: score}, "by_env": [...] (:func:`by_environment`), "episodes": table,
    "made_again"}`` (the episodes in the lake's ``eval_rollouts`` columns; ``made_again``: how a
    neural checkpoint the lake dropped was made again, in memory, None when it was read).
    ``samples`` and ``tasks`` replace the run's evaluation settings, ``seed`` its sampling seed (the
    tasks chosen stay the run's). A StepError names what is missing: a policy without weights, a
    pool without a held-out split, a step not trained, a language model's checkpoint not kept (and
    the steps that are). ``known``: neural checkpoints made again so far, by step, which a dropped
    one is made again from where nearer than a kept one, and which it joins (:func:`evaluate_steps`).
    ``pool``: another pool of the lake whose held-out split to score the policy on (a transfer
    evaluation; the result's ``pool`` names it, ``own_pool`` is False and ``recorded`` is empty:
    the run recorded its own pool's scores)."""
    spec = evaluated_run(lake)
    on = pool or spec.pool
    if on != spec.pool and not lake.read("tasks", pool=on, columns=["task_id"]).num_rows:
        raise StepError(
            f"--pool {on}: no such pool in {lake.root} (`envsched pool create` or `envsched pool import` "
            "adds one, `envsched pool list` shows them)"
        )
    if not lake.read("eval_tasks", pool=on).num_rows:
        raise StepError(f"pool {on!r} has no held-out split (eval_tasks) to evaluate on")
    given = {k: v for k, v in {"eval_samples": samples, "eval_tasks": tasks}.items() if v is not None}
    asked = replace(spec, pool=on, policy_config={**spec.policy_config, **given})
    asked.policy_settings().validate(asked.policy)  # --samples / --tasks within their bounds
    if spec.policy == "neural":
        res = _neural(lake, asked, step, best, seed, log, known)
    else:
        res = _language_model(lake, asked, step, best, seed, log)
    own = on == spec.pool
    return {**res, "pool": on, "own_pool": own, "recorded": res["recorded"] if own else {}}


def evaluated_run(lake: Lake) -> RunSpec:
    """The lake's run, when its policy is one envsched evaluates; else a StepError saying why not."""
    spec = require_run(lake)
    if spec.trainer == "external" or spec.policy not in EVALUATED_POLICIES:
        outside = " (an outside trainer's run)" if spec.trainer == "external" else ""
        raise StepError(
            f"the run's policy is {spec.policy!r}{outside}: envsched evaluates the policies it trains "
            f"({', '.join(EVALUATED_POLICIES)}); an outside trainer records its own (ExternalRun.log_eval)"
        )
    return spec


def evaluable_steps(lake: Lake) -> list[int]:
    """The steps whose policy :func:`evaluate` can score: every step a neural run trained (a
    checkpoint the lake dropped is made again), a language model's kept checkpoints."""
    if evaluated_run(lake).policy == "neural":
        return lake.steps("train_metrics")
    from trainer.policy_step import kept_checkpoints  # torch: a language model's checkpoints, as above

    return sorted({s for s, _ in kept_checkpoints(lake)})


def evaluated_steps(lake: Lake) -> list[int]:
    """The steps the run evaluated (its ``heldout_*`` records), in order; a StepError when none."""
    steps = list(heldout_scores(lake))
    if not steps:
        raise StepError("--steps evaluated: the run has not evaluated a step yet")
    return steps


def evaluate_steps(lake: Lake, steps: Sequence[int], log=print, **settings) -> list[dict]:
    """:func:`evaluate` of the policy after each of ``steps`` in turn (the same ``settings``: samples,
    tasks, seed, pool), every step checked before the first is scored: a StepError names those that
    cannot be (not trained, or a language model's checkpoint not kept) and those that can."""
    can = evaluable_steps(lake)
    allowed = set(can)
    missing = [s for s in steps if s not in allowed]
    if missing:
        shown = (
            f"{can[0]}..{can[-1]}"
            if can and can == list(range(can[0], can[-1] + 1))
            else ", ".join(map(str, can[-12:]))
        )
        raise StepError(
            f"--steps: the policy after step(s) {', '.join(map(str, missing))} cannot be scored; "
            f"these can: {shown or 'none yet'}"
        )
    done, known = {}, {}  # earliest first: a dropped checkpoint is made again from the nearest one
    for i, step in enumerate(sorted(steps), start=1):
        log(f"evaluating the policy after step {step} ({i}/{len(steps)})")
        done[step] = evaluate(lake, step=step, log=log, known=known, **settings)
    return [done[step] for step in steps]


def _recorded(lake: Lake, step: int) -> dict:
    """The held-out scores the run recorded after ``step``, by split."""
    return {
        name.removeprefix("heldout_"): score for name, score in heldout_scores(lake).get(step, {}).items()
    }


def _choose(step: int | None, kept: list[int], what: str) -> int:
    """``step`` when its ``what`` is kept (default: the newest kept); else a StepError naming them."""
    if not kept:
        raise StepError(f"no {what} is kept: the run has trained no step yet")
    if step is None:
        return kept[-1]
    if step not in kept:
        raise StepError(
            f"--step {step}: the {what} after that step is not kept; these are: {', '.join(map(str, kept[-12:]))}"
        )
    return step


def by_environment(episodes: pa.Table) -> list[dict]:
    """Each held-out environment's score (the mean over its tasks of each task's mean reward, as a
    split's), weakest first within each split: ``{"split", "env_id", "tasks", "episodes", "mean"}``."""
    tasks: dict[tuple, dict[str, list[float]]] = {}
    for r in episodes.select(["split", "env_id", "task_id", "reward"]).to_pylist():
        tasks.setdefault((r["split"], r["env_id"]), {}).setdefault(r["task_id"], []).append(r["reward"])
    rows = [
        {
            "split": split,
            "env_id": env,
            "tasks": len(by_task),
            "episodes": sum(len(v) for v in by_task.values()),
            "mean": sum(sum(v) / len(v) for v in by_task.values()) / len(by_task),
        }
        for (split, env), by_task in tasks.items()
    ]
    return sorted(rows, key=lambda r: (r["split"], r["mean"], r["env_id"]))


def _result(
    spec: RunSpec, lake: Lake, step: int, where: str, splits: list[dict], episodes, made: dict | None = None
) -> dict:
    """``made``: how a dropped checkpoint was made again (trainer.remake.made_again), None when read."""
    return {
        "policy": spec.policy,
        "step": step,
        "checkpoint": where,
        "splits": splits,
        "recorded": _recorded(lake, step),
        "by_env": by_environment(episodes),
        "episodes": episodes,
        "made_again": made,
    }


def _neural(
    lake: Lake, spec: RunSpec, step: int | None, best: bool, seed: int | None, log, known: dict | None
) -> dict:
    from trainer.neural.runner import (  # torch: the learner's own
        EVAL_SAMPLES,
        heldout_evaluation,
        load_learner,
        new_learner,
    )
    from trainer.remake import made_again  # the learner's steps run again: torch, as above

    name = CHECKPOINT_FILES["neural"]
    kept = lake.artifact_steps("checkpoints", name)  # one listing, as made_again reads it
    if best:
        record = best_evaluated(lake)
        if record is None:
            raise StepError("--best: the run has no held-out evaluation yet to pick the best policy by")
        step = int(record["step"])
    elif step is None:
        step = _choose(step, kept, "neural learner's checkpoint")
    made = None
    if step in kept:
        learner = load_learner(lake, spec, step + 1, log)  # the one the step after it starts from
        where = lake.where(checkpoint_rel(step, name))
    else:
        trained = lake.steps("train_metrics")
        if step not in trained:
            raise StepError(
                f"--step {step}: the run has not trained step {step}"
                + (f" (its steps: {trained[0]}..{trained[-1]})" if trained else "")
            )
        # the lake keeps step 0's checkpoint, every KEEP_EVERY-th, the newest two and the best: any other is made
        # again from the kept one before it, in memory (nothing is written)
        data, made = made_again(lake, step, log, known)
        if known is not None:
            known[step] = data
        learner = new_learner(lake, spec)
        learner.load_bytes(data)
        source = f"step {made['from']}'s checkpoint" if made["from_kept"] else f"step {made['from']}'s policy"
        where = (
            f"not kept: made again from {source}, {len(made['remade'])} step(s) each matching the digest "
            f"it recorded, {made['seconds']:.1f} s"
        )
    try:
        results, episodes = heldout_evaluation(lake, spec, learner, step, seed=seed)
    finally:
        learner.close()
    samples = spec.policy_settings().eval_samples or EVAL_SAMPLES
    splits = [
        {"split": split, "tasks": res["tasks"], "samples": samples, "mean": res["mean"], "se": res["se"]}
        for split, res in results.items()
    ]
    return _result(spec, lake, step, where, splits, episodes, made)


def _language_model(lake: Lake, spec: RunSpec, step: int | None, best: bool, seed: int | None, log) -> dict:
    import torch  # the model's: loaded only when a language model is evaluated

    from trainer import ranks  # torch's (a process of its own: one rank)
    from trainer.engines import HFEngine, VLLMEngine  # torch / vLLM: as above
    from trainer.model import load_policy, qwen3_tokenizer  # transformers: as above
    from trainer.policy_step import (  # torch: as above
        agent_loop,
        best_checkpoint,
        heldout_evaluation,
        kept_checkpoints,
    )
    from trainer.update import GRPOConfig  # torch: as above

    if best:
        folder, record = best_checkpoint(lake)
        if record is None:
            raise StepError("--best: no best held-out policy is kept (the run has not been evaluated yet)")
        path, step = folder / "policy", int(record["step"])
    else:
        found = dict(kept_checkpoints(lake))  # a periodic one over `latest` at a tie: it stays
        step = _choose(step, sorted(found), "language model's checkpoint")
        path = found[step]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pc = spec.policy_settings()
    cfg = GRPOConfig.from_dict(pc.set_values())
    tok = qwen3_tokenizer()
    if spec.policy == "vllm":
        engine = VLLMEngine(str(path))
    else:
        engine = HFEngine(load_policy(str(path), device=device), tok, device=device)
    loop = agent_loop(engine, tok, cfg)
    session = types.SimpleNamespace(lake=lake, spec=spec, pc=pc, ranks=ranks.init(device))
    held = heldout_evaluation(session, step, loop, log, seed=seed)
    split_of = held["rollouts"].column("split").to_pylist()
    splits = [
        {
            "split": e["benchmark"].removeprefix("heldout_"),
            "tasks": split_of.count(e["benchmark"].removeprefix("heldout_")) // held["samples"],
            "samples": held["samples"],
            "mean": e["score"],
            "se": e["se"],
        }
        for e in held["evals"]
    ]
    return _result(spec, lake, step, str(path), splits, held["rollouts"])
