"""symnccl's all-reduce inside jax.jit + shard_map, one process driving every
local GPU, checked against jax.lax.psum.

    python examples/jax_shard_map_allreduce.py

With several processes (one GPU each), call jax.distributed.initialize()
first; the rest is unchanged.
"""
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import symnccl.jax as sj  # noqa: E402


def main():
    comms = sj.communicator()           # one communicator per local GPU
    n = len(comms)
    mesh = jax.make_mesh((n,), ("x",))
    shard = 1 << 16

    @jax.jit
    def ours(x):
        return jax.shard_map(lambda a: sj.all_reduce(a, op="sum"), mesh=mesh,
                             in_specs=P("x"), out_specs=P("x"))(x)

    @jax.jit
    def reference(x):
        return jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh,
                             in_specs=P("x"), out_specs=P("x"))(x)

    # small integers: exact in bf16 whatever the summation order
    host = np.random.default_rng(0).integers(-8, 9, n * shard)
    x = jax.device_put(jnp.asarray(host, jnp.bfloat16),
                       NamedSharding(mesh, P("x")))
    y, r = ours(x), reference(x)
    same = bool(jnp.all(y == r))
    print(f"{n} GPUs, {shard} bf16 per shard: symnccl == psum: {same}")
    for c in comms:
        c.close()
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
