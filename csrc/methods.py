"""One declaration per Communicator method: the table below is the only
place a collective method's parameters, keyword list, argument format and
docstring are written (one row each). The build runs this file (setup.py), which writes

  csrc/methods.h     SN_METHODS(X) (the methods, whose C functions are
                     sn_<name>), and for each: SN_KW_<name> (its kwlist),
                     SN_FMT_<name> (its PyArg_ParseTupleAndKeywords format)
                     and SN_DOC_<name> (its docstring, with the signature
                     Python's inspect reads);
  symnccl/_C.pyi     the methods' stubs, between the markers
                     "# methods: generated" and "# end of generated methods".

`python3 csrc/methods.py --check` exits 1 when either is not current
(tests/test_build.py runs it). A parameter is (name, C format code, stub
annotation, default as Python writes it, or REQUIRED); KW_ONLY starts the
keyword-only ones.
"""
import os
import sys

REQUIRED = object()
KW_ONLY = ("*",)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

X = ("x", "O", "Any", REQUIRED)
OUT = ("out", "O", "Any", "None")
OP = ("op", "O", "str", "'sum'")
ALGO = ("algo", "O", "str", "'auto'")
STREAM = ("stream", "O", "StreamLike", "None")
ROOT_ = ("root", "i", "int", "0")

