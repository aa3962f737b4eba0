// The launch entry point: checks what no kernel should have to, and hands
// the launch to the unit of its element type (unit.cu) or to multimem.cu.
// Also the sizes of the kernels' regions, which the host lays out
// (csrc/runtime/staging.c), and this build's table of entry points
// (symnccl_kernels_2_<SYMNCCL_NCCL_MINOR>, launch.h).
#include <cstdint>

#include "alltoall.cuh"
#include "devcomm.cuh"
#include "packet.cuh"
#include "push.cuh"

#define SYMNCCL_UNIT_DECL_(id, nccl, ctype)                           \
  cudaError_t symnccl_launch_##id(const symnccl_kargs* a, cudaStream_t s);
SYMNCCL_KERNEL_DTYPES(SYMNCCL_UNIT_DECL_)
#undef SYMNCCL_UNIT_DECL_
cudaError_t symnccl_launch_multimem(const symnccl_kargs* a, cudaStream_t s);
// devcomm.cu, copy.cu
ncclResult_t snk_devcomm_create(ncclComm_t, int, int, symnccl_devcomm**);
ncclResult_t snk_devcomm_destroy(ncclComm_t, symnccl_devcomm*);
void snk_devcomm_free(symnccl_devcomm*);
void snk_devcomm_info(const symnccl_devcomm*, int*, int*, int*);
ncclResult_t snk_comm_properties(ncclComm_t, int*, int*);
cudaError_t snk_copy(void*, const void*, size_t, int, cudaStream_t);
cudaError_t snk_lsa_pointer(ncclWindow_t, size_t, int, void**);
ncclResult_t snk_loopback_devcomm(int, int, symnccl_devcomm**);
cudaError_t snk_loopback_window(char*, int, ncclWindow_t*);
void snk_loopback_window_free(ncclWindow_t);

