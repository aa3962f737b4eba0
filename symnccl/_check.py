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


def reference(op: str, inputs: list[np.ndarray], dtype: str) -> np.ndarray:
    """The exact result: float64 for floats, int64 arithmetic for ints."""
    wide = np.float64 if is_float(dtype) else np.int64
    xs = np.stack([a.astype(wide) for a in inputs])
    n = len(inputs)
    if op == "sum":
        return xs.sum(0)
    if op == "prod":
        return xs.prod(0)
    if op == "max":
        return xs.max(0)
    if op == "min":
        return xs.min(0)
    if op == "avg":
        s = xs.sum(0)
        if is_float(dtype):
            return s / n
        return np.trunc(s / n).astype(np.int64)   # C integer division
    raise ValueError(op)


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
        o = out.astype(np.int64)
        if out.dtype.itemsize < 8:   # NCCL wraps like the hardware does
            bits = out.dtype.itemsize * 8
            signed = np.iinfo(out.dtype).min < 0
            m = ref & ((1 << bits) - 1)
            if signed:
                m = np.where(m >= 1 << (bits - 1), m - (1 << bits), m)
            ref = m
        return int(np.count_nonzero(o != ref))
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
