"""Type stubs for symnccl._C, the C extension (csrc/). Its docstrings and
inspect.signature give the same signatures at run time."""
from typing import Any, Optional, Sequence, Union

StreamLike = Union[None, int, Any]   # a handle, torch/cupy stream, __cuda_stream__
Shape = Union[int, Sequence[int]]
DType = Union[str, Any]              # "bfloat16", numpy/torch/jax dtypes

NCCL_BUILD_VERSION: int
CUDA_BUILD_VERSION: int
MAX_CTAS: int
UNIQUE_ID_BYTES: int
NCCL_DEVICE_API_BUILDS: tuple[tuple[int, int], ...]
DTYPES: tuple[str, ...]
KERNEL_DTYPES: tuple[str, ...]
OPS: tuple[str, ...]
OP_CODES: dict[str, int]
KERNEL_OPS: tuple[str, ...]
ALGORITHMS: tuple[str, ...]
ALGO_CODES: dict[str, int]
ALGO_SUMMARY: dict[str, str]
ALGO_KERNELS: dict[str, tuple[str, ...]]
COLLECTIVE_KERNELS: dict[str, dict[str, str]]
KERNELS: tuple[str, ...]
MULTIMEM_OPS: dict[str, tuple[str, ...]]
AUTO_TABLE: tuple[dict[str, Any], ...]
KERNEL_TABLE: tuple[dict[str, Any], ...]
NCCL_WINDOW_POLICY: tuple[dict[str, Any], ...]
NCCL_DEVICE_API_HEADERS: dict[int, int]
NCCL_PDL_WAITS_FROM: int
NCCL_NEWEST_MINOR: int
NCCL_SUPPORT: dict[str, tuple[dict[str, Any], ...]]
DEFAULT_TIMEOUT: float
MAX_TIMEOUT: float
XLA_HANDLERS: tuple[str, ...]
KNOBS: dict[str, tuple[Any, ...]]


class NcclError(RuntimeError):
    code: int


class CudaError(RuntimeError):
    code: int


class PeerTimeoutError(TimeoutError):
    rank: Optional[int]
    collective: str
    kernel: str
    reason: str
    waited: float


class CallMismatchError(RuntimeError):
    rank: Optional[int]
    collective: str
    kernel: str
    reason: str
    waited: float


class SymmetricBuffer:
    shape: tuple[int, ...]
    dtype: str
    size: int
    nbytes: int
    device: int
    ptr: int
    registered: bool
    comm: Optional["Communicator"]
    def __dlpack__(self, *, stream: Optional[int] = None,
                   max_version: Optional[tuple[int, int]] = None,
                   dl_device: Optional[tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def copy_from_host(self, obj: Any, /) -> None: ...
    def to_bytes(self) -> bytes: ...


class DeviceArray(SymmetricBuffer): ...


class Communicator:
    rank: int
    nranks: int
    device: int
    lsa_size: int
    lsa_rank: int
    symmetric: bool
    symmetric_reason: str
    device_api_reason: Optional[str]
    multicast: bool
    multicast_reason: str
    closed: bool
    timeout: float
    staging_bytes: int
    nccl_comm: int
    knobs: dict[str, Any]
    failure: Optional[dict[str, Any]]
    def __init__(self, unique_id: bytes, rank: int, nranks: int,
                 device: Optional[int] = None, *, timeout: float = 600.0,
                 multicast: Optional[bool] = None,
                 staging_bytes: int = 33554432) -> None: ...
    @classmethod
    def init_all(cls, devices: Sequence[int], *, timeout: float = 600.0,
                 multicast: Optional[bool] = None) -> list["Communicator"]: ...
    def empty(self, shape: Shape, dtype: DType = "float32"
              ) -> SymmetricBuffer: ...
    def zeros(self, shape: Shape, dtype: DType = "float32"
              ) -> SymmetricBuffer: ...
    def all_reduce(self, x: Any, out: Any = None, op: str = "sum",
                   algo: str = "auto", stream: StreamLike = None) -> Any: ...
    def reduce_scatter(self, x: Any, out: Any = None, op: str = "sum",
                       algo: str = "auto", stream: StreamLike = None
                       ) -> Any: ...
    def all_gather(self, x: Any, out: Any = None, algo: str = "auto",
                   stream: StreamLike = None) -> Any: ...
    def broadcast(self, x: Any, root: int = 0, out: Any = None,
                  algo: str = "auto", stream: StreamLike = None) -> Any: ...
    def reduce(self, x: Any, root: int = 0, out: Any = None,
               op: str = "sum", algo: str = "auto",
               stream: StreamLike = None) -> Any: ...
    def all_to_all(self, x: Any, out: Any = None, algo: str = "auto",
                   stream: StreamLike = None) -> Any: ...
    def all_to_all_v(self, x: Any, out: Any, in_splits: Any,
                     out_splits: Any = None, algo: str = "auto",
                     stream: StreamLike = None, *,
                     out_offsets: Any = None) -> Any: ...
    def barrier(self, stream: StreamLike = None, *,
                blocking: bool = False) -> None: ...
    def all_reduce_rmsnorm(self, x: Any, residual: Any, weight: Any,
                           eps: float, *, out: Any = None,
                           residual_out: Any = None,
                           quant: Optional[str] = None, scale: Any = None,
                           algo: str = "auto", stream: StreamLike = None
                           ) -> tuple[Any, Any]: ...
    def check(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def __enter__(self) -> "Communicator": ...
    def __exit__(self, *exc: Any) -> None: ...
    # testing and benchmark hooks
    def _launches(self) -> dict[str, int]: ...
    def _staging_layout(self) -> dict[str, int]: ...
    def _epoch(self, kernel: str, /) -> int: ...
    def _algo_unavailable(self, algo: str, dtype: str, op: str = "sum",
                          collective: str = "all_reduce"
                          ) -> Optional[str]: ...
    @classmethod
    def _loopback(cls, nranks: int, device: int = -1, *,
                  timeout: float = 30.0, staging_bytes: int = 33554432
                  ) -> list["Communicator"]: ...
    def _auto_algo(self, nbytes: int, dtype: str, op: str,
                   in_window: bool, collective: str = "all_reduce"
                   ) -> str: ...
    def _inject_fault(self, kernels: Sequence[str]) -> None: ...


def get_unique_id() -> bytes: ...
def _multi_gpu_caveat() -> str | None: ...
def _check_timeout(seconds: float, /) -> float: ...
def _exit_timeout() -> float: ...
def _nccl_pick_build(runtime: int, headers: tuple[int, ...], /
                     ) -> int | str: ...
def _nccl_multi_gpu_caveat(runtime: int, headers: int, /) -> str | None: ...
def nccl_runtime_version() -> int: ...
def nccl_device_api() -> tuple[int, int]: ...
def cuda_versions() -> dict[str, int]: ...
