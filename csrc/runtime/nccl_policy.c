/* What symnccl knows of NCCL's versions, declared once: which library a
 * build of the kernels may run on, which calls NCCL's own symmetric-window
 * kernels get wrong (and so may only see plain memory), and which NCCL
 * kernels may start before the kernel ahead of them on the stream has
 * ended. Pure functions of a version code and the call: the host code
 * asks them, the CPU tests ask them through _C (tests/test_nccl_policy.py),
 * and the table is exported as _C.NCCL_WINDOW_POLICY for the docs.
 */
#include "runtime.h"

#include <stdio.h>
#include <string.h>

#define V(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))

static int
v_major(int code)
{
    return code / 10000;
}

static int
v_minor(int code)
{
    return code % 10000 / 100;
}

static int
v_patch(int code)
{
    return code % 100;
}

/* ------------------------------------------------------------------ */
/* The library a build of the kernels may run on. docs/BUILD.md, 'NCCL
 * headers', has the evidence. NCCL refuses its device API to code built
 * against newer headers than the library (dev_runtime.cc,
 * getNcclVersionCompat: "NCCL library is too old"), and from 2.30 on a
 * library takes a device communicator laid out by older headers only
 * where it carries a conversion for them (ncclDevCommCompat_v<version>,
 * src/devcomm/; "NCCL library is not backwards compatible" otherwise).
 * 2.28's requirements carry no version, so a 2.28 build runs on 2.28
 * only. */

/* The newest NCCL symnccl was checked against: libraries past this minor
 * are refused until their conversions are read (pyproject.toml's
 * nvidia-nccl-cu13 range ends there too). */
#define NEWEST_MINOR 32

typedef struct {
    int headers_lo, headers_hi;  /* the build's NCCL_VERSION_CODE range */
    int library_lo, library_hi;  /* the libraries carrying a conversion */
    const char *evidence;
} nccl_conversion;

static const nccl_conversion conversions[] = {
    /* ncclDevCommCompat_v22907: its range (22905, 22907) in the 2.30.7,
     * 2.31.2 and 2.32.3 libraries (in the sources from 2.30.3 on, its
     * layout of the old struct fixed in 2.30.4: from 2.30.7 here) */
    {V(2, 29, 5), V(2, 29, 7), V(2, 30, 7), V(2, NEWEST_MINOR, 99),
     "ncclDevCommCompat_v22907 (2.29.5-2.29.7 headers)"},
    /* ncclDevCommCompat_v23000 (23000, 23007) in the 2.31.2 and 2.32.3
     * libraries (in 2.30 it is the library's own layout) */
    {V(2, 30, 0), V(2, 30, 7), V(2, 31, 2), V(2, NEWEST_MINOR, 99),
     "ncclDevCommCompat_v23000 (2.30.0-2.30.7 headers)"},
    /* ncclDevCommCompat_v23100: (23100, 23203) in the 2.32.3 library,
     * whose ncclDevComm is laid out as 2.31's */
    {V(2, 31, 0), V(2, 31, 99), V(2, 32, 0), V(2, NEWEST_MINOR, 99),
     "ncclDevCommCompat_v23100 (2.31.0-2.32.3 headers)"},
};

#define N_CONVERSIONS (sizeof(conversions) / sizeof(conversions[0]))

/* Whether a build against `headers` may run on `runtime` (no message). */
static int
runs_on(int runtime, int headers)
{
    if (v_major(runtime) != 2 || v_major(headers) != 2 ||
        v_minor(runtime) > NEWEST_MINOR || runtime < headers)
        return 0;
    if (v_minor(runtime) == v_minor(headers))
        return 1;
    for (size_t i = 0; i < N_CONVERSIONS; i++) {
        const nccl_conversion *c = &conversions[i];
        if (headers >= c->headers_lo && headers <= c->headers_hi &&
            runtime >= c->library_lo && runtime <= c->library_hi)
            return 1;
    }
    return 0;
}

/* The libraries a build against `headers` runs on, as text ("2.29.7 to
 * 2.29.x, 2.30.7 to 2.32.x"), and the lowest and highest of them. */