#: (name, parameters, stub return type, docstring), in the method table's
#: order (comm.c); the docstring is written in its row, nowhere else
METHODS = [
    ("all_reduce", [X, OUT, OP, ALGO, STREAM], "Any",
     'Reduces x over all ranks. Without out= the result is written '
     'in place (for JAX arrays, which are immutable, into a new array). '
     "Returns the result in x's framework type, zero-copy. Runs on "
     "`stream`, else the framework's current stream, else the legacy "
     'default stream; never blocks the host.\n\n'
     "ops: sum, prod, max, min, avg.\nalgo: 'auto' (the default: a "
     'table measured on H100s and H200s, symnccl.AUTO_TABLE; SYMNCCL_ALGO '
     "overrides it); symnccl's kernels on the NCCL device API: 'll' "
     "(barrier-free LL packets, small messages), 'll128' (the same "
     "in 128-byte lines, up to a few MiB), 'lamport' (packets that are "
     'their own flag, a few hundred KiB to a few MiB; float32, float16 '
     "and bfloat16 with sum or avg), 'one_shot', 'two_shot' "
     '(NVLink loads; inputs outside a window go through the staging '
     "window), 'push' (store-only two-shot with flags, any input), "
     "'multimem' (NVLink SHARP, only where multicast was granted); "
     "'nccl'. Every rank must pass the same algo and "
     "the same kind "
     'of input (all in a SymmetricBuffer at the same offset, or none). '
     'Calls on one communicator from different streams are ordered '
     'by symnccl; a replayed CUDA graph must not overlap other calls '
     'on the same communicator.\n\n'
     'Example:\n    comm.all_reduce(t)                 # in place\n'
     "    y = comm.all_reduce(x, out=y, op='max')"),
    ("reduce_scatter", [X, OUT, OP, ALGO, STREAM], "Any",
     'x holds nranks * n elements; rank r receives the reduction of '
     "block r (n elements). Without out=, a new tensor of x's framework "
     'type is returned: shape (x.shape[0] // nranks, *x.shape[1:]) '
     'when the first dimension divides, else 1-D.\n\n'
     "algo: 'auto' (the default) picks among symnccl's kernels and "
     'NCCL by a table measured on 2x H200 (symnccl.AUTO_TABLE; SYMNCCL_ALGO '
     'overrides it); it runs NCCL on 3 or more ranks, inside symnccl.group() '
     "and where no kernel takes the call. 'll' or 'll128' run symnccl's "
     "packet kernels (small and medium messages), 'push' its store-only "
     'kernel (large ones); all give the same bits as block r of all_reduce. '
     "'nccl' runs ncclReduceScatter.\n\n"
     'Example:\n    part = comm.reduce_scatter(x)'),
    ("all_gather", [X, OUT, ALGO, STREAM], "Any",
     "Concatenates every rank's x (rank order) into out, which holds "
     'nranks * x.size elements; without out=, a new tensor of shape '
     '(nranks * x.shape[0], *x.shape[1:]).\n\n'
     "algo: 'auto' (the default) picks among symnccl's kernels and "
     'NCCL by a table measured on 2x H200 (symnccl.AUTO_TABLE; SYMNCCL_ALGO '
     'overrides it); it runs NCCL on 3 or more ranks, inside symnccl.group() '
     "and where no kernel takes the call. 'll' or 'll128' run symnccl's "
     "packet kernels (small and medium messages), 'push' its store-only "
     "kernel (large ones); every dtype. 'nccl' runs ncclAllGather.\n"
     '\nExample:\n    full = comm.all_gather(x)'),
    ("broadcast", [X, ROOT_, OUT, ALGO, STREAM], "Any",
     "Copies root's x to every rank, in place unless out= is given.\n"
     "\nalgo: 'auto' (the default) picks among symnccl's kernels and "
     'NCCL by a table measured on 2x H200 (symnccl.AUTO_TABLE; SYMNCCL_ALGO '
     'overrides it); it runs NCCL on 3 or more ranks, inside symnccl.group() '
     "and where no kernel takes the call. 'one_shot' runs symnccl's "
     "kernel (peers load root's copy between two barriers; every dtype); "
     "'nccl' runs ncclBroadcast.\n\n"
     'Example:\n    comm.broadcast(weights, root=0)'),
    ("reduce", [X, ROOT_, OUT, OP, ALGO, STREAM], "Any",
     "Reduces every rank's x into root's out (x itself unless out= "
     'is given); on the other ranks out is left unspecified, as '
     'torch.distributed.reduce '
     'leaves it.\n\n'
     "algo: 'auto' (the default) picks among symnccl's kernels and "
     'NCCL by a table measured on 2x H200 (symnccl.AUTO_TABLE; SYMNCCL_ALGO '
     'overrides it); it runs NCCL on 3 or more ranks, inside symnccl.group() '
     "and where no kernel takes the call. 'one_shot' runs symnccl's "
     "kernel (the root loads every rank's copy: the bits of all_reduce); "
     "'nccl' runs ncclReduce.\n\n"
     'Example:\n    comm.reduce(loss_sum, root=0)'),
    ("all_reduce_rmsnorm",
     [X, ("residual", "O", "Any", REQUIRED),
      ("weight", "O", "Any", REQUIRED), ("eps", "d", "float", REQUIRED),
      KW_ONLY, OUT, ("residual_out", "O", "Any", "None"),
      ("quant", "O", "Optional[str]", "None"),
      ("scale", "O", "Any", "None"), ALGO, STREAM],
     "tuple[Any, Any]",
     '-> (y, h)\n\n'
     'The all-reduce of a tensor-parallel layer fused with the residual '
     "add and RMSNorm after it (vLLM's fused_add_rms_norm): x (T, "
     "H) holds this rank's partial sums, residual (T, H), weight (H,);\n"
     '    h = all_reduce(x) + residual\n    y = h * rsqrt(mean(h * '
     "h over H) + eps) * weight\nThe all-reduce is rounded to x's dtype, "
     'h too before the norm (as vLLM and the unfused composition round '
     'them); the mean and the scaling are fp32, the normalised value '
     "is rounded to the dtype before the weight (as vLLM and torch's "
     'rms_norm do). float32, float16, bfloat16; H a multiple of 8; '
     "residual and weight of x's dtype. Every rank gets the same bits "
     '(the ranks are summed in rank order). y goes to out=, h to '
     'residual_out= '
     '(residual_out=residual: in place, as vLLM), else to new tensors '
     "of x's framework.\n\n"
     "quant='fp8_static': y is written as float8_e4m3fn into out= "
     '(given), y / scale[0] saturated to +-448, scale= a float32 tensor '
     "of one element; quant='fp8_dynamic': each row's scale is computed "
     "(max(amax|y| / 448, 1 / (448 * 512)), vLLM's per-token scale) "
     'and written into scale= (float32, one per row). y is rounded '
     "to x's dtype before it is quantised.\n\n"
     "algo: 'one_shot' (symnccl's kernel: each rank stages x, then "
     "reduces every row from every rank, adds, normalises); 'two_shot' "
     '(each rank reduces and normalises 1/n of the rows and stores '
     "y and h into every rank's staging window; residual and weight "
     'must be the same on every rank, as in tensor parallelism; no '
     "quant); 'll' (no barrier: each rank pushes its rows to every "
     'peer as LL packets and reduces them as they land, the decode '
     "sizes; one_shot's bits); 'll128' (ll in 128-byte lines of 120 "
     'data bytes: 16/15 of the rows on the link instead of twice them, '
     "the sizes between ll's and one_shot's; one_shot's bits); "
     "'lamport' (ll with the rows as their own flag: an empty slot "
     'word is all ones, a NaN that x never sends (a word of x that is '
     'all ones travels as another NaN, which the sums turn into the '
     "same NaN), so the rows cross the link once; one_shot's bits); "
     "'nccl' "
     "(ncclAllReduce, then symnccl's "
     "add+norm kernel); 'auto' (symnccl.AUTO_TABLE). A loopback team "
     "runs the kernels only (not 'nccl').\n\n"
     'Example:\n    y, h = comm.all_reduce_rmsnorm(attn_out, residual, '
     'w, 1e-6,\n                                   residual_out=residual)'),
    ("all_to_all", [X, OUT, ALGO, STREAM], "Any",
     'x holds nranks blocks of m rows (its first dimension: nranks '
     '* m); block j goes to rank j, and block i of the output comes '
     'from rank i: torch.distributed.all_to_all_single without splits, '
     'jax.lax.all_to_all(x, 0, 0, tiled=True). Without out=, a new '
     "tensor of x's shape. Every dtype (moved as bytes); out must "
     'not overlap x.\n\n'
     "algo: 'push' runs symnccl's store-only kernel, 'll' its LL packet "
     'kernel (small messages: a block must fit one row of packets); '
     "'nccl' runs grouped ncclSend/ncclRecv; 'auto' follows "
     "symnccl.AUTO_TABLE "
     "by x's bytes (ll, push, then NCCL).\n\n"
     "Example:\n    y = comm.all_to_all(x, algo='push')   # x: (n*m, "
     'd)'),
    ("all_to_all_v",
     [X, ("out", "O", "Any", REQUIRED), ("in_splits", "O", "Any", REQUIRED),
      ("out_splits", "O", "Any", "None"), ALGO, STREAM, KW_ONLY,
      ("out_offsets", "O", "Any", "None")],
     "Any",
     'Uneven all-to-all: this rank sends in_splits[q] rows of x (the '
     'first in_splits[0] to rank 0, the next to rank 1, ...) and writes '
     'the rows it receives from ranks 0, 1, ... one after another '
     'into out, which the caller sizes for the most rows it can receive. '
     'in_splits: a host sequence of nranks ints, or a device int64 '
     'tensor of nranks. out_splits: an optional device int64 tensor '
     'of nranks that receives the rows each rank sent here; out_offsets, '
     "likewise, the row of out where each rank's rows start. out, "
     'out_splits and out_offsets each need memory of their own (not '
     "shared with x, in_splits or each other). Returns out.\n\n"
     "algo='push' (or 'll', for small messages) runs symnccl's kernel: "
     'the ranks exchange the counts on the device, so with device '
     'splits nothing synchronises with the host and the call can be '
     'captured in a CUDA graph whose replays read the splits anew. '
     'Rows that would land past the end of out are dropped (sum(out_splits) '
     "> out rows shows it), and so are rows past x's end. 'll' carries "
     "one row of LL packets per source: a block past it (the communicator's "
     'size, the same on every rank) is cut there (out_splits says '
     "what arrived; host splits that were cut warn). 'nccl' exchanges "
     'the counts with NCCL and reads them back to the host: that path '
     'synchronises with the stream (and cannot be captured); it drops '
     "rows as the kernels do. 'auto' follows symnccl.AUTO_TABLE by "
     "out's bytes, which must be the same on every rank (ll only where "
     'a block out can keep fits its row, so it never cuts).\n'
     '\nExample:\n    splits = torch.bincount(dest, minlength=n)  # '
     'on the GPU\n    comm.all_to_all_v(x[order], out, splits, '
     'out_splits=got, '
     "algo='push')"),
    ("barrier", [STREAM, KW_ONLY, ("blocking", "p", "bool", "False")],
     "None",
     'A device-side barrier on the stream (a one-element all-reduce). '
     'With blocking=True the host also waits for it, GIL released.\n'
     '\nExample:\n    comm.barrier(blocking=True)'),
]


