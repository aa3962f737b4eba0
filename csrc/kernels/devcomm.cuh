// The device-communicator holder shared by the .cu files (C++ only).
#ifndef SYMNCCL_KERNELS_DEVCOMM_CUH
#define SYMNCCL_KERNELS_DEVCOMM_CUH

#include <nccl.h>
#include <nccl_device.h>

struct symnccl_devcomm {
  ncclDevComm dc;
  int requested_multimem;
};

namespace symnccl {

// Most ranks of one LSA team that the kernels' generic paths (world size
// not a template parameter, N = 0) handle.
constexpr int kMaxRanks = 32;

// Every rank's address of byte `off` of window `win`, in LSA rank order
// (N: the world size when it is a template parameter, else 0 and n ranks).
template <int N>
struct LsaPtrs {
  char* p[N > 0 ? N : kMaxRanks];
};

template <int N>
__device__ __forceinline__ LsaPtrs<N> lsa_ptrs(ncclWindow_t win, size_t off,
                                               int n) {
  LsaPtrs<N> r;
#pragma unroll
  for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
    if (N == 0 && q >= n) break;
    r.p[q] = static_cast<char*>(ncclGetLsaPointer(win, off, q));
  }
  return r;
}

}  // namespace symnccl

#endif  // SYMNCCL_KERNELS_DEVCOMM_CUH