static void
library_ranges(int headers, char *buf, size_t size, int *lo, int *hi)
{
    int los[N_CONVERSIONS + 1], his[N_CONVERSIONS + 1], n = 0;
    los[n] = headers;   /* its own minor, from its headers on */
    his[n++] = V(v_major(headers), v_minor(headers), 99);
    for (size_t i = 0; i < N_CONVERSIONS; i++) {
        const nccl_conversion *c = &conversions[i];
        if (headers >= c->headers_lo && headers <= c->headers_hi) {
            los[n] = c->library_lo;
            his[n++] = c->library_hi;
        }
    }
    /* in increasing order as declared; a range starting right where the
     * one before ends (2.29.99, then 2.30.0) joins it */
    size_t used = 0;
    buf[0] = '\0';
    *lo = los[0];
    *hi = his[0];
    for (int i = 0; i < n; i++) {
        const int start = los[i];
        int end = his[i];
        while (i + 1 < n && los[i + 1] <= end + 1)
            end = his[++i] > end ? his[i] : end;
        if (end > *hi)
            *hi = end;
        if (used < size)
            used += (size_t)snprintf(
                buf + used, size - used, "%s%d.%d.%d to %d.%d.x",
                used ? ", " : "", v_major(start), v_minor(start),
                v_patch(start), v_major(end), v_minor(end));
    }
}

const char *
sn_nccl_version_verdict(int runtime, int headers, char *buf, size_t size)
{
    const int cu = CUDART_VERSION / 1000;
    if (runs_on(runtime, headers))
        return NULL;
    int lo, hi;
    char ranges[160];
    library_ranges(headers, ranges, sizeof(ranges), &lo, &hi);
    if (v_major(runtime) == v_major(headers) &&
        v_minor(runtime) == v_minor(headers)) {
        /* NCCL refuses its device API to code built against newer headers
         * than the library (ncclDevCommCreate and ncclCommQueryProperties
         * return ncclInvalidUsage): symnccl would run without its
         * kernels. */
        snprintf(buf, size, "the loaded libnccl is NCCL %d.%d.%d, older "
                 "than the NCCL %d.%d.%d headers symnccl's kernels were "
                 "built with, and NCCL refuses its device API to code built "
                 "against newer headers than the library. Install a newer "
                 "library: pip install 'nvidia-nccl-cu%d>=%d.%d.%d,<%d.%d' "
                 "(or rebuild symnccl against NCCL %d.%d.%d's headers: "
                 "SYMNCCL_NCCL_INCLUDE_2_%d)", v_major(runtime),
                 v_minor(runtime), v_patch(runtime), v_major(headers),
                 v_minor(headers), v_patch(headers), cu, v_major(headers),
                 v_minor(headers), v_patch(headers), v_major(headers),
                 v_minor(headers) + 1, v_major(runtime), v_minor(runtime),
                 v_patch(runtime), v_minor(headers));
        return buf;
    }
    /* -U: the newest of the range, which runs (the range as one spec
     * would keep a library in a gap, e.g. 2.30.5) */
    snprintf(buf, size, "the loaded libnccl is NCCL %d.%d.%d, and "
             "symnccl's kernels built against NCCL %d.%d.%d's headers run "
             "on NCCL %s only (the NCCL device API of another minor takes "
             "them only through a conversion that library carries; "
             "docs/BUILD.md, 'NCCL headers'). Install one: pip install -U "
             "'nvidia-nccl-cu%d>=%d.%d.%d,<%d.%d'", v_major(runtime),
             v_minor(runtime), v_patch(runtime), v_major(headers),
             v_minor(headers), v_patch(headers), ranges, cu, v_major(lo),
             v_minor(lo), v_patch(lo), v_major(hi), v_minor(hi) + 1);
    return buf;
}

