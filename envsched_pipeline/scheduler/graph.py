"""The task graph as the scheduler uses it: candidate neighbours per task (built elsewhere, by
:mod:`envsched_pipeline.graph`), from which it keeps the observed ones at selection time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass
class TaskGraph:
    """Candidate neighbours per task, indexed like the pool's task list."""

    task_ids: np.ndarray
    within_idx: np.ndarray  # (N, Cw) int, -1 = none; sorted by similarity desc
    within_sim: np.ndarray
    cross_idx: np.ndarray  # (N, Cx)
    cross_sim: np.ndarray
    _sym: sp.csr_matrix | None = None

    def symmetric(self) -> sp.csr_matrix:
        """max(A, A^T) over both edge kinds (for the MMR similarity penalty)."""
        if self._sym is None:
            n = len(self.task_ids)
            rows, cols, vals = [], [], []
            for idx, sim in ((self.within_idx, self.within_sim), (self.cross_idx, self.cross_sim)):
                r, c = np.nonzero(idx >= 0)
                rows.append(r)
                cols.append(idx[r, c])
                vals.append(sim[r, c])
            r, c, v = (np.concatenate(x) if x else np.array([]) for x in (rows, cols, vals))
            a = sp.csr_matrix((v.astype(np.float32), (r, c)), shape=(n, n))
            self._sym = a.maximum(a.T).tocsr()
        return self._sym

    def reindex(self, task_ids: np.ndarray) -> TaskGraph:
        """The same graph over another task order (tasks missing from the graph get no edges)."""
        pos = {t: i for i, t in enumerate(self.task_ids.tolist())}
        new_of_old = np.full(len(self.task_ids), -1, np.int64)
        take = np.full(len(task_ids), -1, np.int64)
        for j, t in enumerate(task_ids.tolist()):
            i = pos.get(t)
            if i is not None:
                take[j] = i
                new_of_old[i] = j

        def remap(idx, sim):
            out_i = np.full((len(task_ids), idx.shape[1]), -1, np.int64)
            out_s = np.zeros((len(task_ids), idx.shape[1]), np.float32)
            ok = take >= 0
            src = idx[take[ok]]
            mapped = np.where(src >= 0, new_of_old[np.maximum(src, 0)], -1)
            out_i[ok] = mapped
            out_s[ok] = np.where(mapped >= 0, sim[take[ok]], 0.0)
            return out_i, out_s

        wi, ws = remap(self.within_idx, self.within_sim)
        ci, cs = remap(self.cross_idx, self.cross_sim)
        return TaskGraph(np.asarray(task_ids), wi, ws, ci, cs)
