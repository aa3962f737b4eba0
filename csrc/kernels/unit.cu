// One kernel unit: every kernel family (lsa.cuh, packet.cuh, push.cuh)
// instantiated for one element type. setup.py compiles this file once per
// entry of SYMNCCL_KERNEL_DTYPES (launch.h) with -DSYMNCCL_UNIT_DT=<ID>, so
// the units build in parallel; launch.cu picks the unit by dtype.
#include "devcomm.cuh"
#include "lsa.cuh"
#include "packet.cuh"
#include "push.cuh"

#ifndef SYMNCCL_UNIT_DT
#error "compile with -DSYMNCCL_UNIT_DT=<ID of SYMNCCL_KERNEL_DTYPES>"
#endif

SYMNCCL_BEGIN
// The kernels that move bytes (all_gather, broadcast), in the unit of
// SYMNCCL_DT_BYTES only; nullptr elsewhere.
template <typename T>
void (*bytes_kernel(const symnccl_kargs& a))(ncclDevComm,
                                             const symnccl_kargs) {
  if constexpr (std::is_same<T, DType<SYMNCCL_DT_BYTES>::type>::value) {
    switch (a.kernel) {
      case SYMNCCL_K_PUSH_ALL_GATHER:
        return push_split(a) ? push_all_gather<T, true>
                             : push_all_gather<T, false>;
      case SYMNCCL_K_LL_ALL_GATHER: return packet_all_gather<T, LL>;
      case SYMNCCL_K_LL128_ALL_GATHER: return packet_all_gather<T, LL128>;
      case SYMNCCL_K_ONE_SHOT_BROADCAST: return one_shot_broadcast<T>;
    }
  }
  return nullptr;
}
SYMNCCL_END

#define SYMNCCL_CAT_(a, b) a##b
#define SYMNCCL_CAT(a, b) SYMNCCL_CAT_(a, b)

// symnccl_launch_<ID>: declared in launch.cu.
cudaError_t SYMNCCL_CAT(symnccl_launch_, SYMNCCL_UNIT_DT)(
    const symnccl_kargs* a, cudaStream_t stream) {
  using namespace symnccl;
  using T = DType<SYMNCCL_CAT(SYMNCCL_DT_, SYMNCCL_UNIT_DT)>::type;
  void (*kernel)(ncclDevComm, const symnccl_kargs);
  switch (a->kernel) {
    case SYMNCCL_K_ONE_SHOT: kernel = one_shot<T>; break;
    case SYMNCCL_K_TWO_SHOT: kernel = two_shot<T>; break;
    case SYMNCCL_K_LL: kernel = packet_one_shot<T, LL>; break;
    case SYMNCCL_K_LL_TWO_SHOT: kernel = packet_two_shot<T, LL>; break;
    case SYMNCCL_K_LL128: kernel = packet_one_shot<T, LL128>; break;
    case SYMNCCL_K_LL128_TWO_SHOT: kernel = packet_two_shot<T, LL128>; break;
    case SYMNCCL_K_PUSH: kernel = push<T>; break;
    case SYMNCCL_K_LL_REDUCE_SCATTER:
      kernel = packet_reduce_scatter<T, LL>;
      break;
    case SYMNCCL_K_LL128_REDUCE_SCATTER:
      kernel = packet_reduce_scatter<T, LL128>;
      break;
    case SYMNCCL_K_ONE_SHOT_REDUCE: kernel = one_shot_reduce<T>; break;
    case SYMNCCL_K_PUSH_REDUCE_SCATTER:
      kernel = push_split(*a) ? push_reduce_scatter<T, true>
                              : push_reduce_scatter<T, false>;
      break;
    case SYMNCCL_K_LL_ALL_GATHER:
    case SYMNCCL_K_LL128_ALL_GATHER:
    case SYMNCCL_K_ONE_SHOT_BROADCAST:
    case SYMNCCL_K_PUSH_ALL_GATHER:
      kernel = bytes_kernel<T>(*a);
      if (kernel == nullptr) return cudaErrorInvalidValue;
      break;
    default: return cudaErrorInvalidValue;
  }
  return symnccl_launch_kernel(kernel, *a, stream);
}
