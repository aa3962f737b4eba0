/* symnccl internal header of the Python face: the module state, the
 * Python objects, and the functions each file of python/ offers the
 * others. It includes runtime.h, which declares the runtime's files and
 * the communicator object (CommObject) without Python.
 *
 * The .c files live in folders by face (docs/ARCHITECTURE.md, "Host
 * code"): runtime/ (what a launch needs, meant to run without Python: the
 * XLA handlers call it on XLA's threads), python/ (the Python face: the
 * module, its types and methods, argument parsing, raising), xla/ (the XLA
 * FFI face, which never calls the Python API). runtime/ and xla/ include
 * runtime.h, never this header (so never Python.h), and call no Python
 * API and no function of python/; tests/test_cpu.py checks both.
 *
 * The .c files form layers; a file calls only files listed before it (the
 * layers above it, and earlier files of its own), never one after, so
 * there is no circle. This list is the one declaration of the order:
 * tests/layering.py reads it for the layering test (tests/test_cpu.py,
 * which also checks that it names every file) and for docs/ARCHITECTURE.md's
 * table ("Host code", tests/test_docs.py).
 *
 *   1  runtime/base.c  runtime/nccl_policy.c  runtime/abi.c  python/errors.c
 *      runtime/wait.c  python/blocking.c  runtime/registry.c
 *      python/dtypes.c  python/streams.c  python/nccl_info.c
 *      python/tables.c
 *   2  runtime/windows.c  runtime/staging.c  runtime/faults.c
 *      python/failures.c  runtime/loopback.c
 *   3  runtime/lifecycle.c  python/lifetime.c  runtime/watchdog.c
 *      runtime/launch.c  runtime/run.c
 *   4  python/buffer.c
 *   5  python/dlpack.c
 *   6  python/collectives.c  python/fused.c  python/alltoall.c
 *      xla/xla_ffi.c  python/xla.c
 *   7  python/comm.c
 *   8  python/module.c
 *
 * The .c files talk to NCCL through nccl.h and to the CUDA C++ side only
 * through kernels/launch.h.
 */
#ifndef SYMNCCL_H
#define SYMNCCL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "runtime.h"
#include "methods.h"

/* Methods and attributes of torch.Tensor the torch fast path reads,
 * interned once (module.c): X(ID, name). */
#define SN_TORCH_NAMES(X)                \
    X(GET_DEVICE, "get_device")          \
    X(IS_CONJ, "is_conj")                \
    X(IS_NEG, "is_neg")                  \
    X(IS_CONTIGUOUS, "is_contiguous")    \
    X(DATA_PTR, "data_ptr")              \
    X(SHAPE, "shape")                    \
    X(DTYPE, "dtype")                    \
    X(NEW_EMPTY, "new_empty")            \
    X(REQUIRES_GRAD, "requires_grad")
#define SN_TORCH_NAME_ENUM_(id, name) SN_TORCH_##id,
enum { SN_TORCH_NAMES(SN_TORCH_NAME_ENUM_) SN_N_TORCH_NAMES };
#undef SN_TORCH_NAME_ENUM_

/* ------------------------------------------------------------------ */
/* Module state: everything that would otherwise be a process global. */

typedef struct SNState {
    PyTypeObject *CommunicatorType;
    PyTypeObject *SymmetricBufferType;
    PyTypeObject *DeviceArrayType;
    PyObject *NcclError;
    PyObject *CudaError;
    PyObject *PeerTimeoutError;  /* faults.c raises them */
    PyObject *CallMismatchError;
    /* Python callables installed by symnccl/_frameworks.py */
    PyObject *stream_hook;     /* (obj, device) -> int stream handle */
    PyObject *frameworks;      /* module with alloc(like, shape, device) and
                                  wrap(like, DeviceArray) */
    PyObject *str_dlpack;      /* interned "__dlpack__" */
    PyObject *str_dlpack_device;
    /* interned names the torch fast path calls (SN_TORCH_NAMES) */
    PyObject *torch_names[SN_N_TORCH_NAMES];
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
    /* symnccl.torch's eager gate (_torch_eager_install): the tensor types
     * that skip the custom op, the attribute that must be true ("is_cuda"),
     * torch's queries that must all return a false value (no mode,
     * transform or tracer active), and torch.is_grad_enabled */
    PyObject *eager_types, *eager_attr, *eager_checks, *eager_grad_mode;
    struct { PyObject *obj; const struct sn_dtype *dt; } torch_dtypes[16];
    int n_torch_dtypes;
    struct CommObject *live;   /* communicators not yet closed (borrowed) */
    /* The XLA handler's closing hook (python/xla.c installs it;
     * lifetime.c knows nothing of XLA): c has left OPEN, with the GIL:
     * the handler's registry drops c (and its reference), so no XLA call
     * enters it again. (The close hook, without the GIL: lifecycle.c's
     * sn_comm_on_close.) */
    void (*on_closing)(struct CommObject *c);
} SNState;

