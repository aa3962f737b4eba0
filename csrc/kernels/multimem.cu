// Multicast (NVLS) kernel: multimem.ld_reduce + multimem.st on the
// multicast address NCCL maps for a window (ncclGetLsaMultimemPointer).
//
// Built for every target and gated at run time: the host launches it only on
// a communicator whose ncclDevComm was granted lsaMultimem (comm.multicast),
// which symnccl never requests while NCCL_NVLS_ENABLE=0,
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1 or NVSHMEM_DISABLE_NVLS=1 is set. It has
// never run on the machines this project is developed on (multicast is
// disabled there); its PTX/SASS is checked by tests/test_cpu.py.
//
// Algorithm (in place in the window; one NVSwitch reduction per element):
//   0. input not in a window: copy it into this rank's staging window part;
//   1. barrier: every rank's input is in its window;
//   2. rank r takes slice r of the 16-byte vectors: one multimem.ld_reduce
//      reads the vector from every rank and reduces it in the switch (fp32
//      accumulation for 16-bit types), one multimem.st writes the result to
//      every rank's window;
//   3. barrier: every slice has landed everywhere;
//   4. out is not the window: copy the result out.
// Elements after the last whole vector (fewer than 8) are reduced by every
// rank from its peers' windows by plain loads, in rank order, before step 3
// and written after it, so nobody overwrites an input a peer still reads.
//
// Every element is reduced once, by one rank, and stored to all: every rank
// holds the same bits. The switch's reduction order is not specified, so the
// bits may differ from the one_shot/two_shot result.
//
// dtypes: float32 (sum, avg), float16 and bfloat16 (sum, avg, max, min). The
// fp8 forms of multimem.ld_reduce need arch-specific sm_100a targets; they
// are not built.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>
#include <nccl_device.h>

#include "devcomm.cuh"
#include "launch.h"
#include "primitives.cuh"

SYMNCCL_BEGIN
namespace {



#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SN_MULTIMEM 1
#endif

// One 16-byte vector reduced over every rank by the switch.
template <typename T>
__device__ __forceinline__ uint4 mm_ld_reduce(const void* mc, int op);

template <>
__device__ __forceinline__ uint4 mm_ld_reduce<float>(const void* mc, int) {
  uint4 r = {0, 0, 0, 0};
#ifdef SN_MULTIMEM
  asm volatile(
      "multimem.ld_reduce.relaxed.sys.global.add.v4.f32 {%0, %1, %2, %3}, "
      "[%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(mc)
      : "memory");
#endif
  return r;
}

#define SN_MM_16BIT(T, ptx_type)                                              \
  template <>                                                                 \
  __device__ __forceinline__ uint4 mm_ld_reduce<T>(const void* mc, int op) { \
    uint4 r = {0, 0, 0, 0};                                                   \
    SN_MM_16BIT_BODY(ptx_type)                                                \
    return r;                                                                 \
  }
#ifdef SN_MULTIMEM
#define SN_MM_16BIT_BODY(ptx_type)                                          \
  if (op == SYMNCCL_OP_MAX)                                                 \
    asm volatile("multimem.ld_reduce.relaxed.sys.global.max.v4." ptx_type   \
                 " {%0, %1, %2, %3}, [%4];"                                 \
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)               \
                 : "l"(mc)                                                  \
                 : "memory");                                               \
  else if (op == SYMNCCL_OP_MIN)                                            \
    asm volatile("multimem.ld_reduce.relaxed.sys.global.min.v4." ptx_type   \
                 " {%0, %1, %2, %3}, [%4];"                                 \
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)               \
                 : "l"(mc)                                                  \
                 : "memory");                                               \
  else                                                                      \
    asm volatile("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4."   \
                 ptx_type " {%0, %1, %2, %3}, [%4];"                        \
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)               \
                 : "l"(mc)                                                  \
                 : "memory");
#else
#define SN_MM_16BIT_BODY(ptx_type) (void)mc; (void)op;
#endif
SN_MM_16BIT(__half, "f16x2")
SN_MM_16BIT(__nv_bfloat16, "bf16x2")
#undef SN_MM_16BIT
#undef SN_MM_16BIT_BODY

__device__ __forceinline__ void mm_store(void* mc, uint4 v) {
#ifdef SN_MULTIMEM
  asm volatile(
      "multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
          mc),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
      : "memory");
#else
  (void)mc;
  (void)v;
#endif
}

