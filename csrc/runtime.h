/* symnccl's runtime header, free of the Python API: what the files of
 * runtime/ and xla/ include (never symnccl.h, never Python.h:
 * tests/test_cpu.py follows their includes, and setup.py compiles them
 * without Python's include directory). It declares every runtime
 * file's functions and types and the communicator object (CommObject),
 * whose Python object header the runtime never reads; symnccl.h includes
 * it and adds the Python face (the module state, the Python objects, the
 * files of python/). The files' layers are declared in symnccl.h's
 * header comment.
 */
#ifndef SYMNCCL_RUNTIME_H
#define SYMNCCL_RUNTIME_H

/* The POSIX and GNU declarations (strcasecmp, nanosleep, clock_gettime,
 * sigaction, dladdr, ...) the runtime's files use: what Python.h's
 * pyconfig.h turns on for the files that include it first. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dlpack_abi.h"
#include "kernels/launch.h"

#define SN_MAX_NDIM 16
/* The most bytes a tensor may span: what DLPack's int64 shapes, strides
 * and byte offsets, and Python's sizes, can all hold (sn_shape_size). */
#define SN_MAX_BYTES ((size_t)INT64_MAX)
/* The largest grid any symnccl kernel may launch. */
#define SN_MAX_CTAS SYMNCCL_MAX_CTAS
/* A communicator's default timeout in seconds: every wait for a peer
 * gives up after it. The one declaration (the Python front ends read
 * _C.DEFAULT_TIMEOUT; docstrings spell it with SN_STR). */
#define SN_DEFAULT_TIMEOUT 600.0
/* The longest timeout a communicator takes (one day), in seconds: every
 * timeout that enters (Communicator(), init_all, _loopback, _shutdown and
 * the Python front ends) must be finite, > 0 and at most this
 * (sn_check_timeout); the kernels get it in nanoseconds as a uint64
 * (launch.c), which this keeps far from overflowing. _C.MAX_TIMEOUT;
 * docs/FAILURES.md. */
#define SN_MAX_TIMEOUT 86400.0
#define SN_STR_(x) #x
#define SN_STR(x) SN_STR_(x)
#define SN_DEFAULT_STAGING (32u << 20)

struct CommObject;
typedef struct CommObject CommObject;
/* The module state (symnccl.h's SNState), which the runtime only carries
 * (CommObject.st). */
struct SNState;

/* ------------------------------------------------------------------ */
/* base.c: the runtime's base, free of the Python API. */

/* What a failure without CUDA's or NCCL's code raises (sn_err.kind). */
enum {
    SN_ERR_RUNTIME = 0,        /* RuntimeError */
    SN_ERR_NOT_IMPLEMENTED,    /* NotImplementedError (a call that cannot
                                  run inside symnccl.group()) */
    SN_ERR_NO_MEMORY,          /* MemoryError, no message (as
                                  PyErr_NoMemory) */
    SN_ERR_VALUE,              /* ValueError */
    SN_ERR_SYSTEM,             /* SystemError (symnccl's own tables
                                  disagree) */
};

/* A failure where no Python exception can be set (no GIL, XLA's threads,
 * the launch path, the runtime's files), turned into one later by sn_raise
 * (python/errors.c): NcclError where nccl is set, else CudaError where
 * cuda is, else kind's exception; msg is the message (for NCCL and CUDA,
 * the call that failed: sn_raise formats the library's words after it,
 * as sn_set_nccl_error and sn_set_cuda_error do). */
typedef struct {
    cudaError_t cuda;          /* cudaSuccess unless a CUDA call failed */
    ncclResult_t nccl;         /* ncclSuccess unless an NCCL call failed */
    char msg[400];
    int kind;                  /* SN_ERR_* where cuda and nccl are not set */
} sn_err;

/* e filled (kind SN_ERR_RUNTIME); returns -1. */
int sn_fail(sn_err *e, cudaError_t cuda, ncclResult_t nccl, const char *fmt,
            ...);
/* e filled as SN_ERR_NO_MEMORY; returns -1. */
int sn_fail_no_memory(sn_err *e);
/* Checks in the style of NCCL's NCCLCHECKGOTO for the runtime: on failure
 * fill err (the call that failed: `what`) and jump to `label`. */
#define SN_CUDA_ERR_GOTO(err, call, what, label)                       \
    do {                                                               \
        cudaError_t sn_e_ = (call);                                    \
        if (sn_e_ != cudaSuccess) {                                    \
            sn_fail((err), sn_e_, ncclSuccess, "%s", (what));          \
            goto label;                                                \
        }                                                              \
    } while (0)
/* The id of the capture `s` takes part in, 0 when it is not capturing. */
cudaError_t sn_capture_id(cudaStream_t s, unsigned long long *id);

/* ------------------------------------------------------------------ */
/* nccl_policy.c: what symnccl knows of NCCL's versions (pure functions of
 * a version code and a call; _C.NCCL_WINDOW_POLICY). */

/* NULL when kernels built against NCCL `headers` (NCCL_VERSION_CODE) may
 * run on libnccl `runtime`, else why not and what to install (in buf). */
const char *sn_nccl_version_verdict(int runtime, int headers, char *buf,
                                    size_t size);
/* The index of the build (headers[i]: its NCCL_VERSION_CODE) to use beside
 * libnccl `runtime`: the newest that may run on it; -1 with the reason in
 * buf when none may. */
int sn_nccl_pick_build(int runtime, const int *headers, int n, char *buf,
                       size_t size);
/* NULL when libnccl `runtime` with the build against `headers` has passed
 * `python -m symnccl` on two GPUs, else the warning (in buf). */
const char *sn_nccl_multi_gpu_caveat(int runtime, int headers, char *buf,
                                     size_t size);
/* 1 when NCCL `runtime`'s kernels wait at entry for the kernel before
 * them (2.30.7 to 2.30.x; later minors not read for it): symnccl's kernels
 * may then trigger the next launch at their entry (symnccl_kargs.
 * pdl_early). */
int sn_nccl_pdl_early(int runtime);
/* SYMNCCL_NCCL_WINDOWS: NCCL gets plain memory always, windows wherever
 * the buffers are windows, or as the table says for the loaded NCCL. */
enum { SN_NCCL_WINDOWS_PLAIN = 0, SN_NCCL_WINDOWS_ON = 1,
       SN_NCCL_WINDOWS_AUTO = 2 };
/* Before NCCL runs `collective` (SYMNCCL_COLL_*) on x (xbytes) into out
 * (outbytes; block_bytes: reduce_scatter's per-rank block, all_gather's
 * slice): NULL when NCCL `nccl_version` may be given the buffers as they
 * are, else a short reason why it must get plain memory instead (the
 * caller then copies through stream-ordered plain memory). x_in_window /
 * out_in_window: the buffer lies in a registered window. `windows`:
 * SN_NCCL_WINDOWS_*. */
const char *sn_nccl_plain_reason(int nccl_version, int windows,
                                 int collective, const char *x,
                                 size_t xbytes, const char *out,
                                 size_t outbytes, size_t block_bytes,
                                 int x_in_window, int out_in_window);
/* nccl.h's NCCL_API_MAGIC (2.29+), which NCCL 2.30's ncclDevComm opens
 * with (devcomm.cu, snk_devcomm_info). */
