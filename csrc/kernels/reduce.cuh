// Element types and reduction operators shared by every kernel.
//
// Acc<T>: the type a T is accumulated in (fp32 for 16-bit and fp8 floats,
// 64-bit wrapping for integers) and the conversions to and from it. Every
// kernel reduces in a fixed rank order with these, so every rank (and every
// algorithm) produces the same bits for the same inputs.
#ifndef SYMNCCL_KERNELS_REDUCE_CUH
#define SYMNCCL_KERNELS_REDUCE_CUH

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "launch.h"

SYMNCCL_BEGIN

template <typename T>
struct Acc;
template <>
struct Acc<float> {
  using type = float;
  __device__ static float to(float v) { return v; }
  __device__ static float from(float v) { return v; }
};
template <>
struct Acc<double> {
  using type = double;
  __device__ static double to(double v) { return v; }
  __device__ static double from(double v) { return v; }
};
template <>
struct Acc<__half> {
  using type = float;
  __device__ static float to(__half v) { return __half2float(v); }
  __device__ static __half from(float v) { return __float2half_rn(v); }
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
  __device__ static float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from(float v) {
    return __float2bfloat16_rn(v);
  }
};
template <>
struct Acc<__nv_fp8_e4m3> {
  using type = float;
  __device__ static float to(__nv_fp8_e4m3 v) { return float(v); }
  __device__ static __nv_fp8_e4m3 from(float v) { return __nv_fp8_e4m3(v); }
};
template <>
struct Acc<__nv_fp8_e5m2> {
  using type = float;
  __device__ static float to(__nv_fp8_e5m2 v) { return float(v); }
  __device__ static __nv_fp8_e5m2 from(float v) { return __nv_fp8_e5m2(v); }
};
// Integers accumulate in 64 bits and wrap on the way back, like NCCL.
template <>
struct Acc<int32_t> {
  using type = long long;
  __device__ static long long to(int32_t v) { return v; }
  __device__ static int32_t from(long long v) {
    return (int32_t)(uint32_t)(unsigned long long)v;
  }
};
template <>
struct Acc<int64_t> {
  using type = long long;
  __device__ static long long to(int64_t v) { return v; }
  __device__ static int64_t from(long long v) { return v; }
};

template <typename A>
__device__ __forceinline__ A add(A a, A b) {
  return a + b;
}
template <>
__device__ __forceinline__ long long add(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}

// The reduction operators as types, so that a reduction loop is compiled
// for one operator and holds no branch on it; avg reduces as a sum and
// finish() divides.
struct OpSum {
  template <typename A>
  __device__ __forceinline__ static A apply(A a, A b) {
    return add(a, b);
  }
};
struct OpMax {
  template <typename A>
  __device__ __forceinline__ static A apply(A a, A b) {
    return b > a ? b : a;
  }
};
struct OpMin {
  template <typename A>
  __device__ __forceinline__ static A apply(A a, A b) {
    return b < a ? b : a;
  }
};

// f(Op{}) for op (SYMNCCL_OP_*, launch.h): the one place that turns the
// run-time op into a type.
template <typename F>
__device__ __forceinline__ auto with_op(int op, F&& f) {
  switch (op) {
    case SYMNCCL_OP_MAX:
      return f(OpMax{});
    case SYMNCCL_OP_MIN:
      return f(OpMin{});
    default:
      return f(OpSum{});
  }
}

template <typename A>
__device__ __forceinline__ A reduce2(int op, A a, A b) {
  return op == SYMNCCL_OP_MAX   ? OpMax::apply(a, b)
         : op == SYMNCCL_OP_MIN ? OpMin::apply(a, b)
                                : OpSum::apply(a, b);
}

template <typename T>
__device__ __forceinline__ T finish(int op, typename Acc<T>::type a, int n) {
  using A = typename Acc<T>::type;
  if (op == SYMNCCL_OP_AVG) {
    if constexpr (sizeof(A) == 8 && A(0.5) == A(0)) {  // integers
      // wrap to T first, then divide with C truncation (NCCL's order)
      return T((A)Acc<T>::from(a) / (A)n);
    } else {
      return Acc<T>::from(a / A(n));
    }
  }
  return Acc<T>::from(a);
}

// The element type of a SYMNCCL_DT_* (launch.h's SYMNCCL_KERNEL_DTYPES).
template <int DT>
struct DType;
#define SYMNCCL_DTYPE_OF_(id, nccl, ctype) \
  template <>                              \
  struct DType<SYMNCCL_DT_##id> {          \
    using type = ctype;                    \
  };
SYMNCCL_KERNEL_DTYPES(SYMNCCL_DTYPE_OF_)
#undef SYMNCCL_DTYPE_OF_

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_REDUCE_CUH
