"""Reference results and tolerances shared by the self-check
(`python -m symnccl`), the tests and the benchmarks.

Inputs are random, never zeros; every rank can regenerate every other rank's
input from (seed, rank), so each rank checks its own result against a float64
(or exact integer) reference without any communication.
"""
from __future__ import annotations

import numpy as np

try:
    import ml_dtypes
except ImportError:   # bf16/fp8 checks are then skipped, with a reason
    ml_dtypes = None

FLOAT_EPS = {
    "float64": 2.0 ** -52, "float32": 2.0 ** -23, "float16": 2.0 ** -10,
    "bfloat16": 2.0 ** -7, "float8_e4m3fn": 2.0 ** -3,
    "float8_e5m2": 2.0 ** -2,
}


def numpy_dtype(name: str):
    """numpy dtype for a symnccl dtype name, or None when it needs
    ml_dtypes and that is not installed."""
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return None if ml_dtypes is None else np.dtype(getattr(ml_dtypes,
                                                               name))
    return np.dtype(name)


def is_float(name: str) -> bool:
    return name in FLOAT_EPS


def make_input(dtype: str, count: int, rank: int, seed: int,
               op: str = "sum") -> np.ndarray:
    """Rank `rank`'s input: random, reproducible, exactly representable."""
    rng = np.random.default_rng([seed, rank, count])
    npdt = numpy_dtype(dtype)
    if is_float(dtype):
        if op == "prod":
            v = rng.uniform(0.5, 1.5, count)
        else:
            v = rng.uniform(-1.0, 1.0, count)
        if dtype.startswith("float8"):
            v *= 4.0
        return v.astype(npdt)
    info = np.iinfo(npdt)
    if op == "prod":
        lo, hi = (-2, 3) if info.min < 0 else (0, 4)
    else:
        lo, hi = (-100, 101) if info.min < 0 else (0, 101)
    return rng.integers(lo, hi, count).astype(npdt)


def _wrap(v: np.ndarray, npdt) -> np.ndarray:
    """Two's-complement wrap of int64 values into npdt, as the GPU does."""
    bits = np.dtype(npdt).itemsize * 8
    if bits >= 64:
        return v
    m = v & ((1 << bits) - 1)
    if np.iinfo(npdt).min < 0:
        m = np.where(m >= 1 << (bits - 1), m - (1 << bits), m)
    return m


def reference(op: str, inputs: list[np.ndarray], dtype: str) -> np.ndarray:
    """The exact result: float64 for floats; for integers, int64 arithmetic
    wrapped into the dtype (sum and product are wrapped once at the end,
    which modular arithmetic makes equal to wrapping every step), and avg
    as the wrapped sum divided by nranks with C truncation (NCCL's
    sum-then-divide)."""
    is_f = is_float(dtype)
    wide = np.float64 if is_f else np.int64
    xs = np.stack([a.astype(wide) for a in inputs])
    n = len(inputs)
    npdt = inputs[0].dtype
    if op == "sum":
        r = xs.sum(0)
    elif op == "prod":
        r = xs.prod(0)
    elif op == "max":
        r = xs.max(0)
    elif op == "min":
        r = xs.min(0)
    elif op == "avg":
        if is_f:
            return xs.sum(0) / n
        s = _wrap(xs.sum(0), npdt)
        return np.trunc(s / n).astype(np.int64)
    else:
        raise ValueError(op)
    return r if is_f else _wrap(r, npdt)


def count_wrong(out: np.ndarray, op: str, inputs: list[np.ndarray],
                dtype: str) -> int:
    """Elements of `out` outside the dtype's tolerance of the reference.

    Floats: |out - ref| <= (n + 1) * eps * sum_i |x_i| (+ one ulp of the
    result's rounding); max/min must be exact. NaN/inf is always wrong.
    Integers: exact.
    """
    ref = reference(op, inputs, dtype)
    n = len(inputs)
    if not is_float(dtype):
        return int(np.count_nonzero(out.astype(np.int64) != ref))
    o = out.astype(np.float64)
    if op in ("max", "min"):
        return int(np.count_nonzero(~np.isfinite(o) | (o != ref)))
    eps = FLOAT_EPS[dtype]
    mag = np.stack([np.abs(a.astype(np.float64)) for a in inputs])
    if op == "prod":
        scale = np.abs(ref)
    else:
        scale = mag.sum(0) / (n if op == "avg" else 1)
    tol = (n + 1) * eps * scale + eps * np.abs(ref) + 1e-30
    bad = ~np.isfinite(o) | (np.abs(o - ref) > tol)
    return int(np.count_nonzero(bad))


def poison(nbytes: int) -> np.ndarray:
    """0xFF bytes: NaN for every float dtype, -1 / max for integers."""
    return np.full(nbytes, 0xFF, np.uint8)
