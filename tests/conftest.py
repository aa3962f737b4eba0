import pytest

import symnccl
from symnccl.bootstrap import local_device_count

NGPU = local_device_count()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and NGPU < 1:
            item.add_marker(pytest.mark.skip(
                reason="needs a CUDA GPU: none is visible to this process"))
        need = item.get_closest_marker("multigpu")
        if need is not None:
            n = need.args[0] if need.args else 2
            if NGPU < n:
                item.add_marker(pytest.mark.skip(
                    reason=f"needs {n} CUDA GPUs, {NGPU} visible"))


def ranks_param(*ns):
    """Parametrize over world sizes, each marked with the GPUs it needs."""
    return pytest.mark.parametrize(
        "nranks", [pytest.param(n, marks=[pytest.mark.gpu,
                                           pytest.mark.multigpu(n)])
                   for n in ns])


@pytest.fixture
def uid():
    return symnccl.get_unique_id()