int
sn_nccl_pick_build(int runtime, const int *headers, int n, char *buf,
                   size_t size)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (runs_on(runtime, headers[i]) &&
            (best < 0 || headers[i] > headers[best]))
            best = i;
    if (best >= 0 || n == 0) {
        if (n == 0)
            snprintf(buf, size, "symnccl was built without kernels");
        return best;
    }
    /* no build runs on it: a library older than the headers of the
     * build of its own minor says so; else every build's libraries */
    for (int i = 0; i < n; i++)
        if (v_major(headers[i]) == v_major(runtime) &&
            v_minor(headers[i]) == v_minor(runtime)) {
            sn_nccl_version_verdict(runtime, headers[i], buf, size);
            return -1;
        }
    char all[400] = "";
    int lo = 0, hi = 0;
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof(all); i++) {
        char ranges[160];
        int l, h;
        library_ranges(headers[i], ranges, sizeof(ranges), &l, &h);
        lo = i == 0 || l < lo ? l : lo;
        hi = i == 0 || h > hi ? h : hi;
        used += (size_t)snprintf(all + used, sizeof(all) - used, "%s%s",
                                 used ? ", " : "", ranges);
    }
    snprintf(buf, size, "the loaded libnccl is NCCL %d.%d.%d, and no kernel "
             "build of symnccl runs on it: they run on NCCL %s (a library "
             "takes a device communicator of another minor only through a "
             "conversion it carries; docs/BUILD.md, 'NCCL headers'). "
             "Install one: pip install -U 'nvidia-nccl-cu%d>=%d.%d.%d,<%d.%d'",
             v_major(runtime), v_minor(runtime), v_patch(runtime), all,
             CUDART_VERSION / 1000, v_major(lo), v_minor(lo), v_patch(lo),
             v_major(hi), v_minor(hi) + 1);
    return -1;
}

/* ------------------------------------------------------------------ */
/* What has passed `python -m symnccl` on two GPUs: the library and the
 * headers of the kernel build that ran on it, exact releases (another
 * patch is another library). docs/FAILURES.md, 'NCCL versions', has the
 * runs. */

typedef struct {
    int library, headers;
    const char *where;
} nccl_proof;

static const nccl_proof proofs[] = {
    {V(2, 28, 9), V(2, 28, 9), "2x H100, 2026-11-26: 2876 checks, 0 wrong"},
    {V(2, 29, 7), V(2, 29, 7), "2x H100, 2026-11-26: 2876 checks, 0 wrong"},
    {V(2, 30, 7), V(2, 29, 7), "2x H200, 2026-11-26: 2876 checks, 0 wrong"},
    {V(2, 31, 2), V(2, 29, 7), "2x H100, 2026-11-26: 2876 checks, 0 wrong"},
    {V(2, 32, 3), V(2, 29, 7), "2x H200, 2026-11-26: 2876 checks, 0 wrong"},
};

#define N_PROOFS (sizeof(proofs) / sizeof(proofs[0]))

const char *
sn_nccl_multi_gpu_caveat(int runtime, int headers, char *buf, size_t size)
{
    for (size_t i = 0; i < N_PROOFS; i++)
        if (proofs[i].library == runtime && proofs[i].headers == headers)
            return NULL;
    int n = snprintf(buf, size, "symnccl has not passed its self-check on "
                     "two GPUs with NCCL %d.%d.%d loaded and its kernels "
                     "built against NCCL %d.%d.%d's headers: run `python -m "
                     "symnccl` on these GPUs (passed:", v_major(runtime),
                     v_minor(runtime), v_patch(runtime), v_major(headers),
                     v_minor(headers), v_patch(headers));
    for (size_t i = 0; i < N_PROOFS && n > 0 && (size_t)n < size; i++)
        n += snprintf(buf + n, size - (size_t)n, "%s NCCL %d.%d.%d with "
                      "the %d.%d.%d build", i ? ";" : "",
                      v_major(proofs[i].library), v_minor(proofs[i].library),
                      v_patch(proofs[i].library), v_major(proofs[i].headers),
                      v_minor(proofs[i].headers), v_patch(proofs[i].headers));
    if (n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, "; docs/FAILURES.md)");
    return buf;
}

/* ------------------------------------------------------------------ */
/* Programmatic dependent launch. NCCL launches its symmetric kernels as
 * programmatic dependent launches (enqueue.cc, isSymColl), and only from
 * 2.30.7 on do they wait at entry for the kernel before them
 * (cudaGridDependencySynchronize, src/device/symmetric/generate.py). The
 * minors after 2.30 have not been read or run for it: their kernels may
 * not wait, so symnccl's kernels trigger no early launch beside them. */

#define PDL_WAITING_NCCL V(2, 30, 7)
#define PDL_WAITING_NCCL_LAST V(2, 30, 99)

int
sn_nccl_pdl_early(int runtime)
{
    return runtime >= PDL_WAITING_NCCL && runtime <= PDL_WAITING_NCCL_LAST;
}