SYMNCCL_BEGIN
namespace {

using Unit = cudaError_t (*)(const symnccl_kargs*, cudaStream_t);

#define SYMNCCL_UNIT_ENTRY_(id, nccl, ctype) symnccl_launch_##id,
const Unit kUnits[SYMNCCL_DT_COUNT] = {
    SYMNCCL_KERNEL_DTYPES(SYMNCCL_UNIT_ENTRY_)};
#undef SYMNCCL_UNIT_ENTRY_

#define SYMNCCL_UNIT_SIZE_(id, nccl, ctype) sizeof(ctype),
const size_t kItemsize[SYMNCCL_DT_COUNT] = {
    SYMNCCL_KERNEL_DTYPES(SYMNCCL_UNIT_SIZE_)};
#undef SYMNCCL_UNIT_SIZE_

// Data bytes an item of the packet kernel's format carries, and the row
// bytes it takes; 0 for kernels of other families (table.h).
void packet_format(int kernel, size_t* data, size_t* row) {
  switch (symnccl_kernel_row_of(kernel).family) {
    case SYMNCCL_FAMILY_LL:
      *data = LL::kItemData;
      *row = LL::kItemBytes;
      return;
    case SYMNCCL_FAMILY_LL128:
      *data = LL128::kItemData;
      *row = LL128::kItemBytes;
      return;
    case SYMNCCL_FAMILY_LAMPORT:
    case SYMNCCL_FAMILY_LAMPORT_AR:
      *data = Lamport::kItemData;
      *row = Lamport::kItemBytes;
      return;
    default:
      *data = *row = 0;
  }
}

__global__ void lsa_layout(ncclWindow_t win, int n, int* ok) {
  const char* p0 = static_cast<const char*>(ncclGetLsaPointer(win, 0, 0));
  const char* p1 = static_cast<const char*>(ncclGetLsaPointer(win, 0, 1));
  int good = 1;
  for (int q = 0; q < n; q++)
    good &= static_cast<const char*>(ncclGetLsaPointer(win, 0, q)) ==
            p0 + (size_t)q * (size_t)(p1 - p0);
  *ok = good;
}

bool two_shot_packets(int kernel) {
  return symnccl_kernel_row_of(kernel).shot == SYMNCCL_SHOT_TWO;
}

// Items of format `data` bytes that `count` elements of itemsize take; the
// rows kernels' elements are rows (itemsize: a row's bytes), each starting
// on an item (rmsnorm.cuh: ll128_rmsnorm's rows are whole items, LL's
// 16-byte-multiple rows are whole items already).
size_t items_of(int kernel, size_t count, size_t itemsize, size_t data) {
  if (symnccl_kernel_row_of(kernel).plan == SYMNCCL_PLAN_ROWS)
    return count * ((itemsize + data - 1) / data);
  return (count * itemsize + data - 1) / data;
}

size_t packet_max_count(int kernel, size_t row_bytes, size_t itemsize,
                        int nranks) {
  size_t data, row;
  packet_format(kernel, &data, &row);
  if (data == 0 || itemsize == 0) return 0;
  const bool two = two_shot_packets(kernel);
  const size_t items = (two ? row_bytes / 2 : row_bytes) / row;
  if (symnccl_kernel_row_of(kernel).plan == SYMNCCL_PLAN_ROWS)
    return items / items_of(kernel, 1, itemsize, data);
  return items * (two ? (size_t)nranks : 1) * data / itemsize;
}

cudaError_t lsa_layout_ok(ncclWindow_t win, int nranks, int* ok) {
  int* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(int));
  if (e != cudaSuccess) return e;
  lsa_layout<<<1, 1>>>(win, nranks, d);
  e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaMemcpy(ok, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return e;
}

size_t push_region_bytes(int nranks, size_t slot_bytes,
                         size_t* data_offset) {
  size_t flags =
      2 * (size_t)SYMNCCL_PUSH_MAX_CTAS * SYMNCCL_FLAG_LINE(nranks);
  flags = (flags + 4095) / 4096 * 4096;
  if (data_offset != nullptr) *data_offset = flags;
  return flags + 4 * (size_t)nranks * slot_bytes;
}

cudaError_t launch(const symnccl_kargs* a, cudaStream_t stream) {
  if (a->dc == nullptr || a->kernel < 0 || a->kernel >= SYMNCCL_K_COUNT ||
      a->dtype < 0 || a->dtype >= SYMNCCL_DT_COUNT || a->ctas < 1 ||
      a->threads < 32 ||
      a->threads > symnccl_kernel_max_threads(a->kernel, a->local) ||
      a->threads % 32 != 0 || a->epochs == nullptr ||
      a->fault == nullptr || a->claim == nullptr ||
      a->fault_word == nullptr || a->ctl_win == nullptr)
    return cudaErrorInvalidValue;
  const int n = a->dc->dc.lsaSize;
  if (n > SYMNCCL_MAX_RANKS) return cudaErrorInvalidValue;
  const symnccl_kernel_row k = symnccl_kernel_row_of(a->kernel);
  // the add+norm with no peer counts no call: its grid is not the counters'
  if (a->ctas > (k.plan == SYMNCCL_PLAN_ROWS && a->local
                     ? SYMNCCL_LOCAL_MAX_CTAS
                     : SYMNCCL_MAX_CTAS))
    return cudaErrorInvalidValue;
  size_t data, row;
  packet_format(a->kernel, &data, &row);
  // all_to_all in packets: the count and at least one row of x in a row
  // (a longer block is cut: alltoall.cuh)
  if (data != 0 && k.collective == SYMNCCL_COLL_ALL_TO_ALL &&
      a2a_ll_rows(a->row_bytes, a->row_size) == 0)
    return cudaErrorInvalidValue;
  // (the add+norm with no peer is the ll row's too, and sends nothing)
  if (data != 0 && k.collective != SYMNCCL_COLL_ALL_TO_ALL &&
      !(k.plan == SYMNCCL_PLAN_ROWS && a->local)) {
    // the rows must hold the launch's items
    const size_t items =
        k.plan == SYMNCCL_PLAN_ROWS
            ? items_of(a->kernel, a->row_len == 0 ? 0 : a->count / a->row_len,
                       a->row_len * kItemsize[a->dtype], data)
            : items_of(a->kernel, a->count, kItemsize[a->dtype], data);
    const bool two = two_shot_packets(a->kernel);
    const size_t per_row = two ? (items + n - 1) / n : items;
    if (per_row * row > (two ? a->row_bytes / 2 : a->row_bytes))
      return cudaErrorInvalidValue;
  }
  // Lamport packets reduce sums only (packet.cuh, LamportItems)
  if ((k.family == SYMNCCL_FAMILY_LAMPORT ||
       k.family == SYMNCCL_FAMILY_LAMPORT_AR) &&
      a->op != SYMNCCL_OP_SUM && a->op != SYMNCCL_OP_AVG)
    return cudaErrorInvalidValue;
  const bool push = k.family == SYMNCCL_FAMILY_PUSH;
  if (push &&
      (a->threads < n || a->ctas > SYMNCCL_PUSH_MAX_CTAS ||
       a->row_bytes % 16 != 0 ||
       (a->out_win != nullptr && a->out_offset % 16 != 0)))
    return cudaErrorInvalidValue;
  // push reduce_scatter and all_gather: chunks, and two warp groups when
  // the chunks are smaller than a slot (push.cuh)
  if (push && k.collective != SYMNCCL_COLL_ALL_REDUCE &&
      (a->chunk_bytes == 0 || a->chunk_bytes % 16 != 0 ||
       a->chunk_bytes > a->row_bytes || a->threads % 64 != 0 ||
       a->threads / 2 < n))
    return cudaErrorInvalidValue;
  if (k.bytes && a->dtype != SYMNCCL_DT_BYTES) return cudaErrorInvalidValue;
  if (k.plan == SYMNCCL_PLAN_ROOTED && (a->root < 0 || a->root >= n))
    return cudaErrorInvalidValue;
  // all_reduce_rmsnorm: whole rows of whole 16-byte vectors (rmsnorm.cuh)
  if (k.plan == SYMNCCL_PLAN_ROWS &&
      (a->row_len == 0 || a->row_len % 8 != 0 || a->count % a->row_len != 0 ||
       a->residual == nullptr || a->out_h == nullptr ||
       a->weight == nullptr || a->src == nullptr || a->out == nullptr ||
       (!a->local && (n < 2 || a->win == nullptr)) || a->quant < 0 ||
       a->quant > SYMNCCL_QUANT_DYNAMIC ||
       (a->quant != SYMNCCL_QUANT_NONE && a->scale == nullptr) ||
       (a->kernel == SYMNCCL_K_TWO_SHOT_RMSNORM &&
        (a->quant != SYMNCCL_QUANT_NONE ||
         (!a->local && a->mid_win == nullptr)))))
    return cudaErrorInvalidValue;
  // row groups: one_shot_rmsnorm's block (whole warps, at most
  // SYMNCCL_MAX_THREADS, no more than the row's vectors rounded up to a
  // warp), whole groups a CTA, and a wide CTA's rows of one pass
  // (rmsnorm.cuh, rows_on_packets)
  if (symnccl_kernel_row_groups(a->kernel, a->local)) {
    const size_t rvec = a->row_len / (16 / kItemsize[a->dtype]);
    if (a->row_block < 32 || a->row_block > SYMNCCL_MAX_THREADS ||
        a->row_block % 32 != 0 ||
        (size_t)a->row_block > (rvec + 31) / 32 * 32 ||
        a->threads % a->row_block != 0 ||
        (a->threads > SYMNCCL_MAX_THREADS && rvec > (size_t)a->row_block))
      return cudaErrorInvalidValue;
  }
  if (k.unit == SYMNCCL_UNIT_MULTIMEM)
    return symnccl_launch_multimem(a, stream);
  return kUnits[a->dtype](a, stream);
}

}  // namespace
SYMNCCL_END

#ifndef SYMNCCL_NCCL_MINOR
#error "compile with -DSYMNCCL_NCCL_MINOR=<the NCCL 2.x minor of the headers>"
#endif
static_assert(NCCL_MAJOR == 2 && NCCL_MINOR == SYMNCCL_NCCL_MINOR,
              "SYMNCCL_NCCL_MINOR must name the headers' NCCL minor");

#define SYMNCCL_CAT2_(a, b) a##b
#define SYMNCCL_CAT2(a, b) SYMNCCL_CAT2_(a, b)

extern "C" const symnccl_kernels SYMNCCL_CAT2(symnccl_kernels_2_,
                                              SYMNCCL_NCCL_MINOR) = {
    SYMNCCL_NCCL_MINOR,
    NCCL_VERSION_CODE,
    symnccl::launch,
    symnccl::packet_max_count,
    symnccl::push_region_bytes,
    symnccl::lsa_layout_ok,
    snk_devcomm_create,
    snk_devcomm_destroy,
    snk_devcomm_free,
    snk_devcomm_info,
    snk_comm_properties,
    snk_copy,
    snk_lsa_pointer,
    snk_loopback_devcomm,
    snk_loopback_window,
    snk_loopback_window_free,
};