// avg: the switch sums; divide here (one extra rounding for 16-bit types).
template <typename T>
__device__ __forceinline__ uint4 scale(uint4 v, int n) {
  constexpr int E = 16 / sizeof(T);
  union { uint4 u; T t[E]; } x;
  x.u = v;
#pragma unroll
  for (int e = 0; e < E; e++)
    x.t[e] = Acc<T>::from(Acc<T>::to(x.t[e]) / float(n));
  return x.u;
}

template <typename T>
__global__ void __launch_bounds__(512)
    multimem_allreduce(ncclDevComm dc,
                       const __grid_constant__ symnccl_kargs a) {
#ifdef SN_MULTIMEM
  constexpr int E = 16 / sizeof(T);
  const size_t win_off = a.win_offset;
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const size_t count = a.count;
  const int op = a.op;
  const int in_place = a.in_place;
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  const Entry en = enter(a, me, n);
  const uint64_t e = en.epoch;
  const Barrier bar = Barrier::of(a, me, n);
  T* mine = static_cast<T*>(ncclGetLsaPointer(a.win, win_off, me));
  char* mc =
      static_cast<char*>(ncclGetLsaMultimemPointer(a.win, win_off, dc));
  const size_t nvec = count / E;
  const size_t tail = nvec * E;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const bool src_al = (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  const bool out_al = (reinterpret_cast<uintptr_t>(out) & 15) == 0;

  if (src != nullptr && en.ok) {
    for (size_t v = first; v < nvec; v += stride) {
      if (src_al)
        reinterpret_cast<uint4*>(mine)[v] =
            reinterpret_cast<const uint4*>(src)[v];
      else
        for (int e = 0; e < E; e++) mine[v * E + e] = src[v * E + e];
    }
    if (first < count - tail) mine[tail + first] = src[tail + first];
  }
  if (!bar.sync(e + 1, a, me, n, en.ok)) return;

  const size_t slice = (nvec + n - 1) / n;
  const size_t lo = me * slice;
  const size_t hi = lo + slice < nvec ? lo + slice : nvec;
  for (size_t v = lo + first; v < hi; v += stride) {
    uint4 r = mm_ld_reduce<T>(mc + v * 16, op);
    if (op == SYMNCCL_OP_AVG) r = scale<T>(r, n);
    mm_store(mc + v * 16, r);
  }
  // Tail: every rank reduces it alone, in rank order, from plain loads.
  T t = T();
  const bool has_tail = blockIdx.x == 0 && threadIdx.x < count - tail;
  if (has_tail) {
    using A = typename Acc<T>::type;
    const size_t e = tail + threadIdx.x;
    A acc = A();
    for (int q = 0; q < n; q++) {
      const T* p = static_cast<const T*>(ncclGetLsaPointer(a.win, win_off, q));
      acc = q == 0 ? Acc<T>::to(p[e]) : reduce2(op, acc, Acc<T>::to(p[e]));
    }
    t = finish<T>(op, acc, n);
  }
  // The multimem stores are relaxed sys-scope stores to every rank's copy:
  // the barrier's release orders them before the flags, like any store.
  if (!bar.sync(e + 2, a, me, n)) return;
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = e + 2;
  if (has_tail) (in_place ? mine : out)[tail + threadIdx.x] = t;
  if (!in_place) {
    for (size_t v = first; v < nvec; v += stride) {
      if (out_al)
        reinterpret_cast<uint4*>(out)[v] =
            reinterpret_cast<const uint4*>(mine)[v];
      else
        for (int e = 0; e < E; e++) out[v * E + e] = mine[v * E + e];
    }
  }
#endif
}

template <typename T>
cudaError_t launch(const symnccl_kargs& a, cudaStream_t stream) {
  return symnccl_launch_kernel(multimem_allreduce<T>, a, stream);
}

}  // namespace
SYMNCCL_END

// Called by symnccl_launch (launch.cu) for SYMNCCL_K_MULTIMEM.
cudaError_t symnccl_launch_multimem(const symnccl_kargs* a,
                                    cudaStream_t stream) {
  // The multicast address exists only where NCCL granted lsaMultimem.
  if (!a->dc->requested_multimem ||
      a->dc->dc.lsaMultimem.mcBasePtr == nullptr ||
      (a->win_offset & 15) != 0)
    return cudaErrorInvalidValue;
  switch (a->dtype) {
    case SYMNCCL_DT_F32:
      if (a->op != SYMNCCL_OP_SUM && a->op != SYMNCCL_OP_AVG)
        return cudaErrorInvalidValue;
      return symnccl::launch<float>(*a, stream);
    case SYMNCCL_DT_F16: return symnccl::launch<__half>(*a, stream);
    case SYMNCCL_DT_BF16:
      return symnccl::launch<__nv_bfloat16>(*a, stream);
    default: return cudaErrorInvalidValue;
  }
}
