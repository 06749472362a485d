"""LLM topology extraction against a real OpenAI-compatible HTTP server on 127.0.0.1."""

import pytest

from envs.registry import load_synthetic
from envsched_pipeline.graph.llm import LLMTopologyExtractor, MalformedAnswer, validate_topology
from tests.openai_stub import StubOpenAI


def tasks(n=6):
    data = load_synthetic("synthetic", n_envs=2, tasks_per_env=n // 2, seed=1)
    return data.tasks


def extractor(stub, tmp_path, **kw):
    kw.setdefault("backoff", 0.01)
    return LLMTopologyExtractor(
        base_url=stub.base_url, model="stub-model", api_key="k", cache_dir=tmp_path / "cache", **kw
    )


def test_results_match_canned_answers(tmp_path):
    ts = tasks()
    with StubOpenAI() as stub:
        ex = extractor(stub, tmp_path, concurrency=3)
        out = ex.extract(ts)
    assert set(out) == {t["task_id"] for t in ts}
    for t in ts:
        if "Retire" in t["instruction"]:
            assert "delete" in out[t["task_id"]]["operations"]
    assert ex.usage["requests"] == len(ts) and ex.usage["fallbacks"] == 0
    assert ex.usage["prompt_tokens"] > 0
    assert stub.requests[0]["model"] == "stub-model"
    assert "Never include tool names" in stub.requests[0]["messages"][0]["content"]


@pytest.mark.parametrize("fault", ["429", "500", "malformed", "badschema"])
def test_retries_each_fault_then_succeeds(tmp_path, fault):
    ts = tasks(2)[:1]
    with StubOpenAI(script=[fault, fault]) as stub:
        ex = extractor(stub, tmp_path, concurrency=1)
        out = ex.extract(ts)
    assert ex.usage["requests"] == 3 and ex.usage["retries"] == 2
    assert ex.usage["fallbacks"] == 0 and out[ts[0]["task_id"]]["operations"]


def test_timeout_is_retried(tmp_path):
    ts = tasks(2)[:1]
    with StubOpenAI(script=["slow"], slow_seconds=2.0) as stub:
        ex = extractor(stub, tmp_path, concurrency=1, timeout=0.5)
        ex.extract(ts)
    assert ex.usage["errors"].get("timeout") == 1 and ex.usage["requests"] == 2


def test_gives_up_then_falls_back_to_offline(tmp_path):
    ts = tasks(2)[:1]
    with StubOpenAI(script=["500"] * 10) as stub:
        ex = extractor(stub, tmp_path, concurrency=1, max_attempts=3)
        out = ex.extract(ts)
    assert ex.usage["fallbacks"] == 1 and ex.usage["requests"] == 3
    assert out[ts[0]["task_id"]]["operations"]  # the offline topology


def test_resume_from_cache_costs_no_requests(tmp_path):
    ts = tasks(6)
    with StubOpenAI() as stub:
        first = extractor(stub, tmp_path).extract(ts[:3])  # "interrupted" after 3 tasks
        ex = extractor(stub, tmp_path)
        out = ex.extract(ts)
        assert ex.usage["cache_hits"] == 3 and ex.usage["requests"] == 3
        again = extractor(stub, tmp_path)
        again.extract(ts)
        assert again.usage["requests"] == 0 and again.usage["cache_hits"] == 6
    assert all(out[k] == v for k, v in first.items())


def test_validation_rejects_bad_answers():
    with pytest.raises(MalformedAnswer):
        validate_topology("no json here")
    with pytest.raises(MalformedAnswer):
        validate_topology('{"operations": [], "entity_count": 1}')
    with pytest.raises(MalformedAnswer):
        validate_topology('{"operations": ["lookup"], "entity_count": -2}')
    ok = validate_topology(
        '```json\n{"operations": ["Lookup", "teleport"], "entity_count": 2, '
        '"constraints": ["conditional_branch", "BO-104 id"], "check_types": ["equality"]}\n```'
    )
    assert ok["operations"] == ["lookup", "other"] and ok["constraints"] == ["conditional_branch"]


def test_topologies_asset_uses_the_endpoint(small_pool, monkeypatch):
    import dagster as dg

    from envsched_pipeline.assets.topologies import topologies
    from envsched_pipeline.resources.lake import LakeResource
    from envsched_pipeline.resources.llm import LLMResource

    with StubOpenAI() as stub, dg.instance_for_test() as inst:
        res = dg.materialize(
            [topologies],
            instance=inst,
            resources={
                "lake": LakeResource(root=str(small_pool.root)),
                "llm": LLMResource(base_url=stub.base_url, model="stub-model", concurrency=2),
            },
        )
        assert res.success
        n = len(stub.requests)
    assert n == 60
    tab = small_pool.read("topologies", pool="synthetic").to_pylist()
    assert {r["extractor"] for r in tab} == {"llm:stub-model"}
