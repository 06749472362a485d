"""Topologies, features and the task graph in the lake (no Dagster).

    topologies/pool=P   task_id, topology (json), text, extractor, prompt_sha
    features/pool=P     task_id, view, nnz  (+ artifacts features/pool=P/<view>.npz, CSR matrices)
    edges/pool=P        src, dst, kind (within|cross), similarity, rank

The assets call these; the scheduler loads the graph with :func:`load_graph`.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from envsched_pipeline.errors import LakeError
from envsched_pipeline.graph.topk import graph_from_edges, graph_to_edges, topk_graph
from envsched_pipeline.graph.topology import offline_topology, topology_matrix, topology_text
from envsched_pipeline.graph.views import view_matrices
from envsched_pipeline.lake import Lake
from envsched_pipeline.scheduler.graph import TaskGraph


def pool_rows(lake: Lake, pool: str) -> tuple[list[dict], dict[str, list[str]]]:
    tasks = lake.read("tasks", pool=pool)
    if tasks.num_rows == 0:
        raise KeyError(f"pool {pool!r} is not in {lake.root}")
    envs = lake.read("environments", pool=pool).to_pylist()
    tools = {}
    for e in envs:
        try:
            tools[e["env_id"]] = [t["function"]["name"] for t in json.loads(e["tools"] or "[]")]
        except (KeyError, TypeError, json.JSONDecodeError):
            tools[e["env_id"]] = []
    return sorted(tasks.to_pylist(), key=lambda t: t["task_id"]), tools


def build_topologies(lake: Lake, pool: str, extractor=None, progress: Callable | None = None) -> dict:
    """Extract every task's abstract topology (offline by default, or an LLM extractor object with
    ``extract(tasks) -> {task_id: topology dict}`` and ``name``/``prompt_sha``)."""
    tasks, _ = pool_rows(lake, pool)
    t0 = time.perf_counter()
    if extractor is None:
        topo = {t["task_id"]: offline_topology(t) for t in tasks}
        name, prompt_sha = "offline", ""
    else:
        topo = extractor.extract(tasks, progress=progress)
        name, prompt_sha = extractor.name, extractor.prompt_sha
    rows = [
        {
            "pool": pool,
            "task_id": t["task_id"],
            "env_id": t["env_id"],
            "content_hash": t["content_hash"],
            "topology": json.dumps(topo[t["task_id"]], sort_keys=True),
            "text": topology_text(topo[t["task_id"]]),
            "extractor": name,
            "prompt_sha": prompt_sha,
            "operations": ",".join(topo[t["task_id"]].get("operations", [])),
        }
        for t in tasks
    ]
    lake.write("topologies", rows, pool=pool)
    return {
        "tasks": len(rows),
        "extractor": name,
        "seconds": time.perf_counter() - t0,
        "distinct_topologies": len({r["text"] for r in rows}),
    }


def build_features(lake: Lake, pool: str) -> dict:
    tasks, tools = pool_rows(lake, pool)
    t0 = time.perf_counter()
    mats = view_matrices(tasks, tools)
    rows = []
    for view, m in mats.items():
        buf = io.BytesIO()
        sp.save_npz(buf, m)
        lake.write_bytes(lake.artifact_rel("features_npz", None, f"pool={pool}/{view}.npz"), buf.getvalue())
        nnz = np.diff(m.indptr)
        rows += [
            {
                "pool": pool,
                "task_id": t["task_id"],
                "view": view,
                "nnz": int(k),
                "vocabulary": int(m.shape[1]),
            }
            for t, k in zip(tasks, nnz, strict=True)
        ]
    lake.write("features", rows, pool=pool)
    return {
        "views": list(mats),
        "rows": len(rows),
        "seconds": time.perf_counter() - t0,
        "vocabulary": {v: int(m.shape[1]) for v, m in mats.items()},
    }


def load_features(lake: Lake, pool: str) -> dict[str, sp.csr_matrix]:
    feats = lake.read("features", pool=pool)
    views = sorted(set(feats.column("view").to_pylist())) if feats.num_rows else []
    out = {}
    for v in views:
        rel = lake.artifact_rel("features_npz", None, f"pool={pool}/{v}.npz")
        data = lake.read_bytes(rel)
        if data is None:
            raise LakeError(f"{lake.where(rel)} is missing: re-materialize the features of pool {pool!r}")
        out[v] = sp.load_npz(io.BytesIO(data)).tocsr()
    return out


def build_task_graph(lake: Lake, pool: str, progress: Callable | None = None) -> dict:
    tasks, tools = pool_rows(lake, pool)
    t0 = time.perf_counter()
    mats = load_features(lake, pool) or view_matrices(tasks, tools)
    topo_tab = lake.read("topologies", pool=pool)
    texts = (
        dict(zip(topo_tab.column("task_id").to_pylist(), topo_tab.column("text").to_pylist(), strict=True))
        if topo_tab.num_rows
        else {t["task_id"]: topology_text(offline_topology(t)) for t in tasks}
    )
    ids = np.array([t["task_id"] for t in tasks])
    env_of = np.array([t["env_id"] for t in tasks])
    g = topk_graph(
        ids, env_of, list(mats.values()), topology_matrix([texts.get(t, "") for t in ids]), progress=progress
    )
    cols = graph_to_edges(g, pool)
    lake.write("edges", pa.table(cols), pool=pool)
    return {
        "tasks": len(ids),
        "within_edges": int((g.within_idx >= 0).sum()),
        "cross_edges": int((g.cross_idx >= 0).sum()),
        "seconds": time.perf_counter() - t0,
        "graph": g,
    }


def pool_signature(lake: Lake, pool: str) -> str:

    t = lake.read("tasks", pool=pool, columns=["task_id", "content_hash"]).sort_by("task_id")
    blob = "\n".join(
        f"{a}|{b}"
        for a, b in zip(t.column("task_id").to_pylist(), t.column("content_hash").to_pylist(), strict=True)
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_graph(lake: Lake, pool: str) -> None:
    """Build topologies (offline), features and edges if the lake lacks them, or rebuild them when
    the pool was re-imported with edits (topologies of unchanged tasks are kept, e.g. LLM ones)."""
    meta_path = f"graph_meta/pool={pool}.json"
    sig = pool_signature(lake, pool)
    meta = lake.read_json(meta_path) or {}
    stale = meta.get("signature") not in (None, sig) or (
        meta.get("signature") is None
        and lake.has("edges", pool=pool)
        and _edge_tasks(lake, pool) != _pool_task_set(lake, pool)
    )
    if stale:
        _refresh_topologies(lake, pool)
    if not lake.has("topologies", pool=pool):
        build_topologies(lake, pool)
    if stale or not lake.has("features", pool=pool):
        build_features(lake, pool)
    if stale or not lake.has("edges", pool=pool):
        build_task_graph(lake, pool)
    if meta.get("signature") != sig:
        lake.write_json(meta_path, {"signature": sig})


def _pool_task_set(lake: Lake, pool: str) -> set[str]:
    return set(lake.read("tasks", pool=pool, columns=["task_id"]).column("task_id").to_pylist())


def _edge_tasks(lake: Lake, pool: str) -> set[str]:
    return set(lake.read("edges", pool=pool, columns=["src"]).column("src").to_pylist())


def _refresh_topologies(lake: Lake, pool: str) -> None:
    """Keep the topology of every task whose content is unchanged; extract the rest offline."""
    if not lake.has("topologies", pool=pool):
        return
    tasks, _ = pool_rows(lake, pool)
    old = {r["task_id"]: r for r in lake.read("topologies", pool=pool).to_pylist()}
    rows = []
    for t in tasks:
        r = old.get(t["task_id"])
        if r is None or r.get("content_hash", t["content_hash"]) != t["content_hash"]:
            topo = offline_topology(t)
            r = {
                "pool": pool,
                "task_id": t["task_id"],
                "env_id": t["env_id"],
                "topology": json.dumps(topo, sort_keys=True),
                "text": topology_text(topo),
                "extractor": "offline",
                "prompt_sha": "",
                "operations": ",".join(topo.get("operations", [])),
            }
        r["content_hash"] = t["content_hash"]
        rows.append(r)
    lake.write("topologies", rows, pool=pool)


# the graph each (lake, pool) last loaded in this process, with the edges and task order it was
# built from (a step's selection and its statistics fold both load it, and so does every step);
# the LOADED_GRAPHS most recently used
_LOADED: OrderedDict[tuple[str, str], tuple[pa.Table, np.ndarray, TaskGraph]] = OrderedDict()
_LOADED_LOCK = threading.Lock()
LOADED_GRAPHS = 4


def load_graph(lake: Lake, pool: str, state=None) -> TaskGraph:
    """The pool's graph, ordered like ``state.task_ids`` (or the sorted task ids). Built once per
    process for the same edges and task order (the edges partition is read, through the lake's
    cache, every time, so a rebuilt graph is picked up); its arrays are read-only."""
    ensure_graph(lake, pool)
    e = lake.read("edges", pool=pool, columns=["src", "dst", "kind", "similarity", "rank"])
    if state is not None:
        ids = np.asarray(state.task_ids)
    else:
        ids = np.array(
            sorted(lake.read("tasks", pool=pool, columns=["task_id"]).column("task_id").to_pylist())
        )
    key = (str(lake.root), pool)
    with _LOADED_LOCK:
        held = _LOADED.get(key)
        if held is not None:
            _LOADED.move_to_end(key)
    if held is not None and held[0].equals(e) and np.array_equal(held[1], ids):
        return held[2]
    graph = _graph_of_edges(e, ids.copy())  # its own task ids: they are made read-only below
    for a in (graph.task_ids, graph.within_idx, graph.within_sim, graph.cross_idx, graph.cross_sim):
        a.flags.writeable = False  # shared by every later load of the same graph in this process
    with _LOADED_LOCK:
        _LOADED[key] = (e, graph.task_ids, graph)
        while len(_LOADED) > LOADED_GRAPHS:
            _LOADED.popitem(last=False)
    return graph


def _graph_of_edges(e: pa.Table, ids: np.ndarray) -> TaskGraph:
    cols = {c: e.column(c).to_numpy(zero_copy_only=False) for c in e.column_names}
    within = int(cols["rank"][cols["kind"] == "within"].max() + 1) if (cols["kind"] == "within").any() else 0
    cross = int(cols["rank"][cols["kind"] == "cross"].max() + 1) if (cols["kind"] == "cross").any() else 0
    return graph_from_edges(
        ids,
        cols["src"],
        cols["dst"],
        cols["kind"],
        cols["similarity"],
        cols["rank"],
        within_candidates=max(within, 1),
        cross_candidates=max(cross, 1),
    )
