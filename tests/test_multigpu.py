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


@ranks_param(2, 3, 4, 8)   # 3: the generic (non-templated) world size
def test_lsa_algorithms_every_dtype_op_placement_bitwise_equal(nranks):
    pytest.importorskip("torch")
    res = spawn(W.lsa_algorithms, nranks, args=(21,), timeout=900)
    bad = [row for rows, _, _ in res for row in rows if row[-1]]
    assert not bad, bad[:10]
    ref = res[0][1]
    for r, (_, digests, _) in enumerate(res[1:], 1):
        diff = [k for k in ref if ref[k] != digests[k]]
        assert not diff, f"rank {r} differs from rank 0 in {diff[:5]}"
    # one fixed reduction order: every algorithm and input placement gives
    # the same bits for the same inputs
    by_case = {}
    for (algo, dtype, op, count, place), h in ref.items():
        by_case.setdefault((dtype, op, count), set()).add((algo, place, h))
    for case, got in by_case.items():
        assert len({h for _, _, h in got}) == 1, (case, sorted(got))


@ranks_param(2, 3, 4)
def test_packet_two_shot_kernels_forced_at_every_size(nranks):
    """The ll and ll128 two-shot kernels (3+ ranks from a size by default)
    at every size, down to empty slices, on 2 ranks too: the knobs at 0."""
    pytest.importorskip("torch")
    env = {"SYMNCCL_LL_TWO_SHOT_KIB": "0", "SYMNCCL_LL128_TWO_SHOT_KIB": "0"}
    res = spawn(W.lsa_algorithms, nranks, args=(23, (1, 3, 1031, 65537),
                                                 env), timeout=900)
    bad = [row for rows, _, _ in res for row in rows if row[-1]]
    assert not bad, bad[:10]
    for _, _, launches in res:
        assert launches["ll_two_shot"] > 0 and launches["ll"] == 0, launches
        assert launches["ll128_two_shot"] > 0 and launches["ll128"] == 0


@ranks_param(2, 3, 4, 8)
def test_lsa_graph_replay_and_10000_call_stress(nranks):
    pytest.importorskip("torch")
    res = spawn(W.lsa_graph_and_stress, nranks, args=(4, 10000),
                timeout=1200)
    assert all(not b for b in res), res


@ranks_param(2, 3, 4, 8)
def test_push_many_chunks_short_last_chunk_under_sm_contention(nranks):
    pytest.importorskip("torch")
    res = spawn(W.push_chunks_under_contention, nranks, args=(7, 3000),
                timeout=900)
    assert all(not b for b in res), [b[:5] for b in res]


@ranks_param(2, 4)
def test_two_communicators_and_two_streams_never_deadlock(nranks):
    pytest.importorskip("torch")
    import symnccl
    res = spawn(W.lsa_two_comms_two_streams, nranks,
                args=(symnccl.get_unique_id(), 60), timeout=600)
    assert all(not b for b in res), res


@ranks_param(2, 4)
def test_lsa_algorithms_at_256_mib(nranks):
    pytest.importorskip("torch")
    res = spawn(W.lsa_large, nranks, args=(13,), timeout=900)
    bad = [row for rows in res for row in rows if row[-1]]
    assert not bad, bad
    assert len(res[0]) == 21   # 7 algorithms x 3 placements


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


@ranks_param(2, 4)
def test_multimem_all_reduce_matches_float64(nranks):
    """Runs only where NCCL grants NVLink multicast; on the lent machines
    the safety variables disable it and this skips."""
    import os
    from symnccl import _C
    req, why = _C._multicast_gate(True, os.environ.get("NCCL_NVLS_ENABLE"),
                                  os.environ.get(
                                      "TORCH_SYMM_MEM_DISABLE_MULTICAST"),
                                  os.environ.get("NVSHMEM_DISABLE_NVLS"))
    if not req:
        pytest.skip(f"multicast disabled: {why}")
    pytest.importorskip("torch")
    res = spawn(W.multimem_every_dtype, nranks, args=(17,), timeout=600)
    if any(r is None for r in res):
        pytest.skip("multicast disabled: NCCL granted no multicast handle")
    bad = [row for rows in res for row in rows if row[-1]]
    assert not bad, bad[:10]