#define SN_NCCL_API_MAGIC 0xcafebeefu
/* The tables row by row (for python/nccl_info.c): 1 with row i's fields,
 * 0 past the last row. A case row: the NCCL_VERSION_CODE range, the
 * collectives (a mask of 1 << SYMNCCL_COLL_*), the case's name, its
 * alignment and reason; a conversion row: the headers' and libraries'
 * ranges and the evidence; a proof row: the library, the build's headers,
 * where it passed. */
int sn_nccl_case_row(int i, int *lo, int *hi, int *collectives,
                     const char **case_name, size_t *align,
                     const char **reason);
int sn_nccl_conversion_row(int i, int *headers_lo, int *headers_hi,
                           int *library_lo, int *library_hi,
                           const char **evidence);
int sn_nccl_proof_row(int i, int *library, int *headers, const char **where);
/* The newest minor symnccl was checked against; the first NCCL whose
 * kernels wait at entry (sn_nccl_pdl_early). */
int sn_nccl_newest_minor(void);
int sn_nccl_pdl_waits_from(void);

/* ------------------------------------------------------------------ */
/* abi.c: the build of the kernels for the loaded libnccl's minor. */

/* Chooses the build for ncclGetVersion's code (nccl_policy.c,
 * sn_nccl_pick_build); -1 with the reason (the import's ImportError) in
 * msg when none may run on it. */
int sn_abi_select(int nccl_version_code, char *msg, size_t size);
int sn_abi_runtime(void);              /* the code given to sn_abi_select */
int sn_abi_headers(void);              /* the build's headers' code, or 0 */
/* Build i (in the order built): 1 with its minor and its headers'
 * NCCL_VERSION_CODE, 0 past the last. */
int sn_abi_build(int i, int *minor, int *headers);
int sn_abi_minor(void);                /* -1 before a successful select */
/* NULL when the loaded libnccl with the build of NCCL 2.<minor>'s headers
 * (sn_abi_minor(): the build in use) has passed `python -m symnccl` on two
 * GPUs, else the warning (communicators of 2+ ranks give it). */
const char *sn_abi_multi_gpu_caveat(int minor);

/* ------------------------------------------------------------------ */
/* registry.c: the one declaration of dtypes, ops, algorithms, the auto
 * table and the run-time knobs. Python reads them from symnccl._C. */

typedef struct sn_dtype {
    const char *name;          /* "bfloat16" */
    const char *aliases;       /* other spellings, space-separated */
    uint8_t dl_code, dl_bits;  /* DLPack */
    ncclDataType_t nccl;
    int itemsize;
    int kernel;                /* SYMNCCL_DT_*, or -1: no symnccl kernel */
    int xla;                   /* XLA's element type (xla_ffi_abi.h) */
} sn_dtype;

typedef struct sn_op {
    const char *name;          /* "sum" */
    ncclRedOp_t nccl;
    int kernel;                /* SYMNCCL_OP_*, or -1: no symnccl kernel */
} sn_op;

/* Algorithms: SN_ALGO_<ID> of kernels/table.h's SYMNCCL_ALGOS
 * (SN_ALGO_AUTO is algo="auto", not an algorithm). */
#define SN_ALGO_ENUM_(id, name, summary) SN_ALGO_##id,
enum { SN_ALGO_AUTO = -1, SYMNCCL_ALGOS(SN_ALGO_ENUM_) SN_ALGO_COUNT,
       SN_ALGO_UNKNOWN = -2 };
#undef SN_ALGO_ENUM_

typedef struct {
    const char *name;
    const char *summary;       /* one line, for messages and docs */
} sn_algo;

/* Run-time knobs, read once when a communicator is created (the launch
 * path reads no environment). Equal on every rank. */
typedef struct {
    int algo;                  /* SYMNCCL_ALGO: SN_ALGO_* or SN_ALGO_AUTO */
    int lsa_threads, one_shot_ctas, two_shot_ctas, rmsnorm_ctas;
    int rmsnorm_local_ctas;
    int ll_ctas, ll_threads, ll_two_shot_kib, ll128_two_shot_kib;
    int lamport_ctas, lamport_threads;
    int push_ctas, push_threads, push_region_mib, push_chunk_kib;
    int check;                 /* SYMNCCL_CHECK: compare calls first */
    int pdl;                   /* SYMNCCL_PDL: programmatic launches */
    int nccl_windows;          /* SYMNCCL_NCCL_WINDOWS: SN_NCCL_WINDOWS_* */
    int nccl_blocking;         /* SYMNCCL_NCCL_BLOCKING */
} sn_knobs;

/* What decides whether an algorithm can run on a communicator: the same on
 * every rank. */
typedef struct {
    int nranks, lsa_size;
    int symmetric;             /* ncclDevCommCreate succeeded */
    int staging;               /* the staging window exists */
    int push;                  /* it has a push region */
    int multicast;             /* NCCL granted lsaMultimem */
    int nccl;                  /* an NCCL communicator (not loopback) */
    const char *multicast_reason;
} sn_topology;

/* One call, as the resolver sees it. */
typedef struct {
    int collective;            /* SYMNCCL_COLL_* with kernels */
    int algo;                  /* asked: SN_ALGO_* or SN_ALGO_AUTO */
    size_t bytes;              /* the call's larger buffer (an all-gather's
                                  output, else its input) */
    const sn_dtype *dtype;
    const sn_op *op;           /* NULL: the collective has none */
    int in_window;             /* x lies in a registered window */
    int in_group;              /* inside symnccl.group() */
} sn_call_desc;

extern const sn_dtype sn_dtypes[];
extern const int sn_n_dtypes;
extern const sn_op sn_ops[];
extern const int sn_n_ops;
extern const sn_algo sn_algos[SN_ALGO_COUNT];
const sn_dtype *sn_dtype_by_name(const char *name);   /* aliases too */
const sn_dtype *sn_dtype_by_dlpack(SN_DLDataType dt);
const sn_dtype *sn_dtype_by_xla(int type);            /* SNX_*, or NULL */
const sn_op *sn_op_by_name(const char *name);
const sn_op *sn_op_by_nccl(int code);                 /* ncclRedOp_t */
/* SN_ALGO_* for a name ("auto" included), SN_ALGO_UNKNOWN if none. */
int sn_algo_by_name(const char *name);
/* "'auto', 'nccl', 'one_shot', ..." for messages. */
const char *sn_algo_choices(void);
/* The kernel (SYMNCCL_K_*) of `algo` for `collective`: its two-shot
 * variant when `shot` (SYMNCCL_SHOT_TWO) and the table has one, else its
 * one-shot; -1 where the table has none (nccl). */
int sn_kernel_for(int collective, int algo, int shot);
/* The algorithm (SN_ALGO_*) of a kernel. */
int sn_kernel_algo(int kernel);
/* NULL when `algo` can run that collective here, else why not (a kernel
 * that moves bytes: dt and op are not looked at). */
const char *sn_collective_unavailable(const sn_topology *t, int collective,
                                      int algo, const sn_dtype *dt,
                                      const sn_op *op);
/* Names: a SYMNCCL_K_* kernel (SYMNCCL_K_COUNT: "nccl"), a
 * SYMNCCL_COLL_* collective; "?" for anything else. */
