/* symnccl internal header: module state, object layouts, error helpers.
 *
 * Layering (see DESIGN.md): the .c files hold all host logic and talk to NCCL
 * through nccl.h and to the CUDA C++ side only through kernels/launch.h.
 */
#ifndef SYMNCCL_H
#define SYMNCCL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dlpack.h"
#include "kernels/launch.h"

#define SN_MAX_NDIM 16
/* lsaBarrierCount requested from ncclDevCommCreate: the largest grid any
 * symnccl kernel may launch (one barrier slot per CTA). */
#define SN_MAX_CTAS 128
#define SN_DEFAULT_TIMEOUT 600.0
#define SN_DEFAULT_STAGING (32u << 20)
/* Receive buffers of the LL kernel, per rank, after the staging area in the
 * same window: 2 slots x nranks rows x 16-byte packets per 8 data bytes. */
#define SN_LL_REGION (16u << 20)
/* Receive buffers of the ll128 kernel, per rank, after the LL region:
 * 2 slots x nranks rows of 128-byte lines (120 data bytes each). */
#define SN_LL128_REGION (8u << 20)
/* Flags and slots of the push kernel, per rank, after the ll128 region:
 * 2 parities x (receive + result) x nranks slots. SYMNCCL_PUSH_REGION_MIB
 * overrides the size at communicator creation. */
#define SN_PUSH_REGION (64u << 20)
/* Device scratch per communicator: barrier() int at 0, LL epochs at 256,
 * push epochs at 1280, ll128 epochs at 2304 (SN_MAX_CTAS 64-bit counters
 * each). */
#define SN_SCRATCH_BYTES 4096
#define SN_EPOCHS_OFFSET 256
#define SN_PUSH_EPOCHS_OFFSET (SN_EPOCHS_OFFSET + 8 * SN_MAX_CTAS)
#define SN_LL128_EPOCHS_OFFSET (SN_PUSH_EPOCHS_OFFSET + 8 * SN_MAX_CTAS)

/* ------------------------------------------------------------------ */
/* Module state: everything that would otherwise be a process global. */

typedef struct {
    PyTypeObject *CommunicatorType;
    PyTypeObject *SymmetricBufferType;
    PyTypeObject *DeviceArrayType;
    PyObject *NcclError;
    PyObject *CudaError;
    /* Python callables installed by symnccl/_frameworks.py */
    PyObject *stream_hook;     /* (obj, device) -> int stream handle */
    PyObject *frameworks;      /* module with alloc(like, shape, device) and
                                  wrap(like, DeviceArray) */
    PyObject *str_dlpack;      /* interned "__dlpack__" */
    PyObject *str_dlpack_device;
    /* NCCL group bracket (symnccl.group()): thread-affine like NCCL's. */
    int group_depth;
    unsigned long group_thread;
    PyObject *group_pending;   /* list of objects finished at group end */
    int shutting_down;         /* set at interpreter exit: leak, don't free */
    /* torch fast path (dlpack.c): torch.Tensor and
     * torch._C._cuda_getCurrentRawStream, looked up once torch is imported,
     * and the dtypes seen so far (torch dtypes are singletons). */
    PyObject *torch_tensor;
    PyObject *torch_raw_stream;
    struct { PyObject *obj; SN_DLDataType dt; } torch_dtypes[16];
    int n_torch_dtypes;
    struct CommObject *live;   /* communicators not yet closed (borrowed) */
} SNState;

/* ------------------------------------------------------------------ */
/* Window cache: one NCCL window per registered allocation, never two. */

typedef struct sn_window {
    struct sn_window *next;
    char *base;
    size_t size;
    ncclWindow_t win;          /* NULL until registration completed */
    Py_ssize_t refs;
} sn_window;

