/* The kernel table: the one declaration of symnccl's algorithms and of its
 * kernels. Everything that maps one to the other is derived from the two
 * lists below by X-macros, as NCCL's src/device/symmetric/generate.py
 * derives its units from one list:
 *
 *   the kernel ids and names        SYMNCCL_K_* (launch.h), _C.KERNELS
 *   algorithm -> kernel per call    registry.c sn_kernel_for, the resolver
 *   which collectives an algorithm  registry.c (refusals name them),
 *   runs                            _C.ALGO_KERNELS, _C.COLLECTIVE_KERNELS
 *   launch plan of a kernel         launch.c sn_launch_kernels
 *   slots and call counters shared  staging.c sn_epochs
 *   packet format, argument checks  launch.cu
 *   the instantiation per dtype     unit.cu (multimem.cu for MULTIMEM)
 *
 * docs/ARCHITECTURE.md, "Adding things", lists what else a new kernel
 * needs (its .cuh, a launch plan if none fits, tests, the auto table).
 * Included by launch.h; C and C++ alike (the C++ column is expanded by the
 * .cu files only).
 */
#ifndef SYMNCCL_KERNELS_TABLE_H
#define SYMNCCL_KERNELS_TABLE_H

/* Algorithms, the values of algo=: X(ID, name, summary). NCCL is the
 * fallback of every collective and has no kernel of symnccl's. */
#define SYMNCCL_ALGOS(X)                                                     \
    X(NCCL, "nccl", "NCCL's own collective (its symmetric kernels on "      \
                    "windows where the NCCL-window policy allows)")          \
    X(ONE_SHOT, "one_shot", "every rank loads every peer's input between "  \
                            "two barriers")                                  \
    X(TWO_SHOT, "two_shot", "reduce-scatter by peer loads, all-gather by "  \
                            "peer stores")                                   \
    X(LL, "ll", "barrier-free LL packets: data and flag in one 16-byte "    \
                "store")                                                     \
    X(LL128, "ll128", "ll in 128-byte lines of 120 data bytes and a flag "  \
                      "word")                                                \
    X(LAMPORT, "lamport", "barrier-free, the data its own flag: a slot "   \
                          "word of all ones (a NaN) is empty; float dtypes, " \
                          "sums")                                            \
    X(PUSH, "push", "store-only two-shot with per-CTA flags")               \
    X(MULTIMEM, "multimem", "NVLink SHARP (multimem.ld_reduce), where NCCL " \
                            "granted multicast")

/* Slots and call counters a kernel shares with the others of its family
 * (the staging window's regions; a kernel's counters are its family's),
 * and the grid every kernel of a family launches with (its counters are
 * per CTA): X(ID, name).
 *   BARRIER     the load kernels: barrier flag lines
 *   LL          the LL packet rows
 *   LL128       the LL128 packet rows
 *   LAMPORT     the fused kernel's Lamport packet rows (they start, and are
 *               left, all ones); LL, LL128 and LAMPORT launch the packet
 *               grid (SYMNCCL_LL_CTAS x SYMNCCL_LL_THREADS; the fused
 *               kernels' CTAs are sized for their rows: launch.c,
 *               row_launches)
 *   LAMPORT_AR  all_reduce's Lamport packet rows, on a grid of its own
 *               (SYMNCCL_LAMPORT_CTAS x SYMNCCL_LAMPORT_THREADS, CTAs
 *               of up to SYMNCCL_WIDE_MAX_THREADS)
 *   PUSH        the push region's slots and flags */
#define SYMNCCL_FAMILIES(X)                                              \
    X(BARRIER, "barrier") X(LL, "ll") X(LL128, "ll128")                  \
    X(LAMPORT, "lamport") X(LAMPORT_AR, "lamport_ar") X(PUSH, "push")

/* How launch.c turns a call into launches of the kernel: X(ID, name).
 *   LOADS       peers load from a window (the input's, or the staging
 *               window it is copied into), one launch per staging area
 *   PACKETS     one launch per packet row's worth
 *   SLICES      chunk k of every slice in launch k
 *   ROOTED      reduce/broadcast: one_shot's staging chunks
 *   PUSH        one launch, the kernel walks the chunks
 *   ROWS        all_reduce_rmsnorm: whole rows of x, as many per launch as
 *               the staging area holds (ll, ll128, lamport: as a row of
 *               their family's region carries)
 *   ALL_TO_ALL  one launch with the splits, on its family's region
 *               (alltoall.cuh) */
