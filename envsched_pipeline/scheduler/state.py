"""Scheduler state: what the scheduler knows after step t, updated incrementally.

Everything is a flat numpy array over the pool's tasks (index i) or environments (index e), so
an update is O(pool) vector arithmetic and a selection never replays history. The state is saved
to the lake after every step (``state/step=t/scheduler.npz``; the lake keeps step 0's, every 20th
and the newest two, and folds any other again) and loaded for step t+1.

Decayed sums (docs/algorithm.md §2): with gamma = 2^(-1/h_long), after each step every sum is multiplied
by gamma and the new observation is added, so W_i = sum_k gamma^(t - t_k) and X_i likewise.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field

import numpy as np

from envsched_pipeline.rollouts import group_stats

CALIB_WINDOW = 8  # steps of (score, realized variance) pairs kept for calibration


@dataclass
class Observations:
    """One step's group outcomes (task outcomes only; infrastructure failures excluded).

    Arrays of shape (n,) over the tasks rolled out this step.
    """

    step: int
    task_idx: np.ndarray  # int indices into the state's tasks
    mean: np.ndarray
    var: np.ndarray  # population variance of the group's rewards
    dispersion: np.ndarray  # 1.0 if max - min > SPREAD_EPS (an informative group)
    rollouts: np.ndarray  # rollouts that produced a task outcome
    hack_flags: np.ndarray  # rewarded rollouts flagged by the identifier-hack detector
    rewarded: np.ndarray  # rollouts with reward > 0
    spent: np.ndarray | None = None  # all rollouts spent per task (incl. infra failures); exposure
    cost: np.ndarray | None = None  # mean seconds per rollout of the group (cost-aware scheduling)
    halves: np.ndarray | None = None  # the half each task was picked in (cold / coverage / exploit / ...)

    @classmethod
    def from_groups(
        cls, step: int, task_idx, rewards_per_task: list[np.ndarray], hack_flags=None
    ) -> Observations:
        means, vars_, disp, n, rew = [], [], [], [], []
        for r in rewards_per_task:
            r = np.asarray(r, dtype=float)
            m, v, d = group_stats(r)
            means.append(m)
            vars_.append(v)
            disp.append(d)
            n.append(len(r))
            rew.append(float((r > 0).sum()))
        k = len(rewards_per_task)
        return cls(
            step=int(step),
            task_idx=np.asarray(task_idx, dtype=np.int64),
            mean=np.asarray(means, dtype=float),
            var=np.asarray(vars_, dtype=float),
            dispersion=np.asarray(disp, dtype=float),
            rollouts=np.asarray(n, dtype=float),
            hack_flags=np.zeros(k) if hack_flags is None else np.asarray(hack_flags, dtype=float),
            rewarded=np.asarray(rew, dtype=float),
        )


@dataclass
class SchedulerState:
    task_ids: np.ndarray  # (N,) str
    env: np.ndarray  # (N,) int environment index
    env_ids: list[str]
    step: int = -1  # last step whose observations were applied
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    # per-step history kept short: realized mean variance, calibration pairs, picks of last steps
    realized_var: list[float] = field(default_factory=list)
    calib_u: list[np.ndarray] = field(default_factory=list)
    calib_s2: list[np.ndarray] = field(default_factory=list)
    recent_picks: list[np.ndarray] = field(default_factory=list)  # last 3 steps' picked indices
    extra: dict = field(default_factory=dict)  # JSON-able extras (baselines' scalars)
    # the spread model's training rows (features the state had when a task was picked, then whether
    # its group had spread), the most recent last; empty unless the config's spread_model fits one
    model_rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    TASK_ARRAYS = (
        "W",
        "Xm",
        "Xs2",
        "Xd",  # decayed sums (docs/algorithm.md §2)
        "ema_short",
        "ema_long",  # s2 EMAs for the recent-decline guard (docs/algorithm.md §5.5)
        "exposure",
        "last_seen",
        "n_groups",
        "recent_mean_0",
        "recent_mean_1",
        "recent_mean_2",  # last 3 group means (retirement)
        "recent_disp_0",
        "recent_disp_1",
        "recent_disp_2",  # last 3 group dispersions
        "retired",
        "retired_at",
        "hack_W",
        "hack_X",
        "cost_W",
        "cost_X",  # decayed seconds per rollout (cost-aware scheduling)
    )

    @classmethod
    def new(cls, task_ids, env_ids_per_task, content_hashes=None) -> SchedulerState:
        task_ids = np.asarray(task_ids)
        env_ids = sorted(set(env_ids_per_task))
        idx = {e: i for i, e in enumerate(env_ids)}
        env = np.array([idx[e] for e in env_ids_per_task], dtype=np.int64)
        n = len(task_ids)
        st = cls(task_ids=task_ids, env=env, env_ids=env_ids)
        for name in cls.TASK_ARRAYS:
            st.arrays[name] = np.zeros(n)
        st.arrays["last_seen"][:] = -1
        st.arrays["retired_at"][:] = -1
        for k in ("recent_mean", "recent_disp"):
            for j in range(3):
                st.arrays[f"{k}_{j}"][:] = np.nan
        st.arrays["content_hash"] = np.asarray(
            content_hashes if content_hashes is not None else task_ids
        ).astype(str)
        st.arrays["env_rollouts"] = np.zeros(len(env_ids))
        st.arrays["env_last_seen"] = np.full(len(env_ids), -1.0)
        return st

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays")
        if arrays is not None and name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @property
    def n_tasks(self) -> int:
        return len(self.task_ids)

    @property
    def n_envs(self) -> int:
        return len(self.env_ids)

    @property
    def observed(self) -> np.ndarray:
        return self.arrays["W"] > 0

    def index_of(self, task_ids) -> np.ndarray:
        lookup = self.extra.get("_index")
        if lookup is None or len(lookup) != self.n_tasks:
            lookup = {t: i for i, t in enumerate(self.task_ids.tolist())}
            self.extra["_index"] = lookup
        try:
            return np.array([lookup[t] for t in task_ids], dtype=np.int64)
        except KeyError as exc:
            raise KeyError(f"task {exc.args[0]!r} is not in the scheduler's pool") from exc

    # ------------------------------------------------------------- persist
    def _payload(self) -> dict[str, np.ndarray]:
        """What the state's file holds, by name: every array and the meta record."""
        meta = {
            "step": self.step,
            "env_ids": self.env_ids,
            "realized_var": self.realized_var,
            "extra": {k: v for k, v in self.extra.items() if not k.startswith("_")},
        }
        payload = {f"a_{k}": v for k, v in self.arrays.items()}
        payload["task_ids"] = self.task_ids.astype(str)
        payload["env"] = self.env
        for j, (u, s) in enumerate(zip(self.calib_u, self.calib_s2, strict=True)):
            payload[f"calib_u_{j}"] = u
            payload[f"calib_s2_{j}"] = s
        for j, p in enumerate(self.recent_picks):
            payload[f"picks_{j}"] = p
        if self.model_rows.size:
            payload["model_rows"] = self.model_rows
        payload["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
        return payload

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, **self._payload())
        return buf.getvalue()

    def digest(self) -> str:
        """A hash of the state's content (not of its compressed file, whose bytes a zip library
        may vary): two states with the same digest select and update alike."""
        h = hashlib.sha256()
        for name, value in sorted(self._payload().items()):
            a = np.ascontiguousarray(value)
            h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
            h.update(a.tobytes())
        return h.hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes) -> SchedulerState:
        z = np.load(io.BytesIO(data), allow_pickle=False)
        meta = json.loads(bytes(z["meta"]).decode())
        st = cls(task_ids=z["task_ids"], env=z["env"], env_ids=meta["env_ids"], step=meta["step"])
        st.arrays = {k[2:]: z[k].copy() for k in z.files if k.startswith("a_")}
        st.realized_var = list(meta["realized_var"])
        st.extra = dict(meta["extra"])
        if "model_rows" in z.files:
            st.model_rows = z["model_rows"].copy()
        j = 0
        while f"calib_u_{j}" in z.files:
            st.calib_u.append(z[f"calib_u_{j}"])
            st.calib_s2.append(z[f"calib_s2_{j}"])
            j += 1
        j = 0
        while f"picks_{j}" in z.files:
            st.recent_picks.append(z[f"picks_{j}"])
            j += 1
        return st