/* ------------------------------------------------------------------ */
/* NCCL's symmetric-window kernels: the calls they get wrong, one row per
 * NCCL version range and case (the first row that matches a call gives
 * the reason). A call whose buffers are all plain memory never meets
 * them on the versions below (2.29 runs its symmetric LL kernels on plain
 * buffers only under NCCL_SYM_NOWIN_ENABLE=1 or NCCL_SYM_KERNEL, and
 * symnccl sets neither; the 2.30, 2.31 and 2.32 libraries read the same
 * two variables). */

enum {
    CASE_EVERY,           /* every call that involves a window */
    CASE_VIEW_UNALIGNED,  /* a window buffer's address % align != 0 */
    CASE_BLOCK_UNALIGNED, /* out in a window, block_bytes % align != 0 */
    CASE_MIXED,           /* one buffer in a window, the other not */
    CASE_UNALIGNED,       /* any buffer's address or size % align != 0 */
    CASE_COUNT
};

static const char *const case_names[CASE_COUNT] = {
    "every", "view_unaligned", "block_unaligned", "mixed", "unaligned"};

#define ALL_REDUCE (1 << SYMNCCL_COLL_ALL_REDUCE)
#define REDUCE_SCATTER (1 << SYMNCCL_COLL_REDUCE_SCATTER)
#define ALL_GATHER (1 << SYMNCCL_COLL_ALL_GATHER)
/* the collectives NCCL has symmetric kernels for */
#define SYMMETRIC (ALL_REDUCE | REDUCE_SCATTER | ALL_GATHER)

typedef struct {
    int lo, hi;           /* NCCL_VERSION_CODE range, inclusive */
    int collectives;      /* mask of 1 << SYMNCCL_COLL_* */
    int what;             /* CASE_* */
    size_t align;         /* bytes, for the alignment cases */
    const char *reason;   /* what was seen, for messages and docs */
} nccl_case;

static const nccl_case cases[] = {
    /* seen on 2x H200, NCCL 2.28.9: bf16 window offsets of 1..8 elements,
     * in place (float32 at the same offsets was right) */
    {V(2, 28, 0), V(2, 28, 99), ALL_REDUCE, CASE_VIEW_UNALIGNED, 16,
     "NCCL 2.28's symmetric all_reduce gives wrong results on a window "
     "view that does not start on a 16-byte boundary"},
    /* seen on 2x H200, NCCL 2.28.9: bf16, 1031 and 4099 elements per
     * rank */
    {V(2, 28, 0), V(2, 28, 99), REDUCE_SCATTER, CASE_BLOCK_UNALIGNED, 16,
     "NCCL 2.28's symmetric reduce_scatter writes zeros into every 4th "
     "16-bit element of a window output whose per-rank block is not a "
     "multiple of 16 bytes"},
    /* On 2x H100 (2026-11-26), with SYMNCCL_NCCL_WINDOWS=1: NCCL 2.29.7's
     * symmetric kernels gave 5122 wrong elements in 2876 checks (every 4th
     * element of five 4099-element blocks, the pattern of the
     * reduce_scatter row above), 2.30.7's failed at the first call
     * ("invalid device function", on 2x H200 too; NCCL_SYM_KERNEL=none
     * passed). NCCL gets plain memory on 2.29 and 2.30. */
    {V(2, 29, 0), V(2, 29, 99), SYMMETRIC, CASE_EVERY, 0,
     "NCCL 2.29's symmetric kernels gave wrong results on windows on two "
     "GPUs (2.29.7: 5122 wrong elements in 2876 checks)"},
    {V(2, 30, 0), V(2, 30, 99), SYMMETRIC, CASE_EVERY, 0,
     "NCCL 2.30's symmetric kernels failed on windows on two GPUs (2.30.7: "
     "'invalid device function' at the first call)"},
    /* 2.31.2 on 2x H100 and 2.32.3 on 2x H200 (2026-11-26,
     * tools/gpu/other_nccl.sh, SYMNCCL_NCCL_WINDOWS=1): 'invalid device
     * function' at the first call, as 2.30.7. */
    {V(2, 31, 0), V(2, 31, 99), SYMMETRIC, CASE_EVERY, 0,
     "NCCL 2.31's symmetric kernels failed on windows on two GPUs (2.31.2: "
     "'invalid device function' at the first call)"},
    {V(2, 32, 0), V(2, 32, 99), SYMMETRIC, CASE_EVERY, 0,
     "NCCL 2.32's symmetric kernels failed on windows on two GPUs (2.32.3: "
     "'invalid device function' at the first call)"},
    /* 2.29 runs its symmetric LL kernels when only one buffer is a window
     * (sym_kernels.cc, scheduler/symmetric_sched.cc); the 2.30 notes:
     * "Fix data corruption in symmetric LL kernels with unaligned
     * buffers" */
    {V(2, 29, 0), V(2, 29, 99), SYMMETRIC, CASE_MIXED, 0,
     "NCCL 2.29 runs its symmetric LL kernels on mixed window and plain "
     "buffers, which corrupt data (fixed in 2.30)"},
    {V(2, 29, 0), V(2, 29, 99), SYMMETRIC, CASE_UNALIGNED, 16,
     "NCCL 2.29's symmetric LL kernels corrupt data on buffers that are "
     "not 16-byte aligned (fixed in 2.30)"},
};

