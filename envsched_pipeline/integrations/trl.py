"""envsched as the data source of TRL's GRPO trainer (``pip install trl``; the ``trl`` extra).

TRL's ``GRPOTrainer`` draws prompts through a sampler and scores each generation batch with reward
functions. :func:`grpo_trainer` builds one whose sampler hands it envsched's batches (each manifest
task G times, a generation batch per envsched step) and whose reward function scores the completions
and hands the rewards back to the run, so the next batches are chosen from them:

    run = ExternalRun(pool="synthetic", lake="warehouse/trl", batch_size=64, group_size=8, select_lag=1)
    args = GRPOConfig(output_dir="out", num_generations=8, per_device_train_batch_size=64 * 8,
                      steps_per_generation=1, max_steps=200, ...)
    trainer = grpo_trainer(run, model, tokenizer, args)   # rewards: the pool's own verifiers
    trainer.train()

Each prompt is what an agent is first shown (the environment's tool schemas in Qwen3's chat format
and the task's instruction); :class:`VerifierScore` runs the tool calls of a completion in the
task's environment (sandboxed) and returns its checklist verifier's reward. Another scorer is any
``score(task_ids, completions) -> rewards``.

TRL's data loader asks for the next generation batch before the current one is scored (accelerate
fetches a batch ahead), so a run driven by TRL selects one step ahead of its rollouts: started with
``select_lag=1`` (``select_lag`` >= 1 is checked when a generation batch is drawn once per
optimizer step; with ``steps_per_generation`` or ``num_iterations`` > 1 the batch is scored
before the next is asked for, and no lag is needed).

Several processes (``accelerate launch`` / ``torchrun``, one per GPU): each generates its share of a
step (accelerate hands process k the k-th slice of each generation batch), the rewards of every
slice are gathered, and process 0 hands the whole step to the run and chooses the manifests (the
others read them). Build the run on process 0 first (``with PartialState().main_process_first():
run = ExternalRun(...)``), so the others resume the run it started.

Held-out evaluation: ``grpo_trainer(..., heldout=N)`` gives TRL the pool's evaluation split as its
``eval_dataset`` (N tasks of each split, drawn once from the run's seed: the tasks the internal
trainer evaluates), scores those completions with the verifiers of their own environments (the
unseen split's are environments the run never trains on), never hands them to the run as a step,
and records each evaluation in the run's ``evals`` (``heldout_seen`` / ``heldout_unseen`` with
standard errors, after the last step scored), so `envsched status`, the step table and
`envsched report --against` show them as they show the internal trainer's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from envs.registry import episode_spec
from envs.sandbox import SandboxPool
from envsched_pipeline.api import ExternalRun
from envsched_pipeline.errors import ConfigError, StepError
from envsched_pipeline.lake import Lake
from envsched_pipeline.rollouts import ERROR_CLASSES
from trainer import chat
from trainer.heldout import heldout_tasks, summarize
from trainer.realenv import every_environment

PARTS = (("", "score"), ("_se", "se"))  # a recorded held-out score's metrics: its mean, its error
MANIFEST_WAIT_S = 600.0  # how long a process other than 0 waits for process 0 to choose a manifest


def _gathered(items: list, world: int) -> list:
    """``items`` of every process, in process order (this process's alone when there is one)."""
    if world == 1:
        return list(items)
    from accelerate.utils import gather_object  # TRL's own dependency, loaded with the trainer

    return gather_object(list(items))


def _on_process_0(work: Callable[[], object], rank: int, world: int):
    """``work()`` on process 0, its result on every process; an error there is raised on every
    process (never one process failing while the others wait for it in the next collective): the
    error itself on process 0, a StepError naming it on the others (an error need not pickle)."""
    result, error = None, None
    if rank == 0:
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - handed to every process, raised below
            error = exc
    if world == 1:
        if error is not None:
            raise error
        return result
    said = f"{type(error).__name__}: {error}" if error is not None else None
    result, said = _gathered([(result if error is None else None, said)], world)[0]
    if error is not None:
        raise error
    if said is not None:
        raise StepError(f"process 0 failed: {said}")
    return result


def task_prompts(lake: Lake, pool: str, tools_in_prompt: bool = True) -> list[dict]:
    """Every task of ``pool`` as TRL's dataset rows: ``task_id``, ``env_id`` and ``prompt``, the
    Qwen3 chat text an agent is first shown (system turn with the environment's tool schemas, the
    instruction as the user turn, the assistant header). ``tools_in_prompt=False`` leaves the
    schemas out (a policy trained on the pool's tools already; prompts a tenth as long)."""
    rows = lake.read("tasks", pool=pool, columns=["task_id", "env_id", "instruction"]).to_pylist()
    return _prompt_rows(rows, lake.read("environments", pool=pool).to_pylist(), tools_in_prompt)


def heldout_prompts(
    lake: Lake, pool: str, seed: int, per_split: int | None = None, tools_in_prompt: bool = True
) -> list[dict]:
    """The pool's evaluation tasks as TRL's dataset rows (as :func:`task_prompts`, with ``split``:
    "seen" for unseen tasks of the training environments, "unseen" for tasks of environments the
    pool does not contain): ``per_split`` of each split drawn once from ``seed`` (all when None),
    the tasks the internal trainer evaluates a run of that seed on. Empty for a pool without an
    evaluation split."""
    chosen = heldout_tasks(lake.read("eval_tasks", pool=pool).to_pylist(), seed, per_split)
    rows = [{**r, "split": split} for split, picked in chosen.items() for r in picked]
    return _prompt_rows(rows, list(every_environment(lake, pool).values()), tools_in_prompt)


def _prompt_rows(tasks: list[dict], environments: list[dict], tools_in_prompt: bool) -> list[dict]:
    tools = {e["env_id"]: json.loads(e["tools"] or "[]") for e in environments}
    return [
        {
            "task_id": r["task_id"],
            "env_id": r["env_id"],
            **({"split": r["split"]} if "split" in r else {}),
            "prompt": chat.render_system(tools.get(r["env_id"], []) if tools_in_prompt else [])
            + chat.render_user(r["instruction"])
            + chat.assistant_header(),
        }
        for r in tasks
    ]


class VerifierScore:
    """``score(task_ids, completions) -> rewards`` by the pool's own verifiers: each completion's
    ``<tool_call>`` blocks run in its task's environment (a sandbox worker; malformed calls are
    dropped, as the agent loop reports them), its text is the final answer, and the reward is the
    checklist verifier's. An episode the sandbox ends (time limit, crash) scores 0. ``heldout``:
    the pool's evaluation tasks (``eval_tasks``) in their own environments, not its training
    tasks."""

    def __init__(self, lake: Lake, pool: str, workers: int = 2, heldout: bool = False):
        if heldout:
            self.envs = every_environment(lake, pool)
            self.tasks = {t["task_id"]: t for t in lake.read("eval_tasks", pool=pool).to_pylist()}
        else:
            self.envs = {e["env_id"]: e for e in lake.read("environments", pool=pool).to_pylist()}
            self.tasks = {t["task_id"]: t for t in lake.read("tasks", pool=pool).to_pylist()}
        self.sandbox = SandboxPool(workers=workers)
        self.last: list[dict] = []  # the last call's episode results, in order

    def __call__(self, task_ids: Sequence[str], completions: Sequence[str]) -> list[float]:
        jobs = []
        for task_id, text in zip(task_ids, completions, strict=True):
            task = self.tasks[task_id]
            parsed = chat.parse_assistant(text)
            calls = [{"name": c["name"], "arguments": c["arguments"]} for c in parsed.tool_calls]
            jobs.append((episode_spec(self.envs[task["env_id"]], task), calls, parsed.content.strip()))
        self.last = self.sandbox.map_episodes(jobs)
        return [float(r.get("reward") or 0.0) for r in self.last]

    def close(self) -> None:
        self.sandbox.close()


class HeldoutScores:
    """TRL's evaluations of a run's held-out prompts: ``score`` scores an evaluation batch (its
    ``split`` per completion) and keeps the rewards; ``record`` turns an evaluation's rewards into
    ``heldout_seen`` / ``heldout_unseen`` (the mean over tasks of each task's mean, with the standard
    error of its samples' noise, as the internal trainer reports them) in the run's ``evals``, after
    the last step the run scored, and starts the next evaluation afresh. With several processes
    each scores its share of the evaluation, and process 0 records them all."""

    def __init__(
        self,
        run: ExternalRun,
        score: Callable[[list[str], list[str]], list[float]],
        rank: int = 0,
        world: int = 1,
    ):
        self.run, self.scorer, self.rank, self.world = run, score, rank, world
        self.rewards: dict[tuple[str, str], list[float]] = {}

    def score(self, task_ids: list[str], splits: list[str], texts: list[str]) -> list[float]:
        rewards = [float(r) for r in self.scorer(task_ids, texts)]
        for task, split, r in zip(task_ids, splits, rewards, strict=True):
            self.rewards.setdefault((split, task), []).append(r)
        return rewards

    def record(self) -> dict | None:
        """The evaluation's scores by benchmark, recorded (None when nothing was scored)."""
        got: dict[tuple[str, str], list[float]] = {}
        for part in _gathered([self.rewards], self.world):
            for key, rewards in part.items():
                got.setdefault(key, []).extend(rewards)
        self.rewards = {}
        if not got:
            return None
        scores = {}
        for split in sorted({s for s, _ in got}):
            per_task = [r for (s, _), r in sorted(got.items()) if s == split]
            n = min(len(r) for r in per_task)  # TRL gives each prompt its G completions in one batch
            res = summarize([r[:n] for r in per_task])
            scores[f"heldout_{split}"] = {"score": res["mean"], "se": res["se"]}

        def log() -> None:
            step = self.run.next_step - 1
            if step < 0:
                raise StepError("an evaluation before the run's first step has nothing to be recorded after")
            self.run.log_eval(step, scores)

        _on_process_0(log, self.rank, self.world)
        return scores


class EnvSchedReward:
    """A TRL reward function: scores a generation batch, which must be the run's next step (each
    manifest task G times, in manifest order), hands the rewards to the run (``observe``) and
    returns them. A batch of held-out rows (a ``split`` column: TRL's evaluation of
    :func:`heldout_prompts`) is scored by ``heldout`` (a :class:`HeldoutScores`) instead, and never
    reaches the run as a step."""

    __name__ = "envsched"  # TRL names a reward function's metrics by it

    def __init__(
        self,
        run: ExternalRun,
        score: Callable[[list[str], list[str]], list[float]],
        heldout: HeldoutScores | None = None,
        rank: int = 0,
        world: int = 1,
    ):
        self.run, self.score, self.heldout = run, score, heldout
        self.rank, self.world = rank, world

    def __call__(self, prompts, completions, task_id=None, split=None, **_) -> list[float]:
        if task_id is None:
            raise ValueError("the dataset has no task_id column: build it with task_prompts()")
        texts = [c if isinstance(c, str) else (c[-1].get("content") or "") for c in completions]
        if split is not None:
            if self.heldout is None:
                raise StepError("held-out rows (a split column) reached a trainer built without heldout=")
            return self.heldout.score(list(task_id), list(split), texts)
        step = self.run.next_step
        g = self.run.spec.group_size
        whole = [p["task_id"] for p in self.run.manifest(step) for _ in range(g)]
        n = len(whole) // self.world  # accelerate hands process k the k-th slice of the batch
        expected = whole[self.rank * n : (self.rank + 1) * n]
        if list(task_id) != expected:
            raise StepError(
                f"TRL scored {len(task_id)} completions that are not step {step}'s batch ({len(expected)}: "
                "each manifest task G times, in order): one generation batch must be one envsched step "
                "(per_device_train_batch_size x steps_per_generation x processes = B x G)"
            )
        rewards = [float(r) for r in self.score(list(task_id), texts)]
        rows = [
            {"task_id": t, "rollout": (self.rank * n + j) % g, "reward": r}
            for j, (t, r) in enumerate(zip(task_id, rewards, strict=True))
        ]
        # a scorer that ran episodes (VerifierScore) says which the sandbox ended: those count as
        # rollouts spent, not as the task's outcomes
        episodes = getattr(self.score, "last", None) or []
        if len(episodes) == len(rows):
            for row, ep in zip(rows, episodes, strict=True):
                if ep.get("error_class") in ERROR_CLASSES:
                    row["error_class"] = ep["error_class"]
        every = _gathered(rows, self.world)  # every process's slice, in order: the whole step
        _on_process_0(lambda: self.run.observe(step, every), self.rank, self.world)
        return rewards


class EnvSchedSampler:
    """The indices of ``task_ids`` (the dataset's rows) of each step's manifest, each G times, the
    whole batch ``repeat`` times (TRL draws a generation batch once per ``steps_per_generation x
    num_iterations`` optimizer steps), from the run's next step to its ``max_steps``. A torch
    ``Sampler`` by protocol (``__iter__``, ``__len__``). Process 0 chooses each manifest; another
    process (``rank`` > 0) waits for it (at most ``MANIFEST_WAIT_S``) and reads it."""

    def __init__(self, run: ExternalRun, task_ids: Sequence[str], repeat: int = 1, rank: int = 0):
        self.run, self.repeat, self.rank = run, repeat, rank
        self.index = {t: i for i, t in enumerate(task_ids)}

    def _wait_for(self, step: int) -> None:
        deadline = time.monotonic() + MANIFEST_WAIT_S
        while not self.run.lake.has("manifests", step=step):
            if time.monotonic() > deadline:
                raise StepError(
                    f"process {self.rank}: process 0 chose no manifest for step {step} in {MANIFEST_WAIT_S:.0f} s"
                )
            time.sleep(0.2)

    def __iter__(self):
        g = self.run.spec.group_size
        for step in range(self.run.next_step, self.run.spec.max_steps):
            if self.rank > 0:
                self._wait_for(step)
            try:
                picks = self.run.manifest(step)
            except StepError as exc:
                raise StepError(
                    f"{exc}. TRL's data loader asked for step {step}'s batch before the step before "
                    "it was scored: start the run with select_lag=1 (ExternalRun(select_lag=1))"
                ) from exc
            batch = [self.index[p["task_id"]] for p in picks for _ in range(g)]
            for _ in range(self.repeat):
                yield from batch

    def __len__(self) -> int:
        steps = max(self.run.spec.max_steps - self.run.next_step, 0)
        return steps * self.run.spec.batch_size * self.run.spec.group_size * self.repeat


def grpo_trainer(
    run: ExternalRun,
    model,
    tokenizer,
    args,
    score=None,
    tools_in_prompt: bool = True,
    heldout: int = 0,
    **kwargs,
):
    """A ``trl.GRPOTrainer`` over ``run``: its prompts are the run's pool (:func:`task_prompts`), its
    sampler the run's batches (:class:`EnvSchedSampler`), its reward ``score`` handed back to the run
    (:class:`EnvSchedReward`; default :class:`VerifierScore`). ``args`` (a ``GRPOConfig``) must make
    one generation batch one envsched step, which is checked: ``num_generations`` = G,
    ``per_device_train_batch_size x steps_per_generation x processes`` = B x G.
    ``tools_in_prompt``: as :func:`task_prompts`. ``heldout`` > 0: TRL evaluates (when ``args``
    says: ``eval_strategy``, ``eval_steps``) on that many of each held-out split's tasks
    (:func:`heldout_prompts`), ``num_generations_eval`` (else G) samples each, scored by the
    verifiers (``VerifierScore(heldout=True)``; a custom ``score`` scores them too) and recorded in
    the run's ``evals`` (:class:`HeldoutScores`). ``kwargs`` go to ``GRPOTrainer``.

    On a machine without Triton (a CPU) TRL scores every prompt position over the vocabulary
    (151,936 for Qwen3), so there a step costs about prompt length x batch x vocabulary."""
    from datasets import Dataset  # the trl extra's, loaded only when a trainer is built
    from trl import GRPOTrainer  # the trl extra's, loaded only when a trainer is built

    spec = run.spec
    b, g = spec.batch_size, spec.group_size
    world, rank = args.world_size, args.process_index
    if world > 1:  # a process still in its gloo group at exit can abort after a good run
        from trainer.ranks import leave_at_exit  # torch's, loaded only when a trainer is built

        leave_at_exit()
    per_generation = args.per_device_train_batch_size * args.steps_per_generation * world
    if args.num_generations != g:
        raise ConfigError(
            f"GRPOConfig.num_generations is {args.num_generations}; the run's group size G is {g}"
        )
    if per_generation != b * g:
        raise ConfigError(
            f"GRPOConfig.per_device_train_batch_size x steps_per_generation x {world} process(es) is "
            f"{per_generation}; one generation batch must be one envsched step, B x G = {b * g}"
        )
    if kwargs.get("eval_dataset") is not None:
        raise ConfigError(
            "eval_dataset: the envsched reward hands every batch it scores to the run as a training "
            "step; evaluate on the pool's held-out split with heldout=N, or with your own callback "
            "(and ExternalRun.log_eval)"
        )
    if isinstance(heldout, bool) or not isinstance(heldout, int) or heldout < 0:
        raise ConfigError(f"heldout must be a whole number of tasks per split, 0 or more; got {heldout!r}")
    evaluates = str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"
    if heldout and not evaluates:
        raise ConfigError(
            f"heldout={heldout}: GRPOConfig.eval_strategy is 'no'; set eval_strategy='steps' and eval_steps"
        )
    if heldout and args.eval_on_start:
        raise ConfigError(
            "GRPOConfig.eval_on_start: an evaluation before the run's first step has no step to be "
            "recorded after; the run's first evaluation comes after its first step"
        )
    repeat = args.num_iterations * args.steps_per_generation
    if repeat == 1 and spec.select_lag < 1:
        raise ConfigError(
            "TRL's data loader asks for the next generation batch before the current one is scored: "
            "start the run with select_lag=1 (ExternalRun(select_lag=1))"
        )
    rows = task_prompts(run.lake, spec.pool, tools_in_prompt)
    scorer = score if score is not None else VerifierScore(run.lake, spec.pool)
    held = heldout_prompts(run.lake, spec.pool, spec.seed, heldout, tools_in_prompt) if heldout else []
    if heldout and not held:
        raise ConfigError(f"heldout={heldout}: pool {spec.pool} has no held-out split (eval_tasks)")
    scores = None
    if held:
        held_scorer = score if score is not None else VerifierScore(run.lake, spec.pool, heldout=True)
        scores = HeldoutScores(run, held_scorer, rank, world)
        kwargs["eval_dataset"] = Dataset.from_list(held)

    class EnvSchedGRPOTrainer(GRPOTrainer):
        def _get_train_sampler(self, dataset=None):
            return EnvSchedSampler(run, [r["task_id"] for r in rows], repeat=repeat, rank=rank)

        def evaluate(self, *a, **kw):
            """TRL's evaluation, then its held-out scores recorded in the run, logged (TRL's
            trackers: ``eval_heldout_seen``, ...) and returned with the other metrics."""
            metrics = super().evaluate(*a, **kw)
            recorded = scores.record() if scores is not None else None
            if recorded:
                extra = {f"eval_{k}{part}": v[key] for k, v in recorded.items() for part, key in PARTS}
                self.log(extra)
                metrics.update(extra)
            return metrics

    return EnvSchedGRPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        reward_funcs=[EnvSchedReward(run, scorer, scores, rank, world)],
        processing_class=tokenizer,
        **kwargs,
    )
