"""symnccl.jax.all_reduce_rmsnorm: the fused all-reduce + residual add +
RMSNorm (+ FP8) as an XLA custom call inside jax.jit, shard_map and
jax.grad. CPU tests: the lowering, the result types, the argument checks
and the differentiation rules (with JAX's psum standing in for the custom
calls); GPU tests: one device, against the float64 reference and the
unfused composition's gradients, in a fresh process (JAX must not take the
GPU's memory from the tests that follow)."""
import pytest
from conftest import spawn_cpu, xla_handler_or_skip

from symnccl.bootstrap import spawn

jax = pytest.importorskip("jax", reason="jax is not installed")

TARGET = "symnccl_all_reduce_rmsnorm"


def _specs(jnp, T=5, H=64, dtype=None):
    dtype = dtype or jnp.bfloat16
    S = jax.ShapeDtypeStruct
    return S((T, H), dtype), S((T, H), dtype), S((H,), dtype)


def _lowered(f, *specs):
    return jax.jit(f).trace(*specs).lower(
        lowering_platforms=("cuda",)).as_text()


# ------------------------------------------------------------------ CPU

def test_custom_call_lowers_with_its_operands_and_attributes():
    """No GPU: one custom call, x, residual and weight in, y and h out; eps
    and the algorithm as attributes; no collective memory space (the fused
    kernels copy x into the staging window themselves)."""
    xla_handler_or_skip("all_reduce_rmsnorm")
    import jax.numpy as jnp
    import symnccl.jax as sj
    text = _lowered(lambda x, r, w: sj.all_reduce_rmsnorm(
        x, r, w, 1e-5, algo="two_shot"), *_specs(jnp))
    assert text.count(f"stablehlo.custom_call @{TARGET}") == 1, text
    assert f"algo = {sj._ALGO_CODES['two_shot']} : i32" in text, text
    import re
    eps = re.search(r"eps = ([-+.0-9eE]+) : f32", text)
    assert eps and abs(float(eps.group(1)) - 1e-5) < 1e-11, text
    assert "memory_spaces" not in text
    call = next(l for l in text.splitlines() if TARGET in l)
    assert call.count("tensor<5x64xbf16>") == 4, call   # x, residual, y, h


def test_fp8_static_has_a_scale_operand_and_dynamic_a_scale_result():
    xla_handler_or_skip("all_reduce_rmsnorm")
    import jax.numpy as jnp
    import symnccl.jax as sj
    x, r, w = _specs(jnp)
    s = jax.ShapeDtypeStruct((1,), jnp.float32)
    static = next(l for l in _lowered(
        lambda x, r, w, s: sj.all_reduce_rmsnorm(x, r, w, quant="fp8",
                                                 scale=s),
        x, r, w, s).splitlines() if TARGET in l)
    assert "tensor<1xf32>) -> (tensor<5x64xf8E4M3FN>, tensor<5x64xbf16>)" \
        in static, static
    dynamic = next(l for l in _lowered(
        lambda x, r, w: sj.all_reduce_rmsnorm(x, r, w, quant="fp8"),
        x, r, w).splitlines() if TARGET in l)
    assert "-> (tensor<5x64xf8E4M3FN>, tensor<5x64xbf16>, tensor<5x1xf32>)" \
        in dynamic, dynamic


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_results_have_x_s_shape_and_dtype(dtype, monkeypatch):
    """(y, h) of x's shape and dtype (any leading dimensions); quant="fp8":
    float8_e4m3fn y and float32 row scales (..., 1), or the static scale
    given back as it was."""
    import jax.numpy as jnp
    import symnccl.jax as sj
    monkeypatch.setattr(sj, "_registered", True)   # tracing needs none
    S = jax.ShapeDtypeStruct
    dt = jnp.dtype(dtype)
    x, w = S((2, 3, 16), dt), S((16,), dt)
    y, h = jax.eval_shape(lambda x, w: sj.all_reduce_rmsnorm(x, x, w), x, w)
    assert (y.shape, y.dtype, h.shape, h.dtype) == ((2, 3, 16), dt,
                                                    (2, 3, 16), dt)
    q, h, s = jax.eval_shape(
        lambda x, w: sj.all_reduce_rmsnorm(x, x, w, quant="fp8"), x, w)
    assert (q.dtype, h.dtype, s.shape, s.dtype) == (
        jnp.float8_e4m3fn, dt, (2, 3, 1), jnp.float32)
    q, h, s = jax.eval_shape(
        lambda x, w, s: sj.all_reduce_rmsnorm(x, x, w, quant="fp8",
                                              scale=s),
        x, w, S((), jnp.float32))
    assert q.dtype == jnp.float8_e4m3fn and s.shape == ()


