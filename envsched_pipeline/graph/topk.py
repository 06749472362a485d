"""Sparse top-k candidate neighbours per task (never a dense N x N matrix): within-environment
similarities one environment block at a time (mean cosine of the six views), cross-environment ones
through the distinct topology vectors; incremental updates for added tasks; the lake's edge rows."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from envsched_pipeline.graph.topology import offline_topology, topology_matrix, topology_text
from envsched_pipeline.graph.views import view_matrices
from envsched_pipeline.scheduler.graph import TaskGraph


def _topk_rows(sim: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, indices and values of the k largest entries, sorted descending (-inf excluded)."""
    n, m = sim.shape
    k = min(k, m)
    if k <= 0:
        return np.full((n, 0), -1, np.int64), np.zeros((n, 0), np.float32)
    part = np.argpartition(-sim, k - 1, axis=1)[:, :k] if k < m else np.tile(np.arange(m), (n, 1))
    vals = np.take_along_axis(sim, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    idx = np.take_along_axis(part, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    bad = ~np.isfinite(vals) | (vals <= 0)
    idx = np.where(bad, -1, idx)
    vals = np.where(bad, 0.0, vals)
    return idx.astype(np.int64), vals.astype(np.float32)


def topk_graph(
    task_ids: np.ndarray,
    env_of: np.ndarray,
    mats: list[sp.csr_matrix],
    topo: sp.csr_matrix | None,
    within_candidates: int = 24,
    cross_candidates: int = 48,
    chunk: int = 1024,
    rows_subset: np.ndarray | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    _cat=None,
    _uniq=None,
) -> TaskGraph:
    """Top candidates per task: mean cosine of the views inside each environment block; topology
    cosine across environments in row chunks. ``rows_subset``: compute only these rows (the
    incremental path for newly added tasks); other rows stay empty."""
    n = len(task_ids)
    within_idx = np.full((n, within_candidates), -1, np.int64)
    within_sim = np.zeros((n, within_candidates), np.float32)
    envs = sorted(set(env_of.tolist()))
    env_code = np.searchsorted(envs, env_of)
    wanted = np.ones(n, dtype=bool) if rows_subset is None else np.isin(np.arange(n), rows_subset)
    order = np.argsort(env_code, kind="stable")
    bounds = np.searchsorted(env_code[order], np.arange(len(envs) + 1))
    cat = _cat if _cat is not None else _concat_views(mats)
    for e_no in range(len(envs)):
        rows = order[bounds[e_no] : bounds[e_no + 1]]
        targets = rows[wanted[rows]]
        if not len(targets) or cat is None:
            continue
        contiguous = rows[-1] - rows[0] + 1 == len(rows)
        block = cat[rows[0] : rows[-1] + 1] if contiguous else cat[rows]
        for start in range(0, len(targets), chunk):
            part = targets[start : start + chunk]
            local = np.searchsorted(rows, part) if contiguous else None
            s = ((block[local] if contiguous else cat[part]) @ block.T).toarray().astype(np.float32)
            self_pos = (
                np.searchsorted(rows, part)
                if np.all(np.diff(rows) > 0)
                else np.array([np.flatnonzero(rows == p)[0] for p in part])
            )
            s[np.arange(len(part)), self_pos] = -np.inf  # no self edge
            idx, val = _topk_rows(s, within_candidates)
            within_idx[part, : idx.shape[1]] = np.where(idx >= 0, rows[np.maximum(idx, 0)], -1)
            within_sim[part, : val.shape[1]] = val
        if progress:
            progress("within", e_no + 1, len(envs))
    cross_idx = np.full((n, cross_candidates), -1, np.int64)
    cross_sim = np.zeros((n, cross_candidates), np.float32)
    if topo is not None:
        targets = np.flatnonzero(wanted)
        dense = topo.toarray().astype(np.float32) if topo.shape[1] <= 512 and _uniq is None else None
        uniq = _uniq if _uniq is not None else (_unique_rows(dense) if dense is not None else None)
        if uniq is not None and len(uniq[0]) <= 30_000:
            _cross_by_unique(uniq, env_code, targets, cross_idx, cross_sim, cross_candidates, progress)
        else:
            # many distinct topologies: exact chunked top-k, chunk bounded to ~40M similarities
            step = max(16, min(chunk, int(4e7 // max(n, 1))))
            for start in range(0, len(targets), step):
                part = targets[start : start + step]
                s = dense[part] @ dense.T if dense is not None else (topo[part] @ topo.T).toarray()
                s[env_code[part][:, None] == env_code[None, :]] = -np.inf
                idx, val = _topk_rows(s, cross_candidates)
                cross_idx[part, : idx.shape[1]] = idx
                cross_sim[part, : val.shape[1]] = val
                if progress:
                    progress("cross", min(len(targets), start + step), len(targets))
    return TaskGraph(np.asarray(task_ids), within_idx, within_sim, cross_idx, cross_sim)


def _concat_views(mats: list[sp.csr_matrix]) -> sp.csr_matrix | None:
    """The views side by side, scaled by 1/sqrt(#views): a single product then gives the mean of
    the per-view cosines (each view's rows are L2-normalized)."""
    if not mats:
        return None
    return (sp.hstack(mats, format="csr") * (1.0 / np.sqrt(len(mats)))).astype(np.float32).tocsr()


def _unique_rows(dense: np.ndarray):
    """Distinct topology vectors and each task's index into them. Rows are keyed by two random
    projections (float64; distinct rows collide with probability zero, and a 1-D unique is far
    faster than a row-wise one), then keys whose rows are byte-for-byte the same are merged: some
    BLAS kernels (OpenBLAS's AVX-512 ones) round a row's product by where it sits in the matrix, so
    identical rows could get two keys, which moved ties and every pick resting on the graph. Merged
    groups keep the projection order, so the graphs the AVX2 kernels built before are unchanged."""
    if dense.shape[1] == 0:  # no topology terms: every task has the same (empty) topology
        return dense[:1], np.zeros(len(dense), dtype=np.int64)
    r = np.random.default_rng(12345).standard_normal((dense.shape[1], 2))
    proj = dense.astype(np.float64) @ r
    key = proj[:, 0] + 1j * proj[:, 1]
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    reps = np.ascontiguousarray(dense[first])  # one row per key, in key order
    rows = reps.view(np.dtype((np.void, reps.dtype.itemsize * reps.shape[1]))).ravel()
    _, lead, same = np.unique(rows, return_index=True, return_inverse=True)  # lead: each group's first key
    order = np.argsort(lead)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return reps[lead[order]], rank[same.reshape(-1)][inv.reshape(-1)]


def _cross_by_unique(uniq, env_code, targets, cross_idx, cross_sim, k, progress=None) -> None:
    """Exact cross-environment top-k through the distinct topologies: tasks with the same topology
    vector have the same similarity to every other task, so similarities are computed between
    distinct vectors only, and each task takes, in descending similarity, the members of the
    nearest topologies outside its own environment. Ties are broken by a per-task random order, so
    neighbour lists (and in-degrees) spread over all equally similar tasks instead of a few hubs."""
    u, inv = uniq
    n_u = len(u)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(n_u + 1))
    members = [order[bounds[a] : bounds[a + 1]] for a in range(n_u)]
    max_env = int(np.bincount(env_code).max()) if len(env_code) else 0
    rng = np.random.default_rng(0)
    by_topo: dict[int, list[int]] = {}
    for t in targets:
        by_topo.setdefault(int(inv[t]), []).append(int(t))
    done = 0
    for a, tasks in by_topo.items():
        sims = u @ u[a]
        pool_idx, pool_sim, got = [], [], 0
        for b in np.argsort(-sims, kind="stable"):
            if sims[b] <= 0 or got >= k + max_env:
                break
            pool_idx.append(members[b])
            pool_sim.append(np.full(len(members[b]), sims[b], np.float32))
            got += len(members[b])
        if not pool_idx:
            continue
        pidx, psim = np.concatenate(pool_idx), np.concatenate(pool_sim)
        penv = env_code[pidx]
        for t in tasks:
            ok = penv != env_code[t]
            cand, cs = pidx[ok], psim[ok]
            pick = np.lexsort((rng.random(len(cand)), -cs))[:k]
            cross_idx[t, : len(pick)] = cand[pick]
            cross_sim[t, : len(pick)] = cs[pick]
        done += len(tasks)
        if progress:
            progress("cross", done, len(targets))


def _merge_topk(idx_a, sim_a, idx_b, sim_b, k):
    """Merge two candidate lists per row, keeping the k best, deduplicated (vectorized)."""
    idx = np.concatenate([idx_a, idx_b], axis=1)
    sim = np.concatenate([sim_a, np.where(idx_b >= 0, sim_b, 0.0)], axis=1).astype(np.float32)
    sim = np.where(idx >= 0, sim, -np.inf)
    # a pair present in both lists: keep one copy (sort by index, mark equal neighbours)
    by_idx = np.argsort(idx, axis=1, kind="stable")
    sorted_idx = np.take_along_axis(idx, by_idx, axis=1)
    dup_sorted = np.zeros_like(sorted_idx, dtype=bool)
    dup_sorted[:, 1:] = (sorted_idx[:, 1:] == sorted_idx[:, :-1]) & (sorted_idx[:, 1:] >= 0)
    dup = np.zeros_like(dup_sorted)
    np.put_along_axis(dup, by_idx, dup_sorted, axis=1)
    sim = np.where(dup, -np.inf, sim)
    order = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    idx = np.take_along_axis(idx, order, axis=1)
    sim = np.take_along_axis(sim, order, axis=1)
    bad = ~np.isfinite(sim)
    return np.where(bad, -1, idx), np.where(bad, 0.0, sim).astype(np.float32)


def add_tasks(
    graph: TaskGraph,
    env_of: np.ndarray,
    mats: list[sp.csr_matrix],
    topo: sp.csr_matrix | None,
    new_rows: np.ndarray,
    chunk: int = 1024,
) -> TaskGraph:
    """Incremental update for newly added tasks. ``graph`` is already over the full task order
    (``graph.reindex(all_ids)``: new tasks have no edges yet); ``mats``/``topo`` cover all tasks.
    Computes only similarities that involve a new task: the new rows in full, and for old rows
    their similarity to the new tasks, merged into their candidate lists."""
    new_rows = np.asarray(new_rows, dtype=np.int64)
    if len(new_rows) == 0:
        return graph
    n = len(graph.task_ids)
    cw, cx = graph.within_idx.shape[1], graph.cross_idx.shape[1]
    cat = _concat_views(mats)
    dense = topo.toarray().astype(np.float32) if topo is not None and topo.shape[1] <= 512 else None
    uniq = _unique_rows(dense) if dense is not None else None
    # cross-environment rows of the new tasks (within-environment ones are done per block below)
    fresh = topk_graph(graph.task_ids, env_of, [], topo, cw, cx, chunk, rows_subset=new_rows, _uniq=uniq)
    wi, ws = graph.within_idx.copy(), graph.within_sim.copy()
    xi, xs = graph.cross_idx.copy(), graph.cross_sim.copy()
    xi[new_rows], xs[new_rows] = fresh.cross_idx[new_rows], fresh.cross_sim[new_rows]
    is_new = np.zeros(n, dtype=bool)
    is_new[new_rows] = True
    envs = sorted(set(env_of.tolist()))
    env_code = np.searchsorted(envs, env_of)
    order = np.argsort(env_code, kind="stable")
    bounds = np.searchsorted(env_code[order], np.arange(len(envs) + 1))
    # one similarity block per touched environment: the new rows in full, and the old rows
    # against the new tasks (merged only where a new task enters their candidate list)
    for e in np.unique(env_code[new_rows]) if cat is not None else []:
        rows = order[bounds[e] : bounds[e + 1]]
        contiguous = rows[-1] - rows[0] + 1 == len(rows)
        block = cat[rows[0] : rows[-1] + 1] if contiguous else cat[rows]
        sim = (block @ block.T).toarray().astype(np.float32)
        np.fill_diagonal(sim, -np.inf)
        new_l = np.flatnonzero(is_new[rows])
        old_l = np.flatnonzero(~is_new[rows])
        idx, val = _topk_rows(sim[new_l], cw)
        k = idx.shape[1]
        wi[rows[new_l], :k] = np.where(idx >= 0, rows[np.maximum(idx, 0)], -1)
        ws[rows[new_l], :k] = val
        if len(old_l) == 0:
            continue
        s = sim[np.ix_(old_l, new_l)]
        old = rows[old_l]
        cutoff = np.where(wi[old, -1] >= 0, ws[old, -1], 0.0)
        hit = s.max(axis=1) > cutoff
        if not hit.any():
            continue
        rows_hit = old[hit]
        idx, val = _topk_rows(s[hit], min(cw, len(new_l)))
        idx = np.where(idx >= 0, rows[new_l][np.maximum(idx, 0)], -1)
        wi[rows_hit], ws[rows_hit] = _merge_topk(wi[rows_hit], ws[rows_hit], idx, val, cw)
    # old rows x new tasks of other environments, through the distinct topology vectors
    if topo is not None and uniq is not None:
        u, inv = uniq
        sims_u = u @ dense[new_rows].T  # (distinct topologies, new tasks)
        old_all = np.flatnonzero(~is_new)
        best_u = sims_u.max(axis=1)
        cutoff = np.where(xi[old_all, -1] >= 0, xs[old_all, -1], 0.0)
        cand = old_all[best_u[inv[old_all]] > cutoff]
        for start in range(0, len(cand), chunk):
            part = cand[start : start + chunk]
            s = sims_u[inv[part]].copy()
            s[env_code[part][:, None] == env_code[new_rows][None, :]] = -np.inf
            idx, val = _topk_rows(s, min(cx, len(new_rows)))
            idx = np.where(idx >= 0, new_rows[np.maximum(idx, 0)], -1)
            xi[part], xs[part] = _merge_topk(xi[part], xs[part], idx, val, cx)
    return TaskGraph(graph.task_ids, wi, ws, xi, xs)


def build_graph(
    tasks: list[dict],
    tool_names_by_env: dict[str, list[str]],
    topologies: dict[str, str] | None = None,
    within_candidates: int = 24,
    cross_candidates: int = 48,
    chunk: int = 1024,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[TaskGraph, dict]:
    """Build the candidate graph for ``tasks`` (lake rows). ``topologies``: task_id -> topology
    text (default: the offline extractor). Returns the graph and build statistics."""
    task_ids = np.array([t["task_id"] for t in tasks])
    env_of = np.array([t["env_id"] for t in tasks])
    mats = view_matrices(tasks, tool_names_by_env)
    if topologies is None:
        topologies = {t["task_id"]: topology_text(offline_topology(t)) for t in tasks}
    topo = topology_matrix([topologies.get(t["task_id"], "") for t in tasks])
    g = topk_graph(
        task_ids,
        env_of,
        list(mats.values()),
        topo,
        within_candidates,
        cross_candidates,
        chunk,
        progress=progress,
    )
    stats = {
        "tasks": len(tasks),
        "environments": len(set(env_of.tolist())),
        "within_edges": int((g.within_idx >= 0).sum()),
        "cross_edges": int((g.cross_idx >= 0).sum()),
        "views": len(mats),
    }
    return g, stats


def graph_to_edges(g: TaskGraph, pool: str) -> dict[str, np.ndarray]:
    """Columns of the lake ``edges`` table."""
    cols: dict[str, list] = {"src": [], "dst": [], "kind": [], "similarity": [], "rank": []}
    for kind, idx, sim in (("within", g.within_idx, g.within_sim), ("cross", g.cross_idx, g.cross_sim)):
        r, c = np.nonzero(idx >= 0)
        cols["src"].append(g.task_ids[r])
        cols["dst"].append(g.task_ids[idx[r, c]])
        cols["kind"].append(np.full(len(r), kind))
        cols["similarity"].append(sim[r, c].astype(np.float64))
        cols["rank"].append(c.astype(np.int64))
    out = {k: np.concatenate(v) for k, v in cols.items()}
    out["pool"] = np.full(len(out["src"]), pool)
    return out


def graph_from_edges(
    task_ids: np.ndarray, src, dst, kind, sim, rank, within_candidates: int = 24, cross_candidates: int = 48
) -> TaskGraph:
    pos = {t: i for i, t in enumerate(np.asarray(task_ids).tolist())}
    n = len(task_ids)
    out = {}
    for k, cand in (("within", within_candidates), ("cross", cross_candidates)):
        idx = np.full((n, cand), -1, np.int64)
        val = np.zeros((n, cand), np.float32)
        sel = np.asarray(kind) == k
        s_i = np.array([pos.get(t, -1) for t in np.asarray(src)[sel]], dtype=np.int64)
        d_i = np.array([pos.get(t, -1) for t in np.asarray(dst)[sel]], dtype=np.int64)
        rk = np.asarray(rank)[sel].astype(np.int64)
        sv = np.asarray(sim)[sel].astype(np.float32)
        ok = (s_i >= 0) & (d_i >= 0) & (rk < cand)
        idx[s_i[ok], rk[ok]] = d_i[ok]
        val[s_i[ok], rk[ok]] = sv[ok]
        out[k] = (idx, val)
    return TaskGraph(
        np.asarray(task_ids), out["within"][0], out["within"][1], out["cross"][0], out["cross"][1]
    )
