"""CPU tier: which calls NCCL's own symmetric-window kernels may see
(csrc/runtime/nccl_policy.c), and which NCCL lets symnccl's kernels trigger the
next launch early. Every expectation is a fact written down here (what was
seen on GPUs, what NCCL's sources say), asked of the C functions the
collectives use; nothing is computed from the table itself."""
import pytest

C = pytest.importorskip("symnccl._C")

PLAIN, ON, AUTO = 0, 1, 2            # SYMNCCL_NCCL_WINDOWS
V2289, V2297, V2303, V2307 = 22809, 22907, 23003, 23007
V2312, V2323 = 23102, 23203
BASE = 0x7f0000000000                # a window's base: 4096-aligned


def reason(version, collective, x, xbytes, out, outbytes, block,
           x_win, out_win, windows=AUTO):
    return C._nccl_plain_reason(version, windows, collective, x, xbytes, out,
                                outbytes, block, x_win, out_win)


# ------------------------------------------------------------ NCCL 2.28

def test_2_28_all_reduce_on_an_aligned_window_view_goes_to_nccl_as_is():
    assert reason(V2289, "all_reduce", BASE + 64, 8192, BASE + 64, 8192, 0,
                  True, True) is None


@pytest.mark.parametrize("offset", [2, 4, 8, 14])
def test_2_28_all_reduce_on_a_window_view_off_16_bytes_gets_plain_memory(
        offset):
    """Seen on 2x H200 with 2.28.9: bf16 at window offsets of 1..8
    elements gave wrong sums."""
    why = reason(V2289, "all_reduce", BASE + offset, 8192, BASE + offset,
                 8192, 0, True, True)
    assert why is not None and "16-byte" in why, why


def test_2_28_all_reduce_of_an_unaligned_plain_buffer_needs_nothing():
    assert reason(V2289, "all_reduce", BASE + 2, 8192, BASE + 2, 8192, 0,
                  False, False) is None


@pytest.mark.parametrize("block", [1031 * 2, 4099 * 2, 10])
def test_2_28_reduce_scatter_into_a_window_block_off_16_bytes_gets_plain(
        block):
    """Seen with 2.28.9: bf16 blocks of 1031 and 4099 elements per rank
    came back with zeros in every 4th element."""
    why = reason(V2289, "reduce_scatter", BASE, 2 * block, BASE + 8192,
                 block, block, False, True)
    assert why is not None and "reduce_scatter" in why, why


def test_2_28_reduce_scatter_into_plain_memory_or_whole_vectors_is_fine():
    assert reason(V2289, "reduce_scatter", BASE, 8192, BASE + 8192, 4096,
                  4096, True, True) is None
    assert reason(V2289, "reduce_scatter", BASE, 2 * 2062, BASE + 8192,
                  2062, 2062, True, False) is None


def test_2_28_all_gather_has_no_known_case():
    assert reason(V2289, "all_gather", BASE + 2, 2062, BASE + 8192, 4124,
                  2062, True, True) is None


# ----------------------------------------- NCCL 2.29, 2.30, 2.31, 2.32

@pytest.mark.parametrize("version", [22902, V2297, V2303, V2307, V2312,
                                     V2323])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter",
                                        "all_gather"])
def test_minors_without_a_multi_gpu_pass_on_windows_give_nccl_plain_memory(
        version, collective):
    """On 2x H100 with SYMNCCL_NCCL_WINDOWS=1, 2.29.7's symmetric kernels
    gave 5122 wrong elements in 2876 checks, 2.30.7's, 2.31.2's (2x H100)
    and 2.32.3's (2x H200) failed at the first call: auto gives NCCL no
    window at all on them, even a perfectly aligned one."""
    why = reason(version, collective, BASE, 1 << 20, BASE + (1 << 20),
                 1 << 20, 1 << 19, True, True)
    assert why is not None and "two GPUs" in why, why


def test_the_reason_says_what_was_seen():
    def why(v):
        return reason(v, "all_reduce", BASE, 4096, BASE, 4096, 0, True, True)
    assert "5122 wrong elements" in why(V2297)
    assert "invalid device function" in why(V2307)
    assert "invalid device function" in why(V2312)
    assert "invalid device function" in why(V2323)


@pytest.mark.parametrize("version", [V2297, V2307, V2312, V2323])
def test_plain_buffers_need_nothing_on_any_minor(version):
    assert reason(version, "all_reduce", BASE + 2, 10, BASE + 2, 10, 0,
                  False, False) is None


def test_broadcast_and_reduce_meet_no_symmetric_kernel():
    """NCCL has symmetric kernels for all_reduce, reduce_scatter and
    all_gather only."""
    for coll in ("broadcast", "reduce"):
        assert reason(V2297, coll, BASE + 2, 10, BASE + 2, 10, 0, True,
                      True) is None