def test_bad_arguments_raise_before_lowering(monkeypatch):
    import jax.numpy as jnp
    import symnccl.jax as sj
    monkeypatch.setattr(sj, "_registered", True)
    S = jax.ShapeDtypeStruct
    x, r, w = _specs(jnp)

    def trace(*specs, **kw):
        return jax.eval_shape(
            lambda *t: sj.all_reduce_rmsnorm(*t, **kw), *specs)
    with pytest.raises(TypeError, match="dtypes int32, int32, int32, "
                                        "expected one of float32"):
        trace(*_specs(jnp, dtype=jnp.int32))
    with pytest.raises(TypeError, match="bfloat16, float32, bfloat16"):
        trace(x, S((5, 64), jnp.float32), w)
    with pytest.raises(ValueError, match=r"shape \(5, 12\), expected .*"
                                         "multiple of 8"):
        trace(S((5, 12), jnp.bfloat16), S((5, 12), jnp.bfloat16),
              S((12,), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"weight \(32,\), expected "
                                         r"\(5, 64\) \(x's\) and \(64,\)"):
        trace(x, r, S((32,), jnp.bfloat16))
    with pytest.raises(ValueError, match="residual has shape \\(4, 64\\)"):
        trace(x, S((4, 64), jnp.bfloat16), w)
    with pytest.raises(ValueError, match="quant='int8', expected None or "
                                         "'fp8'"):
        trace(x, r, w, quant="int8")
    with pytest.raises(ValueError, match="scale= is given without"):
        jax.eval_shape(lambda x, r, w, s: sj.all_reduce_rmsnorm(
            x, r, w, scale=s), x, r, w, S((1,), jnp.float32))
    with pytest.raises(ValueError, match="scale has dtype bfloat16 and "
                                         "shape \\(2,\\)"):
        jax.eval_shape(lambda x, r, w, s: sj.all_reduce_rmsnorm(
            x, r, w, quant="fp8", scale=s), x, r, w,
            S((2,), jnp.bfloat16))
    with pytest.raises(ValueError, match="eps is -1.0"):
        trace(x, r, w, eps=-1.0)
    with pytest.raises(ValueError, match="algo 'fast' is not available"):
        trace(x, r, w, algo="fast")


def test_fp8_output_has_no_gradient(monkeypatch):
    """As symnccl.torch's op: jax.grad through a quantised call raises,
    naming the call, instead of giving a gradient."""
    import jax.numpy as jnp
    import symnccl.jax as sj
    monkeypatch.setattr(sj, "_registered", True)
    x, r, w = _specs(jnp, dtype=jnp.float32)

    def loss(x, r, w):
        q, h, s = sj.all_reduce_rmsnorm(x, r, w, quant="fp8")
        return jnp.sum(q.astype(jnp.float32) * s) + jnp.sum(h)
    with pytest.raises(NotImplementedError, match="all_reduce_rmsnorm: "
                                                  "quant='fp8' has no "
                                                  "gradient"):
        jax.make_jaxpr(jax.grad(loss))(x, r, w)
    # without differentiation the quantised call traces
    jax.make_jaxpr(loss)(x, r, w)


def test_results_vary_where_residual_does_inside_shard_map():
    """No GPU: with check_vma, y, h and the row scales are invariant for a
    replicated residual (the all-reduce's part is, as psum's) and vary with
    a sharded one: the types the gradient rules rely on."""
    from _workers import jax_fused_workers as W
    assert spawn_cpu(W.result_types_on_cpu) == {
        "replicated": [[], [], []], "sharded": [["x"], ["x"], ["x"]]}


def test_differentiation_rules_match_the_unfused_composition_on_cpu():
    """No GPU: the custom_vjp rule, with psum standing in for the custom
    calls, gives JAX's gradients of psum + add + RMSNorm inside shard_map
    on 2 devices, check_vma on and off, residual replicated and
    sharded."""
    from _workers import jax_fused_workers as W
    rows = spawn_cpu(W.rules_on_cpu, 3)
    assert len(rows) == 4
    for case, dy, dh, dx, dres, dw in rows:
        assert dy == 0 and dh == 0, (case, dy, dh)
        assert max(dx, dres, dw) < 1e-4, (case, dx, dres, dw)


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
def test_one_device_values_kernels_and_fp8():
    """One GPU (symnccl.jax.communicator()): jit and shard_map within the
    float64 reference's rounding bounds for float32, float16 and bfloat16;
    auto and one_shot run one_shot_rmsnorm, two_shot two_shot_rmsnorm, nccl
    NCCL's all-reduce then the add+norm, all with the same bits; FP8
    static and dynamic within one e4m3 step after dequantisation (dynamic
    scales exactly amax / 448)."""
    xla_handler_or_skip("all_reduce_rmsnorm")
    from _workers import jax_fused_workers as W
    res = spawn(W.gpu_one_device, 1, args=(5, ("values", "algos", "fp8")),
                timeout=600)[0]
    assert not res["errors"], res
    assert not res["wrong"], res["wrong"]
    assert res["algos"] == {"auto": ["one_shot_rmsnorm"],
                            "one_shot": ["one_shot_rmsnorm"],
                            "two_shot": ["two_shot_rmsnorm"],
                            "nccl": ["nccl", "one_shot_rmsnorm"]}, \
        res["algos"]
    assert res["same_bits"]
    assert [f[0] for f in res["fp8"]] == ["static", "dynamic"]
    for kind, dtype, off, shape_or_h, exact in res["fp8"]:
        assert dtype == "float8_e4m3fn" and off == 0, (kind, off)
        assert shape_or_h and exact, kind


@pytest.mark.gpu
@pytest.mark.slow   # a JAX process and 8 compiles (4.5 s on an H100)
def test_one_device_gradients_are_the_unfused_composition_s():
    """jit(grad) through shard_map (check_vma on and off) equal to the
    unfused composition's (psum, add, RMSNorm in JAX's ops), with the fused
    kernel in the forward: 4 launches, the calls and their gradients'
    forwards."""
    xla_handler_or_skip("all_reduce_rmsnorm")
    from _workers import jax_fused_workers as W
    res = spawn(W.gpu_one_device, 1, args=(5, ("grads",)), timeout=600)[0]
    assert not res["errors"], res
    assert len(res["grads"]) == 2
    for case, dy, dh, dx, dres, dw in res["grads"]:
        assert max(dy, dh) < 1e-5, (case, dy, dh)
        assert max(dx, dres, dw) < 1e-4, (case, dx, dres, dw)
    assert res["grad_launches"] == 4, res["grad_launches"]
