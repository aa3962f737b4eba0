/* The registry: the one declaration of the dtypes, reduction ops and
 * algorithms symnccl knows, which algorithm auto picks, and the run-time
 * knobs. Everything else reads it: the collectives' argument parsing and
 * messages, the XLA handler, and Python (symnccl.DTYPES, ALGORITHMS, ...,
 * exported from here by sn_registry_export). docs/ARCHITECTURE.md says how
 * to add an entry.
 */
#include "runtime.h"
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
index_kernels(sn_err *err)
{
    memset(kernel_of, -1, sizeof(kernel_of));
    for (int k = 0; k < SYMNCCL_K_COUNT; k++) {
        const symnccl_kernel_row r = symnccl_kernel_row_of(k);
        signed char *slot = &kernel_of[r.collective][kernel_algo[k]][r.shot];
        if (*slot >= 0) {   /* two rows for one call: the table is wrong */
            sn_fail(err, cudaSuccess, ncclSuccess, "kernels/table.h: %s and "
                    "%s both run %s with algorithm %s (shot %d)",
                    kernel_names[*slot], r.name,
                    sn_collective_name(r.collective),
                    sn_algos[kernel_algo[k]].name, r.shot);
            err->kind = SN_ERR_SYSTEM;
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
    if (algo == SN_ALGO_LAMPORT && op != NULL &&
        op->kernel != SYMNCCL_OP_SUM && op->kernel != SYMNCCL_OP_AVG)
        return "lamport reduces sum and avg only (max and min would pass "
               "the stand-in for an all-ones NaN word through: "
               "kernels/packet.cuh)";
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
 * order ll, ll128, lamport, one_shot, two_shot, push, else `above`.
 * two_shot's limit depends on whether the input lies in a window (peers
 * load it in place) or is a plain tensor (copied through the staging
 * window first). No row (a collective or world size not measured), or a
 * kernel that cannot take the call: NCCL (where lamport cannot, ll128
 * first stands in). The measurements behind each limit:
 * docs/PERFORMANCE.md, "The auto tables".
 *
 * all_reduce, 2x/3x/4x H200, bf16, CUDA-graph replay: on 2 ranks ll128
 * 256 KiB 4.1 vs ll 4.7 us, 1 MiB 7.6 vs two_shot 9.0. lamport (2x H100,
 * session 20, allreduce_h100x2_bfloat16_lamport_{1,2,3,4}.json, four
 * runs on the packet grid): level with ll and ll128 to 256 KiB (ll128
 * ahead by 0.0-0.1 us in three runs of four), ahead from 512 KiB
 * (4.87-5.63 against ll128 5.43-6.46) to 3 MiB (2 MiB 10.9-11.4 against
 * ll128 12.9-13.5, push 14.4-14.7, two_shot 15.1-16.1; 3 MiB 15.4
 * against two_shot 19.2, push 19.3), level at 4 MiB (20.3-21.4 against
 * two_shot 20.1-21.0, push 21.0-21.3); on its own grid (64 x 1024,
 * _lamport_grid_c6_*.json, allreduce_h100x2_bfloat16_s20.json) 4 MiB
 * 17.7-18.7 and 8 MiB 38.4 against push 35.9: lamport from 256 KiB to
 * 4 MiB, push above. It reads x in place (no staging for tensors).
 * Where lamport cannot take a call (a dtype or op) ll128 stands in
 * (auto_algo). On 3+ ranks ll128 is its two-shot from 512 KiB
 * (SYMNCCL_LL128_TWO_SHOT_KIB): 4x 1 MiB 10.1-11.2 us vs two_shot
 * 12.6-14.1, 3x 1 MiB 8.9 vs push 13.5; below that its one-shot beats
 * ll (4x 256 KiB 6.4-7.2 vs 7.7-8.7). 5-7 ranks follow the 4-rank row
 * without having been measured; from 8 ranks NCCL
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
 * 63-66).
 *
 * 3 and 4 ranks, 3x / 4x H100 over NVLink, bf16, CUDA-graph replay, one
 * run each (results/collectives_h100x3_bfloat16.json, _h100x4_; NCCL is
 * nccl:plain and torch.dist, the faster of the two where they differ):
 * reduce_scatter, 3: ll 3.9-4.2 us to 128 KiB (NCCL 12.4-13.1), ll128 4.4
 * at 256 KiB to 68.6 at 16 MiB (NCCL 72.0), NCCL at 64 MiB (212 against
 * push 226, ll128 277). 4: ll 5.2-5.5 to 32 KiB (ll128 within 0.3), ll128
 * to 2 MiB (10.3, push 14.9, NCCL 22.7), push 19.0 / 60.2 / 191.4 at
 * 4 / 16 / 64 MiB (NCCL 39.1 / 63.7 / 195.9), NCCL past it (unmeasured).
 * all_gather, 3: ll 4.0-6.4 to 2 MiB (15.3, NCCL 28.0), ll128 29.0 at
 * 4 MiB (NCCL 50.4), NCCL from 16 MiB (98 against ll128 101; push at 3
 * ranks trails everywhere: 495 at 64 MiB). 4: ll 3.9-5.1 to 128 KiB,
 * ll128 to 2 MiB (11.8, NCCL 25.0), push 21.1 / 66.2 at 4 / 16 MiB (NCCL
 * 47.5 / 80.3), NCCL at 64 MiB (200 against push 203). broadcast,
 * one_shot: 3, 7.9-11.5 us to 512 KiB (NCCL 8.4-12.2), NCCL from 1 MiB
 * (a tie at 17.1); 4, 9.0-9.7 to 128 KiB (NCCL 10.2-11.7), NCCL from
 * 256 KiB (one_shot 11.3 against torch.dist 10.7). reduce, one_shot: 3,
 * 9.0-10.8 to 256 KiB (NCCL 11.2-12.4), NCCL from 512 KiB; 4, 9.7-10.6
 * to 128 KiB (NCCL 11.4-12.4), NCCL from 256 KiB. 5-7 ranks: not
 * measured, NCCL (the rows end at 4). NCCL against which these rows were
 * chosen is its call on plain memory; on window buffers NCCL's own
 * all-gather kernels are faster at some sizes (3 ranks 4 MiB 25.3 against
 * ll128 29.0; 4 ranks 16 MiB 58.1 against push 66.2), where the policy
 * gives NCCL its windows (2.28).
 *
 * Those 3-rank runs split a power of two in three, which put every
 * rank's block but the first 4 or 8 bytes off a 16-byte vector: push's
 * all-gather (on bytes) then stored a byte at a time, and NCCL and the
 * packet kernels were slowed too. bench_collectives.py now makes a
 * rank's block whole vectors, as a model's tensors are; 3x H100 again
 * (session 23, collectives_h100x3_bfloat16_aligned_{1,2}.json, two
 * runs, 1-256 MiB): reduce_scatter ll128 15.5 / 14.5 at 4 MiB (push
 * 18.1 / 16.9, NCCL 38.2 / 34.7), push from 16 MiB: 68.6 / 55.2 (ll128
 * 77.4 / 65.2, NCCL 74.4 / 61.9), 176.7 / 171.9 at 64 MiB (NCCL 187.3 /
 * 189.1), 633.6 / 633.5 at 256 MiB (NCCL 652.1 / 659.0); all_gather
 * ll128 14.2 / 15.1 at 4 MiB (push 16.5 / 17.8, NCCL 38.6 / 41.2), push
 * 64.6 / 62.7 at 16 MiB (NCCL 66.9 / 67.6), 185.6 / 180.5 at 64 MiB
 * (NCCL 198.0 / 188.9), a tie at 256 MiB (627.5 / 627.9 against 627.5
 * / 629.5): the 3-rank rows take push above ll128's 4 MiB, to 64 MiB
 * for all_gather. Below (collectives_h100x3_bfloat16_aligned_small_
 * {1,2}.json, 32 KiB-8 MiB, two runs): all_gather ll and ll128 level to
 * 128 KiB (4.0-4.2), ll128 ahead from 256 KiB (512 KiB 4.75 / 4.89
 * against ll 6.27 / 5.91, 1 MiB 5.9 / 6.0 against 8.4 / 8.4, 2 MiB 9.3
 * / 9.2 against 13.4 / 12.8): all_gather's ll to 128 KiB, no longer 2
 * MiB; reduce_scatter's ll to 128 KiB stands (level with ll128 there,
 * behind from 512 KiB); at 8 MiB push leads ll128 in both (30.8-33.4
 * against 32.7-36.0). */

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define ANY_SIZE ((size_t)1 << 60)   /* a limit no call reaches */

