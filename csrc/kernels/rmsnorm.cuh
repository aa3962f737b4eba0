// all_reduce + residual add + RMSNorm in one kernel (all_reduce_rmsnorm),
// on one_shot's skeleton (lsa.cuh) and symnccl's own bounded Barrier
// (primitives.cuh).
//
// one_shot_rmsnorm: x holds `rows` rows of H elements (this rank's partial
//   sums), residual and out_h rows of H, weight H elements. For every row:
//     s = x summed over the ranks in rank order 0..n-1 (reduce_ranks, in
//         Acc<T>, rounded to T: the bits of all_reduce),
//     h = T(s + residual)                       -> out_h (the new residual)
//     r = rsqrt(sum(h * h) / H + eps)           (fp32, from h as stored)
//     y = T(T(h * r) * weight)                  -> out
//   which is vLLM's fused_add_rms_norm and torch's rms_norm composition
//   (the normalised value rounded to T before the weight; a no-op for
//   float32).
//
//   Steps: each CTA takes whole rows (row i goes to CTA i % grid on every
//   rank) and copies its rows of x into the staging window; entry barrier
//   (the same CTA of every peer staged the same rows); each thread loads
//   its vectors of the row from every rank (ld.cg), adds the residual,
//   stores h and keeps up to kKeep vectors in registers (beyond that it
//   reads back its own h from out_h); a block reduction of the row's sum of
//   squares (fixed order: lanes by xor shuffles, then warps 0..w-1, the
//   same on every thread, rank and launch); y; exit barrier (no peer still
//   reads my staging rows when the next kernel overwrites them).
//   On one rank, and with a.local (the NCCL fallback: x holds NCCL's sum
//   already), nothing is staged and no barrier is taken: x is read in
//   place, and the call counters are not touched.
//
// Bits: every rank runs the same grid and block (the host derives them
// from rows, H and the dtype only) on the same inputs, so every rank's y
// and h are the same bits, and a.local gives the bits of the one-shot for
// the same sums.
//
// Requirements: H a multiple of 8 (a row is whole 16-byte vectors, so
// every staged row starts 16-byte aligned); x, residual, out, out_h and
// weight of any alignment (element-wise loads and stores when any is not
// 16-byte aligned); out and out_h do not overlap (out_h may be residual,
// out may be x); grid <= SYMNCCL_MAX_CTAS; rows * H * sizeof(T) within the
// staging area; block <= 512. Float32, float16, bfloat16 (unit FLOAT).
#ifndef SYMNCCL_KERNELS_RMSNORM_CUH
#define SYMNCCL_KERNELS_RMSNORM_CUH

#include "primitives.cuh"

SYMNCCL_BEGIN

// 16-byte vectors of h a thread keeps in registers between the sum of
// squares and the normalisation: a row of 4 * 512 vectors (H = 16384
// bf16/fp16, 8192 fp32) never reads out_h back.
constexpr int kRmsKeep = 2;

// Sum of one float per thread over the CTA, in a fixed order; every thread
// gets the same bits. `buf`: 2 x 32 floats of shared memory, alternating
// by row parity (one __syncthreads per row: a thread can write the next
// row's partial only after every thread read this row's).
__device__ __forceinline__ float block_sum(float v, float* buf) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  const int warps = (int)(blockDim.x >> 5);
  if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < warps; w++) s += buf[w];
  return s;
}

template <typename T>
struct RmsRow {
  static constexpr int E = Pack<T, 16>::kElems;
  using U = typename Pack<T, 16>::U;
  Peers in;           // every rank's row 0 (x itself when not staged)
  int n;              // ranks reduced (1 when not staged)
  bool in_aligned;    // the rows read through `in` are 16-byte aligned
  bool aligned;       // residual, out, out_h, weight all 16-byte aligned
  size_t H;

  // h's vector v of row r (reduced, plus residual), rounded to T; adds its
  // squares to ss.
  __device__ __forceinline__ uint4 h(size_t r, size_t v,
                                     const T* res) const {
    Accum<T, 16, OpSum> acc[1];
    const size_t row_off = r * H * sizeof(T);
    reduce_ranks<T, 16, 1>(n, [&](int q, uint4(&raw)[1]) {
      raw[0] = load_pack<16, true>(
          reinterpret_cast<const T*>(in(q) + row_off), v, H, in_aligned);
    }, acc);
    U s, x, out;
    s.raw = acc[0].result(SYMNCCL_OP_SUM, n);
    x.raw = load_pack<16>(res + r * H, v, H, aligned);
#pragma unroll
    for (int k = 0; k < E; k++)
      out.t[k] = Acc<T>::from(Acc<T>::to(s.t[k]) + Acc<T>::to(x.t[k]));
    return out.raw;
  }
};

