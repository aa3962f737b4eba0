// Element types and reduction operators shared by every kernel.
//
// Acc<T>: the type a T is accumulated in (fp32 for 16-bit and fp8 floats,
// 64-bit wrapping for integers) and the conversions to and from it. Every
// kernel reduces in a fixed rank order with these, so every rank (and every
// algorithm) produces the same bits for the same inputs.
#ifndef SYMNCCL_KERNELS_REDUCE_CUH
#define SYMNCCL_KERNELS_REDUCE_CUH

#include <cstdint>
#include <cstring>

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

// The 16-bit floats (__half, __nv_bfloat16) two to a 32-bit word, for
// their paired instructions (HADD2, HMUL2, F2FP: one for two elements,
// where Acc's way takes a conversion an element each way and the fp32
// operation). Where an fp32 operation on two T values is rounded once to
// T, the paired operation gives Acc's bits (every input checked on the
// GPU: tests/data/half2_every_input.cu):
// - a + b: the fp32 sum of two 16-bit floats is exact, or the smaller
//   lies below 2^-13 of the larger (2^-16 for bfloat16), under a quarter
//   of the larger's ulp in T, and both the exact and the fp32 sum round to
//   the larger; so T(a + b) is the exact sum rounded once, as HADD2's.
// - a * b: at most 2 x 11 significant bits, exact in fp32 (half's
//   products lie in its normal range; a bfloat16 product of 16 bits from
//   2^-134 up ends at or above fp32's last subnormal bit, and one below
//   2^-134 is 0 in T either way), so rounded once, as HMUL2's.
// Both need subnormals kept (no -ftz: setup.py passes none), as Acc's
// conversions keep them.
// kOf: T is such a type (else these are not defined for it).
template <typename T>
struct Half2 {
  static constexpr bool kOf = false;
};
template <>
struct Half2<__half> {
  static constexpr bool kOf = true;
  using type = __half2;
  __device__ static float2 to(type v) { return __half22float2(v); }
  __device__ static type from(float a, float b) {
    return __floats2half2_rn(a, b);
  }
};
template <>
struct Half2<__nv_bfloat16> {
  static constexpr bool kOf = true;
  using type = __nv_bfloat162;
  // a bfloat16 is the top half of its fp32: two bit operations, where
  // __bfloat1622float2 splits the word first
  __device__ static float2 to(type v) {
    uint32_t w;
    memcpy(&w, &v, sizeof(w));
    return make_float2(__uint_as_float(w << 16),
                       __uint_as_float(w & 0xffff0000u));
  }
  __device__ static type from(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};

// A 32-bit word as a pair of T and back.
template <typename T>
__device__ __forceinline__ typename Half2<T>::type pair_of(uint32_t w) {
  typename Half2<T>::type p;
  static_assert(sizeof(p) == sizeof(w), "two 16-bit floats");
  memcpy(&p, &w, sizeof(w));
  return p;
}
template <typename T>
__device__ __forceinline__ uint32_t word_of(typename Half2<T>::type p) {
  uint32_t w;
  memcpy(&w, &p, sizeof(w));
  return w;
}

// Element k of a word (low half 0) in fp32; T(a) + T(b), T(a) * T(b)
// elementwise, with Acc's bits (above); the pair (a, b) rounded to T.
template <typename T>
__device__ __forceinline__ float2 floats_of(uint32_t w) {
  return Half2<T>::to(pair_of<T>(w));
}
template <typename T>
__device__ __forceinline__ uint32_t add_pairs(uint32_t a, uint32_t b) {
  return word_of<T>(__hadd2_rn(pair_of<T>(a), pair_of<T>(b)));
}
template <typename T>
__device__ __forceinline__ uint32_t mul_pairs(uint32_t a, uint32_t b) {
  return word_of<T>(__hmul2_rn(pair_of<T>(a), pair_of<T>(b)));
}
template <typename T>
__device__ __forceinline__ uint32_t round_pair(float a, float b) {
  return word_of<T>(Half2<T>::from(a, b));
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