#define SYMNCCL_PLANS(X)                                               \
    X(LOADS, "loads") X(PACKETS, "packets") X(SLICES, "slices")       \
    X(ROOTED, "rooted") X(PUSH, "push") X(ROWS, "rows")               \
    X(ALL_TO_ALL, "all_to_all")

#define SYMNCCL_FAMILY_ENUM_(id, name) SYMNCCL_FAMILY_##id,
enum { SYMNCCL_FAMILIES(SYMNCCL_FAMILY_ENUM_) SYMNCCL_FAMILY_COUNT };
#undef SYMNCCL_FAMILY_ENUM_
#define SYMNCCL_PLAN_ENUM_(id, name) SYMNCCL_PLAN_##id,
enum { SYMNCCL_PLANS(SYMNCCL_PLAN_ENUM_) SYMNCCL_PLAN_COUNT };
#undef SYMNCCL_PLAN_ENUM_

/* ONE: the kernel an algorithm launches; TWO: the two-shot variant of the
 * same algorithm and collective, which ll and ll128 switch to on 3+ ranks
 * from a size (SYMNCCL_LL_TWO_SHOT_KIB, SYMNCCL_LL128_TWO_SHOT_KIB). */
enum { SYMNCCL_SHOT_ONE = 0, SYMNCCL_SHOT_TWO = 1 };

/* Where the kernel is instantiated: X(ID, name). DTYPE, unit.cu once per
 * kernel dtype (only the SYMNCCL_DT_BYTES unit for a kernel that moves
 * bytes); MULTIMEM, multimem.cu; FLOAT, unit.cu's float32, float16 and
 * bfloat16 units only (the registry refuses the other dtypes for such a
 * kernel). */
#define SYMNCCL_UNITS(X) \
    X(DTYPE, "dtype") X(MULTIMEM, "multimem") X(FLOAT, "float")
#define SYMNCCL_UNIT_ENUM_(id, name) SYMNCCL_UNIT_##id,
enum { SYMNCCL_UNITS(SYMNCCL_UNIT_ENUM_) SYMNCCL_UNIT_COUNT };
#undef SYMNCCL_UNIT_ENUM_
/* The dtypes (SYMNCCL_DT_*) whose units hold the FLOAT kernels. */
#define SYMNCCL_UNIT_FLOAT_TAKES(dt)                     \
    ((dt) == SYMNCCL_DT_F32 || (dt) == SYMNCCL_DT_F16 || \
     (dt) == SYMNCCL_DT_BF16)

/* The kernels:
 * X(ID, name, collective, algo, shot, family, plan, bytes, unit, entry)
 *   name        what Communicator._launches() reports (tests read it to
 *               prove which kernel ran) and a failure names
 *   collective  SYMNCCL_COLL_<collective> it runs
 *   algo        the algorithm (SYMNCCL_ALGOS) that selects it
 *   shot, family, plan, unit   as above
 *   bytes       1: moves bytes whatever the dtype (no op; runs in the unit
 *               of SYMNCCL_DT_BYTES with counts in bytes)
 *   entry       the kernel (C++, in parentheses): T is the unit's element
 *               type, `a` the launch's symnccl_kargs
 * The order is the ids' order; a failure record stores the id. */