typedef struct CommObject {
    PyObject_HEAD
    struct CommObject *live_next, *live_prev;   /* open communicators */
    ncclComm_t comm;
    symnccl_devcomm *devcomm;
    int rank, nranks, device;
    int lsa_size, lsa_rank;
    int symmetric, multicast;
    const char *symmetric_reason;
    const char *multicast_reason;
    int multicast_requested;
    int closed;                /* 0 open, 1 closed, 2 aborted */
    double timeout;
    int *scratch;              /* SN_SCRATCH_BYTES of zeroed device memory:
                                  barrier()'s int, the LL epoch counters */
    sn_window *windows;
    /* Staging window for LSA kernels on inputs that are not in a window
     * (and the phase-1 buffer of out-of-place two-shot). Allocated and
     * registered at creation: registration is collective, so it cannot be
     * left to the first op, which ranks might reach with different kinds
     * of input. */
    char *staging;
    size_t staging_bytes;      /* usable staging area at offset 0 */
    size_t staging_alloc;      /* whole allocation: staging + LL region +
                                  ll128 region + push region */
    sn_window *staging_win;
    /* LL kernel: receive buffer at staging + ll_offset, messages of up to
     * ll_max_bytes per launch, fixed grid (ll_ctas x ll_threads). */
    size_t ll_offset, ll_max_bytes;
    int ll_ctas, ll_threads;
    /* ll on 3+ ranks: the two-shot packet kernel from this many bytes */
    size_t ll_two_shot_min;
    /* ll128 kernel: its receive buffer at staging + ll128_offset, rows of
     * ll128_row_bytes, the ll grid, its own epochs; on 3+ ranks its
     * two-shot from ll128_two_shot_min bytes */
    size_t ll128_offset, ll128_row_bytes, ll128_two_shot_min;
    /* push kernel: flags at staging + push_offset, slots at push_data,
     * slot_bytes per slot, fixed grid (push_ctas x push_threads). */
    size_t push_offset, push_data, push_slot_bytes;
    int push_ctas, push_threads;
    /* one_shot/two_shot grid limits and the SYMNCCL_ALGO override
     * (SN_ALGO_AUTO when unset), read once at creation like the knobs
     * above: the launch path does no getenv. */
    int lsa_threads, one_shot_ctas, two_shot_ctas;
    int algo_env;
    /* LSA kernels of one communicator share barrier slots and LL buffers, so
     * they run one after another: lsa_event is recorded after each launch,
     * and a call on another stream first waits for it (comm.c). */
    cudaEvent_t lsa_event;
    cudaStream_t lsa_stream;
    unsigned long long lsa_capture;  /* capture id of the last record, 0 */
    int lsa_used;
    /* Guards the LSA ordering state and xla_windows: the XLA FFI handler
     * launches from XLA's threads without the GIL. */
    pthread_mutex_t lock;
    sn_window *xla_windows;    /* XLA buffers registered by the handler */
} CommObject;

static inline void sn_lock(CommObject *c) { pthread_mutex_lock(&c->lock); }
static inline void sn_unlock(CommObject *c) { pthread_mutex_unlock(&c->lock); }

/* SN_ALLOC_HOST: malloc'd host memory exported as a CPU tensor, only for
 * testing the DLPack machinery on machines without a GPU. */
enum { SN_ALLOC_NCCL = 1, SN_ALLOC_CUDA = 2, SN_ALLOC_HOST = 3 };

typedef struct {
    PyObject_HEAD
    CommObject *comm;          /* strong ref, NULL for a DeviceArray */
    char *ptr;
    size_t nbytes;
    int alloc_kind;
    sn_window *win;            /* NULL when not registered (or comm closed) */
    int pending;               /* window registration waits on group end */
    int device;
    int ndim;
    int64_t shape[SN_MAX_NDIM];
    int64_t strides[SN_MAX_NDIM];
    SN_DLDataType dtype;
    /* Producer-side stream tracking for the DLPack stream protocol. */
    cudaStream_t last_stream;
    int has_last_stream;
    cudaEvent_t event;
    Py_ssize_t exports;
} BufferObject;

