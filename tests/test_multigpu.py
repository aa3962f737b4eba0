"""GPU tier, several GPUs: one process per GPU (spawned from pytest) and one
process driving all GPUs (init_all)."""
import subprocess
import sys

import pytest

from symnccl.bootstrap import spawn

from _workers import collectives as W
from conftest import ranks_param


@ranks_param(2, 4, 8)
def test_all_reduce_every_dtype_and_op_on_windows_matches_float64(nranks):
    res = spawn(W.all_reduce_every_dtype_on_windows, nranks, args=(11,),
                timeout=600)
    bad = [row for rows in res for row in rows if row[-1]]
    assert not bad, bad[:10]
    assert len(res[0]) == 12 * 4 * 5 * 2


@ranks_param(2, 4, 8)
def test_reduce_scatter_between_windows_with_unaligned_blocks(nranks):
    res = spawn(W.reduce_scatter_windows_odd_blocks, nranks, args=(9,),
                timeout=300)
    bad = [row for rows in res for row in rows if row[-1]]
    assert not bad, bad


@ranks_param(2, 4, 8)
def test_torch_tensors_through_every_collective(nranks):
    pytest.importorskip("torch")
    res = spawn(W.torch_collectives, nranks, args=(5,), timeout=600)
    bad = [row for rows in res for row in rows if row[-1]]
    assert not bad, bad[:10]


@ranks_param(2)
def test_errors_name_what_was_seen_and_lifetime_after_close(nranks):
    pytest.importorskip("torch")
    res = spawn(W.errors_and_lifetime, nranks, timeout=300)
    for rank, (msgs, total, after) in enumerate(res):
        other = (rank + 1) % nranks
        assert msgs["device"] == (f"x: tensor is on cuda:{other}, "
                                  f"communicator is on cuda:{rank}")
        assert msgs["cpu"].startswith(f"x: expected a CUDA tensor on "
                                      f"cuda:{rank}, got a CPU tensor")
        assert "out has dtype float16, expected float32" in msgs["dtype"]
        assert "multiple of nranks" in msgs["divisible"]
        assert "is closed" in msgs["closed"]
        assert total == after == 1000.0 * nranks * (nranks + 1) / 2


@ranks_param(2, 4, 8)
def test_lsa_algorithms_every_dtype_op_placement_bitwise_equal(nranks):
    pytest.importorskip("torch")
    res = spawn(W.lsa_algorithms, nranks, args=(21,), timeout=900)
    bad = [row for rows, _ in res for row in rows if row[-1]]
    assert not bad, bad[:10]
    ref = res[0][1]
    for r, (_, digests) in enumerate(res[1:], 1):
        diff = [k for k in ref if ref[k] != digests[k]]
        assert not diff, f"rank {r} differs from rank 0 in {diff[:5]}"


@ranks_param(2, 4, 8)
def test_lsa_graph_replay_and_stress(nranks):
    pytest.importorskip("torch")
    res = spawn(W.lsa_graph_and_stress, nranks, args=(4, 2000), timeout=900)
    assert all(not b for b in res), res


@ranks_param(2, 4, 8)
def test_init_all_one_process_drives_all_gpus(nranks):
    rows = W.init_all_in_one_process(list(range(nranks)), 3)
    assert all(w == 0 for _, w in rows), rows


@ranks_param(2)
def test_cli_self_check_passes(nranks):
    r = subprocess.run([sys.executable, "-m", "symnccl", "--quick",
                        "--nranks", str(nranks)], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PASS" in r.stdout and "0 wrong" in r.stdout