static inline SNState *
sn_state_from_type(PyTypeObject *tp)
{
    return (SNState *)PyType_GetModuleState(tp);
}

/* ------------------------------------------------------------------ */
/* errors.c: one formatter per library; exceptions carry .code. */

int sn_set_nccl_error(SNState *st, ncclResult_t rc, ncclComm_t comm,
                      const char *what);
int sn_set_cuda_error(SNState *st, cudaError_t rc, const char *what);

/* The runtime's failure (runtime/base.c) as a Python exception. */
int sn_raise(SNState *st, const sn_err *e);

/* Checks in the style of NCCL's NCCLCHECKGOTO: on failure, set the Python
 * error naming `what` and jump to `label`. ncclInProgress is success (the
 * communicators are non-blocking; sn_wait_comms completes them). */
#define SN_CUDA_GOTO(st, call, what, label)                            \
    do {                                                               \
        cudaError_t sn_e_ = (call);                                    \
        if (sn_e_ != cudaSuccess) {                                    \
            sn_set_cuda_error((st), sn_e_, (what));                    \
            goto label;                                                \
        }                                                              \
    } while (0)

#define SN_NCCL_GOTO(st, call, comm, what, label)                      \
    do {                                                               \
        ncclResult_t sn_r_ = (call);                                   \
        if (sn_r_ != ncclSuccess && sn_r_ != ncclInProgress) {         \
            sn_set_nccl_error((st), sn_r_, (comm), (what));            \
            goto label;                                                \
        }                                                              \
    } while (0)

/* ------------------------------------------------------------------ */
/* blocking.c: the waits of Python callers, and the timeout check. */

/* 0 when `seconds` is a timeout a communicator takes (finite, > 0, at most
 * SN_MAX_TIMEOUT), else -1 with ValueError "<what> must be ..., got ...". */
int sn_check_timeout(double seconds, const char *what);
/* sn_wait_nccl for Python callers: GIL released, Ctrl-C honoured, at most
 * `timeout` seconds, and no longer once *stop is set (abort() from another
 * thread; stop may be NULL); -1 with NcclError / TimeoutError /
 * RuntimeError (stopped) / the signal's exception set. */
int sn_wait_comms(SNState *st, ncclComm_t *comms, int n, double timeout,
                  const volatile int *stop, const char *what);
/* After an NCCL call on c returned rc: wait for it to complete, or, inside
 * symnccl.group(), leave it to the group's end. */
int sn_nccl_complete(SNState *st, struct CommObject *c, ncclResult_t rc,
                     const char *what);

/* ------------------------------------------------------------------ */
/* dtypes.c: dtype and shape arguments. */

/* "bfloat16", numpy dtypes and scalar types, torch.bfloat16, jnp.bfloat16,
 * ml_dtypes types; NULL with TypeError naming the supported ones. */
const sn_dtype *sn_parse_dtype(PyObject *obj);
/* TypeError "<prefix>unsupported dtype <seen>: expected one of ...". */
int sn_raise_bad_dtype(const char *prefix, const char *seen);
int sn_parse_shape(PyObject *obj, int *ndim, int64_t *shape);
/* The elements (*count) and bytes (*nbytes) of a compact tensor of `shape`
 * (either may be NULL); -1 with ValueError "<what>: shape (...) ..." when
 * a dimension is negative or the tensor (every dimension counted as at
 * least 1, so that its strides fit too) would pass SN_MAX_BYTES. Every
 * shape that sizes memory or is exported passes it first. */
int sn_shape_size(const char *what, int ndim, const int64_t *shape,
                  size_t itemsize, size_t *count, size_t *nbytes);

/* ------------------------------------------------------------------ */
/* streams.c: streams, as cudaStream_t (NULL: the legacy default). */

/* None, an int handle, a torch/cupy stream or anything with
 * __cuda_stream__. */
int sn_parse_stream(PyObject *obj, cudaStream_t *out);
/* 1 once torch is imported (st->torch_tensor, st->torch_raw_stream looked
 * up), else 0; never raises. */
