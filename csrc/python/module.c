/* symnccl._C: module definition and state, module-level functions (unique
 * ids, versions, the NCCL group bracket) and the testing hooks that need no
 * communicator.
 */
#include "symnccl.h"

#include <string.h>

static struct PyModuleDef sn_module_def;

static SNState *
get_state(PyObject *module)
{
    return (SNState *)PyModule_GetState(module);
}

/* _multicast_gate(multicast, NCCL_NVLS_ENABLE, TORCH_SYMM_MEM_DISABLE_
 * MULTICAST, NVSHMEM_DISABLE_NVLS) -> (request?, reason): the decision the
 * communicator takes, for the CPU tests. */
static PyObject *
py_multicast_gate(PyObject *module, PyObject *args)
{
    PyObject *mc;
    int mode;
    const char *a = NULL, *b = NULL, *c = NULL;
    if (!PyArg_ParseTuple(args, "Ozzz", &mc, &a, &b, &c) ||
        sn_parse_multicast(mc, &mode) < 0)
        return NULL;
    const char *reason = sn_multicast_gate(mode, a, b, c);
    if (reason == NULL)
        return Py_BuildValue("(Os)", Py_True, mode == SN_MC_AUTO
                             ? "requested (auto)" : "requested");
    return Py_BuildValue("(Os)", Py_False, reason);
}

/* ------------------------------------------------------------------ */
/* Module functions.                                                    */

static PyObject *
py_get_unique_id(PyObject *module, PyObject *unused)
{
    SNState *st = get_state(module);
    ncclUniqueId id;
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclGetUniqueId(&id);
    Py_END_ALLOW_THREADS
    if (rc != ncclSuccess)
        return (sn_set_nccl_error(st, rc, NULL, "ncclGetUniqueId"), NULL);
    return PyBytes_FromStringAndSize(id.internal, NCCL_UNIQUE_ID_BYTES);
}

/* (2, minor) of the headers of the kernel build in use (import fails
 * without one: abi.c). */
static PyObject *
py_nccl_device_api(PyObject *module, PyObject *unused)
{
    int m = sn_abi_minor();
    return m < 0 ? Py_NewRef(Py_None) : Py_BuildValue("(ii)", 2, m);
}

static PyObject *
py_nccl_runtime_version(PyObject *module, PyObject *unused)
{
    int v = 0;
    ncclResult_t rc = ncclGetVersion(&v);
    if (rc != ncclSuccess)
        return (sn_set_nccl_error(get_state(module), rc, NULL,
                                  "ncclGetVersion"), NULL);
    return PyLong_FromLong(v);
}

/* _multi_gpu_caveat() -> None, or what a communicator of 2+ ranks warns
 * about the loaded libnccl with the kernel build in use (abi.c). */
static PyObject *
py_multi_gpu_caveat(PyObject *module, PyObject *unused)
{
    const char *caveat = sn_abi_multi_gpu_caveat(sn_abi_minor());
    return caveat == NULL ? Py_NewRef(Py_None)
                          : PyUnicode_FromString(caveat);
}

static PyObject *
py_cuda_versions(PyObject *module, PyObject *unused)
{
    int drv = 0, rt = 0, ndev = 0;
    /* No driver is not an error here: report zeros. */
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
        rt = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess)
        ndev = 0;
    (void)cudaGetLastError();
    return Py_BuildValue("{s:i,s:i,s:i}", "driver", drv, "runtime", rt,
                         "device_count", ndev);
}

static PyObject *
py_set_hooks(PyObject *module, PyObject *args)
{
    SNState *st = get_state(module);
    PyObject *stream_hook, *frameworks;
    if (!PyArg_ParseTuple(args, "OO", &stream_hook, &frameworks))
        return NULL;
    if (!PyCallable_Check(stream_hook)) {
        PyErr_SetString(PyExc_TypeError, "stream hook must be callable");
        return NULL;
    }
    Py_INCREF(stream_hook);
    Py_INCREF(frameworks);
    Py_XDECREF(st->stream_hook);
    Py_XDECREF(st->frameworks);
    st->stream_hook = stream_hook;
    st->frameworks = frameworks;
    Py_RETURN_NONE;
}

