"""JAX workers for symnccl.jax.all_reduce_rmsnorm (tests/test_jax_fused.py):
each runs in a fresh process, since JAX reads XLA_FLAGS and the allocator
settings once, before its first use."""
import os

import numpy as np

EPS = 1e-6


def _cpu(ndev):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count="
                               f"{ndev}")
    os.environ["JAX_PLATFORMS"] = "cpu"


def _unfused(jax, jnp, x, residual, weight, eps, axis):
    """The composition the fused call stands for, in JAX's own ops: psum,
    the add rounded to x's dtype, the norm in fp32."""
    h = (jax.lax.psum(x, axis) + residual).astype(x.dtype)
    hf = h.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(hf * hf, -1, keepdims=True) + eps)
    y = (hf * rstd * weight.astype(jnp.float32)).astype(x.dtype)
    return y, h


def _grad_rows(jax, jnp, sj, mesh, axis, seed, check_vma, res_spec,
               dtype=None):
    """(case, max |dy|, max |dh|, max |dx|, max |dres|, max |dw|): jit(grad)
    through shard_map of sj.all_reduce_rmsnorm against the unfused
    composition, on random inputs and a random loss weighting of both
    outputs."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    dtype = dtype or jnp.float32
    n = mesh.devices.size
    rng = np.random.default_rng(seed)
    T, H = 3, 24
    put = lambda a, spec: jax.device_put(jnp.asarray(a, dtype),
                                         NamedSharding(mesh, spec))
    x = put(rng.standard_normal((n * T, H)), P(axis))
    res_rows = n * T if res_spec == P(axis) else T
    r = put(rng.standard_normal((res_rows, H)), res_spec)
    w = put(1 + 0.5 * rng.standard_normal(H), P())
    wy = jnp.asarray(rng.standard_normal((n * T, H)), jnp.float32)
    wh = jnp.asarray(rng.standard_normal((n * T, H)), jnp.float32)
    outs = []
    for f in (lambda x, r, w: sj.all_reduce_rmsnorm(x, r, w, EPS),
              lambda x, r, w: _unfused(jax, jnp, x, r, w, EPS, axis)):
        g = jax.shard_map(f, mesh=mesh, in_specs=(P(axis), res_spec, P()),
                          out_specs=(P(axis), P(axis)), check_vma=check_vma)

        def loss(x, r, w, g=g):
            y, h = g(x, r, w)
            return (jnp.sum(jnp.sin(y.astype(jnp.float32)) * wy) +
                    jnp.sum(jnp.cos(h.astype(jnp.float32)) * wh))
        y, h = jax.jit(g)(x, r, w)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, r, w)
        outs.append((y, h) + tuple(grads))
    diff = [float(jnp.max(jnp.abs(a.astype(jnp.float32) -
                                  b.astype(jnp.float32))))
            for a, b in zip(*outs)]
    case = f"residual {res_spec} vma={check_vma} {jnp.dtype(dtype).name}"
    return [(case, *diff)]


def rules_on_cpu(seed):
    """The differentiation rules alone, on 2 CPU devices: the custom call
    replaced by the unfused composition (the handler needs a GPU) and the
    backward's all-reduce by psum, gradients against JAX's own of the
    composition, inside shard_map with check_vma on and off, residual
    replicated and sharded."""
    _cpu(2)
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    import symnccl.jax as sj
    axis = "x"
    sj._nranks = lambda: 2
    sj._all_reduce_raw = lambda x, op, algo: jax.lax.psum(x, axis)

    def fused_raw(x, residual, weight, eps, quant, scale, algo):
        return _unfused(jax, jnp, x, residual, weight, eps, axis)
    sj._all_reduce_rmsnorm_raw = fused_raw
    mesh = jax.make_mesh((2,), (axis,))
    rows = []
    for vma in (True, False):
        for spec in (P(), P(axis)):
            rows += _grad_rows(jax, jnp, sj, mesh, axis, seed, vma, spec)
    return rows


def result_types_on_cpu():
    """The manual axes y, h and the row scales vary over inside shard_map
    (check_vma), traced only, for a replicated and a sharded residual."""
    _cpu(2)
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import symnccl.jax as sj
    sj._registered = True   # tracing needs no handler (and no CUDA)
    mesh = jax.make_mesh((2,), ("x",))
    seen = {}
    for spec in (P(), P("x")):
        def f(x, r, w, spec=spec):
            outs = (sj.all_reduce_rmsnorm(x, r, w) +
                    sj.all_reduce_rmsnorm(x, r, w, quant="fp8")[2:])
            key = "replicated" if spec == P() else "sharded"
            seen[key] = [sorted(sj._varying(o)) for o in outs]
            return x
        spec_of = lambda shape, s: jax.ShapeDtypeStruct(
            shape, jnp.bfloat16, sharding=NamedSharding(mesh, s))
        jax.make_jaxpr(jax.shard_map(
            f, mesh=mesh, in_specs=(P("x"), spec, P()),
            out_specs=P("x")))(spec_of((4, 16), P("x")),
                               spec_of((4 if spec == P("x") else 2, 16),
                                       spec),
                               spec_of((16,), P()))
    return seen


# ------------------------------------------------------------------ GPU

def _ulp(dtype):
    return {"float32": 2.0 ** -23, "float16": 2.0 ** -10,
            "bfloat16": 2.0 ** -7}[dtype]


def _wrong(x, r, w, y, h, dtype):
    """Elements of h and y outside the rounding bounds of the float64
    reference (tests/test_fused.py's bounds, one rank)."""
    x64, r64, w64 = (np.asarray(a, np.float64) for a in (x, r, w))
    h64 = x64 + r64
    H = h64.shape[-1]
    rstd = 1 / np.sqrt((h64 * h64).sum(-1, keepdims=True) / H + EPS)
    y64 = h64 * rstd * w64
    u = _ulp(dtype)
    mag = np.abs(x64) + np.abs(r64)
    hb = 2 * u * mag + 2.0 ** -23 * mag + 1e-30
    rel = (np.abs(h64) * hb).sum(-1, keepdims=True) / \
        (h64 * h64).sum(-1, keepdims=True)
    yb = (np.abs(w64) * rstd * hb * 1.01 +
          np.abs(y64) * (rel * 1.01 + 64 * 2.0 ** -24 + 3 * u) +
          1e-6 * rstd)
    hg = np.asarray(h, np.float64)
    yg = np.asarray(y, np.float64)
    return (int((~(np.abs(hg - h64) <= hb)).sum()),
            int((~(np.abs(yg - y64) <= yb)).sum()))


def _fp8_off(q, y, s):
    """Elements of q whose value is more than one e4m3 step from y / s
    (saturated to +-448)."""
    v = np.clip(np.asarray(y, np.float64) / s, -448.0, 448.0)
    a = np.abs(v)
    step = np.where(a >= 2.0 ** -6,
                    2.0 ** (np.floor(np.log2(np.maximum(a, 1e-30))) - 3),
                    2.0 ** -9)
    return int((~(np.abs(np.asarray(q, np.float64) - v) <= step)).sum())


def gpu_one_device(rank, nranks, uid, seed, parts):
    """One GPU, one communicator (symnccl.jax.communicator()): the fused
    custom call in jit and shard_map for each dtype against the float64
    reference; every algorithm's bits and the kernel (or NCCL) that ran
    (the launch counters); FP8 static and dynamic after dequantisation;
    gradients against the unfused composition's: the `parts` named. Each
    runs even when one before it raised (out["errors"] names what
    raised)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from _workers import jax_on_one_gpu
    jax_on_one_gpu(jax)
    import symnccl.jax as sj
    comms = sj.communicator()
    c = comms[0]
    mesh = jax.make_mesh((1,), ("x",))
    rng = np.random.default_rng(seed)
    out = {"wrong": [], "algos": {}, "fp8": [], "grads": [], "errors": {}}

    def values():
        T, H = 7, 1000
        for dtype in ("float32", "float16", "bfloat16"):
            jdt = jnp.dtype(dtype)
            # laid out as shard_map's in_specs say (it reshards nothing)
            put = lambda a, spec: jax.device_put(jnp.asarray(a, jdt),
                                                 NamedSharding(mesh, spec))
            x = put(rng.standard_normal((T, H)), P("x"))
            r = put(rng.standard_normal((T, H)), P())
            w = put(1 + 0.5 * rng.standard_normal(H), P())
            f = jax.jit(lambda x, r, w: sj.all_reduce_rmsnorm(x, r, w, EPS))
            sm = jax.jit(jax.shard_map(
                lambda x, r, w: sj.all_reduce_rmsnorm(x, r, w, EPS),
                mesh=mesh, in_specs=(P("x"), P(), P()),
                out_specs=(P("x"), P("x"))))
            for name, fn in (("jit", f), ("shard_map", sm)):
                y, h = fn(x, r, w)
                bad = _wrong(x.astype(jnp.float32), r.astype(jnp.float32),
                             w.astype(jnp.float32), y.astype(jnp.float32),
                             h.astype(jnp.float32), dtype)
                if bad != (0, 0) or y.dtype != jdt or h.dtype != jdt:
                    out["wrong"].append((name, dtype, bad, str(y.dtype)))

    x = jnp.asarray(rng.standard_normal((5, 4096)), jnp.bfloat16)
    r = jnp.asarray(rng.standard_normal((5, 4096)), jnp.bfloat16)
    w = jnp.asarray(1 + 0.5 * rng.standard_normal(4096), jnp.bfloat16)

    def algos():
        """every algorithm: the same bits, and the kernel the counters
        show"""
        bits = {}
        for algo in ("auto", "one_shot", "two_shot", "nccl"):
            before = c._launches()
            y, h = jax.jit(lambda x, r, w, algo=algo: sj.all_reduce_rmsnorm(
                x, r, w, EPS, algo=algo))(x, r, w)
            jax.block_until_ready((y, h))
            after = c._launches()
            out["algos"][algo] = sorted(k for k in after
                                        if after[k] != before[k])
            bits[algo] = (np.asarray(y).tobytes(), np.asarray(h).tobytes())
        out["same_bits"] = len(set(bits.values())) == 1

    def fp8():
        """static (a scale that saturates the largest values) and
        dynamic"""
        y, h = jax.jit(lambda x, r, w: sj.all_reduce_rmsnorm(
            x, r, w, EPS, algo="one_shot"))(x, r, w)
        yf = np.asarray(y.astype(jnp.float32), np.float64)
        s = np.float32(np.abs(yf).max() / 448.0 / 1.5)
        q, hq, sq = jax.jit(lambda x, r, w, s: sj.all_reduce_rmsnorm(
            x, r, w, EPS, quant="fp8", scale=s))(x, r, w, jnp.asarray([s]))
        out["fp8"].append(("static", str(q.dtype), _fp8_off(
            np.asarray(q.astype(jnp.float32)), yf, float(s)),
            np.asarray(hq).tobytes() == np.asarray(h).tobytes(),
            float(np.asarray(sq)[0]) == float(s)))
        q, hq, sd = jax.jit(lambda x, r, w: sj.all_reduce_rmsnorm(
            x, r, w, EPS, quant="fp8"))(x, r, w)
        amax = np.abs(yf).max(-1)
        want = np.maximum(amax / 448.0,
                          1.0 / (448.0 * 512)).astype(np.float32)
        sd = np.asarray(sd)
        out["fp8"].append(("dynamic", str(q.dtype), _fp8_off(
            np.asarray(q.astype(jnp.float32)), yf, sd.astype(np.float64)),
            sd.shape == (5, 1), bool(np.array_equal(sd[:, 0], want))))

    def grads():
        """jit(grad) through shard_map against the unfused composition,
        float32; each case runs the fused kernel twice (the call, and the
        forward of its gradient)"""
        before = c._launches()["one_shot_rmsnorm"]
        for vma in (True, False):
            out["grads"] += _grad_rows(jax, jnp, sj, mesh, "x", seed, vma,
                                       P())
        out["grad_launches"] = c._launches()["one_shot_rmsnorm"] - before

    for part in (values, algos, fp8, grads):
        if part.__name__ not in parts:
            continue
        try:
            part()
        except Exception as e:   # reported, and the next part runs
            out["errors"][part.__name__] = f"{type(e).__name__}: {e}"[:2000]
    c.close()
    return out
