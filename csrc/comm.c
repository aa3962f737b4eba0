/* symnccl.Communicator: an NCCL communicator on one GPU, its device
 * communicator (ncclDevComm, which proves the device API is usable) and the
 * cache of symmetric windows registered on it.
 *
 * Communicators are created non-blocking (ncclConfig_t.blocking = 0) so that
 * every wait for peers is bounded by `timeout` and interruptible by Ctrl-C;
 * a communicator that times out can still be abort()ed.
 */
#include "symnccl.h"

#include <cuda.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static SNState *
comm_state(CommObject *self)
{
    return sn_state_from_type(Py_TYPE((PyObject *)self));
}

static void
init_config(ncclConfig_t *cfg)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    *cfg = init;
    const char *b = getenv("SYMNCCL_NCCL_BLOCKING");
    cfg->blocking = (b != NULL && strcmp(b, "1") == 0) ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* Device communicator: created right after the communicator, collective. */

/* CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED through the driver entry point
 * (an attribute query: no multicast object is created). -1 if unknown. */
static int
device_has_multicast(int device)
{
    typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);
    static attr_fn get_attr;
    static int loaded;
    if (!loaded) {
        enum cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute",
                                             (void **)&get_attr, 12000,
                                             cudaEnableDefault, &q)
            != cudaSuccess)
            get_attr = NULL;
        loaded = 1;
    }
    int v = 0;
    if (get_attr == NULL ||
        get_attr(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, device)
            != CUDA_SUCCESS)
        return -1;
    return v != 0;
}

static const char *
decide_multicast(int mode, int nranks, int device)
{
    const char *why = sn_multicast_gate(
        mode, getenv("NCCL_NVLS_ENABLE"),
        getenv("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
        getenv("NVSHMEM_DISABLE_NVLS"));
    if (why != NULL)
        return why;
    /* NCCL 2.28.9 accepts lsaMultimem on a system without NVLS and then
     * fails every window registration ("Multicast support requested for
     * team but none available on system", seen on a single H100, with
     * multicast=True too). So: never for one rank, and auto only where the
     * GPU reports switch multicast. */
    if (nranks < 2)
        return "not requested (a single rank has no peers)";
    if (mode == SN_MC_AUTO && device_has_multicast(device) != 1)
        return "not requested (auto: the GPU reports no switch multicast)";
    return NULL;
}

static void
read_devcomm(CommObject *c)
{
    int has_mc = 0;
    symnccl_devcomm_info(c->devcomm, &c->lsa_size, &c->lsa_rank, &has_mc);
    c->symmetric = 1;
    c->symmetric_reason = "ncclDevCommCreate succeeded";
    c->multicast = has_mc;
    if (c->multicast_requested)
        c->multicast_reason = has_mc ? "granted by NCCL"
                                     : "requested, but NCCL granted none";
}

/* Not collective-safe to retry unless every rank failed the same way; NCCL
 * reports an unusable multimem request with ncclInvalidArgument on all
 * ranks, which is the one case retried. */
static int
create_devcomm(SNState *st, CommObject *c)
{
    symnccl_devcomm *dc = NULL;
    ncclResult_t rc;
    int mc = c->multicast_requested;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        rc = symnccl_devcomm_create(c->comm, SN_MAX_CTAS, mc, &dc);
        Py_END_ALLOW_THREADS
        if (rc == ncclInProgress || rc == ncclSuccess) {
            if (sn_wait_comms(st, &c->comm, 1, c->timeout,
                              "ncclDevCommCreate") < 0) {
                if (!PyErr_ExceptionMatches(st->NcclError)) {
                    free(dc);   /* timed out or interrupted */
                    return -1;
                }
                PyErr_Clear();
                rc = ncclInternalError;
            }
            else
                rc = ncclSuccess;
        }
        if (rc == ncclSuccess)
            break;
        if (dc != NULL) {
            free(dc);   /* never created: nothing for NCCL to destroy */
            dc = NULL;
        }
        if (mc && rc == ncclInvalidArgument) {
            c->multicast_reason = "requested, but NCCL refused it "
                                  "(ncclInvalidArgument): NVLS unavailable";
            mc = 0;
            continue;
        }
        c->symmetric = 0;
        c->symmetric_reason = "ncclDevCommCreate failed: the NCCL device API "
                              "is not usable on this communicator";
        c->lsa_size = 1;
        c->lsa_rank = 0;
        return 0;
    }
    c->devcomm = dc;
    c->multicast_requested = mc;
    read_devcomm(c);
    return 0;
}

static int
alloc_scratch(SNState *st, CommObject *c)
{
    SN_CUDA_GOTO(st, cudaMalloc((void **)&c->scratch, SN_SCRATCH_BYTES),
                 "cudaMalloc", error);
    SN_CUDA_GOTO(st, cudaMemset(c->scratch, 0, SN_SCRATCH_BYTES),
                 "cudaMemset", error);
    SN_CUDA_GOTO(st, cudaEventCreateWithFlags(&c->lsa_event,
                                              cudaEventDisableTiming),
                 "cudaEventCreateWithFlags", error);
    return 0;
error:
    return -1;
}

