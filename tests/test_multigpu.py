"""GPU tier, several GPUs: one process per GPU (spawned from pytest) and one
process driving all GPUs (init_all)."""
import subprocess
import sys

import pytest

import symnccl
from symnccl.bootstrap import spawn

from _workers import collectives as W
from _workers import serving as S
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


@ranks_param(2)
def test_ranks_created_with_different_settings_refuse_alike(nranks):
    """A knob set otherwise on rank 1 (the push chunk, the packet grid),
    or a staging_bytes= one page smaller: every rank's creation refuses,
    with the same ValueError naming it and every rank's value (a window of
    another size may be refused by NCCL's registration first: then every
    rank must still raise, and the words are the CPU test's,
    test_ranks_whose_settings_differ_are_named_with_every_ranks_value);
    the same settings create."""
    same = spawn(W.created_with_settings, nranks, args=("", 0, 0),
                 timeout=300)
    assert same == [("ok", True)] * nranks, same
    big = 32 << 20
    for knob, value, staging, named in (
            ("SYMNCCL_PUSH_CHUNK_KIB", 1024, 0,
             "SYMNCCL_PUSH_CHUNK_KIB (rank 0: 0, rank 1: 1024)"),
            ("SYMNCCL_LL_CTAS", 8, 0, "SYMNCCL_LL_CTAS (rank 0: 64, "
             "rank 1: 8)"),
            ("", 0, big - 4096, f"staging_bytes (rank 0: {big}, rank 1: "
             f"{big - 4096})")):
        res = spawn(W.created_with_settings, nranks,
                    args=(knob, value, staging), timeout=300)
        assert all(r[0] != "ok" for r in res), (knob, res)
        if staging and res[0][0] != "ValueError":
            continue
        assert [r[0] for r in res] == ["ValueError"] * nranks, (knob, res)
        assert named in res[0][1] and len({r[1] for r in res}) == 1, \
            (knob, res)


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
    res = spawn(W.lsa_two_comms_two_streams, nranks,
                args=(symnccl.get_unique_id(), 60), timeout=600)
    assert all(not b for b in res), res


@ranks_param(2, 4)
def test_lsa_algorithms_at_256_mib(nranks):
    pytest.importorskip("torch")
    res = spawn(W.lsa_large, nranks, args=(13,), timeout=900)
    bad = [row for rows in res for row in rows if row[-1]]
    assert not bad, bad
    assert len(res[0]) == 24   # 8 algorithms x 3 placements


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


# ------------------------------------------- serving collectives on peers

@ranks_param(2, 3, 4, 8)
def test_fused_rmsnorm_every_kernel_dtype_and_shape_on_real_peers(nranks):
    """all_reduce_rmsnorm on real peers: one_shot, two_shot, ll, ll128,
    lamport, auto and nccl, float32/float16/bfloat16, T 1/3/17/128 x H
    8/1000/4096/16384, every other shape unaligned, poisoned outputs, in
    place, FP8 static and dynamic: within the float64 reference's rounding
    bounds, the kernels each algo runs (launch counters), the same bits on
    every rank and from every fused kernel (one_shot, two_shot, ll, ll128,
    lamport, and auto where it runs one), in place as out of place."""
    pytest.importorskip("torch")
    res = spawn(S.fused_rmsnorm_every_kernel, nranks, args=(31,),
                timeout=600)
    bad = [row for rows, _, _ in res for row in rows if row[-1]]
    assert not bad, bad[:10]
    # 3 dtypes x 16 shapes x 7 algos, 3 x 4 in place x 5 kernels, 3 x 2
    # FP8 shapes x 4 kernels x 2 quants, and H 1031's refusal
    assert len(res[0][0]) == 336 + 60 + 48 + 1, len(res[0][0])
    ref = res[0][1]
    for r, (_, digests, _) in enumerate(res[1:], 1):
        assert set(digests) == set(ref), r
        diff = [k for k in ref if ref[k][0] != "nccl" and
                ref[k] != digests[k]]
        assert not diff, f"rank {r} differs from rank 0 in {diff[:5]}"
    by_case = {}
    for (what, algo, dtype, T, H, pad), (family, h) in ref.items():
        if family == "fused":
            kind = what if what.startswith("fp8") else "y,h"
            by_case.setdefault((kind, dtype, T, H, pad), set()).add(
                (what, algo, h))
    assert len(by_case) == 3 * 16 + 3 * 2 * 2, len(by_case)
    for case, got in by_case.items():
        assert len({h for _, _, h in got}) == 1, (case, sorted(got))
    for rank, (_, _, launches) in enumerate(res):
        for k in ("one_shot_rmsnorm", "two_shot_rmsnorm", "ll_rmsnorm",
                  "ll128_rmsnorm", "lamport_rmsnorm", "nccl"):
            assert launches[k] > 0, (rank, k, launches)


@ranks_param(2, 3, 4, 8)
def test_all_to_all_and_v_every_kernel_and_dtype_on_real_peers(nranks):
    """all_to_all (push, ll, auto, nccl) in every dtype, rows of 1, 3 and
    64 elements, unaligned views: bit-exact against the expected
    permutation; all_to_all_v with random uneven splits from the host and
    the device: bit-exact, out's rest still poisoned, out_splits and
    out_offsets right; each call ran its algo's kernel (launch counters)."""
    pytest.importorskip("torch")
    res = spawn(S.all_to_all_every_kernel, nranks, args=(37,), timeout=600)
    bad = [row for rows, _ in res for row in rows if row[-1]]
    assert not bad, bad[:10]
    rows = res[0][0]
    assert sum(r[0] == "all_to_all_v" for r in rows) == 24 * 4
    for algo in S.A2A_ALGOS:
        dtypes = {r[2] for r in rows if r[:2] == ("all_to_all", algo)}
        assert dtypes == set(symnccl.DTYPES), (algo, dtypes)
        assert {r[6] for r in rows if r[:2] == ("all_to_all_v", algo)} \
            == {"host", "device"}, algo
    for rank, (_, launches) in enumerate(res):
        for k in ("push_all_to_all", "ll_all_to_all", "nccl"):
            assert launches[k] > 0, (rank, k, launches)