const char *sn_kernel_name(int kernel);
const char *sn_collective_name(int collective);
/* The resolver, the one place that picks the algorithm of a call, for
 * every collective and caller (the methods, the XLA handlers, the test
 * hooks): algo="auto" walks the auto table (or SYMNCCL_ALGO where that
 * can run the call; NCCL inside a group); an explicit algorithm is checked
 * against the kernel table, the dtype/op, the topology and the group.
 * Returns SN_ALGO_*, or SN_ALGO_UNKNOWN with why[] naming what was asked
 * and why it cannot run. */
int sn_resolve(const sn_topology *t, const sn_knobs *k, const sn_call_desc *d,
               char *why, size_t len);
/* all_reduce_rmsnorm resolved to SN_ALGO_NCCL (no fused kernel serves it):
 * the all-reduce before symnccl's add+norm. Asked "nccl": NCCL's. Asked
 * "auto": the one all_reduce's auto table picks for the same bytes (a
 * kernel, or NCCL), so the call costs the unfused composition's
 * all-reduce and one kernel (docs/PERFORMANCE.md, 'Fused all-reduce,
 * all-to-all and steps'). */
int sn_then_norm_algo(const sn_topology *t, const sn_knobs *k, int asked,
                      const sn_dtype *dt, size_t bytes);
/* SYMNCCL_COLL_* of a collective with kernels ("all_reduce", ...), -1
 * for another name; "all_reduce, reduce_scatter, ..." for messages; 1 when
 * a collective has kernels. */
int sn_collective_index(const char *cname);
const char *sn_collective_choices(void);
int sn_collective_has_kernels(int collective);
/* Why `algo` cannot run dtype/op on a communicator of topology t, or
 * NULL (the gates every kernel shares). */
const char *sn_algo_unavailable(const sn_topology *t, int algo,
                                const sn_dtype *dt, const sn_op *op);
/* The knobs from the environment; -1 with err (ValueError) on a bad
 * value. */
int sn_knobs_read(sn_knobs *k, sn_err *err);
/* Once, at import: checks launch.h's kernel dtypes against the registry
 * and indexes the kernel table (-1 with err, SystemError, where the table
 * is wrong). */
int sn_registry_init(sn_err *err);
/* The tables row by row, for their Python view (python/tables.c): knob i
 * (1, or 0 past the last) and its value in k; SYMNCCL_EXIT_TIMEOUT's;
 * the multicast kernel's ops of kernel dtype SYMNCCL_DT_* (a mask of
 * 1 << SYMNCCL_OP_*); the auto table's row i (NULL past the last); the
 * registry's name of kernel dtype SYMNCCL_DT_*. */
int sn_knob_row(int i, const char **env, int *dflt, int *lo, int *hi,
                const char **doc);
int sn_knob_value(const sn_knobs *k, int i);
/* Knob i of k set to value (as read: the caller clamps). */
void sn_knob_set(sn_knobs *k, int i, int value);
/* The first knob of the table, then SYMNCCL_ALGO, whose value differs
 * among nranks knob sets (k, then every `stride` bytes): 1, with why
 * holding "SYMNCCL_X (rank 0: a, rank 1: b, ...)"; 0 when all agree.
 * Every knob must be equal on every rank of a communicator (docs/
 * BUILD.md, 'Run-time knobs'); creation compares them (lifecycle.c,
 * sn_connect_agree_check). */
int sn_knobs_differ(const sn_knobs *k, size_t stride, int nranks, char *why,
                    size_t len);
void sn_exit_knob(const char **env, int *dflt, const char **doc);
int sn_multimem_row(int i, int *kernel_dtype, unsigned *ops);
typedef struct {
    int collective, max_ranks;
    size_t ll, ll128, lamport, one_shot, two_shot_window, two_shot_tensor,
        push;
    int above;
} sn_auto_row;
const sn_auto_row *sn_auto_table_row(int i);
const char *sn_kernel_dtype_name(int kernel_dt);

/* ------------------------------------------------------------------ */
/* wait.c: the one bounded wait for non-blocking NCCL communicators. */

/* A wait for work that usually completes within microseconds (an NCCL
 * enqueue, an eager call's event) spins this long before it naps (a 20 us
 * nanosleep costs ~80 us with the default timer slack: eager algo="nccl"
 * calls took ~110 us while every wait napped; a 1 ms first nap was the
 * ~1 ms of each NCCL all_to_all_v). */
#define SN_WAIT_SPIN_SECONDS 1e-3
double sn_now(void);           /* seconds, CLOCK_MONOTONIC */
/* The time `seconds` from now, on sn_now's clock: every deadline. */
double sn_deadline(double seconds);
enum { SN_WAIT_DONE = 0, SN_WAIT_FAILED = 1, SN_WAIT_TIMEOUT = 2,
       SN_WAIT_STOPPED = 3 };
/* Until no communicator reports ncclInProgress, the clock passes `until`,
 * or *stop is set (may be NULL). Touches no Python state: callable without
 * the GIL. On SN_WAIT_FAILED, *failed is the communicator's index and *bad
 * its error. */
int sn_wait_nccl(ncclComm_t *comms, int n, double until,
                 const volatile int *stop, int *failed, ncclResult_t *bad);
/* sn_wait_nccl of a wait that began at `since` (sn_now; it spins until
 * SN_WAIT_SPIN_SECONDS past it, then naps): a wait in slices. */
int sn_wait_nccl_since(ncclComm_t *comms, int n, double since, double until,
                       const volatile int *stop, int *failed,
                       ncclResult_t *bad);

/* ------------------------------------------------------------------ */
/* windows.c: one NCCL window per registered allocation, never two. */

typedef struct sn_window {
    struct sn_window *next;
    char *base;
    size_t size;
    ncclWindow_t win;          /* NULL until registration completed, and
                                  after deregistration */
    ptrdiff_t refs;
    void *dead;                /* refs 0, release deferred: the buffer's
                                  ncclMemAlloc memory, freed by the
                                  communicator once deregistered */
    int lost;                  /* a registration whose completion was given
                                  up on (timeout, abort): never shared or
                                  found; NCCL may still write win, which
                                  the teardown deregisters */
} sn_window;

/* Another reference on the live window that holds [base, base+size), or
 * NULL when none does (GIL held: the list is the GIL's). A SymmetricBuffer
 * shares it, else registers a node of its own (python/buffer.c). */
sn_window *sn_window_share(struct CommObject *c, char *base, size_t size);
/* ncclCommWindowRegister of w's range (collective: every rank calls it;
 * the caller releases the GIL around it and completes the call). */
ncclResult_t sn_window_register(struct CommObject *c, sn_window *w);
/* Unlinks and frees w's node (GIL held: the list is the GIL's). */
void sn_window_forget(struct CommObject *c, sn_window *w);
/* A registration NCCL took but did not complete in time: w stays on the
 * list (NCCL may still write w->win), never shared or found again. */
void sn_window_lose(struct CommObject *c, sn_window *w);
/* Deregisters w now, local in NCCL 2.28-2.30: no GIL needed, no Python;
 * waits at most c->timeout for NCCL, and no longer once c->life.stop is set;
 * 0 (w->win NULL), or -1 (left registered). */
