/* C interface to symnccl's CUDA C++ side (csrc/kernels/).
 *
 * nccl_device.h is C++-only, so everything that needs it (the ncclDevComm
 * struct, the kernels) lives in .cu files behind the functions below. The
 * host .c files include only this header, nccl.h and the CUDA runtime API.
 * docs/ARCHITECTURE.md shows where it sits.
 *
 * Every kernel is launched through one function, symnccl_launch(), with one
 * argument struct, symnccl_kargs; the kernels receive that struct by value.
 *
 * The device API's structs change between NCCL minor versions, so the .cu
 * files are compiled once per kernel build (setup.py NCCL_HEADERS: 2.28's
 * headers, and 2.29's, which NCCL 2.29 to 2.32 accept through the
 * conversions they carry; docs/BUILD.md, "NCCL headers"), into one object
 * each whose only global symbol is its table of entry points,
 * symnccl_kernels_2_<minor>. At import the module picks the newest build
 * the loaded libnccl runs (csrc/runtime/nccl_policy.c,
 * csrc/runtime/abi.c); the functions declared below call through it.
 */
#ifndef SYMNCCL_KERNELS_LAUNCH_H
#define SYMNCCL_KERNELS_LAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef __cplusplus
/* The C++ side's names carry the NCCL minor they were built for
 * (symnccl::nccl2_<minor>::...), so the builds' template instantiations and
 * internal names never meet when their objects are linked into one module
 * (setup.py keeps only each build's table global). */
#define SYMNCCL_ABI_NS_(minor) nccl2_##minor
#define SYMNCCL_ABI_NS(minor) SYMNCCL_ABI_NS_(minor)
#define SYMNCCL_BEGIN \
    namespace symnccl {  \
    inline namespace SYMNCCL_ABI_NS(SYMNCCL_NCCL_MINOR) {
#define SYMNCCL_END \
    }                \
    }