/* A tensor borrowed from any DLPack producer for the span of one call. */
typedef struct {
    PyObject *capsule;         /* owned; NULL for our own buffers */
    void *managed;             /* DLManagedTensor(Versioned) to release */
    int versioned;
    BufferObject *own;         /* borrowed, set when the object is ours */
    char *ptr;
    int device;
    SN_DLDataType dtype;
    ncclDataType_t nccl_dtype;
    int itemsize;
    int ndim;
    int64_t shape[SN_MAX_NDIM];
    size_t count;
    int readonly;
} SNTensor;

/* ------------------------------------------------------------------ */
/* module.c */
SNState *sn_state_from_type(PyTypeObject *tp);
int sn_set_nccl_error(SNState *st, ncclResult_t rc, ncclComm_t comm,
                      const char *what);
int sn_set_cuda_error(SNState *st, cudaError_t rc, const char *what);
/* Waits, GIL released and interruptible, until none of the communicators
 * reports ncclInProgress. -1 with an exception set on error or timeout. */
int sn_wait_comms(SNState *st, ncclComm_t *comms, int n, double timeout,
                  const char *what);
/* Completes an NCCL call made on a (non-blocking) communicator. */
int sn_nccl_complete(SNState *st, CommObject *c, ncclResult_t rc,
                     const char *what);
/* multicast= modes: False, True, None (auto: request unless disabled). */
enum { SN_MC_OFF = 0, SN_MC_ON = 1, SN_MC_AUTO = 2 };
/* NULL when lsaMultimem may be requested, else why not. Never NULL while
 * NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 or
 * NVSHMEM_DISABLE_NVLS=1 (the arguments are those variables' values). */
const char *sn_multicast_gate(int mode, const char *nvls_enable,
                              const char *torch_disable,
                              const char *nvshmem_disable);
int sn_parse_multicast(PyObject *obj, int *mode);

/* Switch to a device, remembering the previous one. */
int sn_device_push(SNState *st, int device, int *prev);
void sn_device_pop(int prev);

#define SN_CUDA_GOTO(st, call, what, label)                            \
    do {                                                               \
        cudaError_t sn_e_ = (call);                                    \
        if (sn_e_ != cudaSuccess) {                                    \
            sn_set_cuda_error((st), sn_e_, (what));                    \
            goto label;                                                \
        }                                                              \
    } while (0)

/* comm.c */
extern PyType_Spec sn_communicator_spec;
int sn_comm_check_usable(SNState *st, CommObject *c);
/* At interpreter exit: close every open communicator (abort on failure). */
int sn_comm_shutdown_all(SNState *st, double timeout);
/* Registers [base, base+size) once; returns the cached node. */
sn_window *sn_comm_window_acquire(SNState *st, CommObject *c, char *base,
                                  size_t size);
void sn_comm_window_release(CommObject *c, sn_window *w);
int sn_comm_in_window(CommObject *c, const char *ptr);

/* The registered window holding [ptr, ptr + size), or NULL. */
sn_window *sn_comm_find_window(CommObject *c, const char *ptr, size_t size);

/* buffer.c */
extern PyType_Spec sn_symmetric_buffer_spec;
extern PyType_Spec sn_device_array_spec;
PyObject *sn_buffer_new(SNState *st, CommObject *comm, PyTypeObject *tp,
                        int ndim, const int64_t *shape, SN_DLDataType dtype,
                        int zero, cudaStream_t stream);
int sn_is_buffer(SNState *st, PyObject *o);
int sn_buffer_finish_pending(SNState *st, BufferObject *b);
void sn_buffer_mark_written(BufferObject *b, cudaStream_t stream);

/* dlpack.c */
int sn_dtype_from_name(const char *name, SN_DLDataType *out);
const char *sn_dtype_name(SN_DLDataType dt);
int sn_dtype_itemsize(SN_DLDataType dt);
int sn_dtype_to_nccl(SN_DLDataType dt, ncclDataType_t *out);
int sn_parse_dtype(PyObject *obj, SN_DLDataType *out);
int sn_parse_shape(PyObject *obj, int *ndim, int64_t *shape);
/* Parse a stream argument (None, int, torch/cupy stream, __cuda_stream__). */
int sn_parse_stream(PyObject *obj, cudaStream_t *out);
int sn_default_stream(SNState *st, PyObject *tensor, int device,
                      cudaStream_t *out);