int sn_window_deregister_now(struct CommObject *c, sn_window *w);
/* A node for a window registered by the caller (inside a group). */
sn_window *sn_window_node(struct CommObject *c, char *base, size_t size);
/* The registered window holding [ptr, ptr + size), or NULL. */
sn_window *sn_window_find(const struct CommObject *c, const char *ptr,
                          size_t size);
/* Forgets the windows, deregistering them first when `deregister`
 * (abort, once no kernel of c runs); no Python, no GIL needed. */
void sn_windows_detach(struct CommObject *c, int deregister);
/* Registered windows (the staging window included). */
size_t sn_windows_count(const struct CommObject *c);
/* Frees the nodes (the communicator's deallocation). */
void sn_windows_free(struct CommObject *c);

/* ------------------------------------------------------------------ */
/* staging.c: the staging window (staging area, then the ll, ll128, push and
 * lamport regions) and the device scratch (barrier word, kernel epochs). */

typedef struct {
    size_t staging;            /* usable staging area at offset 0 */
    size_t ll_offset, ll_row;  /* 2 slots x nranks rows of ll_row bytes */
    size_t ll128_offset, ll128_row;
    size_t push_offset;        /* push flags */
    size_t push_data;          /* push slots (4 x nranks of push_slot) */
    size_t push_slot;
    size_t ctl_offset;         /* the control block (SYMNCCL_CTL_BYTES):
                                  fault word, barrier flags */
    size_t splits_offset;      /* all_to_all's splits packets */
    size_t lamport_offset, lamport_row;  /* 2 slots x nranks rows */
    size_t lamport_ar_offset, lamport_ar_row;   /* the same */
    size_t bytes;              /* the whole allocation */
} sn_layout;

/* A communicator's memory (CommObject.mem), staging.c's: it allocates and
 * frees it. A loopback rank's staging is its team's (loopback.c);
 * lifecycle.c registers the staging window, and forgets the pointers
 * where an abort leaves the memory allocated. */
typedef struct {
    sn_layout layout;
    int *scratch;              /* device scratch */
    char *staging;             /* the staging window's memory */
    sn_window *staging_win;
    void *check_dev, *check_host;  /* SYMNCCL_CHECK's buffers */
} sn_comm_memory;

/* The layout for c's ranks, staging size and knobs (no allocation). */
void sn_layout_compute(struct CommObject *c, size_t staging_bytes);
/* The packet region of kernel family SYMNCCL_FAMILY_* (ll, ll128,
 * lamport, lamport_ar): 1, with its offset in the staging window and the
 * bytes of one of its rows (either pointer may be NULL); 0, and both 0,
 * for a family without one. */
int sn_packet_region(const sn_layout *l, int family, size_t *offset,
                     size_t *row);
/* The staging window: 1 when c has one (the device API, one LSA team),
 * sn_staging_reserve its ncclMemAlloc (lifecycle.c releases the GIL
 * around it), sn_staging_clear the regions' first contents (zeroed, the
 * lamport region all ones; -1 with err); the caller registers it. */
int sn_staging_wanted(const struct CommObject *c);
ncclResult_t sn_staging_reserve(struct CommObject *c);
int sn_staging_clear(struct CommObject *c, sn_err *err);
void sn_staging_free(struct CommObject *c);
/* Loopback teams (loopback.c; Communicator._loopback in comm.c): the
 * team's memory for nranks ranks of `bytes` each (one reference, the
 * caller's: sn_loopback_release); rank c->rank's part given to c (whose
 * scratch and failure record the caller has allocated), as
 * sn_comms_connect gives a real communicator its own (c then holds a
 * reference, until sn_loopback_leave, which lifecycle.c calls where a
 * real communicator's staging memory is freed). NULL / -1 with err. */
typedef struct sn_loopback sn_loopback;
sn_loopback *sn_loopback_new(int nranks, int device, size_t bytes,
                             sn_err *err);
int sn_loopback_join(struct CommObject *c, sn_loopback *t, sn_err *err);
void sn_loopback_release(sn_loopback *t);
void sn_loopback_leave(struct CommObject *c);
/* cudaMalloc'd, zeroed scratch and the cross-stream event; -1 with err. */
int sn_scratch_alloc(struct CommObject *c, sn_err *err);
void sn_scratch_free(struct CommObject *c);
/* The call counters of kernel SYMNCCL_K_*: its family's (kernels/table.h),
 * SN_MAX_CTAS of them, in the scratch. */
uint64_t *sn_epochs(const struct CommObject *c, int kernel);
/* The zeroed word the first CTA to give up takes (symnccl_kargs.claim). */
unsigned *sn_claim_word(const struct CommObject *c);
/* A zero-initialised int in the scratch (barrier()'s all-reduce). */
int *sn_barrier_word(const struct CommObject *c);
/* SYMNCCL_CHECK's buffers, allocated at the first use: room for nranks + 1
 * call signatures of `bytes` on the device and in pinned host memory; -1
 * with err. */
int sn_check_buffers(struct CommObject *c, size_t bytes, void **dev,
                     void **host, sn_err *err);

/* ------------------------------------------------------------------ */
/* faults.c: a communicator's failure record, the checks that raise from
 * it, and the first steps of an abort (docs/ARCHITECTURE.md, "Failures"). */

/* A communicator's failure record (CommObject.fail), faults.c's
 * (lifecycle.c forgets the pointers where an abort leaves the memory
 * allocated). */
typedef struct {
    symnccl_fault *fault;      /* the record, mapped host memory */
    symnccl_fault *fault_dev;  /* ... its device address */
    uint64_t *fault_src;       /* pinned: the code written to the word */
    symnccl_fault failure;     /* the record once c failed (reason != 0) */
    char msg[400];             /* a host-found failure's own message */
    cudaStream_t ctl_stream;   /* non-blocking: writes the fault word */
} sn_comm_failure;

/* A communicator's NCCL calls in flight (CommObject.watch): faults.c's
 * watched list, under its mutex, which watchdog.c's thread polls
 * (lifecycle.c forgets the event as above). */
typedef struct {
    cudaEvent_t event;         /* recorded after each eager NCCL call */
    double deadline;
    int collective, armed, expired;
    int revoked;               /* ncclCommRevoke'd by the watchdog's poll */
    int listed;                /* on the watched list */
    struct CommObject *next, *prev;
} sn_comm_watch;

/* The record (mapped host memory), c's own stream and the NCCL watch
 * event; -1 with err. */
int sn_fault_alloc(struct CommObject *c, sn_err *err);
void sn_fault_free(struct CommObject *c);
/* 1 once c has failed (the record is copied into c->fail.failure), else 0.
 * Reads host memory only: no CUDA call, no synchronisation. */
int sn_fault_poll(struct CommObject *c);
/* The message of c's failure (after sn_fault_poll), into buf. */
void sn_fault_describe(const struct CommObject *c, char *buf, size_t size);
/* A failure reason's name (SYMNCCL_FAULT_*: "timeout", ...; "?"). */
const char *sn_fault_reason_name(int reason);
/* Installs the signal handler that raises the abort flag of every live
 * communicator, then hands the signal on: 0 (installed, or already), -1
 * with errno (sigaction), -2 for a signal out of range. */
