"""reasoning-gym pool: chosen datasets x N seeded tasks; each dataset is one environment.

The task's data are regenerated inside the sandbox worker from (dataset, size, seed, index), so
the lake stores only the question and the identity; ``score_answer`` is the verifier.
"""

from __future__ import annotations

import json

from envs.registry import PoolData
from envs.runtime import Runtime, register, time_limit

DEFAULT_DATASETS = (
    "basic_arithmetic",
    "chain_sum",
    "leg_counting",
    "base_conversion",
    "caesar_cipher",
    "count_bits",
    "letter_counting",
    "number_sorting",
    "spell_backward",
    "word_sorting",
    "gcd",
    "lcm",
)


def load(
    name: str = "reasoning_gym",
    datasets: tuple[str, ...] = DEFAULT_DATASETS,
    per_dataset: int = 50,
    seed: int = 0,
) -> PoolData:
    import reasoning_gym as rg  # optional pool package, loaded when this pool is used

    envs, tasks = [], []
    for k, ds_name in enumerate(datasets):
        ds = rg.create_dataset(ds_name, size=per_dataset, seed=seed + k)
        envs.append(
            {
                "pool": name,
                "env_id": ds_name,
                "summary": f"reasoning-gym dataset {ds_name}",
                "introduction": "Answer the question. Put only the final answer in your reply.",
                "rules": "",
                "tools": "[]",
                "class_name": "",
                "code": "",
                "code_sha": "",
            }
        )
        for j in range(per_dataset):
            e = ds[j]
            ident = {"dataset": ds_name, "size": per_dataset, "seed": seed + k, "index": j}
            tasks.append(
                {
                    "pool": name,
                    "task_id": f"{ds_name}-{j:04d}",
                    "env_id": ds_name,
                    "content_hash": f"rg:{ds_name}:{seed + k}:{j}",
                    "instruction": e["question"],
                    "init_state": json.dumps(ident),
                    "checks": json.dumps([{"check_item": "answer is correct", "check_func": "score_answer"}]),
                    "gold": json.dumps([{"name": "answer", "arguments": {"answer": str(e["answer"])}}]),
                    "class_name": "",
                }
            )
    return PoolData(name=name, environments=envs, tasks=tasks)


# imported by a sandbox worker before it forks a process per environment (envs/sandbox.py), so
# that each environment's process does not import the package again
PRELOAD = ("reasoning_gym",)
_CACHE: dict[tuple, object] = {}


@register("reasoning_gym")
class ReasoningGymRuntime(Runtime):
    def __init__(self, spec: dict):
        self.task = spec["task"]
        self.ident = json.loads(self.task["init_state"])
        self.answer: str | None = None
        self.timeout = float(spec.get("check_timeout", 5.0))

    def _dataset(self):
        import reasoning_gym as rg  # optional pool package, loaded when this pool is used

        key = (self.ident["dataset"], self.ident["size"], self.ident["seed"])
        if key not in _CACHE:
            _CACHE[key] = rg.create_dataset(key[0], size=key[1], seed=key[2])
        return _CACHE[key]

    def reset(self) -> dict:
        return {"observation": self.task["instruction"], "tools": []}

    def step(self, call: dict) -> str:
        if call.get("name") == "answer":  # the gold "action" form used by the simulated learner
            self.answer = str((call.get("arguments") or {}).get("answer", ""))
            return "answer recorded"
        return f"Error: unknown tool {call.get('name')!r} (this task has no tools; answer in text)"

    def finish(self, answer: str | None = None) -> dict:
        ds = self._dataset()
        entry = ds[self.ident["index"]]
        given = answer if answer is not None else self.answer
        err = None
        try:
            with time_limit(self.timeout):
                score = float(ds.score_answer(given, entry)) if given is not None else 0.0
        except Exception as exc:
            score, err = 0.0, f"{type(exc).__name__}: {exc}"
        return {
            "reward": round(score, 4),
            "checks": [{"item": "answer is correct", "passed": score >= 1.0, "error": err}],
            "error": err,
        }