template <typename T>
__device__ __forceinline__ float sum_squares(uint4 w) {
  typename Pack<T, 16>::U u;
  u.raw = w;
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < Pack<T, 16>::kElems; k++) {
    const float f = (float)Acc<T>::to(u.t[k]);
    s += f * f;
  }
  return s;
}

// y = T(T(h * rstd) * w), elementwise, in fp32.
template <typename T>
__device__ __forceinline__ uint4 normalise(uint4 hw, uint4 ww, float rstd) {
  typename Pack<T, 16>::U h, w, y;
  h.raw = hw;
  w.raw = ww;
#pragma unroll
  for (int k = 0; k < Pack<T, 16>::kElems; k++) {
    const T t = Acc<T>::from((float)Acc<T>::to(h.t[k]) * rstd);
    y.t[k] = Acc<T>::from((float)Acc<T>::to(t) * (float)Acc<T>::to(w.t[k]));
  }
  return y.raw;
}

template <typename T>
__global__ void __launch_bounds__(512)
    one_shot_rmsnorm(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  constexpr int E = Pack<T, 16>::kElems;
  __shared__ float s_sum[2][32];
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  const Entry en = enter(a, me, n);
  const uint64_t e = en.epoch;
  const bool peers = !a.local && n > 1;
  const T* src = static_cast<const T*>(a.src);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out);
  T* out_h = static_cast<T*>(a.out_h);
  const size_t H = a.row_len;
  const size_t rows = a.count / H;
  const size_t rvec = H / E;  // H % 8 == 0: whole vectors
  const bool src_aligned = (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  const bool aligned = ((reinterpret_cast<uintptr_t>(res) |
                         reinterpret_cast<uintptr_t>(w) |
                         reinterpret_cast<uintptr_t>(out) |
                         reinterpret_cast<uintptr_t>(out_h)) &
                        15) == 0;
  const size_t tid = threadIdx.x, bd = blockDim.x;
  Barrier bar{};
  RmsRow<T> row;
  row.H = H;
  row.aligned = aligned;
  if (peers) {
    bar = Barrier::of(a, me, n);
    row.in = Peers::of(a.win, a.win_offset);
    row.n = n;
    row.in_aligned = (a.win_offset & 15) == 0;
    // my rows of x into my staging rows (the same CTA of every peer reads
    // them after the barrier)
    T* mine = reinterpret_cast<T*>(row.in(me));
    if (en.ok)
      for (size_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (size_t v = tid; v < rvec; v += bd)
          store_pack<16>(mine + r * H, v, H, row.in_aligned,
                         load_pack<16>(src + r * H, v, H, src_aligned));
    if (!bar.sync(e + 1, a, me, n, en.ok)) return;
  } else {
    row.in = Peers{const_cast<char*>(reinterpret_cast<const char*>(src)), 0};
    row.n = 1;
    row.in_aligned = src_aligned;
    if (!__syncthreads_and(en.ok)) return;
  }

  int parity = 0;
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x, parity ^= 1) {
    T* hr = out_h + r * H;
    const T* wr = w;
    uint4 keep[kRmsKeep], wk[kRmsKeep];
    // all the loads of the kept vectors (and their weights) first, no
    // store between them, so they are in flight together; then the stores
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec) {
        keep[u] = row.h(r, tid + u * bd, res);
        wk[u] = load_pack<16>(wr, tid + u * bd, H, aligned);
      }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec) {
        ss += sum_squares<T>(keep[u]);
        store_pack<16>(hr, tid + u * bd, H, aligned, keep[u]);
      }
    for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd) {
      const uint4 hv = row.h(r, v, res);
      ss += sum_squares<T>(hv);
      store_pack<16>(hr, v, H, aligned, hv);
    }
    const float total = block_sum(ss, s_sum[parity]);
    const float rstd = rsqrtf(total / (float)H + a.eps);
    T* yr = out + r * H;
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec)
        store_pack<16>(yr, tid + u * bd, H, aligned,
                       normalise<T>(keep[u], wk[u], rstd));
    // past the kept vectors: this thread's own h, read back
    for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd)
      store_pack<16>(yr, v, H, aligned,
                     normalise<T>(load_pack<16>(hr, v, H, aligned),
                                  load_pack<16>(wr, v, H, aligned), rstd));
  }
  if (!peers) return;
  if (!bar.sync(e + 2, a, me, n)) return;
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = e + 2;
}

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_RMSNORM_CUH
