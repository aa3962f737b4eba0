/* The registry: the one declaration of the dtypes, reduction ops and
 * algorithms symnccl knows, which algorithm auto picks, and the run-time
 * knobs. Everything else reads it: the collectives' argument parsing and
 * messages, the XLA handler, and Python (symnccl.DTYPES, ALGORITHMS, ...,
 * exported from here by sn_registry_export). docs/ARCHITECTURE.md says how
 * to add an entry.
 */
#include "symnccl.h"
#include "xla/xla_ffi_abi.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* dtypes: name, other spellings, DLPack code/bits, NCCL type, size, and
 * the kernel unit (launch.h's SYMNCCL_KERNEL_DTYPES) or -1. */

const sn_dtype sn_dtypes[] = {
    {"float32", "float fp32 f32", SN_kDLFloat, 32, ncclFloat32, 4,
     SYMNCCL_DT_F32, SNX_F32},
    {"bfloat16", "bf16", SN_kDLBfloat, 16, ncclBfloat16, 2, SYMNCCL_DT_BF16,
     SNX_BF16},
    {"float16", "half fp16 f16", SN_kDLFloat, 16, ncclFloat16, 2,
     SYMNCCL_DT_F16, SNX_F16},
    {"float64", "double fp64 f64", SN_kDLFloat, 64, ncclFloat64, 8,
     SYMNCCL_DT_F64, SNX_F64},
    {"float8_e4m3fn", "float8_e4m3 fp8_e4m3", SN_kDLFloat8_e4m3fn, 8,
     ncclFloat8e4m3, 1, SYMNCCL_DT_F8E4M3, SNX_F8E4M3FN},
    {"float8_e5m2", "fp8_e5m2", SN_kDLFloat8_e5m2, 8, ncclFloat8e5m2, 1,
     SYMNCCL_DT_F8E5M2, SNX_F8E5M2},
    {"int8", "", SN_kDLInt, 8, ncclInt8, 1, -1, SNX_S8},
    {"uint8", "", SN_kDLUInt, 8, ncclUint8, 1, -1, SNX_U8},
    {"int32", "", SN_kDLInt, 32, ncclInt32, 4, SYMNCCL_DT_I32, SNX_S32},
    {"uint32", "", SN_kDLUInt, 32, ncclUint32, 4, -1, SNX_U32},
    {"int64", "", SN_kDLInt, 64, ncclInt64, 8, SYMNCCL_DT_I64, SNX_S64},
    {"uint64", "", SN_kDLUInt, 64, ncclUint64, 8, -1, SNX_U64},
};
const int sn_n_dtypes = (int)(sizeof(sn_dtypes) / sizeof(sn_dtypes[0]));

/* ------------------------------------------------------------------ */
/* reduction ops: name, NCCL's, the kernels' (or -1). */

const sn_op sn_ops[] = {
    {"sum", ncclSum, SYMNCCL_OP_SUM},
    {"prod", ncclProd, -1},
    {"max", ncclMax, SYMNCCL_OP_MAX},
    {"min", ncclMin, SYMNCCL_OP_MIN},
    {"avg", ncclAvg, SYMNCCL_OP_AVG},
};
const int sn_n_ops = (int)(sizeof(sn_ops) / sizeof(sn_ops[0]));

/* ------------------------------------------------------------------ */
/* Algorithms and kernels: views of the kernel table (kernels/table.h). */

#define ALGO_(id, name, summary) [SN_ALGO_##id] = {name, summary},
const sn_algo sn_algos[SN_ALGO_COUNT] = {SYMNCCL_ALGOS(ALGO_)};
#undef ALGO_

/* Each kernel's algorithm: the one column of the table that only the C
 * side reads. */
#define KALGO_(id, name, coll, algo, ...) [SYMNCCL_K_##id] = SN_ALGO_##algo,
static const int kernel_algo[SYMNCCL_K_COUNT] = {
    SYMNCCL_KERNEL_TABLE(KALGO_)};
#undef KALGO_

#define NAME_(id, name, ...) name,
static const char *const kernel_names[SYMNCCL_K_COUNT + 1] = {
    SYMNCCL_KERNEL_TABLE(NAME_) "nccl"};
#undef NAME_
#define NAME_(id, name) name,
static const char *const collective_names[SYMNCCL_COLL_COUNT] = {
    SYMNCCL_COLLECTIVES(NAME_)};
#undef NAME_

/* kernel_of[collective][algo][shot]: the kernel, or -1; filled from the
 * table once at import (index_kernels), read on every call. */
static signed char kernel_of[SYMNCCL_COLL_COUNT][SN_ALGO_COUNT][2];
/* the collectives with a kernel (the others are NCCL's only) */
static int has_kernels[SYMNCCL_COLL_COUNT];
/* per collective: "no kernel of this algorithm runs this collective (those
 * that do: ll, ll128, push, nccl)", with the names read off the table */
static char no_kernel[SYMNCCL_COLL_COUNT][192];
/* "expected all_reduce, reduce_scatter, ..." */
static char collective_choices[192];

static int
index_kernels(void)
{
    memset(kernel_of, -1, sizeof(kernel_of));
    for (int k = 0; k < SYMNCCL_K_COUNT; k++) {
        const symnccl_kernel_row r = symnccl_kernel_row_of(k);
        signed char *slot = &kernel_of[r.collective][kernel_algo[k]][r.shot];
        if (*slot >= 0) {   /* two rows for one call: the table is wrong */
            PyErr_Format(PyExc_SystemError, "kernels/table.h: %s and %s "
                         "both run %s with algorithm %s (shot %d)",
                         kernel_names[*slot], r.name,
                         sn_collective_name(r.collective),
                         sn_algos[kernel_algo[k]].name, r.shot);
            return -1;
        }
        *slot = (signed char)k;
        has_kernels[r.collective] = 1;
    }
    size_t n = 0;
    for (int coll = 0; coll < SYMNCCL_COLL_COUNT; coll++) {
        if (!has_kernels[coll])
            continue;
        n += (size_t)snprintf(collective_choices + n,
                              sizeof(collective_choices) - n, "%s%s",
                              n ? ", " : "", sn_collective_name(coll));
        char *m = no_kernel[coll];
        const size_t size = sizeof(no_kernel[coll]);
        size_t len = (size_t)snprintf(m, size, "no kernel of this algorithm "
                                      "runs this collective (those that do: ");
        for (int algo = 0; algo < SN_ALGO_COUNT && len < size; algo++)
            if (kernel_of[coll][algo][SYMNCCL_SHOT_ONE] >= 0)
                len += (size_t)snprintf(m + len, size - len, "%s, ",
                                        sn_algos[algo].name);
        if (len < size)
            snprintf(m + len, size - len, "nccl)");
    }
    return 0;
}

int
sn_kernel_for(int collective, int algo, int shot)
{
    if (collective < 0 || collective >= SYMNCCL_COLL_COUNT || algo < 0 ||
        algo >= SN_ALGO_COUNT)
        return -1;
    const int k = kernel_of[collective][algo][shot != 0];
    /* no two-shot of its own: the algorithm's kernel */
    return k >= 0 || !shot ? k : kernel_of[collective][algo][0];
}

int
sn_kernel_algo(int kernel)
{
    return kernel >= 0 && kernel < SYMNCCL_K_COUNT ? kernel_algo[kernel]
                                                   : SN_ALGO_NCCL;
}


const char *
sn_kernel_name(int kernel)
{
    return kernel >= 0 && kernel <= SYMNCCL_K_COUNT ? kernel_names[kernel]
                                                    : "?";
}

const char *
sn_collective_name(int collective)
{
    return collective >= 0 && collective < SYMNCCL_COLL_COUNT
               ? collective_names[collective] : "?";
}

/* What the multicast kernel reduces in the NVSwitch (multimem.ld_reduce):
 * fp32 adds only; the fp8 forms need sm_100a targets and are not built. */
#define OPBIT(op) (1u << (op))
static const struct { int dtype; unsigned ops; } multimem_ops[] = {
    {SYMNCCL_DT_F32, OPBIT(SYMNCCL_OP_SUM) | OPBIT(SYMNCCL_OP_AVG)},
    {SYMNCCL_DT_F16, OPBIT(SYMNCCL_OP_SUM) | OPBIT(SYMNCCL_OP_AVG) |
                         OPBIT(SYMNCCL_OP_MAX) | OPBIT(SYMNCCL_OP_MIN)},
    {SYMNCCL_DT_BF16, OPBIT(SYMNCCL_OP_SUM) | OPBIT(SYMNCCL_OP_AVG) |
                          OPBIT(SYMNCCL_OP_MAX) | OPBIT(SYMNCCL_OP_MIN)},
};

static int
multimem_takes(const sn_dtype *dt, const sn_op *op)
{
    for (size_t i = 0; i < sizeof(multimem_ops) / sizeof(multimem_ops[0]);
         i++)
        if (multimem_ops[i].dtype == dt->kernel && op->kernel >= 0)
            return (multimem_ops[i].ops & OPBIT(op->kernel)) != 0;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Which algorithm can run where. */

const char *
sn_algo_unavailable(const sn_topology *t, int algo, const sn_dtype *dt,
                    const sn_op *op)
{
    if (algo == SN_ALGO_NCCL)
        return NULL;
    if (!t->symmetric)
        return "the NCCL device API is not usable on this communicator";
    if (t->lsa_size != t->nranks)
        return "not every rank is reachable by NVLink load/store";
    if (t->nranks > SYMNCCL_MAX_RANKS)
        return "more ranks than symnccl's kernels take";
    if (!t->staging)
        return "the communicator has no staging window";
    if (op != NULL && op->kernel < 0)
        return "this op has no symnccl kernel (NCCL runs it)";
    if (dt != NULL && dt->kernel < 0)
        return "this dtype has no symnccl kernel (NCCL runs it)";
    if (algo == SN_ALGO_PUSH && !t->push)
        return "the communicator has no push region";
    if (algo == SN_ALGO_MULTIMEM) {
        if (!t->multicast)
            return t->multicast_reason != NULL
                       ? t->multicast_reason
                       : "multicast was not granted on this communicator";
        if (dt == NULL || op == NULL || !multimem_takes(dt, op))
            return "this dtype/op has no multimem reduction in PTX";
    }
    return NULL;
}

const char *
sn_collective_unavailable(const sn_topology *t, int collective, int algo,
                          const sn_dtype *dt, const sn_op *op)
{
    if (algo == SN_ALGO_NCCL)
        return NULL;
    const int k = sn_kernel_for(collective, algo, SYMNCCL_SHOT_ONE);
    if (k < 0)
        return no_kernel[collective];
    /* a kernel that moves bytes takes every dtype, and no op */
    if (symnccl_kernel_row_of(k).bytes)
        dt = NULL, op = NULL;
    /* a FLOAT kernel exists in the float32, float16, bfloat16 units only */
    if (symnccl_kernel_row_of(k).unit == SYMNCCL_UNIT_FLOAT && dt != NULL &&
        !SYMNCCL_UNIT_FLOAT_TAKES(dt->kernel))
        return "this dtype has no kernel of this collective (float32, "
               "float16 and bfloat16 have)";
    return sn_algo_unavailable(t, algo, dt, op);
}

/* ------------------------------------------------------------------ */
/* algo="auto": one table for every collective. A row serves one
 * collective at world sizes up to max_ranks (the first row that fits);
 * a call whose larger buffer (an all-gather's output, else the input) is
 * `bytes` takes the first algorithm whose limit it is within, in the
 * order ll, ll128, one_shot, two_shot, else `above`. two_shot's limit
 * depends on whether the input lies in a window (peers load it in place)
 * or is a plain tensor (copied through the staging window first). No row
 * (a collective or world size not measured), or a kernel that cannot take
 * the call: NCCL. The measurements behind each limit: docs/PERFORMANCE.md,
 * "The auto tables".
 *
 * all_reduce, 2x/3x/4x H200, bf16, CUDA-graph replay: on 2 ranks ll128
 * 256 KiB 4.1 vs ll 4.7 us, 1 MiB 7.6 vs two_shot 9.0. On 3+ ranks ll128
 * is its two-shot from 512 KiB (SYMNCCL_LL128_TWO_SHOT_KIB): 4x 1 MiB
 * 10.1-11.2 us vs two_shot 12.6-14.1, 3x 1 MiB 8.9 vs push 13.5; below
 * that its one-shot beats ll (4x 256 KiB 6.4-7.2 vs 7.7-8.7). 5-7 ranks
 * follow the 4-rank row without having been measured; from 8 ranks NCCL
 * (measured at 8 before ll, ll128 and push existed). one_shot won at no
 * size (it reads n-1 whole copies where two_shot reads one); multimem is
 * never chosen automatically.
 *
 * The other four, 2x H200 (results/collectives_h200x2_bfloat16.json):
 * reduce_scatter: ll128 3.3-3.9 us up to 512 KiB (ll within 0.2 us of
 * it), 6.2 at 1 MiB, 7.7 at 2 MiB (push 10.3), then push: 4 MiB 14.1
 * (ll128 15.8), 16 MiB 48 (NCCL 53), 64 MiB 153 (NCCL 176). all_gather: ll
 * 2.8-3.3 us up to 64 KiB (ll128 0.1 us behind), ll128 to 4 MiB (13.1,
 * push 13.9), then push: 16 MiB 40 (NCCL 57), 64 MiB 128 (NCCL 162).
 * reduce and broadcast: one_shot 5.9-6.6 us up to 64 KiB (NCCL 8-10),
 * 22.7 / 29.3 at 4 MiB (NCCL 26.6 / 29.8), NCCL from 16 MiB (one_shot
 * reads the root's whole tensor on every rank: 86-110 us against NCCL's
 * 63-66). 3+ ranks: not measured yet, NCCL. */

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define ANY_SIZE ((size_t)1 << 60)   /* a limit no call reaches */

/* A row: the algorithm of a call of `bytes` is the first whose limit it
 * does not exceed, in the order of the fields (a limit of 0: never, but
 * for an empty call, which launches nothing), then `above`. */
typedef struct {
    int collective, max_ranks;
    size_t ll, ll128, one_shot, two_shot_window, two_shot_tensor, push;
    int above;
} auto_row;

static const auto_row auto_table[] = {
    {SYMNCCL_COLL_ALL_REDUCE, 2, 64 * KIB, 1 * MIB, 0, 4 * MIB, 0, 0,
     SN_ALGO_PUSH},
    {SYMNCCL_COLL_ALL_REDUCE, 3, 0, 1536 * KIB, 0, 0, 0, 0, SN_ALGO_PUSH},
    {SYMNCCL_COLL_ALL_REDUCE, 7, 0, 1536 * KIB, 0, 4 * MIB, 2 * MIB, 0,
     SN_ALGO_PUSH},
    {SYMNCCL_COLL_REDUCE_SCATTER, 2, 0, 2 * MIB, 0, 0, 0, 0, SN_ALGO_PUSH},
    {SYMNCCL_COLL_ALL_GATHER, 2, 64 * KIB, 4 * MIB, 0, 0, 0, 0, SN_ALGO_PUSH},
    {SYMNCCL_COLL_REDUCE, 2, 0, 0, 4 * MIB, 0, 0, 0, SN_ALGO_NCCL},
    {SYMNCCL_COLL_BROADCAST, 2, 0, 0, 4 * MIB, 0, 0, 0, SN_ALGO_NCCL},
    /* all_to_all and all_to_all_v (by out's bytes, which every rank
     * agrees on), bf16, CUDA-graph replay, against
     * torch.distributed.all_to_all_single (NCCL). 2x H200
     * (benchmarks/results/alltoall_h200x2_bfloat16.json): ll 5.1-7.7 us
     * up to 1 MiB (NCCL 10.6-15.1); push 18.7 / 43.2 us at 4 / 16 MiB
     * (NCCL 21.7 / 55.7), behind it at 64 MiB (150.5 against 140.8): NCCL
     * above 16 MiB. 2x H100 (issue 38's run): the same order (ll 4.6-7.3
     * up to 1 MiB, push 20.1 / 46.7 at 4 / 16 MiB, NCCL at 64 MiB). */
    {SYMNCCL_COLL_ALL_TO_ALL, 2, 1 * MIB, 0, 0, 0, 0, 16 * MIB,
     SN_ALGO_NCCL},
    /* all_reduce_rmsnorm, bf16, CUDA-graph replay. 1 rank (1x H100,
     * benchmarks/results/fused_h100x1_bfloat16.json): one_shot (the
     * add+norm with no peer) at every size measured, 3.9-5.7 us against
     * 8.5-16.5 for all_reduce + torch's add + rms_norm up to T 128 x H 8192
     * (2 MiB), 75.9 against 115.2 at 32 MiB. 2 ranks over NVLink (2x H200,
     * fused_h200x2_bfloat16.json; H 4096 and 8192, T 1-2048): ll ahead to
     * 256 KiB, the largest measured below 1 MiB (T 1: 6.4-7.8 us against
     * one_shot's 8.8-10.8): the row takes it to 512 KiB; one_shot from
     * 1 MiB (12.9 against ll's 17.2) to 32 MiB (136.0 against the
     * composed path's 149.9 and unfused 159.9); past 32 MiB, and from 3
     * ranks, "nccl" resolved from "auto": all_reduce's own choice, then
     * symnccl's add+norm (sn_then_norm_algo). */
    {SYMNCCL_COLL_ALL_REDUCE_RMSNORM, 1, 0, 0, ANY_SIZE, 0, 0, 0,
     SN_ALGO_NCCL},
    {SYMNCCL_COLL_ALL_REDUCE_RMSNORM, 2, 512 * KIB, 0, 32 * MIB, 0, 0, 0,
     SN_ALGO_NCCL},
};
#define N_AUTO (sizeof(auto_table) / sizeof(auto_table[0]))

static int
auto_algo(const sn_topology *t, const sn_knobs *k, const sn_call_desc *d)
{
    /* SYMNCCL_ALGO overrides the table wherever that algorithm can run the
     * call ("nccl": every call) */
    if (k->algo == SN_ALGO_NCCL ||
        (k->algo >= 0 &&
         sn_collective_unavailable(t, d->collective, k->algo, d->dtype,
                                   d->op) == NULL))
        return k->algo;
    const auto_row *r = NULL;
    for (size_t i = 0; i < N_AUTO && r == NULL; i++)
        if (auto_table[i].collective == d->collective &&
            t->nranks <= auto_table[i].max_ranks)
            r = &auto_table[i];
    if (r == NULL)
        return SN_ALGO_NCCL;
    const size_t b = d->bytes;
    const int algo =
        b <= r->ll         ? SN_ALGO_LL
        : b <= r->ll128    ? SN_ALGO_LL128
        : b <= r->one_shot ? SN_ALGO_ONE_SHOT
        : b <= (d->in_window ? r->two_shot_window : r->two_shot_tensor)
            ? SN_ALGO_TWO_SHOT
        : b <= r->push ? SN_ALGO_PUSH
                       : r->above;
    /* a dtype, op or communicator its kernel cannot take: NCCL */
    if (sn_collective_unavailable(t, d->collective, algo, d->dtype,
                                  d->op) != NULL)
        return SN_ALGO_NCCL;
    return algo;
}

int
sn_then_norm_algo(const sn_topology *t, const sn_knobs *k, int asked,
                  const sn_dtype *dt, size_t bytes)
{
    if (asked != SN_ALGO_AUTO)
        return SN_ALGO_NCCL;
    const sn_call_desc ar = {
        .collective = SYMNCCL_COLL_ALL_REDUCE,
        .algo = SN_ALGO_AUTO,
        .bytes = bytes,
        .dtype = dt,
        .op = sn_op_by_name("sum"),
    };
    return auto_algo(t, k, &ar);
}

int
sn_resolve(const sn_topology *t, const sn_knobs *k, const sn_call_desc *d,
           char *why, size_t len)
{
    const char *cname = sn_collective_name(d->collective);
    int algo = d->algo;
    if (d->collective < 0 || d->collective >= SYMNCCL_COLL_COUNT ||
        !has_kernels[d->collective] || algo < SN_ALGO_AUTO ||
        algo >= SN_ALGO_COUNT) {
        snprintf(why, len, "no algorithm %d for collective %d", algo,
                 d->collective);
        return SN_ALGO_UNKNOWN;
    }
    if (algo == SN_ALGO_AUTO)   /* inside a group: NCCL's grouping */
        algo = d->in_group ? SN_ALGO_NCCL : auto_algo(t, k, d);
    else if (algo != SN_ALGO_NCCL) {
        const char *no = sn_collective_unavailable(t, d->collective, algo,
                                                   d->dtype, d->op);
        if (no != NULL) {
            snprintf(why, len, "algo '%s' cannot run this %s (%s%s%s%s): %s",
                     sn_algos[algo].name, cname,
                     d->dtype != NULL ? d->dtype->name : "any dtype",
                     d->op != NULL ? ", op '" : "",
                     d->op != NULL ? d->op->name : "",
                     d->op != NULL ? "'" : "", no);
            return SN_ALGO_UNKNOWN;
        }
        if (d->in_group) {
            snprintf(why, len, "algo '%s' cannot run inside "
                     "symnccl.group(); use algo='nccl'", sn_algos[algo].name);
            return SN_ALGO_UNKNOWN;
        }
    }
    /* all_reduce_rmsnorm's "auto" beyond its kernels runs all_reduce's
     * own choice, then the add+norm: NCCL only where that is NCCL */
    if (algo == SN_ALGO_NCCL && !t->nccl &&
        !(d->collective == SYMNCCL_COLL_ALL_REDUCE_RMSNORM &&
          sn_then_norm_algo(t, k, d->algo, d->dtype, d->bytes) !=
              SN_ALGO_NCCL)) {
        snprintf(why, len, "%s: this call needs NCCL, and a loopback "
                 "communicator (Communicator._loopback) runs symnccl's "
                 "kernels only", cname);
        return SN_ALGO_UNKNOWN;
    }
    return algo;
}

int
sn_collective_by_name(const char *cname)
{
    for (int i = 0; i < SYMNCCL_COLL_COUNT; i++)
        if (has_kernels[i] && strcmp(cname, collective_names[i]) == 0)
            return i;
    PyErr_Format(PyExc_ValueError, "unknown collective '%s': expected %s",
                 cname, collective_choices);
    return -1;
}

int
sn_call_unavailable(const sn_topology *t, const char *cname, int algo,
                    const sn_dtype *dt, const sn_op *op, const char **why)
{
    const int coll = sn_collective_by_name(cname);
    if (coll < 0)
        return -1;
    *why = algo == SN_ALGO_AUTO
               ? NULL
               : sn_collective_unavailable(t, coll, algo, dt, op);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Lookups. */

static int
in_list(const char *name, const char *list)
{
    size_t len = strlen(name);
    for (const char *p = list; *p != '\0';) {
        const char *end = strchr(p, ' ');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0)
            return 1;
        p += n + (end != NULL);
    }
    return 0;
}

const sn_dtype *
sn_dtype_by_name(const char *name)
{
    for (int i = 0; i < sn_n_dtypes; i++)
        if (strcmp(name, sn_dtypes[i].name) == 0 ||
            in_list(name, sn_dtypes[i].aliases))
            return &sn_dtypes[i];
    return NULL;
}

const sn_dtype *
sn_dtype_by_dlpack(SN_DLDataType dt)
{
    if (dt.lanes != 1)
        return NULL;
    for (int i = 0; i < sn_n_dtypes; i++)
        if (sn_dtypes[i].dl_code == dt.code && sn_dtypes[i].dl_bits == dt.bits)
            return &sn_dtypes[i];
    return NULL;
}

const sn_dtype *
sn_dtype_by_xla(int type)
{
    for (int i = 0; i < sn_n_dtypes; i++)
        if (sn_dtypes[i].xla == type)
            return &sn_dtypes[i];
    return NULL;
}

const sn_op *
sn_op_by_nccl(int code)
{
    for (int i = 0; i < sn_n_ops; i++)
        if ((int)sn_ops[i].nccl == code)
            return &sn_ops[i];
    return NULL;
}

const sn_op *
sn_op_by_name(const char *name)
{
    for (int i = 0; i < sn_n_ops; i++)
        if (strcmp(name, sn_ops[i].name) == 0)
            return &sn_ops[i];
    return NULL;
}

int
sn_algo_by_name(const char *name)
{
    if (strcmp(name, "auto") == 0)
        return SN_ALGO_AUTO;
    for (int i = 0; i < SN_ALGO_COUNT; i++)
        if (strcmp(name, sn_algos[i].name) == 0)
            return i;
    return SN_ALGO_UNKNOWN;
}

int
sn_registry_lookup(const char *algo, const char *dtype, const char *op,
                   int *a, const sn_dtype **dt, const sn_op **o)
{
    *a = sn_algo_by_name(algo);
    *dt = sn_dtype_by_name(dtype);
    *o = sn_op_by_name(op);
    if (*a == SN_ALGO_UNKNOWN || *dt == NULL || *o == NULL) {
        PyErr_Format(PyExc_ValueError, "unknown algo %s, dtype %s or op %s: "
                     "expected names from symnccl.ALGORITHMS, DTYPES, OPS",
                     algo, dtype, op);
        return -1;
    }
    return 0;
}

const char *
sn_algo_choices(void)
{
    static char buf[256];
    if (buf[0] == '\0') {
        size_t n = (size_t)snprintf(buf, sizeof(buf), "'auto'");
        for (int i = 0; i < SN_ALGO_COUNT && n < sizeof(buf); i++)
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, ", '%s'",
                                  sn_algos[i].name);
    }
    return buf;
}

/* ------------------------------------------------------------------ */
/* Run-time knobs (README: "Build and run-time knobs"). Values outside
 * [lo, hi] are clamped; thread counts are rounded down to `multiple`. */

/* A name a knob also takes for one of its values. */
typedef struct {
    const char *name;
    int value;
} knob_name;

typedef struct {
    const char *env;
    size_t offset;             /* in sn_knobs */
    int dflt, lo, hi, multiple;
    const char *doc;
    const knob_name *names;    /* NULL, or names of values ({NULL} ends) */
} knob;

static const knob_name nccl_windows_names[] = {
    {"auto", SN_NCCL_WINDOWS_AUTO}, {NULL, 0}};

static const knob knobs[] = {
    {"SYMNCCL_THREADS", offsetof(sn_knobs, lsa_threads), 512, 32, 512, 32,
     "threads per CTA of one_shot and two_shot"},
    {"SYMNCCL_ONE_SHOT_CTAS", offsetof(sn_knobs, one_shot_ctas), 32, 1,
     SN_MAX_CTAS, 1, "largest one_shot grid"},
    {"SYMNCCL_TWO_SHOT_CTAS", offsetof(sn_knobs, two_shot_ctas), 64, 1,
     SN_MAX_CTAS, 1, "largest two_shot grid"},
    /* a CTA per row up to here: one_shot's 32 would leave T 128 rows four
     * to a CTA, one after another (kernels/rmsnorm.cuh) */
    {"SYMNCCL_RMSNORM_CTAS", offsetof(sn_knobs, rmsnorm_ctas), 128, 1,
     SN_MAX_CTAS, 1, "largest grid of all_reduce_rmsnorm's kernels with "
     "peers (a CTA per row)"},
    /* 0: as many CTAs as are resident at once (two of 512 threads per SM),
     * each with rows in flight (kernels/rmsnorm.cuh, add_rmsnorm; docs/
     * PERFORMANCE.md, 'Fused all-reduce, all-to-all and steps') */
    {"SYMNCCL_RMSNORM_LOCAL_CTAS", offsetof(sn_knobs, rmsnorm_local_ctas),
     0, 0, SYMNCCL_LOCAL_MAX_CTAS, 1, "largest grid of all_reduce_rmsnorm's "
     "add+norm with no peer (one rank, or after an all-reduce); 0: as many "
     "as are resident at once"},
    /* 64 CTAs: 256 KiB 5.4 -> 4.6 us on 2 ranks, 8.7 -> 7.9 us (two-shot
     * packets) on 4; the same at 4 KiB (docs/PERFORMANCE.md, 'Packets: ll
     * and ll128') */
    {"SYMNCCL_LL_CTAS", offsetof(sn_knobs, ll_ctas), 64, 1, SN_MAX_CTAS, 1,
     "grid of ll and ll128 (fixed per communicator)"},
    {"SYMNCCL_LL_THREADS", offsetof(sn_knobs, ll_threads), 512, 32, 512, 32,
     "threads per CTA of ll and ll128"},
    /* 8: a T 1 row's packets polled by 8 SMs, not one (one SM's poll cost
     * ~2.2 us of ll_rmsnorm's 8.0 at H 8192; kernels/rmsnorm.cuh,
     * docs/PERFORMANCE.md 'Predictions and outcomes': not yet measured) */
    {"SYMNCCL_FUSED_CLUSTER", offsetof(sn_knobs, fused_cluster), 8, 1,
     SYMNCCL_MAX_CLUSTER, 1, "all_reduce_rmsnorm's ll: each row split over "
     "a thread-block cluster of up to this many CTAs (the largest power of "
     "two that fits the row's block, the LL grid and the launch's rows; "
     "sm_90+); 1: a row is one CTA's"},
    {"SYMNCCL_LL_TWO_SHOT_KIB", offsetof(sn_knobs, ll_two_shot_kib), 128, 0,
     1 << 20, 1, "ll's two-shot from this size on 3+ ranks (0: at every size, on "
     "2 ranks too)"},
    /* 512 KiB: 4x 9.3 vs the one-shot's 11.3 us, 3x 8.2 vs 9.6; at 384 KiB
     * the one-shot is ahead (docs/PERFORMANCE.md, 'The auto tables') */
    {"SYMNCCL_LL128_TWO_SHOT_KIB", offsetof(sn_knobs, ll128_two_shot_kib),
     512, 0, 1 << 20, 1, "ll128's two-shot from this size on 3+ ranks (0: at every size, "
     "on 2 ranks too)"},
    /* 64 CTAs: two communicators' push kernels stay co-resident on a
     * 132-SM GPU (README: Streams) */
    {"SYMNCCL_PUSH_CTAS", offsetof(sn_knobs, push_ctas), 64, 1,
     SYMNCCL_PUSH_MAX_CTAS, 1, "grid of push (fixed per communicator)"},
    /* a multiple of 64: the reduce-scatter and all-gather split each CTA
     * into two warp groups (push.cuh) */
    {"SYMNCCL_PUSH_THREADS", offsetof(sn_knobs, push_threads), 512, 64, 512,
     64, "threads per CTA of push"},
    {"SYMNCCL_PUSH_REGION_MIB", offsetof(sn_knobs, push_region_mib), 64, 1,
     4096, 1, "size of push's region in the staging window"},
    /* 0 until measured on 2 GPUs: the split pipeline was designed for
     * NVLink (predicted 16 MiB 28-32 us against 48) and only a loopback
     * team on one GPU has run it (docs/PERFORMANCE.md, 'Push chunks') */
    {"SYMNCCL_PUSH_CHUNK_KIB", offsetof(sn_knobs, push_chunk_kib), 0, 0,
     1 << 20, 1, "push reduce_scatter/all_gather: 0 (or a slot or more): "
     "chunks of a whole slot; less: chunks of this many KiB, each CTA split "
     "into senders and consumers"},
    /* off by default: one all-gather and one synchronisation per call */
    {"SYMNCCL_CHECK", offsetof(sn_knobs, check), 0, 0, 1, 1,
     "1: ranks compare each eager call's collective, dtype, count, op, "
     "algo and root before running it (CallMismatchError)"},
    /* off: every NCCL wait bounded (docs/PERFORMANCE.md, 'Eager NCCL
     * calls: the launch thread') */
    {"SYMNCCL_NCCL_BLOCKING", offsetof(sn_knobs, nccl_blocking), 0, 0, 1, 1,
     "1: a blocking NCCL communicator: eager NCCL calls launch inline, "
     "without NCCL's launch thread, but init, window registration and "
     "host-side waits are no longer bounded by the timeout"},
    {"SYMNCCL_NCCL_WINDOWS", offsetof(sn_knobs, nccl_windows),
     SN_NCCL_WINDOWS_AUTO, 0, 2, 1, "NCCL's own kernels get windows: 0 "
     "never (plain memory), 1 wherever the buffers are windows, 2 or auto "
     "as csrc/runtime/nccl_policy.c's table says for the loaded NCCL",
     nccl_windows_names},
    {"SYMNCCL_PDL", offsetof(sn_knobs, pdl), 1, 0, 1, 1,
     "1: kernels are programmatic dependent launches, whose launch overlaps "
     "the end of the kernel before them on the stream"},
};
#define N_KNOBS (sizeof(knobs) / sizeof(knobs[0]))

/* The process's knob, read at its moment (the interpreter's exit: the
 * seconds each communicator left open gets to close before it is
 * aborted), not per communicator, and never refused: a value the timeout
 * check (sn_check_timeout) refuses warns, and the default is used, so
 * that exit still closes every communicator. */
static const struct {
    const char *env;
    int dflt;
    const char *doc;
} exit_knob = {"SYMNCCL_EXIT_TIMEOUT", 30,
               "seconds interpreter exit gives each communicator left open "
               "to close before aborting it (read at exit; a value the "
               "timeout check refuses warns and the default is used)"};

PyObject *
sn_py_exit_timeout(PyObject *module, PyObject *unused)
{
    const char *s = getenv(exit_knob.env);
    if (s == NULL)
        return PyFloat_FromDouble(exit_knob.dflt);
    PyObject *text = PyUnicode_DecodeFSDefault(s);
    if (text == NULL)
        return NULL;
    PyObject *f = PyFloat_FromString(text);
    const double v = f != NULL ? PyFloat_AsDouble(f) : -1.0;
    Py_XDECREF(f);
    if (f != NULL && sn_check_timeout(v, "timeout") == 0) {
        Py_DECREF(text);
        return PyFloat_FromDouble(v);
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const int rc = PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "%s=%R: %S; "
                                    "using %d s", exit_knob.env, text,
                                    value != NULL ? value : Py_None,
                                    exit_knob.dflt);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    Py_DECREF(text);
    return rc < 0 ? NULL : PyFloat_FromDouble(exit_knob.dflt);
}

int
sn_knobs_read(sn_knobs *k)
{
    for (size_t i = 0; i < N_KNOBS; i++) {
        const knob *kb = &knobs[i];
        int v = kb->dflt;
        const char *s = getenv(kb->env);
        const knob_name *named = NULL;
        for (const knob_name *n = kb->names; s != NULL && n != NULL &&
             n->name != NULL; n++)
            if (strcmp(s, n->name) == 0)
                named = n;
        if (named != NULL) {
            v = named->value;
        } else if (s != NULL && s[0] != '\0') {
            char *end;
            errno = 0;
            long x = strtol(s, &end, 10);
            if (errno != 0 || *end != '\0') {
                char also[128] = "";   /* " or NAME, NAME" */
                size_t used = 0;
                for (const knob_name *n = kb->names; n != NULL &&
                     n->name != NULL && used < sizeof(also); n++)
                    used += (size_t)snprintf(also + used, sizeof(also) - used,
                                             "%s%s", used ? ", " : " or ",
                                             n->name);
                PyErr_Format(PyExc_ValueError, "%s=%s is not an integer%s "
                             "(%s; default %d)", kb->env, s, also, kb->doc,
                             kb->dflt);
                return -1;
            }
            v = x < kb->lo ? kb->lo : x > kb->hi ? kb->hi : (int)x;
            v = v / kb->multiple * kb->multiple;
        }
        *(int *)((char *)k + kb->offset) = v;
    }
    k->algo = SN_ALGO_AUTO;
    const char *a = getenv("SYMNCCL_ALGO");
    if (a != NULL && a[0] != '\0') {
        k->algo = sn_algo_by_name(a);
        if (k->algo == SN_ALGO_UNKNOWN) {
            PyErr_Format(PyExc_ValueError, "SYMNCCL_ALGO=%s is not an "
                         "algorithm: expected one of %s", a,
                         sn_algo_choices());
            return -1;
        }
    }
    return 0;
}

PyObject *
sn_knobs_dict(const sn_knobs *k)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    PyObject *v = PyUnicode_FromString(k->algo >= 0 ? sn_algos[k->algo].name
                                                    : "auto");
    int rc = v != NULL ? PyDict_SetItemString(d, "SYMNCCL_ALGO", v) : -1;
    Py_XDECREF(v);
    for (size_t i = 0; rc == 0 && i < N_KNOBS; i++) {
        v = PyLong_FromLong(*(const int *)((const char *)k +
                                           knobs[i].offset));
        rc = v != NULL ? PyDict_SetItemString(d, knobs[i].env, v) : -1;
        Py_XDECREF(v);
    }
    if (rc < 0)
        Py_CLEAR(d);
    return d;
}

