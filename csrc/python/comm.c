/* symnccl.Communicator: the Python type. Creation, close and abort are
 * lifetime.c (over runtime/lifecycle.c); the collective methods are
 * collectives.c; this file parses arguments, and holds the properties,
 * allocation and the benchmark and testing hooks.
 */
#include "symnccl.h"

#include <stdlib.h>
#include <string.h>

static SNState *
comm_state(CommObject *self)
{
    return sn_state_from_type(Py_TYPE((PyObject *)self));
}

/* ------------------------------------------------------------------ */
/* Construction.                                                        */

static int
check_device(SNState *st, int device)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess)
        return sn_set_cuda_error(st, e, "cudaGetDeviceCount (is a GPU and "
                                        "its driver present?)");
    if (device < 0 || device >= ndev) {
        PyErr_Format(PyExc_ValueError,
                     "device %d does not exist: this process sees %d CUDA "
                     "device(s), expected 0 <= device < %d", device, ndev,
                     ndev);
        return -1;
    }
    return 0;
}

static PyObject *
comm_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"unique_id", "rank", "nranks", "device",
                             "timeout", "multicast", "staging_bytes", NULL};
    SNState *st = sn_state_from_type(tp);
    PyObject *uid_obj, *dev_obj = Py_None, *mc_obj = Py_None;
    int rank, nranks, multicast;
    double timeout = SN_DEFAULT_TIMEOUT;
    Py_ssize_t staging = SN_DEFAULT_STAGING;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oii|O$dOn:Communicator",
                                     kwlist, &uid_obj, &rank, &nranks,
                                     &dev_obj, &timeout, &mc_obj,
                                     &staging) ||
        sn_parse_multicast(mc_obj, &multicast) < 0)
        return NULL;
    if (staging < 0 || staging % 4096 != 0) {
        PyErr_Format(PyExc_ValueError, "staging_bytes must be a multiple of "
                     "4096 and >= 0, got %zd", staging);
        return NULL;
    }
    if (!PyBytes_Check(uid_obj) ||
        PyBytes_Size(uid_obj) != NCCL_UNIQUE_ID_BYTES) {
        PyErr_Format(PyExc_ValueError,
                     "unique_id must be the %d bytes from "
                     "symnccl.get_unique_id(), got %R", NCCL_UNIQUE_ID_BYTES,
                     Py_TYPE(uid_obj));
        return NULL;
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        PyErr_Format(PyExc_ValueError,
                     "rank %d is out of range for nranks %d: expected "
                     "0 <= rank < nranks, nranks >= 1", rank, nranks);
        return NULL;
    }
    if (sn_check_timeout(timeout, "timeout") < 0)
        return NULL;
    if (st->group_depth > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Communicator() cannot be created inside "
                        "symnccl.group(); use Communicator.init_all() to "
                        "drive several GPUs from one thread");
        return NULL;
    }
    int device;
    if (dev_obj == Py_None) {
        cudaError_t e = cudaGetDevice(&device);
        if (e != cudaSuccess)
            return (sn_set_cuda_error(st, e, "cudaGetDevice"), NULL);
    }
    else {
        device = PyLong_AsLong(dev_obj);
        if (device == -1 && PyErr_Occurred())
            return NULL;
    }
    if (check_device(st, device) < 0)
        return NULL;
    CommObject *c = sn_comm_new(tp, rank, nranks, device, timeout, multicast,
                                (size_t)staging);
    if (c == NULL)
        return NULL;
    ncclUniqueId id;
    memcpy(id.internal, PyBytes_AsString(uid_obj), NCCL_UNIQUE_ID_BYTES);
    if (sn_comms_connect(st, &c, 1, &id) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

/* Communicator.init_all(devices): one process, one thread, several GPUs. */
static PyObject *
comm_init_all(PyObject *cls, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"devices", "timeout", "multicast", NULL};
    PyTypeObject *tp = (PyTypeObject *)cls;
    SNState *st = sn_state_from_type(tp);
    PyObject *devs_obj, *seq = NULL, *result = NULL;
    PyObject *mc_obj = Py_None;
    double timeout = SN_DEFAULT_TIMEOUT;
    int multicast;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$dO:init_all", kwlist,
                                     &devs_obj, &timeout, &mc_obj) ||
        sn_parse_multicast(mc_obj, &multicast) < 0)
        return NULL;
    if (st->group_depth > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "init_all() cannot be called inside symnccl.group()");
        return NULL;
    }
    if (!PySequence_Check(devs_obj)) {
        PyErr_Format(PyExc_TypeError, "devices must be a sequence of ints, "
                     "got %R", Py_TYPE(devs_obj));
        return NULL;
    }
    if (sn_check_timeout(timeout, "timeout") < 0)
        return NULL;
    seq = PySequence_List(devs_obj);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyList_Size(seq);
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "devices must name at least one GPU");
        Py_DECREF(seq);
        return NULL;
    }
    CommObject **cs = PyMem_Calloc((size_t)n, sizeof(CommObject *));
    if (cs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long d = PyLong_AsLong(PyList_GetItem(seq, i));
        if (d == -1 && PyErr_Occurred())
            goto done;
        for (Py_ssize_t k = 0; k < i; k++)
            if (cs[k]->device == d) {
                PyErr_Format(PyExc_ValueError,
                             "device %ld appears twice in devices", d);
                goto done;
            }
        if (check_device(st, (int)d) < 0)
            goto done;
        cs[i] = sn_comm_new(tp, (int)i, (int)n, (int)d, timeout, multicast,
                            SN_DEFAULT_STAGING);
        if (cs[i] == NULL)
            goto done;
    }
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) {
        sn_set_nccl_error(st, rc, NULL, "ncclGetUniqueId");
        goto done;
    }
    if (sn_comms_connect(st, cs, (int)n, &id) < 0)
        goto done;
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyList_SetItem(result, i, (PyObject *)cs[i]);
        cs[i] = NULL;
    }