static int
env_int(const char *name, int dflt, int lo, int hi)
{
    const char *v = getenv(name);
    int x = v != NULL && v[0] != '\0' ? atoi(v) : dflt;
    return x < lo ? lo : x > hi ? hi : x;
}

/* Run-time knobs (README: Build and run-time knobs), read once per
 * communicator; each must be equal on every rank. */
static int
read_knobs(CommObject *c)
{
    /* 64 CTAs: 256 KiB 5.4 -> 4.6 us on 2 ranks, 8.7 -> 7.9 us (two-shot
     * packets) on 4; the same at 4 KiB (benchmarks/NOTES.md, 11-12) */
    c->ll_ctas = env_int("SYMNCCL_LL_CTAS", 64, 1, SN_MAX_CTAS);
    c->ll_threads = env_int("SYMNCCL_LL_THREADS", 512, 32, 512) / 32 * 32;
    c->ll_two_shot_min = (size_t)env_int("SYMNCCL_LL_TWO_SHOT_KIB", 128, 0,
                                         1 << 20) << 10;
    /* ll128 two-shot from 512 KiB: 4x 9.3 vs its one-shot's 11.3 us, 3x
     * 8.2 vs 9.6; at 384 KiB the one-shot is ahead (NOTES.md, 17) */
    c->ll128_two_shot_min = (size_t)env_int("SYMNCCL_LL128_TWO_SHOT_KIB",
                                            512, 0, 1 << 20) << 10;
    /* 64 CTAs: two communicators' push kernels stay co-resident on a
     * 132-SM GPU (README: Streams) */
    c->push_ctas = env_int("SYMNCCL_PUSH_CTAS", 64, 1,
                           SYMNCCL_PUSH_MAX_CTAS);
    c->push_threads = env_int("SYMNCCL_PUSH_THREADS", 512, 64, 512) / 32 * 32;
    c->lsa_threads = env_int("SYMNCCL_THREADS", 512, 32, 512) / 32 * 32;
    c->one_shot_ctas = env_int("SYMNCCL_ONE_SHOT_CTAS", 32, 1, SN_MAX_CTAS);
    c->two_shot_ctas = env_int("SYMNCCL_TWO_SHOT_CTAS", 64, 1, SN_MAX_CTAS);
    c->algo_env = SN_ALGO_AUTO;
    const char *a = getenv("SYMNCCL_ALGO");
    if (a != NULL && a[0] != '\0') {
        c->algo_env = sn_algo_from_name(a);
        if (c->algo_env == -2) {
            PyErr_Format(PyExc_ValueError, "SYMNCCL_ALGO=%s is not an "
                         "algorithm: expected auto, nccl, one_shot, "
                         "two_shot, ll, ll128, push or multimem", a);
            return -1;
        }
    }
    return 0;
}

/* ncclMemAlloc for the staging window (the staging area, the LL and ll128
 * receive buffers, the push region; all but the first zeroed); registration
 * is done by the caller (alone, or for several communicators inside one
 * NCCL group), after this returns, so no peer can write into them before
 * they are cleared. */
static int
alloc_staging_memory(SNState *st, CommObject *c)
{
    if (!c->symmetric || c->lsa_size != c->nranks || c->staging_bytes == 0)
        return 0;
    const size_t n = (size_t)c->nranks;
    /* Largest LL message per launch: the region split into 2 slots x
     * nranks rows x 2 bytes of packet per byte of data, in whole pages. */
    c->ll_max_bytes = SN_LL_REGION / (4 * n) / 4096 * 4096;
    c->ll_offset = c->staging_bytes;
    size_t ll = symnccl_ll_buffer_bytes(c->nranks, c->ll_max_bytes);
    /* ll128: 2 slots x nranks rows, in whole pages */
    c->ll128_offset = c->ll_offset + ll;
    c->ll128_row_bytes = SN_LL128_REGION / (2 * n) / 4096 * 4096;
    const size_t ll128 = 2 * n * c->ll128_row_bytes;
    /* push: 4 x nranks slots in the region, in whole pages */
    size_t region = (size_t)env_int("SYMNCCL_PUSH_REGION_MIB",
                                    (int)(SN_PUSH_REGION >> 20), 1, 4096)
                    << 20;
    c->push_slot_bytes = region / (4 * n) / 4096 * 4096;
    if (c->push_slot_bytes == 0)
        c->push_slot_bytes = 4096;
    c->push_offset = c->ll128_offset + ll128;
    size_t data_off = 0;
    size_t push = symnccl_push_region_bytes(c->nranks, c->push_slot_bytes,
                                            &data_off);
    c->push_data = c->push_offset + data_off;
    c->staging_alloc = c->staging_bytes + ll + ll128 + push;
    ncclResult_t rc;
    void *p = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclMemAlloc(&p, c->staging_alloc);
    Py_END_ALLOW_THREADS
    if (rc != ncclSuccess)
        return sn_set_nccl_error(st, rc, c->comm, "ncclMemAlloc (staging)");
    c->staging = p;
    cudaError_t e = cudaMemset(c->staging + c->ll_offset, 0,
                               ll + ll128 + data_off);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        return sn_set_cuda_error(st, e, "clearing the LL and push buffers");
    return 0;
}