#define SYMNCCL_KERNEL_TABLE(X)                                              \
    X(ONE_SHOT, "one_shot", ALL_REDUCE, ONE_SHOT, ONE, BARRIER, LOADS, 0,    \
      DTYPE, (one_shot<T>))                                                  \
    X(TWO_SHOT, "two_shot", ALL_REDUCE, TWO_SHOT, ONE, BARRIER, LOADS, 0,    \
      DTYPE, (two_shot<T>))                                                  \
    X(LL, "ll", ALL_REDUCE, LL, ONE, LL, PACKETS, 0, DTYPE,                  \
      (packet_one_shot<T, LL>))                                              \
    X(LL_TWO_SHOT, "ll_two_shot", ALL_REDUCE, LL, TWO, LL, PACKETS, 0,       \
      DTYPE, (packet_two_shot<T, LL>))                                       \
    X(LL128, "ll128", ALL_REDUCE, LL128, ONE, LL128, PACKETS, 0, DTYPE,      \
      (packet_one_shot<T, LL128>))                                           \
    X(LL128_TWO_SHOT, "ll128_two_shot", ALL_REDUCE, LL128, TWO, LL128,       \
      PACKETS, 0, DTYPE, (packet_two_shot<T, LL128>))                        \
    X(LAMPORT, "lamport", ALL_REDUCE, LAMPORT, ONE, LAMPORT_AR, PACKETS, 0,  \
      FLOAT, (packet_one_shot<T, LamportItems<T>>))                          \
    X(PUSH, "push", ALL_REDUCE, PUSH, ONE, PUSH, PUSH, 0, DTYPE, (push<T>))  \
    X(MULTIMEM, "multimem", ALL_REDUCE, MULTIMEM, ONE, BARRIER, LOADS, 0,    \
      MULTIMEM, (nullptr))                                                   \
    X(LL_REDUCE_SCATTER, "ll_reduce_scatter", REDUCE_SCATTER, LL, ONE, LL,   \
      SLICES, 0, DTYPE, (packet_reduce_scatter<T, LL>))                      \
    X(LL128_REDUCE_SCATTER, "ll128_reduce_scatter", REDUCE_SCATTER, LL128,   \
      ONE, LL128, SLICES, 0, DTYPE, (packet_reduce_scatter<T, LL128>))       \
    X(LL_ALL_GATHER, "ll_all_gather", ALL_GATHER, LL, ONE, LL, SLICES, 1,    \
      DTYPE, (packet_all_gather<T, LL>))                                     \
    X(LL128_ALL_GATHER, "ll128_all_gather", ALL_GATHER, LL128, ONE, LL128,   \
      SLICES, 1, DTYPE, (packet_all_gather<T, LL128>))                       \
    X(ONE_SHOT_REDUCE, "one_shot_reduce", REDUCE, ONE_SHOT, ONE, BARRIER,    \
      ROOTED, 0, DTYPE, (one_shot_reduce<T>))                                \
    X(ONE_SHOT_BROADCAST, "one_shot_broadcast", BROADCAST, ONE_SHOT, ONE,    \
      BARRIER, ROOTED, 1, DTYPE, (one_shot_broadcast<T>))                    \
    X(PUSH_REDUCE_SCATTER, "push_reduce_scatter", REDUCE_SCATTER, PUSH, ONE, \
      PUSH, PUSH, 0, DTYPE,                                                  \
      (push_split(a) ? push_reduce_scatter<T, true>                          \
                     : push_reduce_scatter<T, false>))                       \
    X(PUSH_ALL_GATHER, "push_all_gather", ALL_GATHER, PUSH, ONE, PUSH, PUSH, \
      1, DTYPE,                                                              \
      (push_split(a) ? push_all_gather<T, true>                              \
                     : push_all_gather<T, false>))                           \
    X(ONE_SHOT_RMSNORM, "one_shot_rmsnorm", ALL_REDUCE_RMSNORM, ONE_SHOT,    \
      ONE, BARRIER, ROWS, 0, FLOAT,                                          \
      (!a.local  ? one_shot_rmsnorm<T>                                       \
       : a.quant ? add_rmsnorm<T, true>                                      \
                 : add_rmsnorm<T, false>))                                   \
    X(TWO_SHOT_RMSNORM, "two_shot_rmsnorm", ALL_REDUCE_RMSNORM, TWO_SHOT,    \
      ONE, BARRIER, ROWS, 0, FLOAT,                                          \
      (a.local ? add_rmsnorm<T, false> : two_shot_rmsnorm<T>))               \
    X(LL_RMSNORM, "ll_rmsnorm", ALL_REDUCE_RMSNORM, LL, ONE, LL, ROWS, 0,   \
      FLOAT,                                                                 \
      (!a.local  ? (a.threads > SYMNCCL_MAX_THREADS                         \
                        ? (a.quant ? ll_rmsnorm<T, true, true>               \
                                   : ll_rmsnorm<T, false, true>)             \
                        : (a.quant ? ll_rmsnorm<T, true, false>              \
                                   : ll_rmsnorm<T, false, false>))           \
       : a.quant ? add_rmsnorm<T, true>                                      \
                 : add_rmsnorm<T, false>))                                   \
    X(LL128_RMSNORM, "ll128_rmsnorm", ALL_REDUCE_RMSNORM, LL128, ONE,     \
      LL128, ROWS, 0, FLOAT,                                                 \
      (!a.local  ? (a.quant ? ll128_rmsnorm<T, true>                         \
                            : ll128_rmsnorm<T, false>)                       \
       : a.quant ? add_rmsnorm<T, true>                                      \
                 : add_rmsnorm<T, false>))                                   \
    X(LAMPORT_RMSNORM, "lamport_rmsnorm", ALL_REDUCE_RMSNORM, LAMPORT, ONE, \
      LAMPORT, ROWS, 0, FLOAT,                                               \
      (!a.local  ? (a.threads > SYMNCCL_MAX_THREADS                         \
                        ? (a.quant ? lamport_rmsnorm<T, true, true>          \
                                   : lamport_rmsnorm<T, false, true>)        \
                        : (a.quant ? lamport_rmsnorm<T, true, false>         \
                                   : lamport_rmsnorm<T, false, false>))      \
       : a.quant ? add_rmsnorm<T, true>                                      \
                 : add_rmsnorm<T, false>))                                   \
    X(PUSH_ALL_TO_ALL, "push_all_to_all", ALL_TO_ALL, PUSH, ONE, PUSH,       \
      ALL_TO_ALL, 1, DTYPE, (push_all_to_all<T>))                            \
    X(LL_ALL_TO_ALL, "ll_all_to_all", ALL_TO_ALL, LL, ONE, LL, ALL_TO_ALL,   \
      1, DTYPE, (ll_all_to_all<T>))