intptr_t sn_stream_to_dlpack(cudaStream_t s);
/* Borrow any DLPack tensor; `stream` is the consumer's stream. */
int sn_tensor_import(SNState *st, PyObject *obj, cudaStream_t stream,
                     int device, const char *argname, SNTensor *t);
/* Testing hooks (module functions _import_info and _host_buffer). */
PyObject *sn_py_import_info(PyObject *module, PyObject *args);
PyObject *sn_py_host_buffer(PyObject *module, PyObject *args);
void sn_tensor_release(SNTensor *t);
PyObject *sn_buffer_dlpack(BufferObject *b, PyObject *args, PyObject *kw);
int sn_is_immutable(PyObject *obj);

/* lsa.c: all_reduce on symnccl's kernels, without the Python API. */
enum { SN_ALGO_NCCL = 0, SN_ALGO_ONE_SHOT = SYMNCCL_ALGO_ONE_SHOT,
       SN_ALGO_TWO_SHOT = SYMNCCL_ALGO_TWO_SHOT, SN_ALGO_LL = SYMNCCL_ALGO_LL,
       SN_ALGO_MULTIMEM = SYMNCCL_ALGO_MULTIMEM,
       SN_ALGO_PUSH = SYMNCCL_ALGO_PUSH, SN_ALGO_LL128 = SYMNCCL_ALGO_LL128,
       SN_ALGO_COUNT,
       SN_ALGO_AUTO = -1 };
extern const char *const sn_algo_names[SN_ALGO_COUNT];
/* SN_ALGO_* for a name ("auto" included), -2 if unknown. */
int sn_algo_from_name(const char *s);
int sn_lsa_op(ncclRedOp_t op);
/* Why `algo` cannot run this dtype/op on c, or NULL. Depends only on what
 * every rank agrees on, so every rank decides alike. */
const char *sn_lsa_unavailable(const CommObject *c, int algo,
                               ncclDataType_t dt, ncclRedOp_t op);
/* algo="auto" (the measured table, SYMNCCL_ALGO override); in_window: x
 * lies in a registered window (the same on every rank). */
int sn_auto_algo(const CommObject *c, size_t bytes, ncclDataType_t dt,
                 ncclRedOp_t op, int in_window);

typedef struct {
    CommObject *c;
    int algo;                  /* an LSA SN_ALGO_*, already checked */
    const char *x;             /* input, any device memory of c's GPU */
    char *out;                 /* output; == x for in place */
    const sn_window *win;      /* window holding x, or NULL (staged) */
    size_t count;
    int itemsize;
    ncclDataType_t dtype;
    ncclRedOp_t op;
    cudaStream_t stream;
    cudaError_t cuda_error;    /* out: on failure */
    char err[160];             /* out: what failed */
} sn_ar;
/* Enqueues the all-reduce on r->stream; 0, or -1 with r->err filled. */
int sn_lsa_all_reduce(sn_ar *r);

/* xla_ffi.c: the XLA FFI handler and its Python-side hooks. */
PyObject *sn_py_xla_handler(PyObject *module, PyObject *unused);
PyObject *sn_py_xla_register(PyObject *module, PyObject *arg);
PyObject *sn_py_xla_stats(PyObject *module, PyObject *arg);
/* Drops c from the handler's table (close, abort). */
void sn_xla_forget(CommObject *c);
/* Deregisters (deregister != 0) and frees the handler's windows of c. */
int sn_xla_release_windows(CommObject *c, int deregister);

/* collectives.c */
PyObject *sn_all_reduce(CommObject *c, PyObject *args, PyObject *kw);
PyObject *sn_reduce_scatter(CommObject *c, PyObject *args, PyObject *kw);
PyObject *sn_all_gather(CommObject *c, PyObject *args, PyObject *kw);
PyObject *sn_broadcast(CommObject *c, PyObject *args, PyObject *kw);
PyObject *sn_barrier(CommObject *c, PyObject *args, PyObject *kw);

#endif /* SYMNCCL_H */
