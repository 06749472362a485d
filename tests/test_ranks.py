"""Data-parallel ranks on CPU (gloo): every rank owns whole groups, the two-rank update equals the
one-process update over the whole batch, and a torchrun-launched training step writes one complete,
correctly ordered step from rank 0. NCCL on GPUs is the same code with another backend (not run here)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from envs.registry import load_synthetic
from envsched_pipeline.core.pools import import_pool
from envsched_pipeline.core.select import select_manifest
from envsched_pipeline.lake import Lake
from envsched_pipeline.run import RunSpec, start_run
from tests.procs import torchrun
from trainer.world import group_slice


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_group_slices_are_disjoint_contiguous_and_balanced(world):
    for n in range(0, 21):
        sizes, covered = [], []
        for r in range(world):
            sl = group_slice(n, r, world)
            covered += list(range(n))[sl]
            sizes.append(sl.stop - sl.start)
        assert covered == list(range(n)) and max(sizes) - min(sizes) <= 1


UPDATE = textwrap.dedent(
    """
    import atexit, json, os, sys
    import numpy as np, torch
    import torch.distributed as dist
    from trainer import ranks

    def at_exit():  # registered before ranks.init's exit handler, so it runs after it
        with open(f"{sys.argv[1]}.exit-{os.environ.get('RANK', '0')}", "w") as f:
            json.dump(dist.is_initialized(), f)

    atexit.register(at_exit)
    from trainer.world import group_slice
    from trainer.model import load_policy, qwen3_tokenizer
    from trainer.update import GRPOConfig, GRPOTrainer

    r = ranks.init("cpu")
    torch.manual_seed(0)
    model = load_policy(None, seed=0)
    ranks.sync_parameters(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model, qwen3_tokenizer(), GRPOConfig(micro_batch=2, lr=1e-3, epochs=2), "cpu")
    rng = np.random.default_rng(0)
    n, g = 3, 2
    seqs = [[int(x) for x in rng.integers(10, 5000, size=int(rng.integers(6, 14)))] for _ in range(n * g)]
    masks = [[0] * 3 + [1] * (len(s) - 3) for s in seqs]
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])  # the last group has no spread: no gradient
    sl = group_slice(n, r.rank, r.world)
    lo, hi = sl.start * g, sl.stop * g
    m = trainer.update(seqs[lo:hi], masks[lo:hi], rewards[lo:hi], g)
    if r.main:
        torch.save(model.state_dict(), sys.argv[1])
        moved = max(float((v - before[k]).abs().max()) for k, v in model.state_dict().items())
        json.dump({"loss": m["loss"], "grad_norm": m["grad_norm"], "moved": moved},
                  open(sys.argv[1] + ".json", "w"))
    """
)


def test_two_ranks_update_equals_one_process_over_the_whole_batch(tmp_path):
    script = tmp_path / "update.py"
    script.write_text(UPDATE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    one = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "one.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    # 3 groups over 2 ranks: rank 0 owns 2, rank 1 owns the zero-spread group and trains nothing
    two = torchrun(2, [str(script), str(tmp_path / "two.pt")], env)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6, rtol=1e-5), k
    ma, mb = (json.loads((tmp_path / f"{x}.pt.json").read_text()) for x in ("one", "two"))
    assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-5, abs=1e-7)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-4)
    assert ma["moved"] > 1e-4  # the update really changed the weights (two epochs, lr 1e-3)
    # every rank left its gloo group before the interpreter exited (one still in it can abort)
    assert [json.loads((tmp_path / f"two.pt.exit-{k}").read_text()) for k in (0, 1)] == [False, False]


def test_a_torchrun_step_writes_one_complete_step_from_rank_0(tmp_path):
    lake = Lake(tmp_path / "lake")
    import_pool(lake, load_synthetic("synthetic", n_envs=3, tasks_per_env=4, seed=1))
    start_run(
        lake,
        RunSpec(
            pool="synthetic",
            policy="hf-tiny",
            batch_size=3,
            group_size=2,
            max_steps=1,
            policy_config={"max_new_tokens": 8, "lr": 1e-4},
        ),
    )
    select_manifest(lake, 0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    p = torchrun(2, ["-m", "trainer.step", "--lake", str(lake.root), "--step", "0"], env)
    assert p.returncode == 0, p.stderr[-3000:]
    roll = lake.read("rollouts", step=0)
    manifest = lake.read("manifests", step=0).sort_by("slot").column("task_id").to_pylist()
    assert roll.num_rows == 6
    # manifest order, G rollouts each, every group on exactly one rank, both ranks used
    assert roll.column("task_id").to_pylist() == [t for t in manifest for _ in range(2)]
    owner = {}
    for t, r in zip(roll.column("task_id").to_pylist(), roll.column("rank").to_pylist(), strict=True):
        owner.setdefault(t, set()).add(r)
    assert all(len(v) == 1 for v in owner.values()) and set().union(*owner.values()) == {0, 1}
    tm = lake.read("train_metrics", step=0).to_pylist()[0]
    assert tm["world_size"] == 2 and tm["rollouts"] == 6
    # held-out evaluation (step 0 evaluates): each rank ran its share, rank 0 wrote them all
    held = lake.read("eval_rollouts", step=0).to_pylist()
    assert len(held) == 2 * 3 * 2 and tm["eval_episodes"] == 12  # 2 splits x B tasks x 2 samples
    assert {(r["split"], r["sample"]) for r in held} == {(s, k) for s in ("seen", "unseen") for k in (0, 1)}
    benches = {e["benchmark"] for e in lake.read("evals", step=0).to_pylist()}
    assert {"heldout_seen", "heldout_unseen"} <= benches