#define SYMNCCL_K_ENUM_(id, ...) SYMNCCL_K_##id,
enum { SYMNCCL_KERNEL_TABLE(SYMNCCL_K_ENUM_) SYMNCCL_K_COUNT };
#undef SYMNCCL_K_ENUM_

/* A kernel's row, less its algorithm and entry (registry.c adds the
 * algorithm; the entry is C++). */
typedef struct {
    const char *name;
    int collective;   /* SYMNCCL_COLL_* */
    int shot;         /* SYMNCCL_SHOT_* */
    int family;       /* SYMNCCL_FAMILY_* */
    int plan;         /* SYMNCCL_PLAN_* */
    int bytes;        /* moves bytes */
    int unit;         /* SYMNCCL_UNIT_* */
} symnccl_kernel_row;

/* The row of kernel k (0 <= k < SYMNCCL_K_COUNT). */
static inline symnccl_kernel_row
symnccl_kernel_row_of(int k)
{
#define SYMNCCL_ROW_(id, name, coll, algo, shot, family, plan, bytes, unit, \
                     entry)                                                 \
    case SYMNCCL_K_##id: {                                                  \
        symnccl_kernel_row r = {name,                                       \
                                SYMNCCL_COLL_##coll,                        \
                                SYMNCCL_SHOT_##shot,                        \
                                SYMNCCL_FAMILY_##family,                    \
                                SYMNCCL_PLAN_##plan,                        \
                                bytes,                                      \
                                SYMNCCL_UNIT_##unit};                       \
        return r;                                                           \
    }
    switch (k) {
        SYMNCCL_KERNEL_TABLE(SYMNCCL_ROW_)
    }
#undef SYMNCCL_ROW_
    {
        symnccl_kernel_row none = {"?", -1, -1, -1, -1, 0, -1};
        return none;
    }
}

/* Kernel k, launched with peers (not a.local, which runs add_rmsnorm),
 * holds whole rows in groups of a.row_block threads (one_shot_rmsnorm's
 * block), as many a CTA as the host sizes it for: up to
 * SYMNCCL_WIDE_MAX_THREADS threads where a row is one pass (rmsnorm.cuh,
 * rows_on_packets: ll_rmsnorm, lamport_rmsnorm). */
static inline int
symnccl_kernel_row_groups(int k, int local)
{
    const symnccl_kernel_row r = symnccl_kernel_row_of(k);
    return !local && r.plan == SYMNCCL_PLAN_ROWS &&
           (r.family == SYMNCCL_FAMILY_LL ||
            r.family == SYMNCCL_FAMILY_LAMPORT);
}

/* The largest CTA of kernel k's launch: the wide kernels' (64 registers a
 * thread: all_reduce's lamport, the row groups), SYMNCCL_MAX_THREADS
 * for the rest. */
static inline int
symnccl_kernel_max_threads(int k, int local)
{
    return symnccl_kernel_row_of(k).family == SYMNCCL_FAMILY_LAMPORT_AR ||
                   symnccl_kernel_row_groups(k, local)
               ? SYMNCCL_WIDE_MAX_THREADS
               : SYMNCCL_MAX_THREADS;
}

#endif /* SYMNCCL_KERNELS_TABLE_H */
