// Device communicator lifetime, kept on the C++ side because ncclDevComm and
// ncclDevCommRequirements are declared only in nccl_device.h (entries of
// the build's table, launch.cu).
//
// The holder is heap-allocated so its address is stable: inside an NCCL group
// ncclDevCommCreate fills it only at ncclGroupEnd.
#include <cstdlib>
#include <cstring>

#include <dlfcn.h>

#include "devcomm.cuh"

ncclResult_t snk_devcomm_create(ncclComm_t comm, int lsa_barrier_count,
                                int request_multimem, symnccl_devcomm** out) {
  *out = nullptr;
  symnccl_devcomm* h =
      static_cast<symnccl_devcomm*>(calloc(1, sizeof(symnccl_devcomm)));
  if (h == nullptr) return ncclSystemError;
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  // NCCL 2.28 has no initializer macro; its headers ask for a zeroed struct,
  // which value-initialisation gives.
  ncclDevCommRequirements reqs = {};
#endif
  reqs.lsaBarrierCount = lsa_barrier_count;
  reqs.lsaMultimem = request_multimem != 0;
  h->requested_multimem = request_multimem != 0;
  ncclResult_t rc = ncclDevCommCreate(comm, &reqs, &h->dc);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    free(h);
    return rc;
  }
  *out = h;
  return rc;
}

ncclResult_t snk_devcomm_destroy(ncclComm_t comm, symnccl_devcomm* dc) {
  if (dc == nullptr) return ncclSuccess;
  ncclResult_t rc = ncclDevCommDestroy(comm, &dc->dc);
  free(dc);
  return rc;
}

void snk_devcomm_free(symnccl_devcomm* dc) { free(dc); }

// NCCL 2.30 opens ncclDevComm with the magic and the version of the
// requirements it was made from (dev_runtime.cc: NCCL_API_MAGIC and
// reqs->version, NCCL_VERSION_CODE of these headers through the
// initializer). A device communicator without them was laid out by
// another NCCL than these headers describe, and nothing else of it can be
// read: launch.h, symnccl_devcomm_info, says how that is reported.
void snk_devcomm_info(const symnccl_devcomm* dc, int* lsa_size, int* lsa_rank,
                      int* has_multimem) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  if (dc->dc.magic != NCCL_API_MAGIC ||
      dc->dc.version != (unsigned)NCCL_VERSION_CODE) {
    *lsa_size = -1;
    *lsa_rank = (int)dc->dc.magic;
    *has_multimem = (int)dc->dc.version;
    return;
  }
#endif
  *lsa_size = dc->dc.lsaSize;
  *lsa_rank = dc->dc.lsaRank;
  *has_multimem =
      dc->requested_multimem && dc->dc.lsaMultimem.mcBasePtr != nullptr;
}

// What NCCL says of a communicator before any device communicator is made
// (NCCL 2.29+: ncclCommQueryProperties): whether the device API and
// multimem are usable on it. ncclInvalidUsage where this NCCL has no such
// query (2.28): the caller then asks ncclDevCommCreate and sees.
ncclResult_t snk_comm_properties(ncclComm_t comm, int* device_api,
                                 int* multimem) {
#ifdef NCCL_COMM_PROPERTIES_INITIALIZER
  // Looked up, not linked: the one extension holds the builds of every
  // minor, and must load beside an NCCL 2.28 that lacks the symbol.
  using Query = ncclResult_t (*)(ncclComm_t, ncclCommProperties_t*);
  static const Query query = reinterpret_cast<Query>(
      dlsym(RTLD_DEFAULT, "ncclCommQueryProperties"));
  if (query == nullptr) return ncclInvalidUsage;
  ncclCommProperties_t p = NCCL_COMM_PROPERTIES_INITIALIZER;
  const ncclResult_t rc = query(comm, &p);
  if (rc != ncclSuccess) return rc;
  *device_api = p.deviceApiSupport;
  *multimem = p.multimemSupport;
  return ncclSuccess;
#else
  (void)comm;
  (void)device_api;
  (void)multimem;
  return ncclInvalidUsage;
#endif
}

// ---- loopback teams (csrc/runtime/loopback.c) ----
//
// A loopback team is nranks ranks of one communicator on one GPU, for
// testing the kernels at any world size: each rank's staging memory is
// mapped SYMNCCL_LOOPBACK_STRIDE apart in one reserved address range, as
// NCCL maps a window's copies of an LSA team (lsaFlatBase + rank * stride,
// stride a multiple of 4 GiB). The kernels then run unchanged on a
// device communicator and a window made here, which hold what they read:
// the rank and team size, and the flat base and stride of the window
// (ncclGetLsaPointer). No NCCL communicator exists; nothing else of these
// structs is set.

ncclResult_t snk_loopback_devcomm(int rank, int nranks,
                                  symnccl_devcomm** out) {
  symnccl_devcomm* h =
      static_cast<symnccl_devcomm*>(calloc(1, sizeof(symnccl_devcomm)));
  *out = h;
  if (h == nullptr) return ncclSystemError;
  h->dc.rank = h->dc.lsaRank = rank;
  h->dc.nRanks = h->dc.lsaSize = nranks;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  h->dc.magic = NCCL_API_MAGIC;
  h->dc.version = NCCL_VERSION_CODE;
#endif
  return ncclSuccess;
}

static_assert(SYMNCCL_LOOPBACK_STRIDE % (1ull << 32) == 0,
              "NCCL's window stride counts 4 GiB units");

cudaError_t snk_loopback_window(char* flat_base, int rank,
                                ncclWindow_t* out) {
  ncclWindow_vidmem w;
  memset(&w, 0, sizeof(w));
  w.lsaFlatBase = flat_base;
  w.lsaRank = w.worldRank = rank;
  w.stride4G = (uint32_t)(SYMNCCL_LOOPBACK_STRIDE >> 32);
  *out = nullptr;
  void* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(w));
  if (e == cudaSuccess) e = cudaMemcpy(d, &w, sizeof(w), cudaMemcpyDefault);
  if (e != cudaSuccess) {
    if (d != nullptr) cudaFree(d);
    return e;
  }
  *out = static_cast<ncclWindow_t>(d);
  return cudaSuccess;
}

void snk_loopback_window_free(ncclWindow_t w) {
  if (w != nullptr) cudaFree(w);
}