/* The watchdog's handler (runtime/watchdog.c calls it from its thread):
 * with the GIL, records and aborts every expired communicator that no
 * thread is inside. */
static void
watch_expired(void)
{
    PyGILState_STATE g = PyGILState_Ensure();
    CommObject *todo[16];
    int n = sn_watch_collect(todo, 16);
    for (int i = 0; i < n; i++)   /* the GIL held since the collect */
        Py_INCREF((PyObject *)todo[i]);
    for (int i = 0; i < n; i++) {
        CommObject *c = todo[i];
        sn_watch_record(c);   /* the poll's, unless c was busy then */
        sn_comm_abort_owned(c->st, c);
        Py_DECREF(c);
    }
    PyGILState_Release(g);
}

/* Interpreter exit: close what is still open (bounded by `timeout`, abort
 * on failure), then stop freeing device memory: the CUDA runtime may already
 * be going away when the last objects are collected. */
static PyObject *
py_shutdown(PyObject *module, PyObject *arg)
{
    SNState *st = get_state(module);
    double timeout = PyFloat_AsDouble(arg);
    if ((timeout == -1.0 && PyErr_Occurred()) ||
        sn_check_timeout(timeout, "_shutdown: timeout") < 0)
        return NULL;
    int failures = sn_comm_shutdown_all(st, timeout);
    if (sn_watch_stop()) {
        Py_BEGIN_ALLOW_THREADS
        sn_watch_join();
        Py_END_ALLOW_THREADS
    }
    st->shutting_down = 1;
    return PyLong_FromLong(failures);
}

static PyObject *
py_check_timeout(PyObject *module, PyObject *arg)
{
    double seconds = PyFloat_AsDouble(arg);
    if ((seconds == -1.0 && PyErr_Occurred()) ||
        sn_check_timeout(seconds, "timeout") < 0)
        return NULL;
    return PyFloat_FromDouble(seconds);
}

/* NCCL groups. Inside a group, NCCL defers collective work (including
 * window registration and device-communicator creation) to ncclGroupEnd;
 * objects whose setup completes there are kept in group_pending. */

static PyObject *
py_group_start(PyObject *module, PyObject *unused)
{
    SNState *st = get_state(module);
    unsigned long me = PyThread_get_thread_ident();
    if (st->group_depth > 0 && st->group_thread != me) {
        PyErr_SetString(PyExc_RuntimeError,
                        "symnccl.group() is already open in another thread; "
                        "NCCL groups are per thread");
        return NULL;
    }
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess)
        return (sn_set_nccl_error(st, rc, NULL, "ncclGroupStart"), NULL);
    if (st->group_depth++ == 0)
        st->group_thread = me;
    Py_RETURN_NONE;
}

/* The communicators of the pending objects, each once, entered (so the
 * watchdog keeps off, and no teardown frees them, while the group's end is
 * waited for; release_group_comms leaves them). One being closed or
 * aborted by another thread is not waited for. */
static int
collect_group_comms(SNState *st, PyObject *pending, ncclComm_t **out,
                    CommObject ***objs, Py_ssize_t *n)
{
    Py_ssize_t len = PyList_Size(pending);
    *out = NULL;
    *objs = NULL;
    *n = 0;
    if (len <= 0)
        return 0;
    ncclComm_t *comms = PyMem_Calloc((size_t)len, sizeof(ncclComm_t));
    CommObject **cs = PyMem_Calloc((size_t)len, sizeof(CommObject *));
    if (comms == NULL || cs == NULL) {
        PyMem_Free(comms);
        PyMem_Free(cs);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *o = PyList_GetItem(pending, i);
        CommObject *c = PyObject_TypeCheck(o, st->CommunicatorType)
                            ? (CommObject *)o : ((BufferObject *)o)->comm;
        int seen = 0;
        for (Py_ssize_t k = 0; k < *n; k++)
            seen |= comms[k] == c->comm;
        char why[8];
        if (!seen && c->comm != NULL &&
            sn_comm_pin(c, why, sizeof(why)) == 0) {
            cs[*n] = c;
            comms[(*n)++] = c->comm;
        }
    }
    *out = comms;
    *objs = cs;
    return 0;
}

