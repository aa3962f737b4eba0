// Every input of the paired 16-bit float helpers (Half2, csrc/kernels/
// reduce.cuh) against Acc's way (each element to fp32, the operation in
// fp32, rounded once to T), bit for bit, on the GPU it runs on:
//   add    add_pairs<T>(a, b)  vs  Acc::from(Acc::to(a) + Acc::to(b))
//   mul    mul_pairs<T>(a, b)  vs  Acc::from(Acc::to(a) * Acc::to(b))
//          (every pair of 16-bit patterns: 2^32 per type, NaNs included)
//   round  round_pair<T>(f, g) vs  Acc::from(f), Acc::from(g)
//          (every fp32 pattern f, with g its complement)
//   to     floats_of<T>(w)     vs  Acc::to of each half (every word)
// Prints one line per type and check, "<type> <check> <mismatches>
// <first a> <first b>", and exits 1 if any differ. A test's program, not
// the library's (whose CUDA is csrc/kernels/): built with nvcc and run by
// tests/test_fused.py (test_half2_helpers_give_acc_s_bits_on_every_input).
#include <cstdio>

#include "kernels/reduce.cuh"

using namespace symnccl;

enum { kAdd, kMul, kRound, kTo, kChecks };
__device__ unsigned long long g_bad[2][kChecks];
__device__ unsigned g_first[2][kChecks][2];

__device__ void bad(int type, int check, unsigned a, unsigned b) {
  if (atomicAdd(&g_bad[type][check], 1ull) == 0) {
    g_first[type][check][0] = a;
    g_first[type][check][1] = b;
  }
}

template <typename T>
__device__ uint16_t bits_of(T v) {
  uint16_t u;
  memcpy(&u, &v, 2);
  return u;
}
template <typename T>
__device__ T of_bits(uint16_t u) {
  T v;
  memcpy(&v, &u, 2);
  return v;
}

// a: blockIdx.x; b: every pattern, two a word (the word's halves: b, b + 1)
template <typename T>
__global__ void pairs(int type) {
  using A = Acc<T>;
  const uint32_t a = blockIdx.x;
  for (uint32_t b = 2 * threadIdx.x; b < 65536; b += 2 * blockDim.x) {
    const uint32_t wa = a | a << 16, wb = b | (b + 1) << 16;
    const uint32_t s = add_pairs<T>(wa, wb), m = mul_pairs<T>(wa, wb);
    for (int h = 0; h < 2; h++) {
      const uint16_t bh = (uint16_t)(b + h);
      const float fa = A::to(of_bits<T>((uint16_t)a));
      const float fb = A::to(of_bits<T>(bh));
      if ((uint16_t)(s >> 16 * h) != bits_of(A::from(fa + fb)))
        bad(type, kAdd, a, bh);
      if ((uint16_t)(m >> 16 * h) != bits_of(A::from(fa * fb)))
        bad(type, kMul, a, bh);
    }
  }
}

// every 32-bit pattern x, as fp32 (round) and as a word of two T (to)
template <typename T>
__global__ void words(int type) {
  using A = Acc<T>;
  const uint32_t x = blockIdx.x * blockDim.x + threadIdx.x;
  const float f = __uint_as_float(x), g = __uint_as_float(~x);
  const uint32_t r = round_pair<T>(f, g);
  if ((uint16_t)r != bits_of(A::from(f)) ||
      (uint16_t)(r >> 16) != bits_of(A::from(g)))
    bad(type, kRound, x, r);
  const float2 t = floats_of<T>(x);
  const float lo = A::to(of_bits<T>((uint16_t)x));
  const float hi = A::to(of_bits<T>((uint16_t)(x >> 16)));
  if (__float_as_uint(t.x) != __float_as_uint(lo) ||
      __float_as_uint(t.y) != __float_as_uint(hi))
    bad(type, kTo, x, __float_as_uint(t.x));
}

int main() {
  pairs<__half><<<65536, 256>>>(0);
  pairs<__nv_bfloat16><<<65536, 256>>>(1);
  words<__half><<<1u << 24, 256>>>(0);
  words<__nv_bfloat16><<<1u << 24, 256>>>(1);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 2;
  }
  unsigned long long n[2][kChecks];
  unsigned first[2][kChecks][2];
  cudaMemcpyFromSymbol(n, g_bad, sizeof n);
  cudaMemcpyFromSymbol(first, g_first, sizeof first);
  const char* types[2] = {"float16", "bfloat16"};
  const char* checks[kChecks] = {"add", "mul", "round", "to"};
  int rc = 0;
  for (int t = 0; t < 2; t++)
    for (int c = 0; c < kChecks; c++) {
      printf("%s %s %llu %08x %08x\n", types[t], checks[c], n[t][c],
             first[t][c][0], first[t][c][1]);
      rc |= n[t][c] != 0;
    }
  return rc;
}