#define N_CASES (sizeof(cases) / sizeof(cases[0]))

static int
misaligned(const char *p, size_t align)
{
    return align != 0 && (uintptr_t)p % align != 0;
}

static int
case_applies(const nccl_case *k, const char *x, size_t xbytes,
             const char *out, size_t outbytes, size_t block_bytes,
             int x_in_window, int out_in_window)
{
    switch (k->what) {
    case CASE_EVERY:
        return 1;
    case CASE_VIEW_UNALIGNED:
        return (x_in_window && misaligned(x, k->align)) ||
               (out_in_window && misaligned(out, k->align));
    case CASE_BLOCK_UNALIGNED:
        return out_in_window && block_bytes % k->align != 0;
    case CASE_MIXED:
        return x_in_window != out_in_window && x != out;
    case CASE_UNALIGNED:
        return misaligned(x, k->align) || misaligned(out, k->align) ||
               xbytes % k->align != 0 || outbytes % k->align != 0 ||
               block_bytes % k->align != 0;
    default:
        return 0;
    }
}

const char *
sn_nccl_plain_reason(int nccl_version, int windows, int collective,
                     const char *x, size_t xbytes, const char *out,
                     size_t outbytes, size_t block_bytes, int x_in_window,
                     int out_in_window)
{
    if (!x_in_window && !out_in_window)
        return NULL;   /* plain already */
    if (windows == SN_NCCL_WINDOWS_ON)
        return NULL;
    if (windows == SN_NCCL_WINDOWS_PLAIN)
        return "SYMNCCL_NCCL_WINDOWS=0: NCCL gets plain memory";
    for (size_t i = 0; i < N_CASES; i++) {
        const nccl_case *k = &cases[i];
        if (nccl_version >= k->lo && nccl_version <= k->hi &&
            collective >= 0 && collective < SYMNCCL_COLL_COUNT &&
            (k->collectives >> collective & 1) &&
            case_applies(k, x, xbytes, out, outbytes, block_bytes,
                         x_in_window, out_in_window))
            return k->reason;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* The tables row by row, for their Python view (python/nccl_info.c:
 * NCCL_WINDOW_POLICY, NCCL_SUPPORT). */

int
sn_nccl_case_row(int i, int *lo, int *hi, int *collectives,
                 const char **case_name, size_t *align, const char **reason)
{
    if (i < 0 || (size_t)i >= N_CASES)
        return 0;
    const nccl_case *k = &cases[i];
    *lo = k->lo;
    *hi = k->hi;
    *collectives = k->collectives;
    *case_name = case_names[k->what];
    *align = k->align;
    *reason = k->reason;
    return 1;
}

int
sn_nccl_conversion_row(int i, int *headers_lo, int *headers_hi,
                       int *library_lo, int *library_hi,
                       const char **evidence)
{
    if (i < 0 || (size_t)i >= N_CONVERSIONS)
        return 0;
    const nccl_conversion *c = &conversions[i];
    *headers_lo = c->headers_lo;
    *headers_hi = c->headers_hi;
    *library_lo = c->library_lo;
    *library_hi = c->library_hi;
    *evidence = c->evidence;
    return 1;
}

int
sn_nccl_proof_row(int i, int *library, int *headers, const char **where)
{
    if (i < 0 || (size_t)i >= N_PROOFS)
        return 0;
    *library = proofs[i].library;
    *headers = proofs[i].headers;
    *where = proofs[i].where;
    return 1;
}

int
sn_nccl_newest_minor(void)
{
    return NEWEST_MINOR;
}

int
sn_nccl_pdl_waits_from(void)
{
    return PDL_WAITING_NCCL;
}