int sn_torch_lookup(SNState *st);
/* 1 when obj is a torch.Tensor (subclasses too). */
int sn_is_torch_tensor(SNState *st, PyObject *obj);
/* _torch_eager_install(types, attr, checks, grad_mode) and _torch_eager(x):
 * symnccl.torch's eager gate in one call (symnccl/_torch_eager.py,
 * _eager). */
PyObject *sn_py_torch_eager_install(PyObject *module, PyObject *args);
PyObject *sn_py_torch_eager(PyObject *module, PyObject *x);
/* The framework's current stream for `tensor`: torch's read directly for a
 * torch tensor (*torch_current = 1, may be NULL), else through
 * symnccl/_frameworks.py's hook. */
int sn_default_stream(SNState *st, PyObject *tensor, int device,
                      cudaStream_t *out, int *torch_current);
intptr_t sn_stream_to_dlpack(cudaStream_t s);
/* Switch to a device, remembering the previous one. */
int sn_device_push(SNState *st, int device, int *prev);
void sn_device_pop(int prev);

/* ------------------------------------------------------------------ */
/* tables.c: the registry as Python sees it. */

/* Algorithm ("auto" too), dtype and op by name; -1 with ValueError. */
int sn_registry_lookup(const char *algo, const char *dtype, const char *op,
                       int *a, const sn_dtype **dt, const sn_op **o);
/* sn_collective_index, -1 with ValueError for another name. */
int sn_collective_by_name(const char *cname);
/* The answer of algo_supported(): *why = NULL when `algo` ("auto"
 * included) can run collective `cname` with dt/op on topology t, else why
 * not; -1 with ValueError for another name. */
int sn_call_unavailable(const sn_topology *t, const char *cname, int algo,
                        const sn_dtype *dt, const sn_op *op,
                        const char **why);
/* _exit_timeout(): SYMNCCL_EXIT_TIMEOUT's seconds (a refused value warns,
 * and its default is used). */
PyObject *sn_py_exit_timeout(PyObject *module, PyObject *unused);
/* Communicator.knobs: every knob's value, by its variable's name. */
PyObject *sn_knobs_dict(const sn_knobs *k);
PyObject *sn_py_settings_differ(PyObject *module, PyObject *sets);
/* Adds DTYPES, OPS, ALGORITHMS, ... to the module (sn_registry_init
 * first). */
int sn_registry_export(PyObject *module);

/* ------------------------------------------------------------------ */
/* nccl_info.c: what symnccl knows of NCCL, as symnccl._C's attributes
 * (NCCL_WINDOW_POLICY, NCCL_SUPPORT, NCCL_DEVICE_API_HEADERS, ...) and the
 * _nccl_* testing functions. */
int sn_nccl_info_export(PyObject *module);

/* ------------------------------------------------------------------ */
/* failures.c: a communicator's failure as Python sees it. */

/* Raises c's failure (PeerTimeoutError or CallMismatchError): -1. */
int sn_fault_raise(SNState *st, struct CommObject *c);
/* -1 with c's failure raised once it has failed, else 0. */
int sn_fault_check(SNState *st, struct CommObject *c);
/* Communicator.failure: the failure as a dict, or None. */
PyObject *sn_fault_dict(struct CommObject *c);
/* Waits for c->watch.event (recorded after the NCCL call of `collective`)
 * with the GIL released and Ctrl-C honoured, for at most c->timeout. Past
 * it the failure is recorded and raised (-1). */
int sn_fault_wait_nccl(SNState *st, struct CommObject *c, int collective);
/* _abort_on_signal(signum): sn_abort_on_signal, ValueError / OSError. */
PyObject *sn_py_abort_on_signal(PyObject *module, PyObject *arg);
/* _fault_code (testing). */
int sn_fault_export(PyObject *module);

/* ------------------------------------------------------------------ */
/* Objects. */

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
    const sn_dtype *dtype;
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
    const sn_dtype *dtype;
    int ndim;
    int64_t shape[SN_MAX_NDIM];
    size_t count;
    int readonly;
    int copied;                /* DLPack IS_COPIED: not the caller's memory */
} SNTensor;

/* ------------------------------------------------------------------ */
/* lifetime.c: the lifecycle as Python sees it (the GIL released around
 * every wait, failures raised). */

int sn_parse_multicast(PyObject *obj, int *mode);
/* A new, unconnected communicator object for rank/nranks on device. */
CommObject *sn_comm_new(PyTypeObject *tp, int rank, int nranks, int device,
                        double timeout, int multicast, size_t staging_bytes);