int sn_abort_on_signal(int sig);
/* 1 when ev is NULL, complete, or failed (its error cleared). */
int sn_event_done(cudaEvent_t ev);
/* The 1 ms nap of the host's polls of events and streams. */
void sn_fault_nap(void);
/* A failure found by the host (an NCCL kernel past the timeout, a call
 * mismatch), recorded unless one is already; `msg` (may be NULL) replaces
 * the message built from the record. */
void sn_fault_record(struct CommObject *c, int reason, int kernel,
                     int collective, int peer, int wait, double waited,
                     const char *msg);
/* Tells c's kernels to stop: the abort flag their waits poll and this
 * rank's fault word (code of `reason`), which every kernel reads at entry,
 * written through c's own stream so that a stream stuck behind a hung
 * kernel is no obstacle. Waits at most `seconds` for that write. */
void sn_fault_stop_kernels(struct CommObject *c, int reason, double seconds);
/* 1 once c's last symnccl launch (and, with `nccl`, its last watched NCCL
 * call) has completed (their events), polling for at most `seconds`; 0 if
 * not. */
int sn_fault_drain(struct CommObject *c, double seconds, int nccl);
/* The watched list (the watchdog's thread is watchdog.c). sn_watch_arm:
 * records c->watch.event on `stream` and arms the deadline; 0 when not
 * (inside a graph capture). sn_watch_forget: close, abort, deallocation.
 * sn_watch_poll: looks at the armed events, 1 when a communicator has
 * expired (deadline passed, or its abort flag raised); an expired one no
 * thread is inside has its failure recorded and NCCL's kernels stopped
 * (ncclCommRevoke) there, before the GIL is taken. sn_watch_collect:
 * the expired OPEN ones no thread is inside, moved to CLOSING (the
 * caller owns their teardown: sn_comm_abort_owned, and takes a reference
 * on each, with the GIL held across the call). */
int sn_watch_arm(struct CommObject *c, int collective, cudaStream_t stream);
void sn_watch_forget(struct CommObject *c);
int sn_watch_poll(void);
/* Records c's expired NCCL call as its failure (a timeout, or an abort
 * where its abort flag was raised), unless one is recorded already. */
void sn_watch_record(struct CommObject *c);
int sn_watch_collect(struct CommObject **out, int max);

/* ------------------------------------------------------------------ */
/* lifecycle.c: communicators' lifecycle without the Python API: the
 * multicast gate, creation's steps, the state machine, the teardown's
 * steps (python/lifetime.c composes them for Python callers). */

/* A communicator's states (CommObject.state, under its lock):
 *   OPEN     callers enter (busy counts them);
 *   CLOSING  close() or an abort owns the teardown: no caller enters, the
 *            teardown waits (bounded) for those inside to leave;
 *   CLOSED   close() completed; ABORTED: an abort completed.
 * OPEN -> CLOSING -> CLOSED or ABORTED; a close turns into an abort when
 * it fails, or when abort() is called meanwhile. */
enum { SN_OPEN = 0, SN_CLOSING = 1, SN_CLOSED = 2, SN_ABORTED = 3 };
enum { SN_TEAR_NONE = 0, SN_TEAR_CLOSE = 1, SN_TEAR_ABORT = 2 };

/* A communicator's lifecycle (CommObject.life), lifecycle.c's
 * (docs/FAILURES.md, "Lifecycle"), under the lock: */
typedef struct {
    int state;                 /* SN_OPEN ... SN_ABORTED */
    int busy;                  /* callers inside c (sn_comm_enter/_pin ..
                                  sn_comm_leave/_unpin) */
    int teardown;              /* while SN_CLOSING: SN_TEAR_CLOSE or
                                  SN_TEAR_ABORT (a close turned abort) */
    int abort_pending;         /* the abort waits for busy to reach 0: the
                                  last caller to leave finishes it */
    int leak_object;           /* deallocated with callers inside: the
                                  object's memory is never freed */
    volatile int stop;         /* an abort began: every wait on c ends */
    int user_aborted;          /* abort() was called (not the watchdog) */
    struct CommObject *next, *prev;   /* open communicators (SNState.live) */
} sn_comm_life;
/* How long a buffer's deallocation waits (GIL released) for the kernels
 * of its communicator before it leaves the window's release to the
 * communicator (windows.c, sn_window_release). */
#define SN_RELEASE_PROMPT_SECONDS 0.5
/* Seconds an abort waits for another thread to leave a method of c (its
 * waits end within 50 ms of c->life.stop), for c's kernels to leave once
 * told to (their waits poll the fault word and the abort flag every few
 * milliseconds; NCCL's, revoked by the watchdog, as long), and for
 * everything of c to end after ncclCommAbort; how long an abort() that
 * found another thread's close waits for it to turn into the abort and
 * end. */
#define SN_ABORT_LEAVE_SECONDS 2.0
#define SN_ABORT_KERNELS_SECONDS 1.0
#define SN_ABORT_DRAIN_SECONDS 5.0
#define SN_ABORT_ALL_SECONDS                                              \
    (SN_ABORT_LEAVE_SECONDS + 2 * SN_ABORT_KERNELS_SECONDS +              \
     SN_ABORT_DRAIN_SECONDS + 1.0)

/* multicast= modes: False, True, None (auto: request unless disabled). */
enum { SN_MC_OFF = 0, SN_MC_ON = 1, SN_MC_AUTO = 2 };
/* NULL when lsaMultimem may be requested, else why not. Never NULL while
 * NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 or
 * NVSHMEM_DISABLE_NVLS=1 (the arguments are those variables' values). */
const char *sn_multicast_gate(int mode, const char *nvls_enable,
                              const char *torch_disable,
                              const char *nvshmem_disable);

/* c joins / leaves the list of open communicators at *live
 * (SNState.live). */
void sn_comm_link(struct CommObject **live, struct CommObject *c);
void sn_comm_unlink(struct CommObject **live, struct CommObject *c);
/* A new communicator object's fields for rank/nranks on device (OPEN,
 * its lock, multicast's request, its knobs, the device's SMs, the staging
 * layout), linked into *live first; -1 with err. */
int sn_comm_init(struct CommObject *c, struct CommObject **live, int rank,
                 int nranks, int device, double timeout, int multicast,
                 size_t staging_bytes, sn_err *err);
/* The steps of sn_comms_connect, in its order; each NCCL group returns
 * its first failure (the caller releases the GIL around it and waits for
 * the communicators). sn_connect_nccl: the NCCL communicators.
 * sn_connect_devcomms_wanted: 0 when NCCL supports no device API (cs are
 * marked so), else 1 with *mc, whether to request multicast.
 * sn_connect_devcomms: the device communicators; _retry after it (rc:
 * its outcome, the wait's included): 1 when the caller tries again
 * without multicast (*mc 0); _read: what NCCL made, checked (-1 with
 * err), or why cs have no device API. sn_connect_memory: c's scratch and
 * failure record (-1 with err). sn_connect_staging: the staging windows'
 * registration (*any: one was registered); _check: their LSA layout,
 * -1 with err. */
ncclResult_t sn_connect_nccl(struct CommObject **cs, int n,
                             const ncclUniqueId *id);