def align_state(state: SchedulerState, task_ids, env_ids_per_task, hashes) -> tuple[SchedulerState, dict]:
    """Re-key a state onto an edited pool by task *content hash* (edit-tolerant resume).

    Unchanged tasks keep all their history, also when renamed; new or edited tasks start fresh;
    removed tasks are archived inside the state (inactive) and restored if they come back.
    Returns the new state and a report of what matched.
    """
    old_hash = state.arrays.get("content_hash")
    if old_hash is None:  # a state written before hashes were stored: match by task id
        old_hash = state.task_ids.astype(str)
        hashes_for_match = np.asarray(task_ids).astype(str)
    else:
        hashes_for_match = np.asarray(hashes).astype(str)
    new = SchedulerState.new(task_ids, env_ids_per_task, hashes)
    n_old, n_new = state.n_tasks, new.n_tasks
    pos_old = {h: i for i, h in enumerate(np.asarray(old_hash).astype(str).tolist())}
    archive_hash = state.arrays.get("archive_hash", np.array([], dtype=str))
    pos_arch = {h: i for i, h in enumerate(np.asarray(archive_hash).astype(str).tolist())}
    src = np.array([pos_old.get(h, -1) for h in hashes_for_match.tolist()], dtype=np.int64)
    src_arch = np.array(
        [pos_arch.get(h, -1) if s < 0 else -1 for h, s in zip(hashes_for_match.tolist(), src, strict=True)],
        dtype=np.int64,
    )
    env_map = {e: i for i, e in enumerate(new.env_ids)}
    old_env_to_new = np.array([env_map.get(e, -1) for e in state.env_ids], dtype=np.int64)
    for name, arr in state.arrays.items():
        if name in ("content_hash",) or name.startswith("archive_"):
            continue
        arr = np.asarray(arr)
        if len(arr) == state.n_envs and name.startswith("env_"):
            out = new.arrays.get(name, np.zeros(new.n_envs, dtype=arr.dtype)).copy()
            ok = old_env_to_new >= 0
            out[old_env_to_new[ok]] = arr[ok]
            new.arrays[name] = out
            continue
        if n_old == 0 or len(arr) % n_old:
            continue
        k = len(arr) // n_old
        rows = arr.reshape(n_old, k)
        base = new.arrays.get(name)
        out = (
            base.reshape(n_new, k).copy()
            if base is not None and len(base) == n_new * k
            else np.zeros((n_new, k), dtype=arr.dtype)
        )
        out[src >= 0] = rows[src[src >= 0]]
        arch = state.arrays.get(f"archive_{name}")
        if arch is not None and (src_arch >= 0).any():
            out[src_arch >= 0] = np.asarray(arch).reshape(len(archive_hash), k)[src_arch[src_arch >= 0]]
        new.arrays[name] = out.reshape(-1) if k > 1 else out.reshape(n_new)
    # archive the rows of removed tasks (kept inactive; restored if the task returns)
    kept = set(src[src >= 0].tolist())
    removed = np.array([i for i in range(n_old) if i not in kept], dtype=np.int64)
    restored = (
        set(np.asarray(archive_hash).astype(str)[src_arch[src_arch >= 0]].tolist())
        if len(archive_hash)
        else set()
    )
    keep_arch = np.array(
        [h not in restored for h in np.asarray(archive_hash).astype(str).tolist()], dtype=bool
    )
    new_arch_hash = (
        np.concatenate(
            [np.asarray(archive_hash).astype(str)[keep_arch], np.asarray(old_hash).astype(str)[removed]]
        )
        if (len(archive_hash) or len(removed))
        else np.array([], dtype=str)
    )
    if len(new_arch_hash):
        new.arrays["archive_hash"] = new_arch_hash
        for name in SchedulerState.TASK_ARRAYS:
            prev = state.arrays.get(f"archive_{name}", np.zeros(0))
            prev = np.asarray(prev)[keep_arch] if len(prev) else np.zeros(0)
            new.arrays[f"archive_{name}"] = np.concatenate([prev, state.arrays[name][removed]])
    # per-step history stays; picked indices are remapped (picks of removed tasks drop out)
    remap = np.full(n_old, -1, dtype=np.int64)
    remap[src[src >= 0]] = np.flatnonzero(src >= 0)
    new.recent_picks = [remap[p][remap[p] >= 0] for p in state.recent_picks]
    new.realized_var, new.calib_u, new.calib_s2 = state.realized_var, state.calib_u, state.calib_s2
    new.model_rows = state.model_rows  # features and outcomes of past picks, not per task
    new.extra = {k: v for k, v in state.extra.items() if not k.startswith("_")}
    new.step = state.step
    report = {
        "kept": int((src >= 0).sum()),
        "restored": int((src_arch >= 0).sum()),
        "new": int(((src < 0) & (src_arch < 0)).sum()),
        "archived": int(len(removed)),
    }
    return new, report


def prior_from(
    previous: SchedulerState, task_ids, env_ids_per_task, hashes, discount: float
) -> SchedulerState:
    """A fresh state whose statistics start from a previous run's final state (matched by content
    hash), discounted: W and X sums are multiplied by ``discount``, so the old run counts as
    ``discount`` of an observation per group it saw. Exposure, retirement and constraints start
    empty: this run has spent nothing yet."""
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"prior discount must be in [0, 1], got {discount}")
    aligned, report = align_state(previous, task_ids, env_ids_per_task, hashes)
    fresh = SchedulerState.new(task_ids, env_ids_per_task, hashes)
    for k in ("W", "Xm", "Xs2", "Xd", "cost_W", "cost_X"):
        if k in aligned.arrays:
            fresh.arrays[k] = aligned.arrays[k] * discount
    fresh.extra["prior"] = {**report, "discount": discount, "from_step": previous.step}
    return fresh