def _params(params):
    """(parameter, keyword-only) pairs."""
    kw = False
    for p in params:
        if p is KW_ONLY:
            kw = True
        else:
            yield p, kw


def signature(name, params):
    """Python's text signature: name($self, /, x, out=None, ...)."""
    parts = ["$self", "/"]
    star = False
    for (pname, _, _, dflt), kw in _params(params):
        if kw and not star:
            parts.append("*")
            star = True
        parts.append(pname if dflt is REQUIRED else f"{pname}={dflt}")
    return f"{name}({', '.join(parts)})"


def fmt(name, params):
    """PyArg_ParseTupleAndKeywords' format: O|OO$O:name."""
    out, optional, star = "", False, False
    for (_, code, _, dflt), kw in _params(params):
        if dflt is not REQUIRED and not optional:
            out += "|"
            optional = True
        if kw and not star:
            out += "$"
            star = True
        out += code
    return f"{out}:{name}"


def c_string(text, indent="    "):
    """A C string literal of `text`, split into lines of at most 79."""
    esc = text.replace("\\", "\\\\").replace('"', '\\"')
    esc = esc.replace("\n", "\\n")
    lines, cur = [], None
    for word in esc.split(" "):
        if cur is None:
            cur = word
        elif len(indent) + len(cur) + len(word) + 3 > 79:
            lines.append(cur + " ")
            cur = word
        else:
            cur += " " + word
    lines.append(cur)
    return "\n".join(f'{indent}"{s}"' for s in lines)