int sn_connect_devcomms_wanted(struct CommObject **cs, int n, int *mc);
ncclResult_t sn_connect_devcomms(struct CommObject **cs, int n, int mc);
int sn_connect_devcomms_retry(struct CommObject **cs, int n,
                              ncclResult_t rc, int *mc);
int sn_connect_devcomms_read(struct CommObject **cs, int n, ncclResult_t rc,
                             sn_err *err);
int sn_connect_memory(struct CommObject *c, sn_err *err);
ncclResult_t sn_connect_staging(struct CommObject **cs, int n, int *any);
int sn_connect_staging_check(struct CommObject **cs, int n, sn_err *err);
/* What every rank of a communicator must share, as each rank's record
 * of it (lifecycle.c, where it travels): staging_bytes and the SYMNCCL_*
 * knobs. size is sizeof(sn_agreed) and sum an FNV-1a hash of the bytes
 * before it: a record torn by a concurrent write, or laid out by another
 * symnccl, is no record. */
typedef struct {
    uint64_t magic;            /* SN_AGREED_MAGIC */
    uint32_t size, unused;
    uint64_t staging_bytes;
    int32_t rank, nranks;
    sn_knobs knobs;
    uint64_t sum;
} sn_agreed;
#define SN_AGREED_MAGIC 0x31636e6d7973ull   /* "symnc1" */
/* r's size and sum filled in. */
void sn_agreed_seal(sn_agreed *r);
/* 1 when r is a whole record of this layout (magic, size, sum). */
int sn_agreed_whole(const sn_agreed *r);
/* The first difference among nranks records (staging_bytes, then the
 * knobs in sn_knobs_differ's order): 1 with why holding "what (rank 0:
 * a, rank 1: b, ...)", 0 when all agree. */
int sn_agreed_differ(const sn_agreed *all, int nranks, char *why,
                     size_t len);
/* sn_connect_agree_write puts c's record into its staging window before
 * the window's registration; sn_connect_agree_check, after it, reads
 * every peer's and compares them: -1 with err (ValueError) naming the
 * first difference with every rank's value, the same verdict on every
 * rank that read every record. */
int sn_connect_agree_write(struct CommObject *c, sn_err *err);
int sn_connect_agree_check(struct CommObject **cs, int n, sn_err *err);

/* The state machine; every step under c's lock, no wait inside. */
/* Enters c without the GIL or Python (the XLA handler; sn_comm_enter's
 * check): 0 entered (counted in busy until sn_comm_unpin / sn_comm_leave);
 * -1 with why[] filled (not OPEN); SN_PIN_FAILED where c has failed and
 * abort() was not called (why[]: its failure's message). */
#define SN_PIN_FAILED (-2)
int sn_comm_pin(struct CommObject *c, char *why, size_t len);
/* Leaving: 1 when the caller was the last inside c and an abort waits
 * for it, which the caller then finishes (sn_comm_abort_finish). */
int sn_comm_leaving(struct CommObject *c);
/* sn_comm_leaving, and the abort finished here (no GIL, no Python). */
void sn_comm_unpin(struct CommObject *c);
/* "open", "being closed", "closed", ... (repr). */
const char *sn_comm_state_name(struct CommObject *c);
/* c's state, and *failed (c has failed). */
int sn_comm_look(struct CommObject *c, int *failed);
/* OPEN -> CLOSING(kind): 1 when the caller now owns the teardown. */
int sn_comm_take_teardown(struct CommObject *c, int kind);
/* close()'s: OPEN, not failed and not `in_group` -> CLOSING(close): 1
 * when the caller owns the teardown; else 0 with what it saw (*state,
 * *failed). */
int sn_comm_take_close(struct CommObject *c, int in_group, int *state,
                       int *failed);
/* abort()'s look: c's state (*was: its teardown); a close under way is
 * marked to turn into an abort. */
int sn_comm_abort_look(struct CommObject *c, int *was);
/* Every wait on c ends (c->life.stop). */
void sn_comm_stop(struct CommObject *c);
/* The owner's abort begins: CLOSING(abort), every wait on c ends. */
void sn_comm_abort_begin(struct CommObject *c);
/* Callers are still inside: 1, and the last of them finishes the abort
 * (abort_pending); else 0. */
int sn_comm_abort_defer(struct CommObject *c);
/* One look of a teardown's wait (the caller naps, sn_comm_nap, between
 * looks): sn_comm_callers_left: 0 no caller is inside c, 1 c->life.stop is
 * set while `stoppable`, 2 the clock (sn_now) passed `until`, -1 look
 * again; sn_comm_teardown_ended: 1 with *state once another thread's
 * teardown has ended (CLOSED, ABORTED), was left to the callers inside
 * (abort_pending), or the clock passed `until`, else 0. */
int sn_comm_callers_left(struct CommObject *c, int stoppable, double until);
int sn_comm_teardown_ended(struct CommObject *c, double until, int *state);
void sn_comm_nap(void);

/* The close hook (python/xla.c installs xla_ffi.c's, once; lifecycle.c
 * knows nothing of XLA): once no caller is inside c, without the GIL
 * and without Python, the windows the XLA handler registered for c go
 * (deregistered when `deregister`: close; abort once no kernel of c
 * runs); the first NCCL failure, else ncclSuccess.
 * sn_comm_closing_windows runs it (ncclSuccess where none is
 * installed). */
typedef ncclResult_t (*sn_close_hook)(struct CommObject *c, int deregister);
void sn_comm_on_close(sn_close_hook hook);
ncclResult_t sn_comm_closing_windows(struct CommObject *c, int deregister);

/* The teardown's steps (no GIL needed). */
/* c's symnccl and (watched) NCCL work has completed: 1; `seconds`
 * passed: 0; c->life.stop was set meanwhile: -1. */
int sn_comm_drain_or_stop(struct CommObject *c, double seconds);
/* c's memory: its loopback team's part, staging, scratch, failure
 * record. */
void sn_comm_free_memory(struct CommObject *c);
/* The rest of an abort once no caller is inside c, by the one thread
 * that owns it (the last caller to leave may be one of XLA's threads):
 * c's kernels drained, the device communicator, the windows (the XLA
 * handler's too, the close hook), ncclCommAbort, the memory once
 * nothing of c runs any more -> ABORTED. */
void sn_comm_abort_finish(struct CommObject *c);
/* The teardown ends in `state` (CLOSED, ABORTED): the windows whose
 * buffers left their release to c go, in the same step under the lock
 * (a release comes either before or after it), their memory freed when
 * `free_dead` (else a kernel of c may still run on it). */
void sn_comm_end_teardown(struct CommObject *c, int state, int free_dead);
/* The deallocation found callers inside c, or a teardown under way: the
 * object is left allocated (life.leak_object), with a message. */
void sn_comm_keep_if_busy(struct CommObject *c);
/* A buffer's release of window w (its last reference gone), under the
 * lock: while c is OPEN or CLOSING, c takes `mem` over (w->dead), and,
 * OPEN and `enter`, the caller enters c (*entered) to reap it. c's state.
 * sn_comm_reap_window: w deregistered and its memory freed once c's
 * kernels drain within SN_RELEASE_PROMPT_SECONDS (*drained: -1 before
 * the first look, then the answer, kept for the next window): 1; else 0
 * (left to the next release or the teardown). No GIL needed. */