static sn_window *
new_window_node(CommObject *c, char *base, size_t size)
{
    sn_window *w = calloc(1, sizeof(sn_window));
    if (w == NULL)
        return NULL;
    w->base = base;
    w->size = size;
    w->refs = 1;
    w->next = c->windows;
    c->windows = w;
    return w;
}

static void
free_staging_memory(CommObject *c)
{
    if (c->staging != NULL) {
        ncclMemFree(c->staging);
        c->staging = NULL;
    }
    c->staging_win = NULL;   /* the node stays in c->windows, detached */
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

static void
live_add(SNState *st, CommObject *c)
{
    c->live_prev = NULL;
    c->live_next = st->live;
    if (st->live != NULL)
        st->live->live_prev = c;
    st->live = c;
}

static void
live_remove(SNState *st, CommObject *c)
{
    if (c->live_prev != NULL)
        c->live_prev->live_next = c->live_next;
    else if (st->live == c)
        st->live = c->live_next;
    if (c->live_next != NULL)
        c->live_next->live_prev = c->live_prev;
    c->live_next = c->live_prev = NULL;
}

/* NCCL calls inside a group return ncclInProgress on nonblocking
 * communicators: that is success here (sn_wait_comms waits for them). */
static ncclResult_t
started(ncclResult_t rc)
{
    return rc == ncclInProgress ? ncclSuccess : rc;
}

/* Ends a group; the first failure (rc, then the group's) is returned. */
static ncclResult_t
group_end(ncclResult_t rc)
{
    ncclResult_t end = started(ncclGroupEnd());
    return rc != ncclSuccess ? rc : end;
}

static CommObject *
comm_alloc(PyTypeObject *tp, int rank, int nranks, int device, double timeout,
           int multicast, size_t staging_bytes)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    CommObject *c = (CommObject *)alloc(tp, 0);
    if (c == NULL)
        return NULL;
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->timeout = timeout;
    c->staging_bytes = staging_bytes;
    c->lsa_size = 1;
    c->symmetric_reason = "not initialised";
    pthread_mutex_init(&c->lock, NULL);
    const char *why = decide_multicast(multicast, nranks, device);
    c->multicast_requested = why == NULL;
    c->multicast_reason = why != NULL ? why
                          : multicast == SN_MC_AUTO ? "requested (auto)"
                                                    : "requested";
    live_add(sn_state_from_type(tp), c);
    if (read_knobs(c) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return c;
}

static void detach_windows(CommObject *c);

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
    if (!(timeout > 0)) {
        PyErr_Format(PyExc_ValueError, "timeout must be > 0 seconds");
        return NULL;
    }
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

    CommObject *c = comm_alloc(tp, rank, nranks, device, timeout, multicast,
                               (size_t)staging);
    if (c == NULL)
        return NULL;
    int prev;
    if (sn_device_push(st, device, &prev) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    ncclUniqueId id;
    memcpy(id.internal, PyBytes_AsString(uid_obj), NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t cfg;
    init_config(&cfg);
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclCommInitRankConfig(&c->comm, nranks, id, rank, &cfg);
    Py_END_ALLOW_THREADS
    if (rc != ncclSuccess && rc != ncclInProgress) {
        sn_set_nccl_error(st, rc, c->comm, "ncclCommInitRankConfig");
        goto error;
    }
    if (sn_wait_comms(st, &c->comm, 1, timeout, "ncclCommInitRankConfig") < 0)
        goto error;
    if (create_devcomm(st, c) < 0 || alloc_scratch(st, c) < 0 ||
        alloc_staging_memory(st, c) < 0)
        goto error;
    if (c->staging != NULL) {
        c->staging_win = sn_comm_window_acquire(st, c, c->staging,
                                                c->staging_alloc);
        if (c->staging_win == NULL)
            goto error;
    }
    sn_device_pop(prev);
    return (PyObject *)c;

error:
    if (c->comm != NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        Py_BEGIN_ALLOW_THREADS
        ncclCommAbort(c->comm);
        Py_END_ALLOW_THREADS
        PyErr_Restore(et, ev, tb);
        c->comm = NULL;
    }
    c->closed = 2;
    free_staging_memory(c);
    sn_device_pop(prev);
    Py_DECREF(c);
    return NULL;
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
    ncclComm_t *raw = PyMem_Calloc((size_t)n, sizeof(ncclComm_t));
    int prev = -1, pushed = 0, group_open = 0;
    ncclResult_t rc;
    if (cs == NULL || raw == NULL) {
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
        cs[i] = comm_alloc(tp, (int)i, (int)n, (int)d, timeout, multicast,
                           SN_DEFAULT_STAGING);
        if (cs[i] == NULL)
            goto done;
    }
    if (sn_device_push(st, cs[0]->device, &prev) < 0)
        goto done;
    pushed = 1;

    ncclUniqueId id;
    rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) {
        sn_set_nccl_error(st, rc, NULL, "ncclGetUniqueId");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ncclGroupStart();
    for (Py_ssize_t i = 0; i < n && rc == ncclSuccess; i++) {
        ncclConfig_t cfg;
        init_config(&cfg);
        if (cudaSetDevice(cs[i]->device) != cudaSuccess) {
            rc = ncclUnhandledCudaError;
            break;
        }
        rc = started(ncclCommInitRankConfig(&cs[i]->comm, (int)n, id, (int)i,
                                            &cfg));
    }
    rc = group_end(rc);
    Py_END_ALLOW_THREADS
    if (rc != ncclSuccess) {
        sn_set_nccl_error(st, rc, NULL, "ncclCommInitRankConfig (init_all)");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        raw[i] = cs[i]->comm;
    if (sn_wait_comms(st, raw, (int)n, timeout, "init_all") < 0)
        goto done;

    /* Device communicators, grouped: creation is collective. */
    int mc = cs[0]->multicast_requested;
    for (int attempt = 0; attempt < 2; attempt++) {
        Py_BEGIN_ALLOW_THREADS
        rc = ncclGroupStart();
        group_open = rc == ncclSuccess;
        for (Py_ssize_t i = 0; i < n && rc == ncclSuccess; i++) {
            cudaSetDevice(cs[i]->device);
            rc = started(symnccl_devcomm_create(cs[i]->comm, SN_MAX_CTAS, mc,
                                                &cs[i]->devcomm));
        }
        if (group_open)
            rc = group_end(rc);
        Py_END_ALLOW_THREADS
        group_open = 0;
        if (rc == ncclSuccess &&
            sn_wait_comms(st, raw, (int)n, timeout, "ncclDevCommCreate") < 0) {
            if (!PyErr_ExceptionMatches(st->NcclError))
                goto done;
            PyErr_Clear();
            rc = ncclInternalError;
        }
        if (rc == ncclSuccess)
            break;
        for (Py_ssize_t i = 0; i < n; i++) {
            free(cs[i]->devcomm);
            cs[i]->devcomm = NULL;
        }
        if (!(mc && rc == ncclInvalidArgument))
            break;
        mc = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            cs[i]->multicast_requested = 0;
            cs[i]->multicast_reason = "requested, but NCCL refused it "
                                      "(ncclInvalidArgument)";
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cs[i]->devcomm != NULL)
            read_devcomm(cs[i]);
        else
            cs[i]->symmetric_reason = "ncclDevCommCreate failed: the NCCL "
                                      "device API is not usable";
        if (cudaSetDevice(cs[i]->device) != cudaSuccess ||
            alloc_scratch(st, cs[i]) < 0) {
            if (!PyErr_Occurred())
                sn_set_cuda_error(st, cudaGetLastError(), "cudaSetDevice");
            goto done;
        }
    }
    /* Staging windows: allocate each, register all in one group. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cudaSetDevice(cs[i]->device) != cudaSuccess ||
            alloc_staging_memory(st, cs[i]) < 0) {
            if (!PyErr_Occurred())
                sn_set_cuda_error(st, cudaGetLastError(), "cudaSetDevice");
            goto done;
        }
    }
    if (cs[0]->staging != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = ncclGroupStart();
        for (Py_ssize_t i = 0; i < n && rc == ncclSuccess; i++) {
            sn_window *w = new_window_node(cs[i], cs[i]->staging,
                                           cs[i]->staging_alloc);
            cs[i]->staging_win = w;
            if (w == NULL) {
                rc = ncclSystemError;
                break;
            }
            cudaSetDevice(cs[i]->device);
            rc = started(ncclCommWindowRegister(cs[i]->comm, w->base, w->size,
                                                &w->win,
                                                NCCL_WIN_COLL_SYMMETRIC));
        }
        rc = group_end(rc);
        Py_END_ALLOW_THREADS
        if (rc != ncclSuccess) {
            sn_set_nccl_error(st, rc, NULL, "ncclCommWindowRegister (staging)");
            goto done;
        }
        if (sn_wait_comms(st, raw, (int)n, timeout, "staging windows") < 0)
            goto done;
    }
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyList_SetItem(result, i, (PyObject *)cs[i]);
        cs[i] = NULL;
    }

done:
    if (cs != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (cs[i] == NULL)
                continue;
            if (cs[i]->comm != NULL) {
                free(cs[i]->devcomm);
                cs[i]->devcomm = NULL;
                detach_windows(cs[i]);
                ncclCommAbort(cs[i]->comm);
                cs[i]->comm = NULL;
            }
            free_staging_memory(cs[i]);
            cs[i]->closed = 2;
            Py_DECREF(cs[i]);
        }
    }
    if (pushed)
        sn_device_pop(prev);
    PyMem_Free(cs);
    PyMem_Free(raw);
    Py_XDECREF(seq);
    return result;
}

/* ------------------------------------------------------------------ */
/* Window cache.                                                        */

sn_window *
sn_comm_window_acquire(SNState *st, CommObject *c, char *base, size_t size)
{
    for (sn_window *w = c->windows; w != NULL; w = w->next) {
        if (base >= w->base && base + size <= w->base + w->size) {
            w->refs++;
            return w;
        }
    }
    sn_window *w = calloc(1, sizeof(sn_window));
    if (w == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    w->base = base;
    w->size = size;
    w->refs = 1;
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclCommWindowRegister(c->comm, base, size, &w->win,
                                NCCL_WIN_COLL_SYMMETRIC);
    Py_END_ALLOW_THREADS
    if (sn_nccl_complete(st, c, rc, "ncclCommWindowRegister") < 0) {
        free(w);
        return NULL;
    }
    w->next = c->windows;
    c->windows = w;
    return w;
}

sn_window *
sn_comm_find_window(CommObject *c, const char *ptr, size_t size)
{
    for (sn_window *w = c->windows; w != NULL; w = w->next)
        if (w->win != NULL && ptr >= w->base && ptr + size <= w->base + w->size)
            return w;
    return NULL;
}

int
sn_comm_in_window(CommObject *c, const char *ptr)
{
    for (sn_window *w = c->windows; w != NULL; w = w->next)
        if (w->win != NULL && ptr >= w->base && ptr < w->base + w->size)
            return 1;
    return 0;
}

static void
window_unlink(CommObject *c, sn_window *w)
{
    for (sn_window **pp = &c->windows; *pp != NULL; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            return;
        }
}

void
sn_comm_window_release(CommObject *c, sn_window *w)
{
    if (w == NULL || --w->refs > 0)
        return;
    if (w->win != NULL && c->closed == 0 && c->comm != NULL) {
        /* Deregistration is local but must not race a kernel still using
         * the window: wait for this device first. */
        int prev;
        if (cudaGetDevice(&prev) == cudaSuccess) {
            cudaSetDevice(c->device);
            cudaDeviceSynchronize();
            /* No Python error can be raised from a deallocator: wait,
             * bounded, without the wait helper. */
            ncclCommWindowDeregister(c->comm, w->win);
            struct timespec t0, t1, pause = {0, 20000};
            clock_gettime(CLOCK_MONOTONIC, &t0);
            ncclResult_t a = ncclInProgress;
            while (ncclCommGetAsyncError(c->comm, &a) == ncclSuccess &&
                   a == ncclInProgress) {
                nanosleep(&pause, NULL);
                clock_gettime(CLOCK_MONOTONIC, &t1);
                if (t1.tv_sec - t0.tv_sec > (time_t)c->timeout)
                    break;
            }
            cudaSetDevice(prev);
        }
    }
    window_unlink(c, w);
    free(w);
}

/* ------------------------------------------------------------------ */
/* Teardown, in DESIGN.md's order: sync -> ncclDevCommDestroy ->
 * ncclCommWindowDeregister -> (ncclMemFree, done by the buffers when their
 * last view dies) -> ncclCommFinalize -> ncclCommDestroy. */

int
sn_comm_check_usable(SNState *st, CommObject *c)
{
    if (c->closed) {
        PyErr_Format(PyExc_RuntimeError, "communicator (rank %d of %d, "
                     "cuda:%d) is %s", c->rank, c->nranks, c->device,
                     c->closed == 2 ? "aborted" : "closed");
        return -1;
    }
    return 0;
}

static void
detach_windows(CommObject *c)
{
    /* Buffers may outlive the communicator: their memory stays valid
     * (ncclMemFree needs no communicator); only the window goes. */
    for (sn_window *w = c->windows; w != NULL; w = w->next)
        w->win = NULL;
}

static int
comm_close_impl(SNState *st, CommObject *c)
{
    if (c->closed)
        return 0;
    if (st->group_depth > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "close() cannot be called inside symnccl.group()");
        return -1;
    }
    int prev;
    if (sn_device_push(st, c->device, &prev) < 0)
        return -1;
    ncclResult_t rc = ncclSuccess;
    cudaError_t ce;
    Py_BEGIN_ALLOW_THREADS
    ce = cudaDeviceSynchronize();
    Py_END_ALLOW_THREADS
    if (ce != cudaSuccess) {
        sn_set_cuda_error(st, ce, "cudaDeviceSynchronize (close)");
        goto fail;
    }
    sn_xla_forget(c);
    if (c->devcomm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = symnccl_devcomm_destroy(c->comm, c->devcomm);
        Py_END_ALLOW_THREADS
        c->devcomm = NULL;
        if (sn_nccl_complete(st, c, rc, "ncclDevCommDestroy") < 0)
            goto fail;
    }
    int xrc;
    Py_BEGIN_ALLOW_THREADS
    xrc = sn_xla_release_windows(c, 1);
    Py_END_ALLOW_THREADS
    if (xrc < 0 && sn_nccl_complete(st, c, ncclInternalError,
                                    "ncclCommWindowDeregister (XLA)") < 0)
        goto fail;
    for (sn_window *w = c->windows; w != NULL; w = w->next) {
        if (w->win == NULL)
            continue;
        Py_BEGIN_ALLOW_THREADS
        rc = ncclCommWindowDeregister(c->comm, w->win);
        Py_END_ALLOW_THREADS
        w->win = NULL;
        if (sn_nccl_complete(st, c, rc, "ncclCommWindowDeregister") < 0)
            goto fail;
    }
    free_staging_memory(c);
    if (c->scratch != NULL) {
        cudaFree(c->scratch);
        c->scratch = NULL;
    }
    if (c->lsa_event != NULL) {
        cudaEventDestroy(c->lsa_event);
        c->lsa_event = NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ncclCommFinalize(c->comm);
    Py_END_ALLOW_THREADS
    if (sn_nccl_complete(st, c, rc, "ncclCommFinalize") < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclCommDestroy(c->comm);
    Py_END_ALLOW_THREADS
    c->comm = NULL;
    c->closed = 1;
    sn_device_pop(prev);
    if (rc != ncclSuccess)
        return sn_set_nccl_error(st, rc, NULL, "ncclCommDestroy");
    return 0;

fail:
    sn_device_pop(prev);
    return -1;
}

static int
comm_abort_impl(CommObject *c)
{
    if (c->closed == 2 || c->comm == NULL) {
        c->closed = c->closed ? c->closed : 2;
        return 0;
    }
    /* After an abort nothing may be called on the communicator: the device
     * communicator and windows go with it. */
    sn_xla_forget(c);
    sn_xla_release_windows(c, 0);
    free(c->devcomm);
    c->devcomm = NULL;
    detach_windows(c);
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclCommAbort(c->comm);
    Py_END_ALLOW_THREADS
    c->comm = NULL;
    c->closed = 2;
    c->scratch = NULL;   /* leaked on purpose: the device may be wedged */
    c->lsa_event = NULL;
    c->staging = NULL;
    c->staging_win = NULL;
    (void)rc;
    return 0;
}

int
sn_comm_shutdown_all(SNState *st, double timeout)
{
    int failures = 0;
    for (CommObject *c = st->live; c != NULL; c = c->live_next) {
        if (c->closed)
            continue;
        double t = c->timeout;
        c->timeout = timeout < t ? timeout : t;
        if (comm_close_impl(st, c) < 0) {
            PyErr_Clear();
            comm_abort_impl(c);
            failures++;
        }
        c->timeout = t;
    }
    return failures;
}

static PyObject *
comm_close(CommObject *self, PyObject *unused)
{
    SNState *st = comm_state(self);
    if (comm_close_impl(st, self) < 0) {
        /* A close that cannot complete must not leave peers waiting on a
         * half-closed communicator: abort it, then report. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        comm_abort_impl(self);
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
comm_abort(CommObject *self, PyObject *unused)
{
    comm_abort_impl(self);
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
        live_remove(st, self);
    if (!self->closed && self->comm != NULL && st != NULL &&
        !st->shutting_down) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (comm_close_impl(st, self) < 0) {
            PyErr_WriteUnraisable((PyObject *)self);
            comm_abort_impl(self);
        }
        PyErr_Restore(et, ev, tb);
    }
    sn_window *w = self->windows;
    while (w != NULL) {
        sn_window *next = w->next;
        free(w);
        w = next;
    }
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
    if (sn_comm_check_usable(st, self) < 0)
        return NULL;
    int ndim;
    int64_t shape[SN_MAX_NDIM];
    SN_DLDataType dt;
    if (sn_parse_shape(shape_obj, &ndim, shape) < 0)
        return NULL;
    if (dtype_obj == NULL || dtype_obj == Py_None)
        sn_dtype_from_name("float32", &dt);
    else if (sn_parse_dtype(dtype_obj, &dt) < 0)
        return NULL;
    return sn_buffer_new(st, self, st->SymmetricBufferType, ndim, shape, dt,
                         zero, NULL);
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
static PyObject *get_closed(CommObject *s, void *c) { return PyBool_FromLong(s->closed != 0); }
static PyObject *get_timeout(CommObject *s, void *c) { return PyFloat_FromDouble(s->timeout); }

static PyObject *
get_staging_bytes(CommObject *s, void *c)
{
    return PyLong_FromSize_t(s->staging != NULL ? s->staging_bytes : 0);
}

static PyObject *
get_symmetric_reason(CommObject *s, void *c)
{
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
        "symmetric=%s multicast=%s%s>", s->rank, s->nranks, s->device,
        s->lsa_size, s->symmetric ? "True" : "False",
        s->multicast ? "True" : "False",
        s->closed == 1 ? " closed" : s->closed == 2 ? " aborted" : "");
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
    {"multicast", (getter)get_multicast, NULL,
     "True only when NCCL granted an NVLink multicast (NVLS) handle.", NULL},
    {"multicast_reason", (getter)get_multicast_reason, NULL,
     "Why multicast is or is not available.", NULL},
    {"closed", (getter)get_closed, NULL, "True after close() or abort().",
     NULL},
    {"timeout", (getter)get_timeout, NULL,
     "Seconds any wait for peers may take before TimeoutError.", NULL},
    {"staging_bytes", (getter)get_staging_bytes, NULL,
     "Size of the staging window the LSA kernels copy non-window inputs "
     "through (0 when they are unavailable). Larger inputs are chunked.",
     NULL},
    {"nccl_comm", (getter)get_handle, NULL,
     "The ncclComm_t as an integer (for interop; do not destroy it).", NULL},
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
    if (!PyArg_ParseTuple(args, "Oi:_lsa_pointer", &obj, &peer) ||
        sn_comm_check_usable(st, self) < 0)
        return NULL;
    if (!PyObject_TypeCheck(obj, st->SymmetricBufferType)) {
        PyErr_SetString(PyExc_TypeError, "expected a SymmetricBuffer");
        return NULL;
    }
    BufferObject *b = (BufferObject *)obj;
    if (b->win == NULL || b->comm != self || !self->symmetric ||
        peer < 0 || peer >= self->lsa_size) {
        PyErr_Format(PyExc_ValueError, "no LSA pointer: the buffer must be "
                     "a registered window of this communicator and 0 <= "
                     "peer < lsa_size (%d), got peer %d", self->lsa_size,
                     peer);
        return NULL;
    }
    int prev;
    if (sn_device_push(st, self->device, &prev) < 0)
        return NULL;
    void *p = NULL;
    cudaError_t e = symnccl_lsa_pointer(b->win->win,
                                        (size_t)(b->ptr - b->win->base),
                                        peer, &p);
    sn_device_pop(prev);
    if (e != cudaSuccess)
        return (sn_set_cuda_error(st, e, "reading the LSA pointer"), NULL);
    return PyLong_FromVoidPtr(p);
}

/* _copy(dst, src, nbytes, stream, engine): cudaMemcpyAsync ("memcpy") or
 * symnccl's copy kernel ("kernel", 16-byte loads) between raw addresses. */
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
    int prev;
    if (sn_device_push(st, self->device, &prev) < 0)
        return NULL;
    cudaError_t e;
    if (strcmp(engine, "memcpy") == 0)
        e = cudaMemcpyAsync((void *)(uintptr_t)dst, (void *)(uintptr_t)src,
                            (size_t)nbytes, cudaMemcpyDeviceToDevice,
                            (cudaStream_t)(uintptr_t)stream);
    else if (strcmp(engine, "kernel") == 0)
        e = symnccl_copy((void *)(uintptr_t)dst, (void *)(uintptr_t)src,
                         (size_t)nbytes, ctas,
                         (cudaStream_t)(uintptr_t)stream);
    else {
        sn_device_pop(prev);
        PyErr_Format(PyExc_ValueError, "engine must be 'memcpy' or "
                     "'kernel', got %s", engine);
        return NULL;
    }
    sn_device_pop(prev);
    if (e != cudaSuccess)
        return (sn_set_cuda_error(st, e, "_copy"), NULL);
    Py_RETURN_NONE;
}

static PyMethodDef comm_methods[] = {
    {"_lsa_pointer", (PyCFunction)comm_lsa_pointer, METH_VARARGS,
     "_lsa_pointer(buf, peer) -> int (benchmark hook)"},
    {"_copy", (PyCFunction)comm_copy, METH_VARARGS,
     "_copy(dst, src, nbytes, stream, engine, ctas=64) (benchmark hook)"},
    {"init_all", (PyCFunction)(void (*)(void))comm_init_all,
     METH_CLASS | METH_VARARGS | METH_KEYWORDS,
     "init_all(devices, *, timeout=600.0, multicast=None) -> list\n\n"
     "One communicator per device, all driven from this thread (rank i on "
     "devices[i]). Collective calls on them (empty, zeros, all_reduce, ...) "
     "must be issued for every communicator inside one symnccl.group().\n\n"
     "Example:\n    comms = symnccl.Communicator.init_all([0, 1])\n"
     "    with symnccl.group():\n"
     "        bufs = [c.empty(1024, 'bfloat16') for c in comms]"},
    {"empty", (PyCFunction)(void (*)(void))comm_empty,
     METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype='float32') -> SymmetricBuffer\n\n"
     "Allocates with ncclMemAlloc and registers one NCCL_WIN_COLL_SYMMETRIC "
     "window. Collective: every rank must call it with the same size.\n\n"
     "Example:\n    buf = comm.empty((4096,), 'bfloat16')\n"
     "    t = torch.from_dlpack(buf)   # zero-copy"},
    {"zeros", (PyCFunction)(void (*)(void))comm_zeros,
     METH_VARARGS | METH_KEYWORDS,
     "zeros(shape, dtype='float32') -> SymmetricBuffer\n\nLike empty(), "
     "filled with zeros."},
    {"all_reduce", (PyCFunction)(void (*)(void))sn_all_reduce,
     METH_VARARGS | METH_KEYWORDS,
     "all_reduce(x, out=None, op='sum', algo='auto', stream=None)\n\n"
     "Reduces x over all ranks. Without out= the result is written in place "
     "(for JAX arrays, which are immutable, into a new array). Returns the "
     "result in x's framework type, zero-copy. Runs on `stream`, else the "
     "framework's current stream, else the legacy default stream; never "
     "blocks the host.\n\nops: sum, prod, max, min, avg.\n"
     "algo: 'auto' (measured table, SYMNCCL_ALGO overrides); symnccl's "
     "kernels on the NCCL device API: 'll' (barrier-free LL packets, small "
     "messages), 'one_shot', 'two_shot' (NVLink loads; inputs outside a "
     "window go through the staging window), 'push' (store-only two-shot "
     "with flags, any input), 'multimem' (NVLink SHARP, only where multicast "
     "was granted); 'nccl'. Every rank must pass the same algo and the same "
     "kind of input (all in a SymmetricBuffer at the same offset, or none). "
     "Calls on one communicator from different streams are ordered by "
     "symnccl; a replayed CUDA graph must not overlap other calls on the "
     "same communicator.\n\n"
     "Example:\n    comm.all_reduce(t)                 # in place\n"
     "    y = comm.all_reduce(x, out=y, op='max')"},
    {"reduce_scatter", (PyCFunction)(void (*)(void))sn_reduce_scatter,
     METH_VARARGS | METH_KEYWORDS,
     "reduce_scatter(x, out=None, op='sum', algo='nccl', stream=None)\n\n"
     "x holds nranks * n elements; rank r receives the reduction of block "
     "r (n elements). Without out=, a new tensor of x's framework type is "
     "returned: shape (x.shape[0] // nranks, *x.shape[1:]) when the first "
     "dimension divides, else 1-D.\n\n"
     "Example:\n    part = comm.reduce_scatter(x)"},
    {"all_gather", (PyCFunction)(void (*)(void))sn_all_gather,
     METH_VARARGS | METH_KEYWORDS,
     "all_gather(x, out=None, algo='nccl', stream=None)\n\n"
     "Concatenates every rank's x (rank order) into out, which holds "
     "nranks * x.size elements; without out=, a new tensor of shape "
     "(nranks * x.shape[0], *x.shape[1:]).\n\n"
     "Example:\n    full = comm.all_gather(x)"},
    {"broadcast", (PyCFunction)(void (*)(void))sn_broadcast,
     METH_VARARGS | METH_KEYWORDS,
     "broadcast(x, root=0, out=None, stream=None)\n\n"
     "Copies root's x to every rank, in place unless out= is given.\n\n"
     "Example:\n    comm.broadcast(weights, root=0)"},
    {"barrier", (PyCFunction)(void (*)(void))sn_barrier,
     METH_VARARGS | METH_KEYWORDS,
     "barrier(stream=None, blocking=False)\n\n"
     "A device-side barrier on the stream (a one-element all-reduce). With "
     "blocking=True the host also waits for it, GIL released.\n\n"
     "Example:\n    comm.barrier(blocking=True)"},
    {"close", (PyCFunction)comm_close, METH_NOARGS,
     "close()\n\nWaits for this device's work, then destroys the device "
     "communicator, deregisters the windows, finalizes and destroys the "
     "communicator. Idempotent. Buffers and views stay valid as plain device "
     "memory.\n\nExample:\n    with symnccl.Communicator(uid, r, n, r) as "
     "comm:\n        ..."},
    {"abort", (PyCFunction)comm_abort, METH_NOARGS,
     "abort()\n\nncclCommAbort: for a communicator that timed out or whose "
     "peers died. Local, never waits."},
    {"__enter__", (PyCFunction)comm_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)comm_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyType_Slot comm_slots[] = {
    {Py_tp_doc,
     "Communicator(unique_id, rank, nranks, device=None, *, timeout=600.0, "
     "multicast=None, staging_bytes=32 MiB)\n\n"
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

PyType_Spec sn_communicator_spec = {
    .name = "symnccl.Communicator",
    .basicsize = sizeof(CommObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = comm_slots,
};
