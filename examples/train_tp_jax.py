"""Tensor- and sequence-parallel training of a transformer MLP block in
jax.jit + shard_map with symnccl, next to the same training with JAX's own
collectives (all_gather, psum_scatter).

One process drives every local GPU. Each device holds 1/n of the sequence
and 1/n of the MLP:

    x (T/n, H) -> LayerNorm -> all_gather (T, H) -> x @ W1[:, shard] -> GELU
      -> @ W2[shard, :] (partial sums) -> reduce_scatter (T/n, H) -> + x

Both runs start from the same weights and see the same data; the script
prints both loss curves, their largest difference and the median step time
of each. Run it as is:

    python examples/train_tp_jax.py
    python examples/train_tp_jax.py --algo ll128

--algo picks symnccl's all_gather / reduce_scatter algorithm, as in
train_tp_torch.py.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import symnccl.jax as sj  # noqa: E402

AXIS = "tp"


def collectives(kind, algo="auto"):
    """(all_gather, reduce_scatter) along axis 0 of a shard."""
    if kind == "symnccl":
        return (lambda a: sj.all_gather(a, algo=algo),
                lambda a: sj.reduce_scatter(a, algo=algo))
    return (lambda a: jax.lax.all_gather(a, AXIS, tiled=True),
            lambda a: jax.lax.psum_scatter(a, AXIS, tiled=True))


def init(hidden, ffn, layers, dtype, seed=0):
    """The whole model (sharded when placed: W1 by columns, W2 by rows)."""
    rng = np.random.default_rng(seed)
    return [{"scale": jnp.ones(hidden, dtype),
             "w1": jnp.asarray(rng.standard_normal((hidden, ffn))
                               / hidden ** 0.5, dtype),
             "w2": jnp.asarray(rng.standard_normal((ffn, hidden))
                               / ffn ** 0.5, dtype)}
            for _ in range(layers)]


SPECS = {"scale": P(), "w1": P(None, AXIS), "w2": P(AXIS, None)}


def layer_norm(x, scale):
    xf = x.astype(jnp.float32)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    return ((xf - mu) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * scale


def make_step(kind, mesh, lr, algo):
    gather, scatter = collectives(kind, algo)

    def block(params, x):
        for p in params:
            h = gather(layer_norm(x, p["scale"]))
            h = jax.nn.gelu(h @ p["w1"])
            x = x + scatter(h @ p["w2"])
        return x

    def shard_loss(params, x, y):
        out = block(params, x)
        err = jnp.sum((out.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)
        # the mean over the whole sequence: every shard's sum, reduced
        return jax.lax.psum(err, AXIS) / (y.size * jax.lax.axis_size(AXIS))

    def loss(params, x, y):
        specs = [SPECS for _ in params]
        f = jax.shard_map(shard_loss, mesh=mesh,
                          in_specs=(specs, P(AXIS), P(AXIS)), out_specs=P())
        return f(params, x, y)

    @jax.jit
    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        params = jax.tree.map(lambda p, g: p - lr * g.astype(p.dtype),
                              params, grads)
        return params, value
    return step


def data(step, seq, hidden, dtype):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((seq, hidden))
    y = np.tanh(x @ rng.standard_normal((hidden, hidden)) / hidden ** 0.5)
    return jnp.asarray(x, dtype), jnp.asarray(y, dtype)


def train(kind, args, mesh):
    dtype = jnp.dtype(args.dtype)
    params = init(args.hidden, args.ffn, args.layers, dtype)
    params = [{k: jax.device_put(v, NamedSharding(mesh, SPECS[k]))
               for k, v in p.items()} for p in params]
    seq_sharding = NamedSharding(mesh, P(AXIS))
    batches = [tuple(jax.device_put(a, seq_sharding)
                     for a in data(s % 8, args.seq, args.hidden, dtype))
               for s in range(min(args.steps, 8))]
    step = make_step(kind, mesh, args.lr, args.algo)
    losses, times = [], []
    for s in range(args.steps):
        x, y = batches[s % len(batches)]
        t0 = time.perf_counter()
        params, value = step(params, x, y)
        value = float(value)   # waits for the step
        times.append(time.perf_counter() - t0)
        losses.append(value)
    return losses, times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--algo", default="auto",
                   help="symnccl's all_gather/reduce_scatter algorithm")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    comms = sj.communicator()
    n = len(comms)
    if args.seq % n or args.ffn % n:
        raise SystemExit(f"--seq and --ffn must divide by {n} devices")
    mesh = jax.make_mesh((n,), (AXIS,))
    res = {}
    for kind in ("symnccl", "jax.lax"):
        losses, times = train(kind, args, mesh)
        warm = sorted(times[5:] or times)
        res[kind] = {"losses": losses, "step_ms": 1e3 * warm[len(warm) // 2]}
    a, b = res["symnccl"]["losses"], res["jax.lax"]["losses"]
    res["max_rel_diff"] = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    res["args"] = vars(args) | {"devices": n}
    # which of symnccl's kernels ran, summed over the devices, for the
    # tests (a diagnostic hook, not API)
    res["kernels"] = {}
    for c in comms:
        for k, v in c._launches().items():
            if v:
                res["kernels"][k] = res["kernels"].get(k, 0) + v
    print(f"{'step':>5} {'symnccl':>12} {'jax.lax':>12}")
    for s in list(range(0, args.steps, 10)) + [args.steps - 1]:
        print(f"{s:>5} {a[s]:>12.6f} {b[s]:>12.6f}")
    print(f"largest relative loss difference: {res['max_rel_diff']:.2e}")
    for kind in ("symnccl", "jax.lax"):
        print(f"{kind:>10}: {res[kind]['step_ms']:.3f} ms/step "
              "(median after 5 steps)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    for c in comms:
        c.close()


if __name__ == "__main__":
    main()