extern "C" {
#endif

/* Element types the kernels are built for: X(ID, NCCL type, C++ type).
 * setup.py compiles csrc/kernels/unit.cu once per entry (-DSYMNCCL_UNIT_DT=
 * ID), so the units build in parallel; the C registry
 * (csrc/runtime/registry.c) marks these dtypes as having kernels. */
#define SYMNCCL_KERNEL_DTYPES(X)          \
    X(F32, ncclFloat32, float)            \
    X(F64, ncclFloat64, double)           \
    X(F16, ncclFloat16, __half)           \
    X(BF16, ncclBfloat16, __nv_bfloat16)  \
    X(F8E4M3, ncclFloat8e4m3, __nv_fp8_e4m3) \
    X(F8E5M2, ncclFloat8e5m2, __nv_fp8_e5m2) \
    X(I32, ncclInt32, int32_t)            \
    X(I64, ncclInt64, int64_t)

#define SYMNCCL_DT_ENUM_(id, nccl, ctype) SYMNCCL_DT_##id,
enum { SYMNCCL_KERNEL_DTYPES(SYMNCCL_DT_ENUM_) SYMNCCL_DT_COUNT };
#undef SYMNCCL_DT_ENUM_

/* all_gather and broadcast move bytes, whatever the dtype: they run in
 * this 1-byte unit, with counts in bytes. */
#define SYMNCCL_DT_BYTES SYMNCCL_DT_F8E4M3

/* Reduction operators of the kernels (the registry maps NCCL's to these). */
enum { SYMNCCL_OP_SUM = 0, SYMNCCL_OP_MAX = 1, SYMNCCL_OP_MIN = 2,
       SYMNCCL_OP_AVG = 3 };

/* Largest LSA team the kernels accept (the host checks lsa_size). */
#define SYMNCCL_MAX_RANKS 32
/* Largest grid of any kernel but add_rmsnorm: the barrier flag lines and
 * the per-CTA call counters are laid out for it. */
#define SYMNCCL_MAX_CTAS 128
/* Largest grid of the add+norm with no peer (all_reduce_rmsnorm with
 * `local`: on one rank, or after an all-reduce): it reads no call counter
 * and takes no barrier (rmsnorm.cuh, add_rmsnorm). Its threads resident on
 * one SM: 65536 registers at 64 a thread (__launch_bounds__(512, 2)). */
#define SYMNCCL_LOCAL_MAX_CTAS 4096
#define SYMNCCL_LOCAL_THREADS_PER_SM 1024
/* Largest grid of the push kernels (their flag lines are laid out for
 * it). */
#define SYMNCCL_PUSH_MAX_CTAS 128
/* Largest CTA of the wide kernels, 64 registers a thread, so that a CTA
 * of 1024 fills one SM's 65536: all_reduce's lamport (packet.cuh,
 * LamportItems), ll_rmsnorm and lamport_rmsnorm (rmsnorm.cuh); every other
 * kernel's is SYMNCCL_MAX_THREADS (symnccl_kernel_max_threads), and a row
 * kernel launched with more threads than that is the wide one. */
#define SYMNCCL_WIDE_MAX_THREADS 1024
#define SYMNCCL_MAX_THREADS 512
/* Bytes of one CTA's line of flags, one 8-byte flag per source rank,
 * whole 128-byte lines (push flags, barrier flags). */
#define SYMNCCL_FLAG_LINE(n) (((size_t)(n) * 8 + 127) / 128 * 128)

/* ---- failures (docs/ARCHITECTURE.md, "Failures") ----
 *
 * A kernel never traps: a trap would leave the process's CUDA context
 * unusable. A wait for a peer that gives up records why in the
 * communicator's failure record, marks the fault word of this rank and of
 * every peer, and its CTA leaves; the host raises at the next point that
 * checks the communicator. */

/* Collectives, as a failure names them: X(ID, name). */
#define SYMNCCL_COLLECTIVES(X)             \
    X(ALL_REDUCE, "all_reduce")            \
    X(REDUCE_SCATTER, "reduce_scatter")    \
    X(ALL_GATHER, "all_gather")            \
    X(BROADCAST, "broadcast")              \
    X(REDUCE, "reduce")                    \
    X(ALL_REDUCE_RMSNORM, "all_reduce_rmsnorm") \
    X(ALL_TO_ALL, "all_to_all")            \
    X(BARRIER, "barrier")                  \
    X(CHECK, "call check")

#define SYMNCCL_COLL_ENUM_(id, name) SYMNCCL_COLL_##id,
enum { SYMNCCL_COLLECTIVES(SYMNCCL_COLL_ENUM_) SYMNCCL_COLL_COUNT };
#undef SYMNCCL_COLL_ENUM_

/* The algorithms and kernels, and everything derived from them. */
#include "table.h"

/* Why a communicator failed: X(ID, name).
 *   timeout   this rank waited longer than the timeout for rank `peer`
 *   peer      rank `peer` gave up first (`detail`: its reason)
 *   abort     abort() on this rank
 *   mismatch  SYMNCCL_CHECK=1: the ranks made different calls */
#define SYMNCCL_FAULTS(X)  \
    X(NONE, "none")        \
    X(TIMEOUT, "timeout")  \
    X(PEER, "peer")        \
    X(ABORT, "abort")      \
    X(MISMATCH, "mismatch")

#define SYMNCCL_FAULT_ENUM_(id, name) SYMNCCL_FAULT_##id,
enum { SYMNCCL_FAULTS(SYMNCCL_FAULT_ENUM_) SYMNCCL_FAULT_COUNT };
#undef SYMNCCL_FAULT_ENUM_

/* What the wait that gave up was waiting for: X(ID, name). */
#define SYMNCCL_WAITS(X)                                    \
    X(NONE, "nothing")                                      \
    X(PACKETS, "its packets")                               \
    X(SLICES, "its slices (push flag 0)")                   \
    X(RESULTS, "its results or its reading (push flag 1)")  \
    X(PREVIOUS, "its reading of the previous push call (push flag 1)") \
    X(BARRIER, "the barrier")                               \
    X(ENTRY, "an entry that never comes (injected fault)")  \
    X(NCCL, "an NCCL kernel to complete")

#define SYMNCCL_WAIT_ENUM_(id, name) SYMNCCL_WAIT_##id,
enum { SYMNCCL_WAITS(SYMNCCL_WAIT_ENUM_) SYMNCCL_WAIT_COUNT };
#undef SYMNCCL_WAIT_ENUM_

/* A communicator's failure record, in mapped host memory: the host reads
 * it without synchronising, the kernels write it once. Zeroed at
 * creation. */
typedef struct {
    uint32_t abort;            /* host -> kernels: leave at the next poll */
    uint32_t reason;           /* SYMNCCL_FAULT_*; written last, once */
    int32_t kernel;            /* SYMNCCL_K_*; SYMNCCL_K_COUNT: NCCL's */
    int32_t collective;        /* SYMNCCL_COLL_* */
    int32_t peer;              /* the rank waited for (timeout); the rank
                                  the first to give up waited for (peer;
                                  that first rank when it was this one);
                                  -1: unknown */
    int32_t detail;            /* peer: the SYMNCCL_FAULT_* of that rank */
    int32_t origin;            /* the rank that gave up first; -1: none */
    int32_t wait;              /* SYMNCCL_WAIT_* */
    int32_t cta;               /* the CTA that gave up */
    uint64_t flag;             /* the flag or epoch waited for */
    uint64_t waited_ns;        /* how long that wait lasted */
} symnccl_fault;

/* A fault word (8 bytes, one per rank, in the staging window's control
 * block): 0, or the code of the first rank to give up: its reason (bits
 * 32-39), that rank (0-7) and the rank it names (8-15: the one it waited
 * for, itself after an abort; 0xff none). */
#define SYMNCCL_FAULT_CODE(reason, origin, named)                     \
    ((uint64_t)(reason) << 32 | (uint64_t)(((named) & 0xff) << 8) |   \
     (uint64_t)((origin) & 0xff))
#define SYMNCCL_FAULT_REASON(w) ((int)(((w) >> 32) & 0xff))
#define SYMNCCL_FAULT_ORIGIN(w) ((int)((w) & 0xff))
#define SYMNCCL_FAULT_NAMED(w) \
    ((((w) >> 8) & 0xff) == 0xff ? -1 : (int)(((w) >> 8) & 0xff))

/* The control block of the staging window (same offset on every rank,
 * zeroed): the fault word, then SYMNCCL_MAX_CTAS barrier flag lines. */
#define SYMNCCL_CTL_BARRIER 128
#define SYMNCCL_CTL_BYTES(n) \
    (SYMNCCL_CTL_BARRIER + (size_t)SYMNCCL_MAX_CTAS * SYMNCCL_FLAG_LINE(n))

/* Opaque holder of an ncclDevComm (device communicator). */
typedef struct symnccl_devcomm symnccl_devcomm;

/* One launch of one kernel. Fields a kernel does not use stay zero. */
typedef struct {
    int kernel;                /* SYMNCCL_K_* */
    const symnccl_devcomm *dc; /* host pointer; the launcher passes the
                                  ncclDevComm itself to the kernel */
    /* data */
    const void *src;           /* input, any device memory; one_shot,
                                  two_shot, multimem: NULL when the input is
                                  already at win + win_offset */
    void *out;                 /* output, any device memory; may equal src */
    size_t count;              /* elements (reduce_scatter, all_gather: of
                                  each slice, the launch's part of it for
                                  the packet kernels, all of it for push) */
    size_t slice_stride;       /* reduce_scatter: elements from one slice of
                                  src to the next; all_gather: of out */
    int dtype;                 /* SYMNCCL_DT_* */
    int op;                    /* SYMNCCL_OP_* */
    int in_place;              /* out is this rank's part of win */
    int root;                  /* reduce, broadcast */
    /* one_shot, two_shot, multimem: where peers load from (same offset on
     * every rank), and two_shot's phase-1 results (mid) */
    ncclWindow_t win;
    size_t win_offset;
    ncclWindow_t mid_win;
    size_t mid_offset;
    void *scratch;             /* one_shot in place: local, >= count elems */
    /* ll, ll128, push: their region of the staging window, same offset on
     * every rank; ll/ll128 rows of row_bytes (two slots x nranks rows),
     * push slots of row_bytes after data_offset */
    ncclWindow_t region_win;
    size_t region_offset;
    size_t row_bytes;
    size_t data_offset;        /* push: slots' offset in region_win */
    size_t chunk_bytes;        /* push reduce_scatter, all_gather: bytes
                                  of a slice per chunk, a multiple of 16,
                                  <= row_bytes (less: the split kernels) */
    uint64_t *epochs;          /* ctas zeroed call counters, local (the
                                  barrier kernels' too) */
    /* push in place on a window: results are stored into out_win at
     * out_offset (16-byte aligned, same on every rank) */
    ncclWindow_t out_win;
    size_t out_offset;
    int ctas, threads;         /* same on every rank */
    /* failures */
    uint64_t timeout_ns;       /* a wait for a peer gives up after this */
    int collective;            /* SYMNCCL_COLL_*, for the record */
    symnccl_fault *fault;      /* the record (device address) */
    unsigned *claim;           /* local, zeroed: the first CTA to give up
                                  takes it and writes the record */
    uint64_t *fault_word;      /* this rank's fault word (local address) */
    ncclWindow_t ctl_win;      /* the control block: every rank's fault */
    size_t ctl_offset;         /* word and the barrier flags */
    int inject;                /* testing: each CTA waits at entry for
                                  something that never comes */
    int pdl;                   /* launched with programmatic stream
                                  serialization: the kernel may start while
                                  the previous one on the stream ends, and
                                  waits for it at entry (SYMNCCL_PDL) */
    int pdl_early;             /* let the next kernel on the stream launch
                                  right after the entry wait; 0: only at
                                  completion (an NCCL before 2.30.7 may
                                  follow: nccl_policy.c, sn_nccl_pdl_early) */
    /* all_reduce_rmsnorm (rmsnorm.cuh): src holds count / row_len rows of
     * this rank's partial sums; out_h <- sum + residual, out <- out_h
     * normalised and scaled by weight (row_len elements) */
    const void *residual;
    void *out_h;
    const void *weight;
    size_t row_len;            /* H, a multiple of 8 */
    int row_block;             /* one_shot_rmsnorm's block for H (a
                                  thread per vector, whole warps, <= 512):
                                  the wide rows kernels' arithmetic is its
                                  (rows_on_packets) */
    float eps;
    int local;                 /* no peer: src holds the sum already (one
                                  rank, or an all-reduce's result): the
                                  add and the norm only (add_rmsnorm), no
                                  barrier, no call counter */
    int quant;                 /* SYMNCCL_QUANT_*: out is float8_e4m3fn */
    float *scale;              /* static: the scale y is divided by ([0]);
                                  dynamic: each row's, written */
    /* all_to_all (alltoall.cuh): count is x's rows, of row_size bytes;
     * rows sent to each rank from in_splits (int64, device) or, when it is
     * NULL, host_splits; the rows received from each rank and where they
     * start in out are written to out_splits and out_offsets (n int64
     * each, either may be NULL); out holds out_rows rows; the splits'
     * packets are at splits_offset in region_win */
    const int64_t *in_splits;
    int64_t *out_splits;
    int64_t *out_offsets;
    size_t row_size;
    size_t out_rows;
    size_t splits_offset;
    int64_t host_splits[SYMNCCL_MAX_RANKS];
} symnccl_kargs;

/* all_reduce_rmsnorm's output quantisation (rmsnorm.cuh): none, FP8 e4m3
 * with a given per-tensor scale, FP8 e4m3 with a scale per row computed
 * from the row's largest |y| (amax / 448). */
enum { SYMNCCL_QUANT_NONE = 0, SYMNCCL_QUANT_STATIC = 1,
       SYMNCCL_QUANT_DYNAMIC = 2 };

/* The entry points of one build of the kernels (one NCCL minor). */
typedef struct {
    int nccl_minor;            /* 2.<nccl_minor> */
    int nccl_headers;          /* NCCL_VERSION_CODE of the headers this
                                  build was compiled against (a library
                                  older than them refuses the device API) */
    cudaError_t (*launch)(const symnccl_kargs *, cudaStream_t);
    size_t (*packet_max_count)(int, size_t, size_t, int);
    size_t (*push_region_bytes)(int, size_t, size_t *);
    cudaError_t (*lsa_layout_ok)(ncclWindow_t, int, int *);
    ncclResult_t (*devcomm_create)(ncclComm_t, int, int, symnccl_devcomm **);
    ncclResult_t (*devcomm_destroy)(ncclComm_t, symnccl_devcomm *);
    void (*devcomm_free)(symnccl_devcomm *);
    void (*devcomm_info)(const symnccl_devcomm *, int *, int *, int *);
    ncclResult_t (*comm_properties)(ncclComm_t, int *, int *);
    cudaError_t (*copy)(void *, const void *, size_t, int, cudaStream_t);
    cudaError_t (*lsa_pointer)(ncclWindow_t, size_t, int, void **);
    ncclResult_t (*loopback_devcomm)(int, int, symnccl_devcomm **);
    cudaError_t (*loopback_window)(char *, int, ncclWindow_t *);
    void (*loopback_window_free)(ncclWindow_t);
} symnccl_kernels;

/* The builds this module holds: setup.py defines SYMNCCL_NCCL_BUILDS(X) as
 * X(28) X(29) ... for the minors it compiled the kernels for. */
#ifdef SYMNCCL_NCCL_BUILDS
#define SYMNCCL_KERNELS_DECL_(minor) \
    extern const symnccl_kernels symnccl_kernels_2_##minor;
SYMNCCL_NCCL_BUILDS(SYMNCCL_KERNELS_DECL_)
#undef SYMNCCL_KERNELS_DECL_
#endif

/* Enqueues the kernel on `stream`. cudaErrorInvalidValue for arguments the
 * kernel cannot take (checked here, not in the kernels). */
cudaError_t symnccl_launch(const symnccl_kargs *a, cudaStream_t stream);

/* Elements of itemsize bytes that one launch of a packet kernel (ll,
 * ll128, or their two-shot) can carry in rows of row_bytes; for a rows
 * kernel (all_reduce_rmsnorm), rows of itemsize bytes, each starting on a
 * packet item. */
size_t symnccl_packet_max_count(int kernel, size_t row_bytes,
                                size_t itemsize, int nranks);

/* Bytes of the push region for nranks ranks and slots of slot_bytes: the
 * flag lines (their size goes to *data_offset, page-rounded), then 2
 * parities x nranks receive slots and 2 x nranks result slots. The flag
 * lines must start zeroed. */
size_t symnccl_push_region_bytes(int nranks, size_t slot_bytes,
                                 size_t *data_offset);

/* *ok = 1 when the team's copies of `win` are evenly spaced (rank q's at
 * rank 0's + q * stride), the layout the kernels' peer addressing relies on
 * (primitives.cuh, Peers). Synchronous; once per communicator. */
cudaError_t symnccl_lsa_layout_ok(ncclWindow_t win, int nranks, int *ok);

/* ---- device communicator (devcomm.cu) ---- */

/* Allocates the holder and calls ncclDevCommCreate with lsaBarrierCount =
 * lsa_barrier_count and lsaMultimem = request_multimem. Collective: call it
 * on every rank, inside ncclGroupStart/End when one thread drives several
 * communicators. The holder is filled when the call (or the group)
 * completes. On failure *out is NULL. */
ncclResult_t symnccl_devcomm_create(ncclComm_t comm, int lsa_barrier_count,
                                    int request_multimem,
                                    symnccl_devcomm **out);

/* ncclDevCommDestroy, then frees the holder. dc may be NULL. */
ncclResult_t symnccl_devcomm_destroy(ncclComm_t comm, symnccl_devcomm *dc);

/* Frees a holder whose ncclDevCommCreate never completed. */
void symnccl_devcomm_free(symnccl_devcomm *dc);

/* Topology read off a created device communicator. *lsa_size -1: it is
 * not one this build can read (NCCL 2.30+: its magic and version are not
 * NCCL_API_MAGIC and the headers' NCCL_VERSION_CODE); *lsa_rank and
 * *has_multimem then hold the magic and the version found. */
void symnccl_devcomm_info(const symnccl_devcomm *dc, int *lsa_size,
                          int *lsa_rank, int *has_multimem);

/* NCCL's own word on the communicator before a device communicator is
 * made (2.29+, ncclCommQueryProperties): *device_api and *multimem 0 or 1.
 * ncclInvalidUsage from a build for an NCCL without the query (2.28). */
ncclResult_t symnccl_comm_properties(ncclComm_t comm, int *device_api,
                                     int *multimem);

/* ---- benchmark helpers (copy.cu) ---- */

/* dst <- src with 16-byte loads (both 16-byte aligned), `ctas` x 512. */
cudaError_t symnccl_copy(void *dst, const void *src, size_t nbytes, int ctas,
                         cudaStream_t stream);
/* The address through which this GPU reaches `peer`'s copy of the window
 * at offset (ncclGetLsaPointer, read back by the host; synchronous). */
cudaError_t symnccl_lsa_pointer(ncclWindow_t win, size_t offset, int peer,
                                void **out);

/* ---- loopback teams (devcomm.cu; csrc/runtime/loopback.c) ---- */

/* Bytes from one rank's staging memory to the next's in a loopback team
 * (a multiple of 4 GiB, as NCCL's window strides are). */
#define SYMNCCL_LOOPBACK_STRIDE (1ull << 32)

/* A device communicator holder for rank `rank` of a loopback team of
 * `nranks`: no NCCL communicator behind it (free it with
 * symnccl_devcomm_free). */
ncclResult_t symnccl_loopback_devcomm(int rank, int nranks,
                                      symnccl_devcomm **out);
/* A window (device memory) whose rank q copy is at flat_base + q *
 * SYMNCCL_LOOPBACK_STRIDE, as seen by `rank`. */
cudaError_t symnccl_loopback_window(char *flat_base, int rank,
                                    ncclWindow_t *out);
void symnccl_loopback_window_free(ncclWindow_t win);

#ifdef __cplusplus
}
#endif

#endif /* SYMNCCL_KERNELS_LAUNCH_H */