# ------------------------------------------------------------- the knob

@pytest.mark.parametrize("version", [V2289, V2297, V2307])
def test_knob_0_gives_nccl_plain_memory_for_every_window_call(version):
    why = reason(version, "all_gather", BASE, 4096, BASE + 8192, 8192,
                 4096, True, True, windows=PLAIN)
    assert why is not None and "SYMNCCL_NCCL_WINDOWS=0" in why, why


@pytest.mark.parametrize("version", [V2289, V2297, V2307])
def test_knob_1_gives_nccl_windows_even_where_it_is_known_wrong(version):
    assert reason(version, "all_reduce", BASE + 2, 8192, BASE + 2, 8192, 0,
                  True, True, windows=ON) is None


def test_the_knob_is_declared_with_auto_by_default():
    default, lo, hi, _ = C.KNOBS["SYMNCCL_NCCL_WINDOWS"]
    assert (default, lo, hi) == (AUTO, PLAIN, AUTO)


TOPO_2 = dict(nranks=2, lsa_size=2, symmetric=1, staging=1, push=1,
              multicast=0)


def _read_knobs():
    """Reads this environment's knobs as a communicator does (through the
    resolver's test entry)."""
    return C._auto_algo_for(TOPO_2, 4096, "float32", "sum", False)


def test_the_knob_takes_auto_by_name_as_documented(monkeypatch):
    """`auto` is the documented meaning of 2: it was refused as 'not an
    integer'."""
    monkeypatch.setenv("SYMNCCL_NCCL_WINDOWS", "auto")
    assert _read_knobs()


def test_a_bad_knob_value_names_the_names_it_takes(monkeypatch):
    monkeypatch.setenv("SYMNCCL_NCCL_WINDOWS", "sometimes")
    with pytest.raises(ValueError, match=r"SYMNCCL_NCCL_WINDOWS=sometimes "
                                         r"is not an integer or auto"):
        _read_knobs()


def test_names_are_that_knob_s_only(monkeypatch):
    monkeypatch.setenv("SYMNCCL_PDL", "auto")
    with pytest.raises(ValueError, match=r"SYMNCCL_PDL=auto is not an "
                                         r"integer \("):
        _read_knobs()


def test_bad_collective_name_is_a_value_error():
    with pytest.raises(ValueError, match="collective"):
        reason(V2289, "scatter", BASE, 16, BASE, 16, 0, True, True)


# ------------------------------------------------------------- the table

def test_table_is_exported_with_its_version_ranges_and_reasons():
    rows = C.NCCL_WINDOW_POLICY
    cases = {(r["lo"][:4], r["case"]) for r in rows}
    assert ("2.28", "view_unaligned") in cases
    assert ("2.28", "block_unaligned") in cases
    assert ("2.29", "every") in cases
    for r in rows:
        assert set(r) == {"lo", "hi", "collectives", "case", "align",
                          "reason"}, r
        assert set(r["collectives"]) <= {"all_reduce", "reduce_scatter",
                                         "all_gather"}, r
        assert r["reason"], r
    every = [(r["lo"], r["hi"]) for r in rows if r["case"] == "every"]
    assert every == [("2.29.0", "2.29.99"), ("2.30.0", "2.30.99"),
                     ("2.31.0", "2.31.99"), ("2.32.0", "2.32.99")]


def test_every_minor_a_build_runs_on_has_a_window_policy_from_a_run():
    """The minors the import accepts past 2.28 (up to NCCL_NEWEST_MINOR)
    all take the safe policy until a two-GPU run on windows passes: a new
    minor admitted without a row here would give NCCL windows unchecked."""
    for minor in range(29, C.NCCL_NEWEST_MINOR + 1):
        v = 2 * 10000 + minor * 100
        assert reason(v, "all_gather", BASE, 4096, BASE + 8192, 8192, 4096,
                      True, True) is not None, minor


# ----------------------------------------------- programmatic launches

@pytest.mark.parametrize("version,early", [
    (V2289, False), (V2297, False), (V2303, False), (23006, False),
    (V2307, True), (23099, True), (23100, False), (V2312, False),
    (V2323, False)])
def test_kernels_trigger_the_next_launch_early_only_beside_nccl_2_30_7(
        version, early):
    """NCCL launches its symmetric kernels as programmatic dependent
    launches; 2.30.7's wait at entry (cudaGridDependencySynchronize) for
    the kernel before them. 2.31 and 2.32's have not been read or run for
    it: no early trigger beside them."""
    assert C._nccl_pdl_early(version) is early
    assert C.NCCL_PDL_WAITS_FROM == V2307