def methods_h():
    out = ["/* Generated by csrc/methods.py from its METHODS table (the one",
           " * declaration of each Communicator collective method): do not",
           " * edit; edit the table and run python3 csrc/methods.py. */",
           "#ifndef SYMNCCL_METHODS_H", "#define SYMNCCL_METHODS_H", "",
           "/* X(name): every method; its C function is sn_<name>. */",
           "#define SN_METHODS(X)" + "".join(
               f" \\\n    X({m[0]})" for m in METHODS), ""]
    for name, params, _, doc in METHODS:
        kws = ", ".join(f'"{p[0]}"' for p, _ in _params(params))
        out.append(f"#define SN_KW_{name} {{{kws}, NULL}}")
        out.append(f'#define SN_FMT_{name} "{fmt(name, params)}"')
        text = signature(name, params) + "\n--\n\n" + doc
        out.append(f"#define SN_DOC_{name} \\")
        out.append(" \\\n".join(c_string(text).split("\n")))
        out.append("")
    out.append("#endif /* SYMNCCL_METHODS_H */")
    return "\n".join(out) + "\n"


def stub(name, params, ret):
    """The _C.pyi stub of one method, wrapped at 79 columns."""
    args = ["self"]
    star = False
    for (pname, _, ann, dflt), kw in _params(params):
        if kw and not star:
            args.append("*")
            star = True
        if dflt is not REQUIRED and dflt.startswith("'"):
            dflt = '"' + dflt[1:-1] + '"'     # the stubs' quotes
        args.append(f"{pname}: {ann}" if dflt is REQUIRED
                    else f"{pname}: {ann} = {dflt}")
    head = f"    def {name}("
    lines, cur = [], head
    for i, a in enumerate(args):
        piece = a + (", " if i + 1 < len(args) else "")
        if len(cur) + len(piece.rstrip()) > 79:
            lines.append(cur.rstrip())
            cur = " " * len(head)
        cur += piece
    tail = f") -> {ret}: ..."
    if len(cur) + len(tail) > 79:
        lines.append(cur.rstrip())
        cur = " " * len(head)
    lines.append(cur + tail)
    return "\n".join(lines)


BEGIN = "    # methods: generated by csrc/methods.py\n"
END = "    # end of generated methods\n"


def c_pyi(current):
    a = current.index(BEGIN) + len(BEGIN)
    b = current.index(END)
    body = "".join(stub(n, p, r) + "\n" for n, p, r, _ in METHODS)
    return current[:a] + body + current[b:]


def outputs():
    """{path: the text it must hold}."""
    h = os.path.join(HERE, "methods.h")
    pyi = os.path.join(ROOT, "symnccl", "_C.pyi")
    return {h: methods_h(), pyi: c_pyi(open(pyi).read())}


def main(argv):
    stale = []
    for path, text in outputs().items():
        old = open(path).read() if os.path.exists(path) else None
        if old == text:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if "--check" not in argv:
            with open(path, "w") as f:
                f.write(text)
    if stale and "--check" in argv:
        print("not current (run python3 csrc/methods.py): " +
              ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
