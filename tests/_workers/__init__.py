"""Workers the tests run in fresh processes (symnccl.bootstrap.spawn)."""


def jax_on_one_gpu(jax):
    """Restricts JAX to the first GPU this process sees, before its backend
    starts. A one-device worker makes symnccl.jax.communicator()'s
    communicators (one per GPU JAX sees) and a one-device mesh: with every
    GPU of a 2-GPU machine visible it got a 2-rank communicator whose peer
    never called (each call waited out the timeout) and a mesh of the wrong
    size."""
    jax.config.update("jax_cuda_visible_devices", "0")
