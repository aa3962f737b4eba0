"""PyTorch integration: torch.distributed bootstrap, custom ops under
eager, torch.compile(fullgraph=True) and CUDA graphs."""
import pytest

from conftest import ranks_param
from symnccl.bootstrap import free_port, spawn

torch = pytest.importorskip("torch", reason="torch is not installed")


def test_custom_ops_are_registered_with_fake_kernels():
    import symnccl.torch  # noqa: F401
    assert hasattr(torch.ops.symnccl, "all_reduce")
    assert hasattr(torch.ops.symnccl, "all_reduce_")
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(8, 3)
        y = torch.ops.symnccl.all_reduce(x, 1, "sum", "auto")
    assert y.shape == (8, 3)


def test_the_private_torch_apis_symnccl_prefers_are_where_they_were():
    """symnccl reads torch's current raw stream (0.2 us instead of 4 for
    torch.cuda.current_stream) and shares unique ids through the default
    store; both have public fallbacks, and this fails when torch moves
    them, so that the fast paths are not lost silently."""
    import torch.distributed as dist
    assert callable(getattr(torch._C, "_cuda_getCurrentRawStream", None))
    assert callable(getattr(dist.distributed_c10d, "_get_default_store",
                            None))


def test_communicator_needs_torch_distributed():
    import symnccl.torch as snt
    if torch.distributed.is_initialized():
        pytest.skip("torch.distributed is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        snt.communicator()


@ranks_param(2)
def test_torch_bootstrap_eager_compile_and_graph(nranks):
    from _workers import torch_integration as T
    res = spawn(T.run, nranks, args=(free_port(),), timeout=600)
    for rank, r in enumerate(res):
        assert r["devices"] == (rank, rank)
        assert r["eager_out"] and r["eager_inplace"], r
        assert r["compiled"], r
        assert r["graph"], r
        assert r["delegates"], r