/* Connects n communicator objects, all driven by this thread (n = 1 for
 * Communicator(), n = len(devices) for init_all): NCCL communicators, device
 * communicators, scratch and staging windows, each step one NCCL group.
 * Collective. On failure every one of them is aborted. */
int sn_comms_connect(SNState *st, CommObject **cs, int n,
                     const ncclUniqueId *id);
/* Entry of every method that uses c (GIL held): -1 with an exception
 * when c is not OPEN (closing, closed, aborted) or has failed; else counts
 * the caller in c->life.busy until sn_comm_leave, and c's memory stays until
 * then. */
int sn_comm_enter(SNState *st, CommObject *c);
/* Leaving; the last caller to leave finishes an abort that waited for it
 * (GIL released meanwhile). */
void sn_comm_leave(SNState *st, CommObject *c);
/* close(): OPEN -> CLOSING; waits (bounded by the timeout) for callers
 * inside to leave and for the device, then destroys in NCCL's order ->
 * CLOSED. A close that cannot complete aborts c itself (-1 with why). */
int sn_comm_close(SNState *st, CommObject *c);
/* abort(): stops c's kernels and every wait on c, waits a few seconds at
 * most for callers inside to leave (else the last to leave finishes it),
 * ncclCommAbort, and frees c's memory once nothing of c runs any more.
 * From any thread, also while another closes c (that close then aborts).
 * Returns within the SN_ABORT_* bounds. */
void sn_comm_abort(SNState *st, CommObject *c);
/* The same for a caller that moved c to CLOSING(abort) itself (the
 * watchdog, sn_watch_collect). */
void sn_comm_abort_owned(SNState *st, CommObject *c);
/* A SymmetricBuffer's deallocation (GIL held) gives back its reference
 * on window w, whose memory is `mem`: 1 when the caller frees `mem` now
 * (the window is shared, or c's teardown has deregistered or forgotten
 * it); 0 when c took `mem` over. Then, while c is OPEN, the window is
 * deregistered and `mem` freed at once if c's kernels drain within
 * SN_RELEASE_PROMPT_SECONDS (GIL released; with any release deferred
 * earlier), else by the next release or c's teardown; while c is
 * CLOSING, by the teardown. Never blocks without a bound. */
int sn_comm_release_window(CommObject *c, sn_window *w, void *mem);
/* Deallocation: close (abort on failure) unless shutting down. */
void sn_comm_finalize(SNState *st, CommObject *c);
/* At interpreter exit: close every open communicator (abort on failure);
 * returns how many had to be aborted. */
int sn_comm_shutdown_all(SNState *st, double timeout);

/* ------------------------------------------------------------------ */
/* buffer.c */

extern PyType_Spec sn_symmetric_buffer_spec;
extern PyType_Spec sn_device_array_spec;
PyObject *sn_buffer_new(SNState *st, CommObject *comm, PyTypeObject *tp,
                        int ndim, const int64_t *shape, const sn_dtype *dt,
                        int zero, cudaStream_t stream);
int sn_is_buffer(SNState *st, PyObject *o);
void sn_buffer_finish_pending(BufferObject *b);
void sn_buffer_mark_written(BufferObject *b, cudaStream_t stream);
/* Orders `stream` after the last op that wrote b. */
int sn_buffer_order(SNState *st, BufferObject *b, cudaStream_t stream);
/* _host_buffer(shape, dtype): testing hook. */
PyObject *sn_py_host_buffer(PyObject *module, PyObject *args);

/* ------------------------------------------------------------------ */
/* dlpack.c: importing any DLPack producer's tensor. */

/* Borrow any DLPack tensor; `stream` is the consumer's stream;
 * torch_current: stream is known to be torch's current stream of `device`
 * (read in this call: the torch fast path need not read it again). */
int sn_tensor_import(SNState *st, PyObject *obj, cudaStream_t stream,
                     int device, int torch_current, const char *argname,
                     SNTensor *t);
void sn_tensor_release(SNTensor *t);
/* Before a result is written into t (out=, in place, out_splits, ...):
 * -1 with BufferError "<what> is read-only" or, for a copy the producer
 * made (DLPack IS_COPIED: the result would be lost with it), saying so;
 * an input may be either. */
int sn_tensor_check_output(const SNTensor *t, const char *what);
int sn_is_immutable(PyObject *obj);
/* _import_info(obj, device): testing hook. */
PyObject *sn_py_import_info(PyObject *module, PyObject *args);

