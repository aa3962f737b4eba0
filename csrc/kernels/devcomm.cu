// Device communicator lifetime, kept on the C++ side because ncclDevComm and
// ncclDevCommRequirements are declared only in nccl_device.h (entries of
// the build's table, launch.cu).
//
// The holder is heap-allocated so its address is stable: inside an NCCL group
// ncclDevCommCreate fills it only at ncclGroupEnd.
#include <cstdlib>

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

void snk_devcomm_info(const symnccl_devcomm* dc, int* lsa_size, int* lsa_rank,
                      int* has_multimem) {
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