int sn_comm_take_window(struct CommObject *c, sn_window *w, void *mem,
                        int enter, int *entered);
int sn_comm_reap_window(struct CommObject *c, sn_window *w, int *drained);

/* ------------------------------------------------------------------ */
/* watchdog.c: a thread that aborts a communicator whose NCCL call has not
 * completed within its timeout. */

/* After an eager NCCL call of `collective` on `stream`: sn_watch_arm, and
 * the thread started if it is not running. 1 when the watch event was
 * recorded; 0 when not (a capture, or a failed record: a caller that
 * reads results after sn_fault_wait_nccl must not then read them). */
int sn_watch_nccl(CommObject *c, int collective, cudaStream_t stream);
/* The Python face's handler, which the thread calls when a communicator
 * has expired (module.c's: with the GIL, sn_watch_collect, the failure
 * recorded, sn_comm_abort_owned). */
void sn_watch_on_expired(void (*fn)(void));
/* Interpreter exit: sn_watch_stop tells the thread to stop, 1 when it ran
 * and must be joined: sn_watch_join, with the GIL released (the thread
 * may be waiting for it). */
int sn_watch_stop(void);
void sn_watch_join(void);

/* ------------------------------------------------------------------ */
/* launch.c: a collective on symnccl's kernels, without the Python API. */

/* The order of a communicator's LSA kernels (CommObject.order), launch.c's
 * (staging.c creates and frees the event with the scratch): they share
 * its barrier slots, packet regions and epochs, so they run one after
 * another: the event is recorded after each launch, and a call on
 * another stream first waits for it. */
typedef struct {
    cudaEvent_t event;
    cudaStream_t stream;       /* where the event was last recorded */
    unsigned long long capture;  /* capture id of the last record, 0 */
    int used;
} sn_comm_order;

/* A communicator's counters (CommObject.count), launch.c's: kernels
 * launched (SYMNCCL_K_*) and NCCL collectives enqueued ([SYMNCCL_K_COUNT]),
 * Communicator._launches(); and the launches that get a fault injected
 * (testing: a SYMNCCL_K_* mask, once each; comm.c's _inject_fault sets
 * it). */
typedef struct {
    unsigned long long launches[SYMNCCL_K_COUNT + 1];
    int inject;
} sn_comm_counters;

typedef struct {
    CommObject *c;
    int algo;                  /* SN_ALGO_* of a kernel, resolved */
    const char *x;             /* input, any device memory of c's GPU */
    char *out;                 /* output; == x for in place */
    const sn_window *win;      /* window holding x, or NULL */
    size_t count;              /* elements; reduce_scatter: of out,
                                  all_gather: of x (one slice) */
    const sn_dtype *dtype;
    const sn_op *op;
    cudaStream_t stream;
    int collective;            /* SYMNCCL_COLL_ALL_REDUCE (0),
                                  _REDUCE_SCATTER, _ALL_GATHER, _REDUCE,
                                  _BROADCAST */
    int root;                  /* reduce, broadcast */
    /* all_reduce_rmsnorm (fused.c): x and out are rows of row_len; out_h
     * <- sum + residual, out <- out_h normalised, times weight */
    const char *residual;
    char *out_h;
    const char *weight;
    size_t row_len;
    float eps;
    int local;                 /* x holds the sum (NCCL's): no peer */
    int quant;                 /* SYMNCCL_QUANT_*: out is float8_e4m3fn */
    float *scale;              /* static: [0]; dynamic: one per row */
    int ar_algo;               /* algo SN_ALGO_NCCL: the all-reduce before
                                  the add+norm (sn_then_norm_algo) */
    /* all_to_all (count: x's rows): bytes per row, out's rows, the rows
     * sent to each rank (device int64, or NULL: host_splits, nranks
     * values), where the counts received and the offsets go (device int64,
     * may be NULL) */
    size_t row_size, out_rows;
    const int64_t *in_splits, *host_splits;
    int64_t *out_splits, *out_offsets;
    /* NCCL (run.c): x / out lie in a registered window (the NCCL-window
     * policy reads it); inside symnccl.group() (a call that must copy
     * through plain memory cannot run there) */
    int x_in_window, out_in_window;
    int in_group;
} sn_ar;

/* Enqueues the collective on r->stream; 0, or -1 with *err filled. */
int sn_launch_kernels(const sn_ar *r, sn_err *err);
/* all_to_all's algorithm (*algo, resolved) checked against what ll
 * carries, from what every rank agrees on: the communicator, the row size,
 * x's rows for equal blocks (ragged 0) and out's rows for all_to_all_v
 * (ragged; the same on every rank by its contract). ll carries one row of
 * LL packets per source: a row that does not fit one is refused for any
 * call; equal blocks past it are refused; an all_to_all_v block past it is
 * cut there (kernels/alltoall.cuh; out_splits says what arrived), *block =
 * the rows a block carries. "auto" that resolved to
 * ll takes push (NCCL where push cannot run) wherever a block out keeps
 * could pass it, so "auto" never cuts. 0 (*block SIZE_MAX where nothing is
 * cut), or -1 with why[] filled. */
int sn_a2a_plan(const CommObject *c, int asked, int *algo, int ragged,
                size_t rows, size_t out_rows, size_t row_size, size_t *block,
                char *why, size_t len);
/* Counts an NCCL collective in c->count.launches. */
void sn_count_nccl(CommObject *c);

/* ------------------------------------------------------------------ */
/* run.c: one launch path per collective, without the Python API, shared
 * by every face (the methods, the torch ops through them, the XLA
 * handlers): symnccl's kernels or NCCL's call, the NCCL-window policy. */

/* Completes an NCCL call of `collective` (`what`: the NCCL function, for
 * messages) that returned rc, the caller's way (the methods: counted,
 * watched, waited for with Python's exception on failure; the XLA
 * handlers: without the GIL); 0, or -1 with the caller's error set. */
typedef int (*sn_nccl_done_fn)(void *ctx, ncclResult_t rc, int collective,
                               const char *what);
/* The resolver (sn_resolve) on c's topology and knobs. */
int sn_run_resolve(const CommObject *c, const sn_call_desc *d, char *why,
                   size_t len);
/* The op a call on c runs (avg is sum on one rank). */
const sn_op *sn_run_op(const CommObject *c, const sn_op *op);
/* Enqueues a resolved call on r->stream: r->algo a kernel's (launch.c),
 * or SN_ALGO_NCCL: the collective's NCCL call (r->count is NCCL's count:
 * reduce_scatter's of out, all_gather's of x), on the buffers where the
 * NCCL-window policy allows (r->x_in_window, r->out_in_window), else
 * through stream-ordered plain memory (refused with not_implemented when
 * r->in_group); all_to_all's equal blocks (r->host_splits) as grouped
 * ncclSend/ncclRecv; all_reduce_rmsnorm's all-reduce (NCCL's, or the
 * kernel of r->ar_algo) then the add+norm kernel with no peer. NCCL's
 * calls are completed by done(ctx, ...). 0; -1 with *err filled; -2 when
 * done() failed (its error is the caller's). */