/* ------------------------------------------------------------------ */
/* collectives.c: the collective methods of Communicator. */

/* The collective methods (csrc/methods.py's table, SN_METHODS: their
 * keyword lists, formats and docstrings too): sn_<name>(c, args, kw), in
 * collectives.c, fused.c (all_reduce_rmsnorm) and alltoall.c (all_to_all,
 * all_to_all_v). */
#define SN_METHOD_DECL_(name) \
    PyObject *sn_##name(CommObject *c, PyObject *args, PyObject *kw);
SN_METHODS(SN_METHOD_DECL_)
#undef SN_METHOD_DECL_
/* A new output of like's framework with this shape: the framework
 * allocates it (torch: like.new_empty, like's dtype; cupy), or symnccl
 * does (dtype dt) and hands it over zero-copy (JAX, symnccl's own
 * buffers). */
PyObject *sn_new_output(SNState *st, CommObject *c, PyObject *like, int ndim,
                        const int64_t *shape, const sn_dtype *dt,
                        cudaStream_t stream);

/* One call's state: stream, device guard, borrowed tensors, result. The
 * collectives of later layers (fused.c, alltoall.c) use it through
 * these: */
typedef struct {
    SNState *st;
    CommObject *c;
    cudaStream_t stream;
    int torch_current;         /* stream is torch's current one, read here */
    int prev, pushed, entered;
    SNTensor x, out;
    PyObject *result;   /* new reference returned to the caller */
} sn_call;

/* Enters c, picks the stream (`stream`, else x's framework's), borrows x
 * (NULL: none); -1 with an exception. */
int sn_call_begin(sn_call *k, CommObject *c, PyObject *x, PyObject *stream);
/* Releases what the call holds; k->result when ok, else NULL. */
PyObject *sn_call_end(sn_call *k, int ok);
/* out=, or (None) a new tensor of x's framework of that shape, borrowed
 * into k->out and checked (dtype, count); -1 with an exception. */
int sn_call_output(sn_call *k, PyObject *x, PyObject *out, size_t count,
                   int ndim, const int64_t *shape);
/* algo=: SN_ALGO_* or SN_ALGO_AUTO; SN_ALGO_UNKNOWN with ValueError. */
int sn_parse_algo(PyObject *obj);
/* The resolved algorithm of a call without op, whose larger buffer is
 * `bytes` (sn_resolve); SN_ALGO_UNKNOWN with the exception set. */
int sn_call_algo(sn_call *k, int collective, int algo, size_t bytes);
/* SYMNCCL_CHECK=1's comparison of the ranks' calls; -1 with an
 * exception. then: all_reduce_rmsnorm on "nccl"'s all-reduce
 * (sn_rmsnorm_ar_algo), else -1. */
int sn_call_check(sn_call *k, int collective, size_t count, int algo,
                  int then);
/* The methods' completion of an NCCL call (an sn_nccl_done_fn, ctx the
 * sn_call): counted, watched and completed; -1 with the exception set. */
int sn_call_nccl_done(void *ctx, ncclResult_t rc, int collective,
                      const char *what);
/* sn_run (run.c) for a method's call; -1 with the exception set (a
 * launched kernel's failure: the communicator's, if it has failed). */
int sn_call_run(sn_call *k, const sn_ar *r);

/* ------------------------------------------------------------------ */
/* python/xla.c: the XLA handlers' module functions. */

/* Installs the closing and close hooks (SNState.on_closing,
 * sn_comm_on_close). */
void sn_xla_init(SNState *st);
PyObject *sn_py_xla_handler(PyObject *module, PyObject *args);
/* _C.XLA_HANDLERS: the handlers' names, from xla_ffi.c's one table. */
int sn_xla_export(PyObject *module);
PyObject *sn_py_xla_register(PyObject *module, PyObject *arg);
PyObject *sn_py_xla_stats(PyObject *module, PyObject *arg);

/* ------------------------------------------------------------------ */
/* comm.c */

extern PyType_Spec sn_communicator_spec;

/* What algo="auto" runs for a call of `bytes` (its larger buffer) of the
 * named collective, dtype and op on topology t with knobs k (sn_resolve),
 * as the algorithm's name: Communicator._auto_algo's and
 * _C._auto_algo_for's answer. NULL with the exception set. */
PyObject *sn_py_auto_algo(const sn_topology *t, const sn_knobs *k,
                          Py_ssize_t bytes, const char *dtype,
                          const char *op, int in_window,
                          const char *collective);

#endif /* SYMNCCL_H */
