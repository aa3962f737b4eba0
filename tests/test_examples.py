"""The training examples and the step benchmark, run as a user runs them
(torchrun / python), on small shapes: symnccl's loss curve must agree with
torch.distributed's (JAX's) to bf16 tolerance, and the loss must fall; the
decode (fused all-reduce + RMSNorm) and expert-parallel MoE examples at one
rank without a launcher and under torchrun at two, each exiting non-zero
when its own check against torch.distributed fails."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ranks_param

# minutes of GPU time: run on purpose (pytest --run-slow)
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--steps", "50", "--seq", "512", "--hidden", "256", "--ffn", "1024"]


def _run(cmd, nranks, timeout=600):
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(nranks))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def _check_curves(res, a, b):
    la, lb = res[a]["losses"], res[b]["losses"]
    assert len(la) == len(lb) == 50
    assert res["max_rel_diff"] < 2e-2, res["max_rel_diff"]
    # SGD on a fixed set of batches: the last round is below the first
    assert sum(la[-8:]) < sum(la[:8]), la
    assert res[a]["step_ms"] > 0 and res[b]["step_ms"] > 0


def _check_kernels(res, algo):
    """algo's reduce_scatter and all_gather kernels ran (both directions
    of every layer: the forward's and the other's backward); with "auto"
    the kernels symnccl.AUTO_TABLE picks for the example's
    sizes (1 and 2 ranks: a row serves both; before the table, NCCL)."""
    from symnccl import _C
    ran = res["kernels"]
    for coll in ("reduce_scatter", "all_gather"):
        names = (_C.COLLECTIVE_KERNELS[coll].values() if algo == "auto"
                 else [_C.COLLECTIVE_KERNELS[coll][algo]])
        assert sum(ran.get(name, 0) for name in names) > 0, (coll, ran)


@ranks_param(1, 2)
@pytest.mark.parametrize("compiled,algo", [
    (False, "auto"), (True, "auto"), (False, "ll"), (True, "push")],
    ids=["eager", "compiled", "eager-ll", "compiled-push"])
def test_train_tp_torch_example(nranks, compiled, algo, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "res.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nranks}", "examples/train_tp_torch.py",
           *SMALL, "--algo", algo, "--json", str(out)] + \
        (["--compile"] if compiled else [])
    _run(cmd, nranks)
    res = json.loads(out.read_text())
    assert res["args"]["nranks"] == nranks
    _check_curves(res, "symnccl", "torch.distributed")
    _check_kernels(res, algo)


@ranks_param(1, 2)
@pytest.mark.parametrize("algo", ["auto", "ll128"])
def test_train_tp_jax_example(nranks, algo, tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "res.json"
    _run([sys.executable, "examples/train_tp_jax.py", *SMALL, "--algo", algo,
          "--json", str(out)], nranks)
    res = json.loads(out.read_text())
    assert res["args"]["devices"] == nranks
    _check_curves(res, "symnccl", "jax.lax")
    _check_kernels(res, algo)


@ranks_param(1, 2)
def test_step_benchmark_runs_and_matches_torch_distributed(nranks,
                                                           tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "step.json"
    _run([sys.executable, "benchmarks/bench_step.py", "--hidden", "256",
          "--layers", "2", "--tokens", "1,16", "--train-tokens", "64",
          "--iters", "2", "--reps", "1", "--out", str(out)], nranks)
    doc = json.loads(out.read_text())
    assert doc["nranks"] == nranks
    steps = [(r["step"], r["tokens"]) for r in doc["rows"]]
    assert steps == [("decode", 1), ("decode", 16), ("train", 64)]
    for r in doc["rows"]:
        assert all(r[k] > 0 for k in ("symnccl", "torch.distributed",
                                      "none")), r
        if r["step"] == "decode":   # two ranks' sums: exact in any order
            assert r["same_output"], r


def _example(script, nranks, *args):
    """The command a user types: python at one rank (no launcher: the
    example makes its own one-rank group), torchrun at two or more."""
    if nranks == 1:
        return [sys.executable, script, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nranks}", script, *args]


@ranks_param(1, 2)
@pytest.mark.parametrize("compiled", [False, True],
                         ids=["graph", "compiled-graph"])
def test_decode_tp_torch_example(nranks, compiled, tmp_path):
    """The fused decode stack (all_reduce_add_rmsnorm in a CUDA graph)
    against the unfused one on torch.distributed: the example exits 1 when
    they differ beyond its tolerance, and the fused kernel ran."""
    pytest.importorskip("torch")
    from symnccl import _C
    out = tmp_path / "res.json"
    tokens = "16" if compiled else "1,16,128"
    _run(_example("examples/decode_tp_torch.py", nranks, "--tokens", tokens,
                  "--hidden", "1024", "--ffn", "2048", "--layers", "2",
                  "--iters", "3", "--reps", "3", "--json", str(out),
                  *(["--compile"] if compiled else [])), nranks)
    res = json.loads(out.read_text())
    assert res["args"]["nranks"] == nranks and res["ok"], res
    assert [r["T"] for r in res["rows"]] == [int(t) for t in
                                             tokens.split(",")]
    for r in res["rows"]:
        want = {"symnccl fused"} | ({"symnccl fused, compiled"}
                                    if compiled else set())
        assert set(r["rel_err"]) == want, r
        assert all(e < 2e-2 for e in r["rel_err"].values()), r
        assert all(us > 0 for us in r["us"].values()), r
    # auto: one_shot at these sizes (AUTO_TABLE's all_reduce_rmsnorm row)
    fused = _C.COLLECTIVE_KERNELS["all_reduce_rmsnorm"].values()
    assert sum(res["kernels"].get(k, 0) for k in fused) > 0, res["kernels"]


@ranks_param(1, 2)
@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_moe_ep_torch_example(nranks, eager, tmp_path):
    """Expert-parallel MoE training on all_to_all_v with device splits
    (the step in a CUDA graph, or eager) against torch.distributed's
    all_to_all_single with host splits: the same loss at every step (the
    example exits 1 otherwise), the loss falls, push's kernel ran."""
    pytest.importorskip("torch")
    from symnccl import _C
    out = tmp_path / "res.json"
    _run(_example("examples/moe_ep_torch.py", nranks, "--steps", "12",
                  "--tokens", "64", "--hidden", "128", "--ffn", "256",
                  "--json", str(out), *(["--eager"] if eager else [])),
         nranks)
    res = json.loads(out.read_text())
    assert res["args"]["nranks"] == nranks and res["ok"], res
    a, b = res["symnccl"]["losses"], res["torch.distributed"]["losses"]
    assert len(a) == len(b) == 12
    assert res["max_rel_diff"] <= 1e-3, res["max_rel_diff"]
    assert sum(a[-3:]) < sum(a[:3]), a
    push = _C.COLLECTIVE_KERNELS["all_to_all"]["push"]
    assert res["kernels"].get(push, 0) > 0, res["kernels"]
