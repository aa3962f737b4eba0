"""JAX: symnccl.jax.all_to_all and ragged_all_to_all (issue 32) against
jax.lax's, inside jit, shard_map and grad. The CPU tier checks the
arguments, the lowering, and the jnp and gradient rules around the custom
calls with the calls replaced by JAX's collectives on 2 CPU devices; the
GPU tier runs the custom calls at 1 device against jax.lax's own."""
import pytest
from conftest import spawn_cpu, xla_handler_or_skip

from symnccl.bootstrap import spawn

jax = pytest.importorskip("jax", reason="jax is not installed")


# ----------------------------------------------------------------- CPU tier

def test_all_to_all_handlers_exist_and_others_are_refused():
    import symnccl.jax as sj
    from symnccl import _C
    for name in ("all_to_all", "all_to_all_v"):
        assert type(_C._xla_handler(name)).__name__ == "PyCapsule", name
    # symnccl.jax registers every handler of the C table, by its target
    assert {f"symnccl_{k}" for k in _C.XLA_HANDLERS} == set(
        sj.TARGETS.values()) and "all_to_all_v" in _C.XLA_HANDLERS
    with pytest.raises(ValueError, match="no XLA handler for 'ragged'"):
        _C._xla_handler("ragged")


def test_custom_calls_lower_with_their_algo(monkeypatch):
    """No GPU: all_to_all lowers to one symnccl_all_to_all, ragged to the
    offsets' symnccl_all_to_all and the rows' symnccl_all_to_all_v, each
    with its algo code; ragged's "auto" is push."""
    xla_handler_or_skip("all_to_all")
    import jax.numpy as jnp
    import symnccl.jax as sj
    monkeypatch.setattr(sj, "_nranks", lambda: 2)
    f = jax.jit(lambda a: sj.all_to_all(a, 1, 0, tiled=True, algo="ll"))
    text = f.trace(jax.ShapeDtypeStruct((3, 8), jnp.bfloat16)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("stablehlo.custom_call @symnccl_all_to_all(") == 1, \
        text
    assert f"algo = {sj._ALGO_CODES['ll']} : i32" in text
    i = jax.ShapeDtypeStruct((2,), jnp.int32)
    g = jax.jit(lambda *a: sj.ragged_all_to_all(*a))
    text = g.trace(jax.ShapeDtypeStruct((10, 4), jnp.float32),
                   jax.ShapeDtypeStruct((12, 4), jnp.float32),
                   i, i, i, i).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("@symnccl_all_to_all_v(") == 1, text
    assert text.count("@symnccl_all_to_all(") == 1, text
    assert text.count(f"algo = {sj._ALGO_CODES['push']} : i32") == 2, text


def test_bad_arguments_raise_naming_what_was_seen(monkeypatch):
    import jax.numpy as jnp
    import symnccl.jax as sj
    with pytest.raises(RuntimeError, match="communicator\\(\\) first"):
        sj.all_to_all(jnp.ones((4, 2)), 0, 0, tiled=True)
    monkeypatch.setattr(sj, "_nranks", lambda: 2)
    x = jnp.ones((4, 3))
    with pytest.raises(ValueError, match="algo 'fast' is not available"):
        sj.all_to_all(x, 0, 0, tiled=True, algo="fast")
    with pytest.raises(ValueError, match="scalar"):
        sj.all_to_all(jnp.ones(()), 0, 0)
    with pytest.raises(ValueError, match="concat_axis 2 is out of range"):
        sj.all_to_all(x, 0, 2, tiled=True)
    with pytest.raises(ValueError, match=r"x.shape\[1\] is 3, expected a "
                       r"multiple of nranks \(2\)"):
        sj.all_to_all(x, 1, 0, tiled=True)
    with pytest.raises(ValueError, match=r"x.shape\[0\] is 4, expected "
                       r"nranks \(2\) with tiled=False"):
        sj.all_to_all(x, 0, 1)
    i = jnp.zeros(2, jnp.int32)
    with pytest.raises(ValueError, match="algo 'nccl' would read the sizes"):
        sj.ragged_all_to_all(x, x, i, i, i, i, algo="nccl")
    with pytest.raises(ValueError, match=r"output \(5, 2\), expected rows"):
        sj.ragged_all_to_all(x, jnp.ones((5, 2)), i, i, i, i)
    with pytest.raises(TypeError, match="output has dtype int32, expected "
                       "float32"):
        sj.ragged_all_to_all(x, x.astype(jnp.int32), i, i, i, i)
    with pytest.raises(ValueError, match=r"send_sizes has shape \(4,\), "
                       r"expected \(2,\)"):
        sj.ragged_all_to_all(x, x, i, jnp.zeros(4, jnp.int32), i, i)
    with pytest.raises(TypeError, match="recv_sizes has dtype float32"):
        sj.ragged_all_to_all(x, x, i, i, i, jnp.zeros(2))


def test_jnp_and_gradient_rules_match_jax_collectives_on_cpu():
    """No GPU: with the custom calls replaced by JAX's collectives of the
    same meaning (2 CPU devices), every split/concat axis pair, tiled and
    not, and ragged exchanges with padding and empty slices give jax.lax's
    values and gradients inside shard_map (check_vma on; off for the
    ragged cases and two of the others): the reshapes around the call and
    the custom_vjp rules (the transposes)."""
    from _workers import jax_alltoall_workers as W
    rows = spawn_cpu(W.rules_on_cpu, 3)
    def cases(c):   # a row per case (+ 1: an untiled pair's values)
        return sum(2 if not t and sa != ca else 1 for _, sa, ca, t in c)
    assert len(rows) == cases(W.A2A_CASES) + cases(W.A2A_VMA_OFF) + 2 * 2
    for case, dy, dx in rows:
        assert dy == 0.0 and dx < 1e-6, (case, dy, dx)


def test_results_vary_as_jax_collectives_do():
    from _workers import jax_alltoall_workers as W
    assert spawn_cpu(W.result_types_on_cpu) == {
        "all_to_all": ["x"], "ragged_all_to_all": ["x"],
        "all_to_all of an invariant x": ["x"],
        "ragged_all_to_all of an invariant x": ["x"]}


# ----------------------------------------------------------------- GPU tier

@pytest.mark.gpu
def test_one_device_equals_jax_lax_and_names_its_kernels():
    """At 1 device, inside jit(shard_map): all_to_all equals
    jax.lax.all_to_all and ragged_all_to_all equals
    jax.lax.ragged_all_to_all bit for bit (several dtypes, tiled and not,
    an empty x, an empty slice), gradients included; the launch counters
    show the kernel of each algo ran (all_to_all's "auto": ll at these
    sizes, by the AUTO_TABLE row that serves 1 and 2 ranks; ragged's:
    push)."""
    xla_handler_or_skip("all_to_all")
    from _workers import jax_alltoall_workers as W
    res = spawn(W.one_gpu, 1, args=(13,), timeout=600)[0]
    bad = [r for r in res["rows"] if not r[1]]
    assert not bad, bad[:10]
    want = {"push": [res["names"]["push"]], "ll": [res["names"]["ll"]],
            "nccl": ["nccl"], "auto": [res["names"]["ll"]]}
    for case, _, ran in res["rows"]:
        if case.startswith("all_to_all "):
            algo, shape = case.split()[1], case.split(" ", 3)[3]
            assert ran == ([] if shape.startswith("(0,") else want[algo]), \
                (case, ran)
    # ragged: the offsets' exchange and the rows', both on the kernel
    k = res["kernels"]
    assert k["ragged push"] == {res["names"]["push"]: 2}, k
    assert k["ragged auto"] == {res["names"]["push"]: 2}, k
    assert k["ragged ll"] == {res["names"]["ll"]: 2}, k