static void
release_group_comms(SNState *st, CommObject **cs, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        sn_comm_leave(st, cs[i]);
    PyMem_Free(cs);
}

static PyObject *
py_group_end(PyObject *module, PyObject *unused)
{
    SNState *st = get_state(module);
    if (st->group_depth <= 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "group end without a matching group start");
        return NULL;
    }
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclGroupEnd();
    Py_END_ALLOW_THREADS
    if (--st->group_depth > 0) {
        if (rc != ncclSuccess && rc != ncclInProgress)
            return (sn_set_nccl_error(st, rc, NULL, "ncclGroupEnd"), NULL);
        Py_RETURN_NONE;
    }
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *pending = st->group_pending;
    st->group_pending = fresh;
    ncclComm_t *comms = NULL;
    CommObject **objs = NULL;
    Py_ssize_t ncomms = 0;
    int err = collect_group_comms(st, pending, &comms, &objs, &ncomms);
    if (err == 0 && rc != ncclSuccess && rc != ncclInProgress)
        err = sn_set_nccl_error(st, rc, ncomms ? comms[0] : NULL,
                                "ncclGroupEnd");
    /* bounded by the communicators' own timeouts; with one communicator
     * (the usual group) its abort() from another thread ends the wait */
    double timeout = 0.0;
    for (Py_ssize_t i = 0; i < ncomms; i++)
        if (objs[i]->timeout > timeout)
            timeout = objs[i]->timeout;
    const volatile int *stop = ncomms == 1 ? &objs[0]->life.stop : NULL;
    if (err == 0 && ncomms > 0)
        err = sn_wait_comms(st, comms, (int)ncomms, timeout, stop,
                            "ncclGroupEnd");
    PyMem_Free(comms);
    release_group_comms(st, objs, ncomms);
    /* Finish what was deferred, even after an error, so that no object
     * stays half-made: a failed registration leaves the window NULL. */
    Py_ssize_t len = PyList_Size(pending);
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *o = PyList_GetItem(pending, i);
        if (!PyObject_TypeCheck(o, st->CommunicatorType))
            sn_buffer_finish_pending((BufferObject *)o);
    }
    Py_DECREF(pending);
    if (err < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
py_group_depth(PyObject *module, PyObject *unused)
{
    return PyLong_FromLong(get_state(module)->group_depth);
}

static PyObject *
py_dtype_info(PyObject *module, PyObject *arg)
{
    const sn_dtype *dt = sn_parse_dtype(arg);
    if (dt == NULL)
        return NULL;
    return Py_BuildValue("(siii)", dt->name, (int)dt->dl_code,
                         (int)dt->dl_bits, dt->itemsize);
}

/* A topology from a dict of sn_topology's fields (testing hooks). */
static int
topology_from_dict(PyObject *d, sn_topology *t)
{
    static const char *fields[] = {"nranks", "lsa_size", "symmetric",
                                   "staging", "push", "multicast"};
    int *dst[] = {&t->nranks, &t->lsa_size, &t->symmetric, &t->staging,
                  &t->push, &t->multicast};
    memset(t, 0, sizeof(*t));
    t->nccl = 1;   /* optional: 0 for a loopback rank */
    PyObject *nccl = PyDict_GetItemString(d, "nccl");   /* borrowed */
    if (nccl != NULL && (t->nccl = PyObject_IsTrue(nccl)) < 0)
        return -1;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        PyObject *v = PyDict_GetItemString(d, fields[i]);   /* borrowed */
        if (v == NULL) {
            PyErr_Format(PyExc_KeyError, "topology has no '%s'", fields[i]);
            return -1;
        }
        *dst[i] = (int)PyLong_AsLong(v);
        if (*dst[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* _algo_unavailable_for(topology, algo, dtype, op, collective=
 * "all_reduce") -> why not, or None: the registry's decision for a
 * communicator of that topology (a dict of sn_topology's fields), without
 * a GPU (testing). */
static PyObject *
py_algo_unavailable_for(PyObject *module, PyObject *args)
{
    PyObject *topo;
    const char *a, *d, *o, *cname = "all_reduce", *why;
    sn_topology t;
    int algo;
    const sn_dtype *dt;
    const sn_op *op;
    if (!PyArg_ParseTuple(args, "O!sss|s", &PyDict_Type, &topo, &a, &d, &o,
                          &cname) ||
        topology_from_dict(topo, &t) < 0 ||
        sn_registry_lookup(a, d, o, &algo, &dt, &op) < 0 ||
        sn_call_unavailable(&t, cname, algo, dt, op, &why) < 0)
        return NULL;
    return why == NULL ? Py_NewRef(Py_None) : PyUnicode_FromString(why);
}

/* _auto_algo_for(topology, nbytes, dtype, op, in_window, collective=
 * "all_reduce") -> what algo="auto" runs on a communicator of that
 * topology, with the knobs of this environment (testing); nbytes is the
 * call's larger buffer. The resolver's answer (sn_resolve). */
static PyObject *
py_auto_algo_for(PyObject *module, PyObject *args)
{
    PyObject *topo;
    Py_ssize_t bytes;
    const char *d, *o, *cname = "all_reduce";
    int in_window;
    sn_topology t;
    sn_knobs k;
    sn_err err;
    if (!PyArg_ParseTuple(args, "O!nssp|s", &PyDict_Type, &topo, &bytes, &d,
                          &o, &in_window, &cname) ||
        topology_from_dict(topo, &t) < 0)
        return NULL;
    if (sn_knobs_read(&k, &err) < 0)
        return (sn_raise(get_state(module), &err), NULL);
    return sn_py_auto_algo(&t, &k, bytes, d, o, in_window, cname);
}

static PyMethodDef sn_methods[] = {
    {"get_unique_id", py_get_unique_id, METH_NOARGS,
     "get_unique_id($module, /)\n--\n\n-> bytes: a new NCCL unique id (128 bytes). Create it "
     "on one rank and send it to the others.\n\n"
     "Example:\n    uid = symnccl.get_unique_id()"},
    {"nccl_device_api", py_nccl_device_api, METH_NOARGS,
     "nccl_device_api($module, /)\n--\n\n-> (2, minor) of the NCCL device API symnccl's "
     "kernels use in this process: the minor of the headers of the kernel "
     "build in use (NCCL_DEVICE_API_HEADERS has their version), which may "
     "be older than the loaded libnccl's."},
    {"_multi_gpu_caveat", py_multi_gpu_caveat, METH_NOARGS,
     "_multi_gpu_caveat($module, /)\n--\n\n"
     "None, or the RuntimeWarning a communicator of 2+ ranks gives with the "
     "loaded libnccl and the kernel build in use (that pair has not passed "
     "the self-check on two GPUs)."},
    {"nccl_runtime_version", py_nccl_runtime_version, METH_NOARGS,
     "nccl_runtime_version($module, /)\n--\n\n"
     "Version code of the loaded libnccl (ncclGetVersion), e.g. 22809."},
    {"cuda_versions", py_cuda_versions, METH_NOARGS,
     "cuda_versions($module, /)\n--\n\n"
     "dict(driver=, runtime=, device_count=); zeros where no driver is "
     "present."},
    {"_set_hooks", py_set_hooks, METH_VARARGS, NULL},
    {"_shutdown", py_shutdown, METH_O, NULL},
    {"_exit_timeout", sn_py_exit_timeout, METH_NOARGS,
     "_exit_timeout(): the seconds SYMNCCL_EXIT_TIMEOUT gives each "
     "communicator at exit (the knob table, registry.c)"},
    {"_check_timeout", py_check_timeout, METH_O,
     "_check_timeout(seconds, /): the check every timeout passes "
     "(finite, > 0, <= MAX_TIMEOUT); returns it as a float, or raises "
     "ValueError. The Python front ends call it before any rendezvous."},
    {"_abort_on_signal", sn_py_abort_on_signal, METH_O,
     "_abort_on_signal(signum): symnccl.abort_on_signal installs it"},
    {"_torch_eager_install", sn_py_torch_eager_install, METH_VARARGS,
     "_torch_eager_install(types, attr, checks, grad_mode): symnccl.torch's "
     "eager gate"},
    {"_torch_eager", sn_py_torch_eager, METH_O,
     "_torch_eager(x) -> 0, 1 or 2: 0 unless type(x) is one of the "
     "installed types, getattr(x, attr) is true, and every installed check "
     "returns a false value; then 2 if x.requires_grad and grad_mode(), "
     "else 1"},
    {"_group_start", py_group_start, METH_NOARGS, NULL},
    {"_group_end", py_group_end, METH_NOARGS, NULL},
    {"_group_depth", py_group_depth, METH_NOARGS, NULL},
    {"_multicast_gate", py_multicast_gate, METH_VARARGS,
     "_multicast_gate(requested, NCCL_NVLS_ENABLE, "
     "TORCH_SYMM_MEM_DISABLE_MULTICAST, NVSHMEM_DISABLE_NVLS) -> "
     "(request, reason). The decision the Communicator takes, as a pure "
     "function of the environment values (None for unset)."},
    {"_dtype_info", py_dtype_info, METH_O,
     "_dtype_info(spec) -> (name, DLPack code, bits, itemsize)"},
    {"_algo_unavailable_for", py_algo_unavailable_for, METH_VARARGS,
     "_algo_unavailable_for(topology, algo, dtype, op, collective="
     "'all_reduce') -> why algo cannot "
     "run on a communicator of that topology, or None (testing)"},
    {"_settings_differ", sn_py_settings_differ, METH_O,
     "_settings_differ(sets) -> None, or the first setting whose value "
     "differs among the ranks' sets (dicts like comm.knobs, plus "
     "'staging_bytes'; a missing one has its default), named as a "
     "communicator's creation refuses it (testing)"},
    {"_auto_algo_for", py_auto_algo_for, METH_VARARGS,
     "_auto_algo_for(topology, nbytes, dtype, op, in_window, collective="
     "'all_reduce') -> the "
     "algorithm algo='auto' runs there (testing)"},
    {"_xla_handler", sn_py_xla_handler, METH_VARARGS,
     "_xla_handler(collective='all_reduce') -> PyCapsule: the XLA FFI "
     "handler symnccl_<collective> for all_reduce, reduce_scatter or "
     "all_gather (for jax.ffi.register_ffi_target)."},
    {"_xla_register", sn_py_xla_register, METH_O,
     "_xla_register(comm): the XLA handler uses comm on comm.device."},
    {"_xla_stats", sn_py_xla_stats, METH_O,
     "_xla_stats(device) -> (window_calls, staged_calls, registrations) of "
     "the XLA handler on that device (testing)."},
    {"_import_info", sn_py_import_info, METH_VARARGS,
     "_import_info(obj, device) -> dict: what DLPack import sees (testing; "
     "device=-1 also accepts CPU tensors)."},
    {"_host_buffer", sn_py_host_buffer, METH_VARARGS,
     "_host_buffer(shape, dtype): host memory exported as a CPU DLPack "
     "tensor by the same code as SymmetricBuffer (testing)."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------ */

static int
sn_exec(PyObject *module)
{
    SNState *st = get_state(module);
    st->NcclError = PyErr_NewExceptionWithDoc(
        "symnccl.NcclError",
        "An NCCL call failed. .code is the ncclResult_t; the message holds "
        "ncclGetErrorString and ncclGetLastError.",
        PyExc_RuntimeError, NULL);
    if (st->NcclError == NULL || PyModule_AddObjectRef(module, "NcclError",
                                                       st->NcclError) < 0)
        return -1;
    st->CudaError = PyErr_NewExceptionWithDoc(
        "symnccl.CudaError",
        "A CUDA runtime call failed. .code is the cudaError_t.",
        PyExc_RuntimeError, NULL);
    if (st->CudaError == NULL || PyModule_AddObjectRef(module, "CudaError",
                                                       st->CudaError) < 0)
        return -1;
    st->PeerTimeoutError = PyErr_NewExceptionWithDoc(
        "symnccl.PeerTimeoutError",
        "A communicator failed: a peer did not arrive within the timeout "
        "(reason 'timeout'), a peer gave up on it first ('peer'), or a "
        "collective was stopped by abort_on_signal ('abort'). .rank is the "
        "peer (None when unknown), .collective the collective, .kernel the "
        "symnccl kernel or 'nccl', .waited the seconds waited. The "
        "communicator refuses further calls until abort() (README: "
        "Failures).",
        PyExc_TimeoutError, NULL);
    if (st->PeerTimeoutError == NULL ||
        PyModule_AddObjectRef(module, "PeerTimeoutError",
                              st->PeerTimeoutError) < 0)
        return -1;
    st->CallMismatchError = PyErr_NewExceptionWithDoc(
        "symnccl.CallMismatchError",
        "SYMNCCL_CHECK=1: the ranks made different calls (collective, dtype, "
        "count, op, algo or root); the message names both. The "
        "communicator refuses further calls until abort().",
        PyExc_RuntimeError, NULL);
    if (st->CallMismatchError == NULL ||
        PyModule_AddObjectRef(module, "CallMismatchError",
                              st->CallMismatchError) < 0)
        return -1;

    st->CommunicatorType = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &sn_communicator_spec, NULL);
    if (st->CommunicatorType == NULL ||
        PyModule_AddType(module, st->CommunicatorType) < 0)
        return -1;
    st->SymmetricBufferType = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &sn_symmetric_buffer_spec, NULL);
    if (st->SymmetricBufferType == NULL ||
        PyModule_AddType(module, st->SymmetricBufferType) < 0)
        return -1;
    st->DeviceArrayType = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &sn_device_array_spec, NULL);
    if (st->DeviceArrayType == NULL ||
        PyModule_AddType(module, st->DeviceArrayType) < 0)
        return -1;

    st->group_pending = PyList_New(0);
    st->str_dlpack = PyUnicode_InternFromString("__dlpack__");
    st->str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
    if (st->group_pending == NULL || st->str_dlpack == NULL ||
        st->str_dlpack_device == NULL)
        return -1;
#define SN_TORCH_NAME_(id, name)                                        \
    if ((st->torch_names[SN_TORCH_##id] = PyUnicode_InternFromString(  \
             name)) == NULL)                                           \
        return -1;
    SN_TORCH_NAMES(SN_TORCH_NAME_)
#undef SN_TORCH_NAME_

    if (PyModule_AddIntConstant(module, "NCCL_BUILD_VERSION",
                                NCCL_VERSION_CODE) < 0 ||
        PyModule_AddIntConstant(module, "CUDA_BUILD_VERSION",
                                CUDART_VERSION) < 0 ||
        PyModule_AddIntConstant(module, "MAX_CTAS", SN_MAX_CTAS) < 0 ||
        PyModule_AddIntConstant(module, "MAX_NDIM", SN_MAX_NDIM) < 0 ||
        PyModule_AddIntConstant(module, "UNIQUE_ID_BYTES",
                                NCCL_UNIQUE_ID_BYTES) < 0)
        return -1;
    PyObject *timeout = PyFloat_FromDouble(SN_DEFAULT_TIMEOUT);
    PyObject *max_timeout = PyFloat_FromDouble(SN_MAX_TIMEOUT);
    int bad = timeout == NULL || max_timeout == NULL ||
              PyModule_AddObjectRef(module, "DEFAULT_TIMEOUT", timeout) < 0 ||
              PyModule_AddObjectRef(module, "MAX_TIMEOUT", max_timeout) < 0;
    Py_XDECREF(timeout);
    Py_XDECREF(max_timeout);
    if (bad)
        return -1;

    /* The kernel build for the loaded libnccl: ImportError when none may
     * run on it (symnccl would run without its kernels). */
    int v = 0;
    ncclResult_t vrc = ncclGetVersion(&v);
    if (vrc != ncclSuccess) {
        PyErr_Format(PyExc_ImportError, "ncclGetVersion failed (%s): the "
                     "loaded libnccl cannot say its version",
                     ncclGetErrorString(vrc));
        return -1;
    }
    char why[1024];
    if (sn_abi_select(v, why, sizeof(why)) < 0) {
        PyErr_SetString(PyExc_ImportError, why);
        return -1;
    }
    if (sn_nccl_info_export(module) < 0 || sn_fault_export(module) < 0)
        return -1;
    sn_watch_on_expired(watch_expired);
    sn_xla_init(st);
    if (sn_xla_export(module) < 0)
        return -1;
    return sn_registry_export(module);
}

static int
sn_traverse(PyObject *module, visitproc visit, void *arg)
{
    SNState *st = get_state(module);
    Py_VISIT(st->CommunicatorType);
    Py_VISIT(st->SymmetricBufferType);
    Py_VISIT(st->DeviceArrayType);
    Py_VISIT(st->NcclError);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->PeerTimeoutError);
    Py_VISIT(st->CallMismatchError);
    Py_VISIT(st->stream_hook);
    Py_VISIT(st->frameworks);
    Py_VISIT(st->group_pending);
    Py_VISIT(st->torch_tensor);
    Py_VISIT(st->torch_raw_stream);
    Py_VISIT(st->eager_types);
    Py_VISIT(st->eager_attr);
    Py_VISIT(st->eager_checks);
    Py_VISIT(st->eager_grad_mode);
    for (int i = 0; i < st->n_torch_dtypes; i++)
        Py_VISIT(st->torch_dtypes[i].obj);
    return 0;
}

static int
sn_clear(PyObject *module)
{
    SNState *st = get_state(module);
    Py_CLEAR(st->CommunicatorType);
    Py_CLEAR(st->SymmetricBufferType);
    Py_CLEAR(st->DeviceArrayType);
    Py_CLEAR(st->NcclError);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->PeerTimeoutError);
    Py_CLEAR(st->CallMismatchError);
    Py_CLEAR(st->stream_hook);
    Py_CLEAR(st->frameworks);
    Py_CLEAR(st->group_pending);
    Py_CLEAR(st->str_dlpack);
    Py_CLEAR(st->str_dlpack_device);
    for (int i = 0; i < SN_N_TORCH_NAMES; i++)
        Py_CLEAR(st->torch_names[i]);
    Py_CLEAR(st->torch_tensor);
    Py_CLEAR(st->torch_raw_stream);
    Py_CLEAR(st->eager_types);
    Py_CLEAR(st->eager_attr);
    Py_CLEAR(st->eager_checks);
    Py_CLEAR(st->eager_grad_mode);
    for (int i = 0; i < st->n_torch_dtypes; i++)
        Py_CLEAR(st->torch_dtypes[i].obj);
    st->n_torch_dtypes = 0;
    return 0;
}

static void
sn_free(void *module)
{
    sn_clear((PyObject *)module);
}

static PyModuleDef_Slot sn_slots[] = {
    {Py_mod_exec, sn_exec},
    {0, NULL},
};

static struct PyModuleDef sn_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "symnccl._C",
    .m_doc = "symnccl native core: NCCL communicators, symmetric windows, "
             "DLPack.",
    .m_size = sizeof(SNState),
    .m_methods = sn_methods,
    .m_slots = sn_slots,
    .m_traverse = sn_traverse,
    .m_clear = sn_clear,
    .m_free = sn_free,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&sn_module_def);
}