/* A row (sn_auto_row, runtime.h): the algorithm of a call of `bytes` is
 * the first whose limit it does not exceed, in the order of the fields (a
 * limit of 0: never, but for an empty call, which launches nothing), then
 * `above`. */
typedef sn_auto_row auto_row;

static const auto_row auto_table[] = {
    {SYMNCCL_COLL_ALL_REDUCE, 2, 64 * KIB, 256 * KIB, 4 * MIB, 0, 0, 0, 0,
     SN_ALGO_PUSH},
    {SYMNCCL_COLL_ALL_REDUCE, 3, 0, 1536 * KIB, 0, 0, 0, 0, 0, SN_ALGO_PUSH},
    {SYMNCCL_COLL_ALL_REDUCE, 7, 0, 1536 * KIB, 0, 0, 4 * MIB, 2 * MIB, 0,
     SN_ALGO_PUSH},
    {SYMNCCL_COLL_REDUCE_SCATTER, 2, 0, 2 * MIB, 0, 0, 0, 0, 0, SN_ALGO_PUSH},
    {SYMNCCL_COLL_REDUCE_SCATTER, 3, 128 * KIB, 4 * MIB, 0, 0, 0, 0, 0,
     SN_ALGO_PUSH},
    {SYMNCCL_COLL_REDUCE_SCATTER, 4, 32 * KIB, 2 * MIB, 0, 0, 0, 0, 64 * MIB,
     SN_ALGO_NCCL},
    {SYMNCCL_COLL_ALL_GATHER, 2, 64 * KIB, 4 * MIB, 0, 0, 0, 0, 0,
     SN_ALGO_PUSH},
    {SYMNCCL_COLL_ALL_GATHER, 3, 128 * KIB, 4 * MIB, 0, 0, 0, 0, 64 * MIB,
     SN_ALGO_NCCL},
    {SYMNCCL_COLL_ALL_GATHER, 4, 128 * KIB, 2 * MIB, 0, 0, 0, 0, 16 * MIB,
     SN_ALGO_NCCL},
    {SYMNCCL_COLL_REDUCE, 2, 0, 0, 0, 4 * MIB, 0, 0, 0, SN_ALGO_NCCL},
    {SYMNCCL_COLL_REDUCE, 3, 0, 0, 0, 256 * KIB, 0, 0, 0, SN_ALGO_NCCL},
    {SYMNCCL_COLL_REDUCE, 4, 0, 0, 0, 128 * KIB, 0, 0, 0, SN_ALGO_NCCL},
    {SYMNCCL_COLL_BROADCAST, 2, 0, 0, 0, 4 * MIB, 0, 0, 0, SN_ALGO_NCCL},
    {SYMNCCL_COLL_BROADCAST, 3, 0, 0, 0, 512 * KIB, 0, 0, 0, SN_ALGO_NCCL},
    {SYMNCCL_COLL_BROADCAST, 4, 0, 0, 0, 128 * KIB, 0, 0, 0, SN_ALGO_NCCL},
    /* all_to_all and all_to_all_v (by out's bytes, which every rank
     * agrees on), bf16, CUDA-graph replay, against
     * torch.distributed.all_to_all_single (NCCL). 2x H200
     * (benchmarks/results/alltoall_h200x2_bfloat16.json): ll 5.1-7.7 us
     * up to 1 MiB (NCCL 10.6-15.1); push 18.7 / 43.2 us at 4 / 16 MiB
     * (NCCL 21.7 / 55.7), behind it at 64 MiB (150.5 against 140.8): NCCL
     * above 16 MiB. 2x H100 (issue 38's run): the same order (ll 4.6-7.3
     * up to 1 MiB, push 20.1 / 46.7 at 4 / 16 MiB, NCCL at 64 MiB).
     * 3x H100 (alltoall_h100x3_bfloat16.json): ll 7.7-12.4 to 1 MiB (NCCL
     * 12.4-20.6), push 25.8 at 4 MiB (NCCL 28.7), a tie at 16 MiB (68.1),
     * NCCL at 64 MiB (185 against 208). 4x H100 (alltoall_h100x4_bfloat16
     * .json and _fine.json, 15 reps): ll 6.7-8.7 to 512 KiB (NCCL
     * 12.7-14.2; 1 MiB is past its row at 4 ranks), push 18.8 / 24.3 /
     * 61.9 at 2 / 4 / 16 MiB (NCCL 22.4 / 25.5 / 68.0), NCCL at 64 MiB (186
     * against 208-223). Two cells are not settled: 1 MiB, push 17.8
     * against NCCL 18.9 in the 5-rep run, 17.3 against 15.9 (9% behind)
     * in the 15-rep one; 4 MiB, 27.5 against 26.3 (5-rep), 24.3 against
     * 25.5 (15-rep). A row has one push range: push, over NCCL from 1 to
     * 16 MiB. 2x H100 again, after push copied its own block a piece a
     * chunk (session 16, alltoall_h100x2_bfloat16_own_pieces.json and
     * _before.json, two runs of each build): push 80.3 / 143.5 / 264 / 498
     * us at 32 / 64 / 128 / 256 MiB against NCCL's 84.1 / 147.8-153.6 /
     * 270.7-272.3 / 506: push above 1 MiB at 2 ranks. 3x and 4x H100
     * again, on that kernel (session 23, alltoall_h100x3_bfloat16_s23
     * .json, _h100x4_, 1-256 MiB, 15 reps, one run each): 3 ranks push
     * 19.8 / 58.8 / 100.2 at 4 / 16 / 32 MiB (NCCL 25.9 / 64.6 / 103.7;
     * the other two push variants ahead too), 184.4 at 64 MiB (NCCL
     * 182.0); 4 ranks push 13.0 / 24.8 / 70.8 / 108.6 at 1 / 4 / 16 / 32
     * MiB (NCCL 19.2 / 33.0 / 72.6 / 116.3: the 1 MiB cell settled), 206.9
     * at 64 MiB (NCCL 200.4): push to 32 MiB at 3 and 4 ranks, NCCL
     * above. */
    {SYMNCCL_COLL_ALL_TO_ALL, 2, 1 * MIB, 0, 0, 0, 0, 0, 0, SN_ALGO_PUSH},
    {SYMNCCL_COLL_ALL_TO_ALL, 3, 1 * MIB, 0, 0, 0, 0, 0, 32 * MIB,
     SN_ALGO_NCCL},
    {SYMNCCL_COLL_ALL_TO_ALL, 4, 512 * KIB, 0, 0, 0, 0, 0, 32 * MIB,
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
     * composed path's 149.9 and unfused 159.9); past 32 MiB (3-4 ranks:
     * past lamport's 256 KiB, below), and from 5 ranks, "nccl" resolved
     * from "auto": all_reduce's own choice, then symnccl's add+norm
     * (sn_then_norm_algo). ll128 (2x H100, session 18,
     * fused_h100x2_bfloat16_ll128_r{2,3}.json and _ll128v1_r{1,4}.json,
     * four runs, H 4096 and 8192, T 1-256): ll ahead to 64 KiB (T 4 x H
     * 8192 ll 8.7-9.4 us against 9.4-10.3), at 128 KiB H decides (T 16 x H
     * 4096 ll128 8.0-9.6 against ll 8.7-10.1; T 8 x H 8192 ll 9.1-9.3
     * against 9.4-10.0); ll128 from 256 KiB to 1 MiB (T 64 x H 4096
     * 8.2-8.7 against one_shot 13.1-13.5, ll 12.5-12.7; T 128 x H 4096
     * 12.2-13.6 against one_shot 14.7-14.9); at 2 MiB one_shot and ll128
     * tie (18.2-19.6 against 19.0-19.2): one_shot from there. lamport (2x
     * H100, session 19, fused_h100x2_bfloat16_lamport{,_r2,_r3}.json,
     * three runs, T 1-512): ahead of ll and ll128 from T 1 (H 4096 T 1
     * 6.0-6.5 us against ll 6.5-6.9; T 16 x H 8192 7.3-7.8 against ll128
     * 9.7-10.1) and of one_shot to 2 MiB (T 128 x H 8192 15.5-16.0
     * against 18.4-18.7; T 256 x H 4096 17.3-17.4 against 18.2-18.9);
     * one_shot from 4 MiB (T 256 x H 8192 25.5-26.1 against 26.4-26.9):
     * lamport to 2 MiB, one_shot to 32 MiB. 3 and 4 ranks (4x H100,
     * session 25, fused_h100x{3,4}_bfloat16_decode_*.json; lamport_rmsnorm
     * with its decode path, rmsnorm.cuh): ahead of the composed path ("nccl":
     * all_reduce's auto, then the add+norm) to T 16 x H 8192 (256 KiB; 4
     * ranks T 1 x H 8192 6.9-7.8 us against 7.6-9.1, T 16 9.4 against
     * 9.9-12.5), level at 512 KiB (T 64 x H 4096 11.6-11.9 against
     * 11.5-13.3), behind at 1 MiB (T 64 x H 8192 18.7-19.0 against
     * 14.3-14.8): lamport to 256 KiB, then the composed path. */
    {SYMNCCL_COLL_ALL_REDUCE_RMSNORM, 1, 0, 0, 0, ANY_SIZE, 0, 0, 0,
     SN_ALGO_NCCL},
    {SYMNCCL_COLL_ALL_REDUCE_RMSNORM, 2, 0, 0, 2 * MIB, 32 * MIB, 0, 0, 0,
     SN_ALGO_NCCL},
    {SYMNCCL_COLL_ALL_REDUCE_RMSNORM, 4, 0, 0, 256 * KIB, 0, 0, 0, 0,
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
    int algo =
        b <= r->ll         ? SN_ALGO_LL
        : b <= r->ll128    ? SN_ALGO_LL128
        : b <= r->lamport  ? SN_ALGO_LAMPORT
        : b <= r->one_shot ? SN_ALGO_ONE_SHOT
        : b <= (d->in_window ? r->two_shot_window : r->two_shot_tensor)
            ? SN_ALGO_TWO_SHOT
        : b <= r->push ? SN_ALGO_PUSH
                       : r->above;
    /* a dtype or op lamport cannot take (not float32, float16 or
     * bfloat16; max, min): its stand-in, ll128, which carries the same
     * sizes in packets without a sentinel; a dtype, op or communicator the
     * kernel cannot take: NCCL */
    if (algo == SN_ALGO_LAMPORT &&
        sn_collective_unavailable(t, d->collective, algo, d->dtype,
                                  d->op) != NULL)
        algo = SN_ALGO_LL128;
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
sn_collective_index(const char *cname)
{
    for (int i = 0; i < SYMNCCL_COLL_COUNT; i++)
        if (has_kernels[i] && strcmp(cname, collective_names[i]) == 0)
            return i;
    return -1;
}

const char *
sn_collective_choices(void)
{
    return collective_choices;
}

int
sn_collective_has_kernels(int collective)
{
    return collective >= 0 && collective < SYMNCCL_COLL_COUNT &&
           has_kernels[collective];
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
    /* 64 CTAs of 1024 threads: lamport's time followed its threads in
     * flight, not the link (2x H100, 4 MiB 20.5 -> 16.8 us from 64 x 512
     * to 128 x 512; 128 x 256 as 64 x 512); a CTA of 1024 fills one SM,
     * so 64 of them leave room for another communicator's grid (docs/
     * PERFORMANCE.md, the predictions table) */
    {"SYMNCCL_LAMPORT_CTAS", offsetof(sn_knobs, lamport_ctas), 64, 1,
     SN_MAX_CTAS, 1, "grid of all_reduce's lamport (fixed per "
     "communicator)"},
    {"SYMNCCL_LAMPORT_THREADS", offsetof(sn_knobs, lamport_threads),
     SYMNCCL_WIDE_MAX_THREADS, 32, SYMNCCL_WIDE_MAX_THREADS, 32,
     "threads per CTA of all_reduce's lamport"},
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
    /* 0: on 2x H100 over NVLink the whole slot was as fast as the best
     * split at every size from 4 MiB (16 MiB: 44.6 us against 49.4-67.1;
     * docs/PERFORMANCE.md, 'Push chunks') */
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

void
sn_exit_knob(const char **env, int *dflt, const char **doc)
{
    *env = exit_knob.env;
    *dflt = exit_knob.dflt;
    *doc = exit_knob.doc;
}

int
sn_knobs_read(sn_knobs *k, sn_err *err)
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
                sn_fail(err, cudaSuccess, ncclSuccess, "%s=%s is not an "
                        "integer%s (%s; default %d)", kb->env, s, also,
                        kb->doc, kb->dflt);
                err->kind = SN_ERR_VALUE;
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
            sn_fail(err, cudaSuccess, ncclSuccess, "SYMNCCL_ALGO=%s is not "
                    "an algorithm: expected one of %s", a, sn_algo_choices());
            err->kind = SN_ERR_VALUE;
            return -1;
        }
    }
    return 0;
}

int
sn_knob_row(int i, const char **env, int *dflt, int *lo, int *hi,
            const char **doc)
{
    if (i < 0 || (size_t)i >= N_KNOBS)
        return 0;
    *env = knobs[i].env;
    *dflt = knobs[i].dflt;
    *lo = knobs[i].lo;
    *hi = knobs[i].hi;
    *doc = knobs[i].doc;
    return 1;
}

int
sn_knob_value(const sn_knobs *k, int i)
{
    return *(const int *)((const char *)k + knobs[i].offset);
}

void
sn_knob_set(sn_knobs *k, int i, int value)
{
    *(int *)((char *)k + knobs[i].offset) = value;
}

/* SYMNCCL_ALGO's value as a name ("auto" or the algorithm's). */
static const char *
algo_knob_name(int algo)
{
    return algo >= 0 && algo < SN_ALGO_COUNT ? sn_algos[algo].name : "auto";
}

/* Rank r's knobs among sets `stride` bytes apart. */
static const sn_knobs *
rank_knobs(const sn_knobs *k, size_t stride, int r)
{
    return (const sn_knobs *)((const char *)k + (size_t)r * stride);
}

int
sn_knobs_differ(const sn_knobs *k, size_t stride, int nranks, char *why,
                size_t len)
{
    for (size_t i = 0; i <= N_KNOBS; i++) {
        int same = 1;
        for (int r = 1; r < nranks && same; r++) {
            const sn_knobs *a = rank_knobs(k, stride, 0);
            const sn_knobs *b = rank_knobs(k, stride, r);
            same = i == N_KNOBS ? a->algo == b->algo
                                : sn_knob_value(a, (int)i) ==
                                      sn_knob_value(b, (int)i);
        }
        if (same)
            continue;
        size_t used = (size_t)snprintf(why, len, "%s (",
                                       i == N_KNOBS ? "SYMNCCL_ALGO"
                                                    : knobs[i].env);
        for (int r = 0; r < nranks && used < len; r++) {
            const sn_knobs *a = rank_knobs(k, stride, r);
            if (i == N_KNOBS)
                used += (size_t)snprintf(why + used, len - used,
                                         "%srank %d: %s", r ? ", " : "", r,
                                         algo_knob_name(a->algo));
            else
                used += (size_t)snprintf(why + used, len - used,
                                         "%srank %d: %d", r ? ", " : "", r,
                                         sn_knob_value(a, (int)i));
        }
        if (used < len)
            snprintf(why + used, len - used, ")");
        return 1;
    }
    return 0;
}

/* A rank's record of what its communicator's ranks must share (runtime.h,
 * sn_agreed; lifecycle.c carries it between the ranks). */
static uint64_t
agreed_hash(const sn_agreed *r)
{
    const unsigned char *p = (const unsigned char *)r;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < offsetof(sn_agreed, sum); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

void
sn_agreed_seal(sn_agreed *r)
{
    r->magic = SN_AGREED_MAGIC;
    r->size = (uint32_t)sizeof(*r);
    r->sum = agreed_hash(r);
}

int
sn_agreed_whole(const sn_agreed *r)
{
    return r->magic == SN_AGREED_MAGIC && r->size == sizeof(*r) &&
           r->sum == agreed_hash(r);
}

int
sn_agreed_differ(const sn_agreed *all, int nranks, char *why, size_t len)
{
    int differ = 0;
    for (int r = 1; r < nranks && !differ; r++)
        differ = all[r].staging_bytes != all[0].staging_bytes;
    if (!differ)
        return sn_knobs_differ(&all[0].knobs, sizeof(*all), nranks, why,
                               len);
    size_t used = (size_t)snprintf(why, len, "staging_bytes (");
    for (int r = 0; r < nranks && used < len; r++)
        used += (size_t)snprintf(why + used, len - used, "%srank %d: %llu",
                                 r ? ", " : "", r,
                                 (unsigned long long)all[r].staging_bytes);
    if (used < len)
        snprintf(why + used, len - used, ")");
    return 1;
}

/* ------------------------------------------------------------------ */
/* The tables row by row, for their Python view (python/tables.c). */

const char *
sn_kernel_dtype_name(int kernel_dt)
{
    for (int i = 0; i < sn_n_dtypes; i++)
        if (sn_dtypes[i].kernel == kernel_dt)
            return sn_dtypes[i].name;
    return NULL;
}

/* The kernel dtypes of launch.h and the registry must name the same
 * types: each X entry's NCCL type is the registry entry marked with it. */
static int
check_kernel_dtypes(sn_err *err)
{
#define CHECK_(id, nccl_type, ctype)                                      \
    {                                                                     \
        const char *n = sn_kernel_dtype_name(SYMNCCL_DT_##id);            \
        const sn_dtype *d = n != NULL ? sn_dtype_by_name(n) : NULL;       \
        if (d == NULL || d->nccl != (nccl_type)) {                        \
            sn_fail(err, cudaSuccess, ncclSuccess, "registry.c and "      \
                    "launch.h disagree on kernel dtype " #id);            \
            err->kind = SN_ERR_SYSTEM;                                    \
            return -1;                                                    \
        }                                                                 \
    }
    SYMNCCL_KERNEL_DTYPES(CHECK_)
#undef CHECK_
    return 0;
}

int
sn_registry_init(sn_err *err)
{
    if (check_kernel_dtypes(err) < 0)
        return -1;
    return index_kernels(err);
}

int
sn_multimem_row(int i, int *kernel_dtype, unsigned *ops)
{
    if (i < 0 || (size_t)i >= sizeof(multimem_ops) / sizeof(multimem_ops[0]))
        return 0;
    *kernel_dtype = multimem_ops[i].dtype;
    *ops = multimem_ops[i].ops;
    return 1;
}

const sn_auto_row *
sn_auto_table_row(int i)
{
    return i >= 0 && (size_t)i < N_AUTO ? &auto_table[i] : NULL;
}