int sn_run(const sn_ar *r, sn_nccl_done_fn done, void *ctx, sn_err *err);
/* Grouped ncclSend/ncclRecv of send[q] rows of r->row_size bytes (from
 * x's row send_off[q]) to and recv[q] rows (into out's row recv_off[q])
 * from every rank q, in rank order; NULL offsets: one block after
 * another. Returns as sn_run. */
int sn_run_exchange(const sn_ar *r, const int64_t *send,
                    const int64_t *send_off, const int64_t *recv,
                    const int64_t *recv_off, sn_nccl_done_fn done, void *ctx,
                    sn_err *err);
/* Whether x and whether out of `collective`'s NCCL call holds nranks
 * blocks of NCCL's count (run.c's row): 0, or -1 where the collective has
 * no NCCL collective of its own. */
int sn_nccl_blocks(int collective, int *x_blocks, int *out_blocks);
/* The bytes of x and out of r's NCCL collective (run.c's row of
 * r->collective, from r->count and the communicator's size), and of one
 * rank's block where x or out holds nranks of them (else 0; block may be
 * NULL). 0, or -1 where r->collective has no NCCL collective of its own. */
int sn_nccl_sizes(const sn_ar *r, size_t *xbytes, size_t *outbytes,
                  size_t *block);
/* Why the fused collective cannot run a call that sn_resolve gave `algo`
 * (two_shot has no FP8 output), or NULL. */
const char *sn_rmsnorm_unavailable(int algo, int quant);
/* A call that resolved to `algo`: the all-reduce before the add+norm
 * (SN_ALGO_NCCL or a kernel's, sn_then_norm_algo) when algo is
 * SN_ALGO_NCCL, else -1. */
int sn_rmsnorm_ar_algo(CommObject *c, int asked, int algo,
                       const sn_dtype *dt, size_t bytes);

/* ------------------------------------------------------------------ */
/* alltoall.c: all_to_all and all_to_all_v (python/), whose NCCL scratch
 * is a part of the communicator. */

/* all_to_all_v's NCCL scratch (CommObject.a2a), alltoall.c's: the counts'
 * memory, every rank's row of counts, x rows and out rows (A2A_WORDS
 * int64) each, allocated at the first such call; busy: a call is using
 * it; lost_*: a failed call's, which a queued copy may still use. Freed
 * with the scratch (staging.c) once the communicator's work has drained
 * (lifecycle.c forgets them where an abort leaves the memory allocated). */
typedef struct {
    int64_t *dev, *host;
    int64_t *lost_dev, *lost_host;
    int busy;
} sn_comm_a2a;

/* ------------------------------------------------------------------ */
/* xla_ffi.c: the XLA FFI handlers, without the Python API. */

/* A communicator's XLA buffers (CommObject.xla), xla_ffi.c's, under the
 * communicator's lock. */
typedef struct {
    sn_window *windows;        /* XLA buffers registered by xla_ffi.c */
    int registering;           /* an XLA thread registers a window: the
                                  others wait for it, without the lock */
} sn_comm_xla;

/* The devices the handlers' registry has a slot for. */
#define SN_XLA_MAX_DEVICES 64
/* The close hook (sn_comm_on_close). */
ncclResult_t sn_xla_on_close(CommObject *c, int deregister);
/* c leaves the registry; how many of the registry's references to c the
 * caller drops (GIL held). */
int sn_xla_unregister(CommObject *c);
/* The communicator registered for `device` becomes c (a reference the
 * caller took); the one it replaces (a reference the caller drops). */
CommObject *sn_xla_swap(int device, CommObject *c);
/* window_calls, staged_calls, registrations of `device`'s handler calls. */
void sn_xla_get_stats(int device, unsigned long long out[3]);
/* The handler table: how many, each one's name and its function. */
size_t sn_xla_n_handlers(void);
const char *sn_xla_handler_name(size_t i);
void *sn_xla_handler_fn(size_t i);

/* ------------------------------------------------------------------ */
/* The communicator object: what every layer shares, and one part per file
 * that owns it (declared in that file's section above). */

/* The Python object's header (PyObject_HEAD), which the runtime never
 * reads or writes: PyObject's size and alignment (python/comm.c checks
 * them where Python.h is included), so that runtime/ and xla/ need no
 * Python.h. The Python face casts a CommObject * to PyObject *. */
typedef struct {
    void *words[2];
} sn_object_head;

typedef struct CommObject {
    sn_object_head ob_base;    /* PyObject_HEAD */
    ncclComm_t comm;           /* NULL: closed, or a loopback rank */
    sn_loopback *loopback;     /* a loopback rank's team (loopback.c) */
    symnccl_devcomm *devcomm;
    int rank, nranks, device;
    int lsa_size, lsa_rank;
    int symmetric, multicast;
    const char *symmetric_reason;
    const char *multicast_reason;
    int multicast_requested;
    char device_api_why[240];  /* symmetric_reason, when it is composed */
    int pdl_early;             /* symnccl_kargs.pdl_early (nccl_policy.c;
                                  settable for testing: _pdl_early) */
    int sms;                   /* the device's SMs */
    double timeout;
    sn_knobs knobs;
    sn_window *windows;        /* windows.c */
    /* Guards the lifecycle (life: state, teardown, busy, abort_pending),
     * the cross-stream order, the counters and the XLA windows: the XLA
     * FFI handler enters and launches from XLA's threads without the GIL.
     *
     * Lock order (deadlock-free because nothing takes them the other way
     * round): the GIL, then xla_ffi.c's registry lock or faults.c's
     * watch_mu, then c->lock. c->lock is held for a few memory operations
     * and kernel launches only: never across a wait for a peer, a device
     * synchronisation or an NCCL wait, never while taking the GIL or
     * calling the Python API (which may release and retake the GIL). A
     * thread that waits (for peers, for callers to leave, for the device)
     * holds no lock, and holds the GIL only for waits that cannot last
     * (docs/FAILURES.md, "Lifecycle"). */
    pthread_mutex_t lock;
    struct SNState *st;        /* the module's state (python/'s) */
    sn_comm_life life;         /* lifecycle.c */
    sn_comm_memory mem;        /* staging.c */
    sn_comm_order order;       /* launch.c */
    sn_comm_counters count;    /* launch.c */
    sn_comm_failure fail;      /* faults.c */
    sn_comm_watch watch;       /* faults.c, watchdog.c's list */
    sn_comm_a2a a2a;           /* alltoall.c */
    sn_comm_xla xla;           /* xla_ffi.c */
} CommObject;

static inline void sn_lock(CommObject *c) { pthread_mutex_lock(&c->lock); }
static inline void sn_unlock(CommObject *c) { pthread_mutex_unlock(&c->lock); }

static inline sn_topology
sn_topology_of(const CommObject *c)
{
    const sn_topology t = {
        .nranks = c->nranks,
        .lsa_size = c->lsa_size,
        .symmetric = c->symmetric,
        .staging = c->mem.staging_win != NULL,
        .push = c->mem.layout.push_slot != 0,
        .multicast = c->multicast,
        .nccl = c->comm != NULL,
        .multicast_reason = c->multicast_reason,
    };
    return t;
}

#endif /* SYMNCCL_RUNTIME_H */
