"""JAX: symnccl.jax's all_reduce, reduce_scatter and all_gather as XLA FFI
custom calls inside jax.jit, shard_map and jax.grad, against jax.lax's
collectives; one process driving every GPU, and one process per GPU under
jax.distributed."""
import pytest

from conftest import ranks_param, spawn_cpu, xla_handler_or_skip
from symnccl.bootstrap import free_port, spawn

jax = pytest.importorskip("jax", reason="jax is not installed")


def test_custom_call_lowers_with_memory_space_attributes():
    """No GPU needed: lowering for CUDA shows the custom call, its
    attributes and the collective memory space requests."""
    xla_handler_or_skip()
    import jax.numpy as jnp
    import symnccl.jax as sj
    f = jax.jit(lambda a: sj.all_reduce(a, op="max", algo="ll"))
    text = f.trace(jax.ShapeDtypeStruct((1000,), jnp.bfloat16)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.custom_call @symnccl_all_reduce" in text
    assert 'operands_memory_spaces = "{0:1}"' in text
    assert 'results_memory_spaces = "{0:1}"' in text
    assert "algo = 3 : i32" in text and "op = 2 : i32" in text


def test_reduce_scatter_and_all_gather_lower_with_their_algo(monkeypatch):
    """No GPU: the algo reaches the handler as an attribute."""
    xla_handler_or_skip()
    import jax.numpy as jnp
    import symnccl.jax as sj
    monkeypatch.setattr(sj, "_nranks", lambda: 2)
    for name, algo in (("reduce_scatter", "push"), ("all_gather", "ll128")):
        f = jax.jit(lambda a, name=name, algo=algo:
                    getattr(sj, name)(a, algo=algo))
        text = f.trace(jax.ShapeDtypeStruct((64, 3), jnp.bfloat16)).lower(
            lowering_platforms=("cuda",)).as_text()
        assert f"stablehlo.custom_call @symnccl_{name}" in text
        assert f"algo = {sj._ALGO_CODES[algo]} : i32" in text, text
        with pytest.raises(ValueError, match="algo 'fast' is not available"):
            getattr(sj, name)(jnp.ones(4), algo="fast")


def test_bad_arguments_raise_before_lowering():
    xla_handler_or_skip()
    import jax.numpy as jnp
    import symnccl.jax as sj
    with pytest.raises(ValueError, match="op 'mean' is not supported"):
        sj.all_reduce(jnp.ones(3), op="mean")
    with pytest.raises(ValueError, match="algo 'fast' is not available"):
        sj.all_reduce(jnp.ones(3), algo="fast")


def test_reduce_scatter_and_all_gather_check_their_arguments(monkeypatch):
    """No GPU: a bad op, a first axis that does not divide among the ranks,
    and a call before communicator() raise before anything is lowered."""
    import jax.numpy as jnp
    import symnccl.jax as sj
    with pytest.raises(ValueError, match="op 'mean' is not supported"):
        sj.reduce_scatter(jnp.ones(4), op="mean")
    with pytest.raises(RuntimeError, match="communicator\\(\\) first"):
        sj.all_gather(jnp.ones(4))
    monkeypatch.setattr(sj, "_nranks", lambda: 2)
    with pytest.raises(ValueError, match="multiple of nranks \\(2\\)"):
        sj.reduce_scatter(jnp.ones(3))
    with pytest.raises(ValueError, match="multiple of nranks"):
        sj.reduce_scatter(jnp.ones(()))


def test_the_jax_distributed_client_symnccl_uses_is_where_it_was():
    """symnccl.jax.communicator() shares unique ids through
    jax.distributed's key-value client, which JAX keeps in a private
    module: this fails when JAX moves it."""
    from jax._src import distributed
    assert hasattr(distributed, "global_state")
    assert hasattr(distributed.global_state, "client")


def _assert_rows(rows):
    bad = [r for r in rows if r[1] or r[2] or r[3]]
    assert not bad, bad[:10]


@ranks_param(2)
def test_one_process_shard_map_equals_psum(nranks):
    xla_handler_or_skip()
    from _workers import jax_workers as J
    res = spawn(J.single_process, 1, args=(5,), timeout=900)[0]
    assert res["n"] >= 2
    _assert_rows(res["rows"])
    # one process may run every device's handler from one thread: XLA's
    # buffers are never registered there (staging window / ll push)
    for st in res["stats"]:
        assert st["staged_calls"] > 0 and st["registrations"] == 0, st


@ranks_param(2)
@pytest.mark.parametrize("user_buffers", [False, True],
                         ids=["xla_buffers", "nccl_user_buffers"])
def test_jax_distributed_processes_equal_psum(nranks, user_buffers):
    xla_handler_or_skip()
    from _workers import jax_workers as J
    res = spawn(J.multi_process, nranks,
                args=(free_port(), user_buffers, 7), timeout=900)
    for r in res:
        _assert_rows(r["rows"])
    st = res[0]["stats"]
    assert st["window_calls"] + st["staged_calls"] > 0, st
    if user_buffers:
        # XLA allocates collective memory with ncclMemAlloc: the handler
        # registers it once per allocation and runs on it in place
        assert st["registrations"] > 0 and st["window_calls"] > 0, st


def test_differentiation_rules_match_jax_collectives_on_cpu():
    """No GPU: the custom_vjp rules, with the custom calls replaced by JAX's
    collectives of the same meaning, give JAX's gradients inside shard_map
    (check_vma on and off), whether JAX types the all-reduce's result
    invariant (then the cotangent arrives summed) or varying (one process
    for both: JAX's start is most of the cost)."""
    from _workers import jax_workers as J
    rows = spawn_cpu(J.rules_on_cpu, 3)
    assert {c.split(":")[0] for c, _, _ in rows} == {
        "invariant result", "varying result"}, rows
    for case, dy, dx in rows:
        assert dy < 1e-5 and dx < 1e-5, (case, dy, dx)


def test_results_are_typed_like_jax_collectives_inside_shard_map():
    """No GPU: with check_vma, the all-reduce's result is invariant (as
    psum's), the reduce-scatter's and all-gather's vary, even for a
    replicated input (as psum_scatter's and all_gather's): the types the
    gradient rules rely on."""
    from _workers import jax_workers as J
    assert spawn_cpu(J.result_types_on_cpu) == {
        "all_reduce": [], "reduce_scatter": ["x"], "all_gather": ["x"],
        # as psum's, psum_scatter's and all_gather's of a replicated x
        "all_reduce of an invariant x": [],
        "reduce_scatter of an invariant x": ["x"],
        "all_gather of an invariant x": ["x"]}


@pytest.mark.slow   # a jitted training-style gradient per collective
@ranks_param(1, 2)
def test_gradients_inside_shard_map_equal_jax_collectives(nranks):
    xla_handler_or_skip()
    from _workers import jax_workers as J
    res = spawn(J.gradients, 1, args=(9,), timeout=900)[0]
    assert res["n"] >= nranks
    for case, dy, dx in res["rows"]:
        tol = 0.0 if "sum" in case and "bfloat16" not in case else \
            (0.1 if "bfloat16" in case else 1e-5)
        assert dy <= tol + 1e-6 and dx <= tol + 1e-5, (case, dy, dx)
    assert res["ll"] == [2] * res["n"], res["ll"]
    # the reduce-scatter and all-gather kernels ran in both passes
    assert set(res["kernels"]) == {"ll_reduce_scatter", "ll_all_gather",
                                   "push_reduce_scatter", "push_all_gather"}
    for name, counts in res["kernels"].items():
        assert counts == [2] * res["n"], (name, counts)