done:
    for (Py_ssize_t i = 0; cs != NULL && i < n; i++)
        Py_XDECREF((PyObject *)cs[i]);
    PyMem_Free(cs);
    Py_DECREF(seq);
    return result;
}

/* Communicator._loopback(nranks): testing, every rank of a team on one GPU
 * (loopback.c). */
static PyObject *
comm_loopback(PyObject *cls, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"nranks", "device", "timeout", "staging_bytes",
                             NULL};
    PyTypeObject *tp = (PyTypeObject *)cls;
    SNState *st = sn_state_from_type(tp);
    int nranks, device = -1;
    double timeout = 30.0;
    Py_ssize_t staging = SN_DEFAULT_STAGING;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|i$dn:_loopback", kwlist,
                                     &nranks, &device, &timeout, &staging))
        return NULL;
    if (nranks < 1 || nranks > SYMNCCL_MAX_RANKS) {
        PyErr_Format(PyExc_ValueError, "nranks must be 1..%d, got %d",
                     SYMNCCL_MAX_RANKS, nranks);
        return NULL;
    }
    if (staging < 0 || staging % 4096 != 0) {
        PyErr_Format(PyExc_ValueError, "staging_bytes must be a multiple of "
                     "4096 and >= 0, got %zd", staging);
        return NULL;
    }
    if (sn_check_timeout(timeout, "timeout") < 0)
        return NULL;
    if (device < 0) {
        cudaError_t e = cudaGetDevice(&device);
        if (e != cudaSuccess)
            return (sn_set_cuda_error(st, e, "cudaGetDevice"), NULL);
    }
    if (check_device(st, device) < 0)
        return NULL;
    int prev;
    if (sn_device_push(st, device, &prev) < 0)
        return NULL;
    PyObject *result = NULL;
    sn_loopback *t = NULL;
    int ok = 0;
    CommObject **cs = PyMem_Calloc((size_t)nranks, sizeof(CommObject *));
    if (cs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int q = 0; q < nranks; q++) {
        cs[q] = sn_comm_new(tp, q, nranks, device, timeout, SN_MC_OFF,
                            (size_t)staging);
        if (cs[q] == NULL)
            goto done;
    }
    sn_err err;
    t = sn_loopback_new(nranks, device, cs[0]->mem.layout.bytes, &err);
    if (t == NULL) {
        sn_raise(st, &err);
        goto done;
    }
    for (int q = 0; q < nranks; q++) {
        if (sn_scratch_alloc(cs[q], &err) < 0) {
            sn_raise(st, &err);
            goto done;
        }
        if (sn_fault_alloc(cs[q], &err) < 0) {
            sn_raise(st, &err);
            goto done;
        }
        /* the regions' first contents, as a real communicator's */
        if (sn_loopback_join(cs[q], t, &err) < 0 ||
            sn_staging_clear(cs[q], &err) < 0) {
            sn_raise(st, &err);
            goto done;
        }
    }
    /* the kernels' addressing of the peers holds for this layout */
    SN_CUDA_GOTO(st, symnccl_lsa_layout_ok(cs[0]->mem.staging_win->win, nranks,
                                           &ok),
                 "checking the loopback layout", done);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "loopback team: the kernels do "
                        "not see the ranks' memory evenly spaced");
        goto done;
    }
    /* the ranks' creation records, as real peers exchange them (one
     * process: always equal; the reading through LSA addresses is what
     * runs here) */
    for (int q = 0; q < nranks; q++)
        if (sn_connect_agree_write(cs[q], &err) < 0) {
            sn_raise(st, &err);
            goto done;
        }
    if (sn_connect_agree_check(cs, nranks, &err) < 0) {
        sn_raise(st, &err);
        goto done;
    }
    result = PyList_New(nranks);
    for (int q = 0; result != NULL && q < nranks; q++) {
        PyList_SetItem(result, q, (PyObject *)cs[q]);
        cs[q] = NULL;
    }

done:
    for (int q = 0; cs != NULL && q < nranks; q++)
        if (cs[q] != NULL) {
            sn_comm_abort(st, cs[q]);   /* leaves the team too */
            Py_DECREF(cs[q]);
        }
    PyMem_Free(cs);
    sn_loopback_release(t);
    sn_device_pop(prev);
    return result;
}

/* ------------------------------------------------------------------ */
/* close, abort, context manager, deallocation.                         */