/* ------------------------------------------------------------------ */
/* Export to Python. */

static int
add(PyObject *module, const char *name, PyObject *value)
{
    if (value == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *
op_names(unsigned mask)
{
    PyObject *t = PyList_New(0);
    for (int i = 0; t != NULL && i < sn_n_ops; i++)
        if (sn_ops[i].kernel >= 0 && (mask & OPBIT(sn_ops[i].kernel))) {
            PyObject *s = PyUnicode_FromString(sn_ops[i].name);
            if (s == NULL || PyList_Append(t, s) < 0)
                Py_CLEAR(t);
            Py_XDECREF(s);
        }
    if (t == NULL)
        return NULL;
    PyObject *r = PyList_AsTuple(t);
    Py_DECREF(t);
    return r;
}

static const char *
dtype_name_of_kernel(int kernel_dt)
{
    for (int i = 0; i < sn_n_dtypes; i++)
        if (sn_dtypes[i].kernel == kernel_dt)
            return sn_dtypes[i].name;
    return NULL;
}

/* The kernel dtypes of launch.h and the registry must name the same
 * types: each X entry's NCCL type is the registry entry marked with it. */
static int
check_kernel_dtypes(void)
{
#define CHECK_(id, nccl_type, ctype)                                      \
    {                                                                     \
        const char *n = dtype_name_of_kernel(SYMNCCL_DT_##id);            \
        const sn_dtype *d = n != NULL ? sn_dtype_by_name(n) : NULL;       \
        if (d == NULL || d->nccl != (nccl_type)) {                        \
            PyErr_SetString(PyExc_SystemError, "registry.c and launch.h " \
                            "disagree on kernel dtype " #id);             \
            return -1;                                                    \
        }                                                                 \
    }
    SYMNCCL_KERNEL_DTYPES(CHECK_)
#undef CHECK_
    return 0;
}

/* KERNEL_TABLE: one dict per kernel, the table's columns by name. */
static PyObject *
kernel_table(void)
{
    static const char *const shots[] = {"one", "two"};
#define NAME_(id, name) name,
    static const char *const families[] = {SYMNCCL_FAMILIES(NAME_)};
    static const char *const plans[] = {SYMNCCL_PLANS(NAME_)};
    static const char *const units[] = {SYMNCCL_UNITS(NAME_)};
#undef NAME_
    PyObject *t = PyTuple_New(SYMNCCL_K_COUNT);
    for (int k = 0; t != NULL && k < SYMNCCL_K_COUNT; k++) {
        const symnccl_kernel_row r = symnccl_kernel_row_of(k);
        PyObject *d = Py_BuildValue(
            "{s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:O,s:s}", "id", k, "name", r.name,
            "collective", sn_collective_name(r.collective), "algo",
            sn_algos[kernel_algo[k]].name, "shot", shots[r.shot], "family",
            families[r.family], "plan", plans[r.plan], "bytes",
            r.bytes ? Py_True : Py_False, "unit", units[r.unit]);
        if (d == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SetItem(t, k, d);
    }
    return t;
}

/* ALGO_KERNELS: {algo: all_reduce's kernels of it (the one-shot, then the
 * two-shot where there is one)}; () for nccl. */
static PyObject *
algo_kernels(void)
{
    PyObject *d = PyDict_New();
    for (int a = 0; d != NULL && a < SN_ALGO_COUNT; a++) {
        const int k1 = kernel_of[SYMNCCL_COLL_ALL_REDUCE][a][0];
        const int k2 = kernel_of[SYMNCCL_COLL_ALL_REDUCE][a][1];
        PyObject *ks = k1 < 0   ? PyTuple_New(0)
                       : k2 < 0 ? Py_BuildValue("(s)", kernel_names[k1])
                                : Py_BuildValue("(ss)", kernel_names[k1],
                                                kernel_names[k2]);
        if (ks == NULL || PyDict_SetItemString(d, sn_algos[a].name, ks) < 0)
            Py_CLEAR(d);
        Py_XDECREF(ks);
    }
    return d;
}

/* COLLECTIVE_KERNELS: {collective: {algo: kernel}} for every collective
 * with kernels other than all_reduce (ALGO_KERNELS has its). */
static PyObject *
collective_kernels(void)
{
    PyObject *all = PyDict_New();
    for (int coll = 0; all != NULL && coll < SYMNCCL_COLL_COUNT; coll++) {
        if (!has_kernels[coll] || coll == SYMNCCL_COLL_ALL_REDUCE)
            continue;
        PyObject *d = PyDict_New();
        for (int a = 0; d != NULL && a < SN_ALGO_COUNT; a++) {
            const int k = kernel_of[coll][a][0];
            if (k < 0)
                continue;
            PyObject *kn = PyUnicode_FromString(kernel_names[k]);
            if (kn == NULL || PyDict_SetItemString(d, sn_algos[a].name,
                                                   kn) < 0)
                Py_CLEAR(d);
            Py_XDECREF(kn);
        }
        if (d == NULL ||
            PyDict_SetItemString(all, collective_names[coll], d) < 0)
            Py_CLEAR(all);
        Py_XDECREF(d);
    }
    return all;
}

int
sn_registry_export(PyObject *module)
{
    if (check_kernel_dtypes() < 0)
        return -1;
    if (index_kernels() < 0)
        return -1;
    PyObject *dtypes = PyTuple_New(sn_n_dtypes);
    PyObject *kdtypes = PyList_New(0);
    PyObject *fdtypes = PyList_New(0);
    if (dtypes == NULL || kdtypes == NULL || fdtypes == NULL)
        goto error;
    for (int i = 0; i < sn_n_dtypes; i++) {
        PyTuple_SetItem(dtypes, i, PyUnicode_FromString(sn_dtypes[i].name));
        if (sn_dtypes[i].kernel >= 0 &&
            PyList_Append(kdtypes, PyTuple_GetItem(dtypes, i)) < 0)
            goto error;
        /* all_reduce_rmsnorm's: the dtypes of the FLOAT units */
        if (sn_dtypes[i].kernel >= 0 &&
            SYMNCCL_UNIT_FLOAT_TAKES(sn_dtypes[i].kernel) &&
            PyList_Append(fdtypes, PyTuple_GetItem(dtypes, i)) < 0)
            goto error;
    }
    if (add(module, "DTYPES", Py_NewRef(dtypes)) < 0 ||
        add(module, "KERNEL_DTYPES", PyList_AsTuple(kdtypes)) < 0 ||
        add(module, "RMSNORM_DTYPES", PyList_AsTuple(fdtypes)) < 0)
        goto error;
    Py_CLEAR(dtypes);
    Py_CLEAR(kdtypes);
    Py_CLEAR(fdtypes);

    PyObject *ops = PyTuple_New(sn_n_ops);
    PyObject *codes = PyDict_New();
    if (ops == NULL || codes == NULL) {
        Py_XDECREF(ops);
        Py_XDECREF(codes);
        return -1;
    }
    for (int i = 0; i < sn_n_ops; i++) {
        PyTuple_SetItem(ops, i, PyUnicode_FromString(sn_ops[i].name));
        PyObject *v = PyLong_FromLong((long)sn_ops[i].nccl);
        int bad = v == NULL || PyDict_SetItemString(codes, sn_ops[i].name,
                                                    v) < 0;
        Py_XDECREF(v);
        if (bad) {
            Py_DECREF(ops);
            Py_DECREF(codes);
            return -1;
        }
    }
    if (add(module, "OPS", ops) < 0 || add(module, "OP_CODES", codes) < 0 ||
        add(module, "KERNEL_OPS", op_names(~0u)) < 0)
        return -1;

    PyObject *algos = PyTuple_New(SN_ALGO_COUNT);
    PyObject *acodes = Py_BuildValue("{s:i}", "auto", SN_ALGO_AUTO);
    PyObject *summary = PyDict_New();
    if (algos == NULL || acodes == NULL || summary == NULL)
        goto algo_error;
    for (int i = 0; i < SN_ALGO_COUNT; i++) {
        const sn_algo *a = &sn_algos[i];
        PyTuple_SetItem(algos, i, PyUnicode_FromString(a->name));
        PyObject *code = PyLong_FromLong(i);
        PyObject *sum = PyUnicode_FromString(a->summary);
        int bad = code == NULL || sum == NULL ||
                  PyDict_SetItemString(acodes, a->name, code) < 0 ||
                  PyDict_SetItemString(summary, a->name, sum) < 0;
        Py_XDECREF(code);
        Py_XDECREF(sum);
        if (bad)
            goto algo_error;
    }
    if (add(module, "ALGORITHMS", algos) < 0 ||
        add(module, "ALGO_CODES", acodes) < 0 ||
        add(module, "ALGO_SUMMARY", summary) < 0)
        return -1;
    if (add(module, "KERNEL_TABLE", kernel_table()) < 0 ||
        add(module, "ALGO_KERNELS", algo_kernels()) < 0 ||
        add(module, "COLLECTIVE_KERNELS", collective_kernels()) < 0)
        return -1;

    PyObject *kern = PyTuple_New(SYMNCCL_K_COUNT);
    for (int i = 0; kern != NULL && i < SYMNCCL_K_COUNT; i++)
        PyTuple_SetItem(kern, i, PyUnicode_FromString(kernel_names[i]));
    if (add(module, "KERNELS", kern) < 0)
        return -1;

    PyObject *mm = PyDict_New();
    for (size_t i = 0;
         mm != NULL && i < sizeof(multimem_ops) / sizeof(multimem_ops[0]);
         i++) {
        PyObject *o = op_names(multimem_ops[i].ops);
        if (o == NULL ||
            PyDict_SetItemString(mm,
                                 dtype_name_of_kernel(multimem_ops[i].dtype),
                                 o) < 0)
            Py_CLEAR(mm);
        Py_XDECREF(o);
    }
    if (add(module, "MULTIMEM_OPS", mm) < 0)
        return -1;

    PyObject *rows = PyTuple_New((Py_ssize_t)N_AUTO);
    for (size_t i = 0; rows != NULL && i < N_AUTO; i++) {
        const auto_row *r = &auto_table[i];
        PyObject *d = Py_BuildValue(
            "{s:s,s:i,s:n,s:n,s:n,s:n,s:n,s:n,s:s}", "collective",
            collective_names[r->collective], "max_ranks", r->max_ranks, "ll",
            (Py_ssize_t)r->ll, "ll128", (Py_ssize_t)r->ll128, "one_shot",
            (Py_ssize_t)r->one_shot, "two_shot_window",
            (Py_ssize_t)r->two_shot_window, "two_shot_tensor",
            (Py_ssize_t)r->two_shot_tensor, "push", (Py_ssize_t)r->push,
            "above", sn_algos[r->above].name);
        if (d == NULL)
            Py_CLEAR(rows);
        else
            PyTuple_SetItem(rows, (Py_ssize_t)i, d);
    }
    if (add(module, "AUTO_TABLE", rows) < 0)
        return -1;

    PyObject *kn = PyDict_New();
    for (size_t i = 0; kn != NULL && i < N_KNOBS; i++) {
        PyObject *v = Py_BuildValue("(iiis)", knobs[i].dflt, knobs[i].lo,
                                    knobs[i].hi, knobs[i].doc);
        if (v == NULL || PyDict_SetItemString(kn, knobs[i].env, v) < 0)
            Py_CLEAR(kn);
        Py_XDECREF(v);
    }
    PyObject *exit_v = Py_BuildValue("(iiis)", exit_knob.dflt, 0,
                                     (int)SN_MAX_TIMEOUT, exit_knob.doc);
    if (kn != NULL &&
        (exit_v == NULL ||
         PyDict_SetItemString(kn, exit_knob.env, exit_v) < 0))
        Py_CLEAR(kn);
    Py_XDECREF(exit_v);
    PyObject *algo_knob = Py_BuildValue("(ssss)", "auto", "", "",
                                        "overrides algo='auto' of every "
                                        "collective where that algorithm "
                                        "can run the call");
    if (kn != NULL &&
        (algo_knob == NULL ||
         PyDict_SetItemString(kn, "SYMNCCL_ALGO", algo_knob) < 0))
        Py_CLEAR(kn);
    Py_XDECREF(algo_knob);
    return add(module, "KNOBS", kn);

algo_error:
    Py_XDECREF(algos);
    Py_XDECREF(acodes);
    Py_XDECREF(summary);
    return -1;
error:
    Py_XDECREF(dtypes);
    Py_XDECREF(kdtypes);
    Py_XDECREF(fdtypes);
    return -1;
}