static PyObject *
comm_close(CommObject *self, PyObject *unused)
{
    SNState *st = comm_state(self);
    if (sn_comm_close(st, self) < 0) {
        /* A close that cannot complete must not leave peers waiting on a
         * half-closed communicator: abort it, then report. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        self->life.user_aborted = 1;
        sn_comm_abort(st, self);
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
comm_abort(CommObject *self, PyObject *unused)
{
    self->life.user_aborted = 1;
    sn_comm_abort(comm_state(self), self);
    Py_RETURN_NONE;
}

/* check(): raises the communicator's failure, or an asynchronous NCCL
 * error; cheap (no synchronisation). */
static PyObject *
comm_check(CommObject *self, PyObject *unused)
{
    SNState *st = comm_state(self);
    /* entered: the NCCL communicator stays while this thread asks it */
    if (sn_comm_enter(st, self) < 0)
        return NULL;
    ncclResult_t rc = ncclSuccess;
    if (self->comm != NULL) {   /* a loopback rank: its record is all */
        ncclResult_t async = ncclSuccess;
        rc = ncclCommGetAsyncError(self->comm, &async);
        if (rc == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
            rc = async;
        if (rc != ncclSuccess)
            sn_set_nccl_error(st, rc, self->comm, "check()");
    }
    sn_comm_leave(st, self);
    if (rc != ncclSuccess)
        return NULL;
    Py_RETURN_NONE;
}

/* failure: the record as a dict, or None */
static PyObject *
get_failure(CommObject *self, void *unused)
{
    /* the record is read while c is OPEN only (its memory goes with the
     * teardown); after that, the copy taken at the failure */
    sn_lock(self);
    const int failed = self->life.state == SN_OPEN ? sn_fault_poll(self)
                                              : self->fail.failure.reason != 0;
    sn_unlock(self);
    if (!failed)
        Py_RETURN_NONE;
    return sn_fault_dict(self);
}

/* _inject_fault(kernels): testing. The next launch of each named kernel
 * (SYMNCCL_KERNELS names) waits at entry for something that never comes,
 * so it gives up after the timeout the way a wait for a dead peer does. */
static PyObject *
comm_inject_fault(CommObject *self, PyObject *arg)
{
    Py_ssize_t len = PySequence_Size(arg);
    if (len < 0)
        return NULL;
    int mask = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *item = PySequence_GetItem(arg, i);
        const char *s = item != NULL ? PyUnicode_AsUTF8AndSize(item, NULL)
                                     : NULL;
        int k = -1;
        for (int j = 0; s != NULL && j < SYMNCCL_K_COUNT; j++)
            if (strcmp(s, sn_kernel_name(j)) == 0)
                k = j;
        if (k < 0 && !PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "unknown kernel %R", item);
        Py_XDECREF(item);
        if (k < 0)
            return NULL;
        mask |= 1 << k;
    }
    sn_lock(self);
    self->count.inject |= mask;
    sn_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *
comm_enter(CommObject *self, PyObject *unused)
{
    return Py_NewRef((PyObject *)self);
}

static PyObject *
comm_exit(CommObject *self, PyObject *args)
{
    return comm_close(self, NULL);
}

static void
comm_dealloc(CommObject *self)
{
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    SNState *st = sn_state_from_type(tp);
    if (st != NULL)
        sn_comm_finalize(st, self);
    if (self->life.leak_object)   /* callers still inside (sn_comm_finalize) */
        return;
    sn_windows_free(self);
    pthread_mutex_destroy(&self->lock);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------------ */
/* Allocation.                                                          */

static PyObject *
comm_alloc_buffer(CommObject *self, PyObject *args, PyObject *kw, int zero)
{
    static char *kwlist[] = {"shape", "dtype", NULL};
    SNState *st = comm_state(self);
    PyObject *shape_obj, *dtype_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &shape_obj,
                                     &dtype_obj))
        return NULL;
    int ndim;
    int64_t shape[SN_MAX_NDIM];
    if (sn_parse_shape(shape_obj, &ndim, shape) < 0)
        return NULL;
    const sn_dtype *dt = dtype_obj == NULL || dtype_obj == Py_None
                             ? sn_dtype_by_name("float32")
                             : sn_parse_dtype(dtype_obj);
    if (dt == NULL ||
        sn_shape_size(zero ? "zeros" : "empty", ndim, shape,
                      (size_t)dt->itemsize, NULL, NULL) < 0)
        return NULL;
    /* the window's registration waits for the peers: counted in busy, so
     * the watchdog keeps off meanwhile */
    if (sn_comm_enter(st, self) < 0)
        return NULL;
    PyObject *b = sn_buffer_new(st, self, st->SymmetricBufferType, ndim,
                                shape, dt, zero, NULL);
    sn_comm_leave(st, self);
    return b;
}

static PyObject *
comm_empty(CommObject *self, PyObject *args, PyObject *kw)
{
    return comm_alloc_buffer(self, args, kw, 0);
}

static PyObject *
comm_zeros(CommObject *self, PyObject *args, PyObject *kw)
{
    return comm_alloc_buffer(self, args, kw, 1);
}

/* ------------------------------------------------------------------ */
/* Properties.                                                          */

static PyObject *get_rank(CommObject *s, void *c) { return PyLong_FromLong(s->rank); }
static PyObject *get_nranks(CommObject *s, void *c) { return PyLong_FromLong(s->nranks); }
static PyObject *get_device(CommObject *s, void *c) { return PyLong_FromLong(s->device); }
static PyObject *get_lsa_size(CommObject *s, void *c) { return PyLong_FromLong(s->lsa_size); }
static PyObject *get_lsa_rank(CommObject *s, void *c) { return PyLong_FromLong(s->lsa_rank); }
static PyObject *get_symmetric(CommObject *s, void *c) { return PyBool_FromLong(s->symmetric); }
static PyObject *get_multicast(CommObject *s, void *c) { return PyBool_FromLong(s->multicast); }
static PyObject *
get_closed(CommObject *s, void *c)
{
    sn_lock(s);
    const int open = s->life.state == SN_OPEN;
    sn_unlock(s);
    return PyBool_FromLong(!open);
}
static PyObject *get_timeout(CommObject *s, void *c) { return PyFloat_FromDouble(s->timeout); }

static PyObject *
get_staging_bytes(CommObject *s, void *c)
{
    return PyLong_FromSize_t(s->mem.staging != NULL ? s->mem.layout.staging
                                                    : 0);
}

static PyObject *
get_symmetric_reason(CommObject *s, void *c)
{
    return PyUnicode_FromString(s->symmetric_reason);
}

static PyObject *
get_device_api_reason(CommObject *s, void *c)
{
    if (s->symmetric)
        Py_RETURN_NONE;
    return PyUnicode_FromString(s->symmetric_reason);
}

static PyObject *
get_multicast_reason(CommObject *s, void *c)
{
    return PyUnicode_FromString(s->multicast_reason);
}

static PyObject *
get_handle(CommObject *s, void *c)
{
    return PyLong_FromVoidPtr(s->comm);
}

static PyObject *
comm_repr(CommObject *s)
{
    return PyUnicode_FromFormat(
        "<symnccl.Communicator rank=%d nranks=%d device=cuda:%d lsa_size=%d "
        "symmetric=%s multicast=%s state=%s>", s->rank, s->nranks,
        s->device, s->lsa_size, s->symmetric ? "True" : "False",
        s->multicast ? "True" : "False", sn_comm_state_name(s));
}

static PyObject *
get_windows(CommObject *s, void *c)
{
    /* under the lock: an abort finishing on another thread (no GIL)
     * unlinks nodes under it (lifecycle.c, end_teardown) */
    sn_lock(s);
    const size_t n = sn_windows_count(s);
    sn_unlock(s);
    return PyLong_FromSize_t(n);
}

static PyObject *
get_knobs(CommObject *s, void *c)
{
    return sn_knobs_dict(&s->knobs);
}

static PyObject *
get_pdl_early(CommObject *s, void *c)
{
    return PyBool_FromLong(s->pdl_early);
}

static int
set_pdl_early(CommObject *s, PyObject *v, void *c)
{
    const int on = v != NULL ? PyObject_IsTrue(v) : -1;
    if (on < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_pdl_early cannot be deleted");
        return -1;
    }
    s->pdl_early = on;
    return 0;
}

static PyGetSetDef comm_getset[] = {
    {"rank", (getter)get_rank, NULL, "This rank, 0 <= rank < nranks.", NULL},
    {"nranks", (getter)get_nranks, NULL, "Number of ranks.", NULL},
    {"device", (getter)get_device, NULL, "CUDA device ordinal.", NULL},
    {"lsa_size", (getter)get_lsa_size, NULL,
     "Ranks reachable by load/store (NVLink) from this one, this one "
     "included; 1 when the device API is not usable.", NULL},
    {"lsa_rank", (getter)get_lsa_rank, NULL, "Rank within the LSA team.",
     NULL},
    {"symmetric", (getter)get_symmetric, NULL,
     "True when ncclDevCommCreate succeeded, i.e. symmetric windows and the "
     "NCCL device API are usable.", NULL},
    {"symmetric_reason", (getter)get_symmetric_reason, NULL, NULL, NULL},
    {"device_api_reason", (getter)get_device_api_reason, NULL,
     "None when symnccl's kernels run on the NCCL device API, else why "
     "not (every collective then goes through NCCL's own kernels).", NULL},
    {"multicast", (getter)get_multicast, NULL,
     "True only when NCCL granted an NVLink multicast (NVLS) handle.", NULL},
    {"multicast_reason", (getter)get_multicast_reason, NULL,
     "Why multicast is or is not available.", NULL},
    {"closed", (getter)get_closed, NULL, "True once close() or abort() "
     "has begun: no call may start on the communicator (it is being "
     "closed or aborted, or it is; repr() says which).", NULL},
    {"timeout", (getter)get_timeout, NULL,
     "Seconds any wait for peers may take before TimeoutError.", NULL},
    {"staging_bytes", (getter)get_staging_bytes, NULL,
     "Size of the staging window the LSA kernels copy non-window inputs "
     "through (0 when they are unavailable). Larger inputs are chunked.",
     NULL},
    {"nccl_comm", (getter)get_handle, NULL,
     "The ncclComm_t as an integer (for interop; do not destroy it).", NULL},
    {"_windows", (getter)get_windows, NULL,
     "Registered windows, the staging window included (testing).", NULL},
    {"failure", (getter)get_failure, NULL,
     "None, or what made the communicator fail: a dict of reason "
     "('timeout', 'peer', 'abort', 'mismatch'), collective, kernel, rank "
     "(the peer), waited (seconds), cta, flag and message.", NULL},
    {"knobs", (getter)get_knobs, NULL,
     "The run-time knobs this communicator read at creation "
     "(symnccl._C.KNOBS lists them).", NULL},
    {"_pdl_early", (getter)get_pdl_early, (setter)set_pdl_early,
     "Whether its kernels let the next launch begin at their entry (beside "
     "NCCL 2.30.7 to 2.30.x: csrc/runtime/nccl_policy.c, sn_nccl_pdl_early); "
     "settable, for testing.", NULL},
    {NULL},
};

/* ------------------------------------------------------------------ */
/* Benchmark hooks: the NVLink ceiling the all-reduce numbers are read
 * against (benchmarks/bench_allreduce.py). */

/* _lsa_pointer(buf, peer) -> int: where this GPU reaches peer's copy of a
 * SymmetricBuffer's memory (synchronous; call once, outside timing). */
static PyObject *
comm_lsa_pointer(CommObject *self, PyObject *args)
{
    SNState *st = comm_state(self);
    PyObject *obj;
    int peer;
    if (!PyArg_ParseTuple(args, "Oi:_lsa_pointer", &obj, &peer))
        return NULL;
    if (!PyObject_TypeCheck(obj, st->SymmetricBufferType)) {
        PyErr_SetString(PyExc_TypeError, "expected a SymmetricBuffer");
        return NULL;
    }
    /* the window stays registered while this thread is inside */
    if (sn_comm_enter(st, self) < 0)
        return NULL;
    BufferObject *b = (BufferObject *)obj;
    if (b->win == NULL || b->win->win == NULL || b->comm != self ||
        !self->symmetric || peer < 0 || peer >= self->lsa_size) {
        PyErr_Format(PyExc_ValueError, "no LSA pointer: the buffer must be "
                     "a registered window of this communicator and 0 <= "
                     "peer < lsa_size (%d), got peer %d", self->lsa_size,
                     peer);
        sn_comm_leave(st, self);
        return NULL;
    }
    int prev;
    if (sn_device_push(st, self->device, &prev) < 0) {
        sn_comm_leave(st, self);
        return NULL;
    }
    void *p = NULL;
    cudaError_t e = symnccl_lsa_pointer(b->win->win,
                                        (size_t)(b->ptr - b->win->base),
                                        peer, &p);
    sn_device_pop(prev);
    sn_comm_leave(st, self);
    if (e != cudaSuccess)
        return (sn_set_cuda_error(st, e, "reading the LSA pointer"), NULL);
    return PyLong_FromVoidPtr(p);
}

/* 0 when [p, p + nbytes) starts and ends in device memory (CUDA knows both
 * ends: a wild address or size is refused before any copy reads it), else
 * -1 with ValueError naming `name`. */
static int
check_device_range(unsigned long long p, unsigned long long nbytes,
                   const char *name)
{
    const unsigned long long ends[2] = {p, p + nbytes - 1};
    for (int i = 0; i < 2; i++) {
        struct cudaPointerAttributes at;
        cudaError_t e = cudaPointerGetAttributes(&at,
                                                 (void *)(uintptr_t)ends[i]);
        if (e != cudaSuccess || (at.type != cudaMemoryTypeDevice &&
                                 at.type != cudaMemoryTypeManaged)) {
            cudaGetLastError();   /* not sticky: leave no error behind */
            PyErr_Format(PyExc_ValueError, "_copy: %s [0x%llx, 0x%llx) is "
                         "not device memory at 0x%llx (expected %llu bytes "
                         "of one allocation on the GPU)", name, p,
                         p + nbytes, ends[i], nbytes);
            return -1;
        }
    }
    return 0;
}

/* _copy(dst, src, nbytes, stream, engine, ctas=64): cudaMemcpyAsync
 * ("memcpy") or symnccl's copy kernel ("kernel", 16-byte loads) between
 * raw device addresses; the benchmarks' copy ceilings (a peer's window
 * through its LSA pointer, _lsa_pointer), nothing else. Private, and
 * checked before anything is enqueued: the engine, the grid (1..MAX_CTAS),
 * the size, and both ranges' ends in device memory. */
static PyObject *
comm_copy(CommObject *self, PyObject *args)
{
    SNState *st = comm_state(self);
    unsigned long long dst, src, nbytes, stream;
    const char *engine;
    int ctas = 64;
    if (!PyArg_ParseTuple(args, "KKKKs|i:_copy", &dst, &src, &nbytes,
                          &stream, &engine, &ctas))
        return NULL;
    const int kernel = strcmp(engine, "kernel") == 0;
    if (!kernel && strcmp(engine, "memcpy") != 0) {
        PyErr_Format(PyExc_ValueError, "_copy: engine must be 'memcpy' or "
                     "'kernel', got '%s'", engine);
        return NULL;
    }
    if (ctas < 1 || ctas > SN_MAX_CTAS) {
        PyErr_Format(PyExc_ValueError, "_copy: ctas must be 1..%d, got %d",
                     SN_MAX_CTAS, ctas);
        return NULL;
    }
    if (nbytes > SN_MAX_BYTES || dst + nbytes < dst || src + nbytes < src) {
        PyErr_Format(PyExc_ValueError, "_copy: %llu bytes from 0x%llx to "
                     "0x%llx pass the end of the address space", nbytes,
                     src, dst);
        return NULL;
    }
    if (kernel && ((dst | src) & 15) != 0) {
        PyErr_Format(PyExc_ValueError, "_copy: engine 'kernel' needs "
                     "16-byte aligned addresses, got dst 0x%llx, src 0x%llx",
                     dst, src);
        return NULL;
    }
    if (nbytes == 0)
        Py_RETURN_NONE;
    if (sn_comm_enter(st, self) < 0)
        return NULL;
    int prev;
    if (sn_device_push(st, self->device, &prev) < 0) {
        sn_comm_leave(st, self);
        return NULL;
    }
    cudaError_t e = cudaSuccess;
    int bad = check_device_range(dst, nbytes, "dst") < 0 ||
              check_device_range(src, nbytes, "src") < 0;
    if (!bad && !kernel)
        e = cudaMemcpyAsync((void *)(uintptr_t)dst, (void *)(uintptr_t)src,
                            (size_t)nbytes, cudaMemcpyDeviceToDevice,
                            (cudaStream_t)(uintptr_t)stream);
    else if (!bad)
        e = symnccl_copy((void *)(uintptr_t)dst, (void *)(uintptr_t)src,
                         (size_t)nbytes, ctas,
                         (cudaStream_t)(uintptr_t)stream);
    sn_device_pop(prev);
    sn_comm_leave(st, self);
    if (bad)
        return NULL;
    if (e != cudaSuccess)
        return (sn_set_cuda_error(st, e, "_copy"), NULL);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* Testing hooks: what ran, where things live, what the registry decides
 * for this communicator. */

/* _launches() -> {kernel name: launches, ..., "nccl": NCCL collectives}:
 * counted when enqueued (a captured graph's replays are not counted). */
static PyObject *
comm_launches(CommObject *self, PyObject *unused)
{
    PyObject *d = PyDict_New();
    sn_lock(self);
    for (int i = 0; d != NULL && i <= SYMNCCL_K_COUNT; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(self->count.launches[i]);
        if (v == NULL || PyDict_SetItemString(d, sn_kernel_name(i), v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    sn_unlock(self);
    return d;
}

static PyObject *
comm_staging_layout(CommObject *self, PyObject *unused)
{
    const sn_layout *l = &self->mem.layout;
    return Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n}",
        "staging",
        (Py_ssize_t)l->staging, "ll_offset", (Py_ssize_t)l->ll_offset,
        "ll_row", (Py_ssize_t)l->ll_row, "ll128_offset",
        (Py_ssize_t)l->ll128_offset, "ll128_row", (Py_ssize_t)l->ll128_row,
        "push_offset", (Py_ssize_t)l->push_offset, "push_data",
        (Py_ssize_t)l->push_data, "push_slot", (Py_ssize_t)l->push_slot,
        "ctl_offset", (Py_ssize_t)l->ctl_offset, "splits_offset",
        (Py_ssize_t)l->splits_offset, "lamport_offset",
        (Py_ssize_t)l->lamport_offset, "lamport_row",
        (Py_ssize_t)l->lamport_row, "lamport_ar_offset",
        (Py_ssize_t)l->lamport_ar_offset, "lamport_ar_row",
        (Py_ssize_t)l->lamport_ar_row, "bytes",
        (Py_ssize_t)l->bytes);
}

/* CTA 0's call counter of a kernel's counters (testing: the push
 * reduce-scatter and all-gather advance it once per chunk). */
static PyObject *
comm_epoch(CommObject *self, PyObject *arg)
{
    SNState *st = comm_state(self);
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "_epoch: expected a kernel name");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8AndSize(arg, NULL);
    /* the scratch stays while this thread is inside */
    if (name == NULL || sn_comm_enter(st, self) < 0)
        return NULL;
    int k = 0;
    while (k < SYMNCCL_K_COUNT && strcmp(sn_kernel_name(k), name) != 0)
        k++;
    if (k == SYMNCCL_K_COUNT || self->mem.scratch == NULL) {
        PyErr_Format(PyExc_ValueError, "_epoch: no counters for kernel "
                     "'%s' on this communicator", name);
        sn_comm_leave(st, self);
        return NULL;
    }
    int prev;
    if (sn_device_push(st, self->device, &prev) < 0) {
        sn_comm_leave(st, self);
        return NULL;
    }
    uint64_t v = 0;
    cudaError_t e;
    Py_BEGIN_ALLOW_THREADS
    e = cudaMemcpy(&v, sn_epochs(self, k), sizeof(v), cudaMemcpyDeviceToHost);
    Py_END_ALLOW_THREADS
    sn_device_pop(prev);
    sn_comm_leave(st, self);
    if (e != cudaSuccess)
        return (sn_set_cuda_error(st, e, "reading a call counter"), NULL);
    return PyLong_FromUnsignedLongLong(v);
}

/* _algo_unavailable(algo, dtype, op="sum", collective="all_reduce") -> why
 * not, or None */
static PyObject *
comm_algo_unavailable(CommObject *self, PyObject *args)
{
    int algo;
    const sn_dtype *dt;
    const sn_op *op;
    const char *a, *d, *o = "sum", *cname = "all_reduce", *why;
    if (!PyArg_ParseTuple(args, "ss|ss:_algo_unavailable", &a, &d, &o,
                          &cname) ||
        sn_registry_lookup(a, d, o, &algo, &dt, &op) < 0)
        return NULL;
    const sn_topology t = sn_topology_of(self);
    if (sn_call_unavailable(&t, cname, algo, dt, op, &why) < 0)
        return NULL;
    return why == NULL ? Py_NewRef(Py_None) : PyUnicode_FromString(why);
}

/* what algo="auto" runs, by names (symnccl.h) */
PyObject *
sn_py_auto_algo(const sn_topology *t, const sn_knobs *k, Py_ssize_t bytes,
                const char *dtype, const char *op_name, int in_window,
                const char *collective)
{
    int algo, coll;
    const sn_dtype *dt;
    const sn_op *op;
    if (sn_registry_lookup("auto", dtype, op_name, &algo, &dt, &op) < 0 ||
        (coll = sn_collective_by_name(collective)) < 0)
        return NULL;
    const sn_call_desc desc = {
        .collective = coll,
        .algo = SN_ALGO_AUTO,
        .bytes = (size_t)bytes,
        .dtype = dt,
        .op = op,
        .in_window = in_window,
    };
    char why[320];
    algo = sn_resolve(t, k, &desc, why, sizeof(why));
    if (algo == SN_ALGO_UNKNOWN) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    return PyUnicode_FromString(sn_algos[algo].name);
}

/* _auto_algo(nbytes, dtype, op, in_window, collective="all_reduce") ->
 * what algo="auto" runs (sn_resolve) */
static PyObject *
comm_auto_algo(CommObject *self, PyObject *args)
{
    int in_window;
    Py_ssize_t bytes;
    const char *d, *o, *cname = "all_reduce";
    if (!PyArg_ParseTuple(args, "nssp|s:_auto_algo", &bytes, &d, &o,
                          &in_window, &cname))
        return NULL;
    const sn_topology t = sn_topology_of(self);
    return sn_py_auto_algo(&t, &self->knobs, bytes, d, o, in_window, cname);
}

static PyMethodDef comm_methods[] = {
    {"_launches", (PyCFunction)comm_launches, METH_NOARGS,
     "_launches() -> {kernel: launches enqueued, ..., 'nccl': NCCL "
     "collectives} (testing)"},
    {"_staging_layout", (PyCFunction)comm_staging_layout, METH_NOARGS,
     "_staging_layout() -> dict: offsets and sizes in the staging window"},
    {"_epoch", (PyCFunction)comm_epoch, METH_O,
     "_epoch(kernel) -> CTA 0's call counter of that kernel (testing)"},
    {"_algo_unavailable", (PyCFunction)comm_algo_unavailable, METH_VARARGS,
     "_algo_unavailable(algo, dtype, op='sum', collective='all_reduce') "
     "-> why algo cannot run, or None"},
    {"_auto_algo", (PyCFunction)comm_auto_algo, METH_VARARGS,
     "_auto_algo(nbytes, dtype, op, in_window, collective='all_reduce') "
     "-> the algorithm algo='auto' runs"},
    {"_lsa_pointer", (PyCFunction)comm_lsa_pointer, METH_VARARGS,
     "_lsa_pointer(buf, peer) -> int (benchmark hook)"},
    {"_copy", (PyCFunction)comm_copy, METH_VARARGS,
     "_copy(dst, src, nbytes, stream, engine, ctas=64) (benchmark hook: "
     "raw device addresses, checked: engine 'memcpy' or 'kernel', ctas "
     "1..MAX_CTAS, both ranges in device memory)"},
    {"init_all", (PyCFunction)(void (*)(void))comm_init_all,
     METH_CLASS | METH_VARARGS | METH_KEYWORDS,
     "init_all($type, /, devices, *, timeout=" SN_STR(SN_DEFAULT_TIMEOUT)
     ", multicast=None)\n--\n\n"
     "-> list of Communicator\n\n"
     "One communicator per device, all driven from this thread (rank i on "
     "devices[i]). Collective calls on them (empty, zeros, all_reduce, ...) "
     "must be issued for every communicator inside one symnccl.group().\n\n"
     "Example:\n    comms = symnccl.Communicator.init_all([0, 1])\n"
     "    with symnccl.group():\n"
     "        bufs = [c.empty(1024, 'bfloat16') for c in comms]"},
    {"_loopback", (PyCFunction)(void (*)(void))comm_loopback,
     METH_CLASS | METH_VARARGS | METH_KEYWORDS,
     "_loopback($type, /, nranks, device=-1, *, timeout=30.0, "
     "staging_bytes=33554432)\n--\n\n"
     "-> list of Communicator\n\n"
     "Testing: nranks ranks of one team on one GPU (csrc/runtime/loopback.c). "
     "symnccl's kernels run on them unchanged, each rank's calls on a "
     "stream of its own; NCCL calls and windows are not available."},
    {"empty", (PyCFunction)(void (*)(void))comm_empty,
     METH_VARARGS | METH_KEYWORDS,
     "empty($self, /, shape, dtype='float32')\n--\n\n-> SymmetricBuffer\n\n"
     "Allocates with ncclMemAlloc and registers one NCCL_WIN_COLL_SYMMETRIC "
     "window. Collective: every rank must call it with the same size.\n\n"
     "Example:\n    buf = comm.empty((4096,), 'bfloat16')\n"
     "    t = torch.from_dlpack(buf)   # zero-copy"},
    {"zeros", (PyCFunction)(void (*)(void))comm_zeros,
     METH_VARARGS | METH_KEYWORDS,
     "zeros($self, /, shape, dtype='float32')\n--\n\n-> SymmetricBuffer: like "
     "empty(), "
     "filled with zeros."},
    /* the collective methods: csrc/methods.py declares each (keywords,
     * format, docstring, stub) */
#define SN_METHOD_DEF_(name)                                           \
    {#name, (PyCFunction)(void (*)(void))sn_##name,                    \
     METH_VARARGS | METH_KEYWORDS, SN_DOC_##name},
    SN_METHODS(SN_METHOD_DEF_)
#undef SN_METHOD_DEF_
    {"check", (PyCFunction)comm_check, METH_NOARGS,
     "check($self, /)\n--\n\n"
     "Raises the communicator's failure (PeerTimeoutError: a peer did not "
     "arrive within the timeout, gave up first, or the call was aborted; "
     "CallMismatchError), or an asynchronous NCCL error. Costs no "
     "synchronisation: the failure record is in mapped host memory."},
    {"_inject_fault", (PyCFunction)comm_inject_fault, METH_O,
     "_inject_fault(kernels) (testing): the next launch of each named "
     "kernel waits at entry for something that never comes and gives up "
     "after the timeout."},
    {"close", (PyCFunction)comm_close, METH_NOARGS,
     "close($self, /)\n--\n\nRefuses new calls from then on, waits (at most "
     "the timeout) for calls other threads are making on it to return, "
     "then for this device's work, then destroys the device "
     "communicator, deregisters the windows, finalizes and destroys the "
     "communicator. A close that cannot complete aborts instead and raises "
     "why. Idempotent. Buffers and views stay valid as plain device "
     "memory (docs/FAILURES.md, 'Lifecycle').\n\nExample:\n    with "
     "symnccl.Communicator(uid, r, n, r) as comm:\n        ..."},
    {"abort", (PyCFunction)comm_abort, METH_NOARGS,
     "abort($self, /)\n--\n\nStops this communicator's kernels, "
     "ncclCommAbort, and frees its memory once nothing of it runs. For a "
     "communicator that failed, timed out or whose peers died; callable "
     "from any thread (another thread's call on it ends, a close under "
     "way aborts). Local: returns within about 10 s (docs/FAILURES.md, "
     "'Lifecycle')."},
    {"__enter__", (PyCFunction)comm_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)comm_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyType_Slot comm_slots[] = {
    {Py_tp_doc,
     "Communicator(unique_id, rank, nranks, device=None, *, timeout="
     SN_STR(SN_DEFAULT_TIMEOUT) ", "
     "multicast=None, staging_bytes=33554432)\n--\n\n"
     "An NCCL communicator on one GPU, with its device communicator and "
     "symmetric windows. Creation waits for all nranks ranks (GIL released, "
     "at most `timeout` seconds).\n\n"
     "multicast: None asks NCCL for an NVLink multicast handle unless "
     "NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 or "
     "NVSHMEM_DISABLE_NVLS=1 is set; True asks likewise and says why not in "
     "multicast_reason; False never asks.\n\n"
     "Example:\n    uid = symnccl.get_unique_id()   # on rank 0, then share\n"
     "    comm = symnccl.Communicator(uid, rank, nranks, device=rank)"},
    {Py_tp_new, comm_new},
    {Py_tp_dealloc, comm_dealloc},
    {Py_tp_repr, comm_repr},
    {Py_tp_methods, comm_methods},
    {Py_tp_getset, comm_getset},
    {0, NULL},
};

/* CommObject opens with runtime.h's stand-in for PyObject_HEAD (the
 * runtime's files see no Python.h): it must be a PyObject exactly. */
_Static_assert(sizeof(sn_object_head) == sizeof(PyObject) &&
                   _Alignof(sn_object_head) == _Alignof(PyObject) &&
                   offsetof(CommObject, ob_base) == 0,
               "runtime.h's sn_object_head is not PyObject's layout");

PyType_Spec sn_communicator_spec = {
    .name = "symnccl.Communicator",
    .basicsize = sizeof(CommObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = comm_slots,
};
