"""The layers of csrc/'s C files, as csrc/symnccl.h's header comment
declares them: the one declaration of the order, read by the layering test
(tests/test_cpu.py, which also checks that it names every file) and by
ARCHITECTURE.md's test (tests/test_docs.py). Also where the tests find a C
file by its name (the files live in csrc/runtime/, csrc/python/ and
csrc/xla/)."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
HEADER = os.path.join(CSRC, "symnccl.h")
#: the runtime's header, without Python: what runtime/ and xla/ include
#: (symnccl.h includes it, then adds the Python face)
RUNTIME_HEADER = os.path.join(CSRC, "runtime.h")
#: the folders of the host C files; csrc/kernels/ is the CUDA C++ side
FOLDERS = ("runtime", "python", "xla")
_FILES = r"((?:[\w/]+\.c\s*)+)$"


def layers():
    """[(number, [file, ...]), ...] in the header's order (files without
    their .c)."""
    text = open(HEADER).read()
    out = []
    for line in text[:text.index("*/")].splitlines():
        first = re.match(r"^ \*\s+(\d+)\s+" + _FILES, line)
        more = re.match(r"^ \*\s+" + _FILES, line)
        if first:
            out.append((int(first.group(1)), first.group(2).split()))
        elif more and out:
            out[-1][1].extend(more.group(1).split())
    return [(n, [f[:-2] for f in files]) for n, files in out]


#: every C file, in layer order: a file calls only files before it
LAYERS = [f for _, files in layers() for f in files]


def c_files():
    """Every host C file as folder/name (without .c), sorted."""
    return sorted(f"{d}/{f[:-2]}" for d in FOLDERS
                  for f in os.listdir(os.path.join(CSRC, d))
                  if f.endswith(".c"))


def path(name):
    """The path of the csrc/ file called `name` ("lifecycle.c",
    "xla_ffi_abi.h", or "runtime/lifecycle.c"): file names are unique
    across csrc/'s folders."""
    if os.path.exists(os.path.join(CSRC, name)):
        return os.path.join(CSRC, name)
    found = [os.path.join(CSRC, d, name) for d in FOLDERS
             if os.path.exists(os.path.join(CSRC, d, name))]
    assert len(found) == 1, (name, found)
    return found[0]


def source(name):
    """The text of the csrc/ file called `name` (see path)."""
    with open(path(name)) as f:
        return f.read()


# ---------------------------------------------------------------------------
# No Python API on XLA's threads: csrc/runtime/ and csrc/xla/ call neither
# the Python API nor a function of csrc/python/ (nor a macro of symnccl.h
# that does), and do not even see Python.h (they include runtime.h, not
# symnccl.h), so that the XLA handlers, which run on XLA's threads without
# the GIL, and the launch path they share with the methods, never can.

_PY_API = re.compile(r"\b_?Py[A-Z_]\w*|#\s*include\s*[<\"]Python\.h[>\"]")


def _code(text):
    """text without its comments and string literals (line count kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"),
                  text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def _defined(text):
    """The sn_ functions a C file defines."""
    return {m.group(1) for m in re.finditer(
        r"^(?:[a-zA-Z_][\w ]*\*?\s*\n)?(sn_\w+)\(", text, re.M)}


def python_uses(name):
    """What the C file `name` (folder/name, without .c) uses of Python,
    sorted: the Python API's names, the functions of csrc/python/ it calls,
    and the macros of symnccl.h and runtime.h it expands that use
    either."""
    python_fns = set()
    for f in c_files():
        if f.startswith("python/"):
            python_fns |= _defined(source(f + ".c"))
    own = _defined(source(name + ".c"))
    calls = lambda code: {fn for fn in python_fns - own
                          if re.search(r"\b" + fn + r"\s*\(", code)}
    header = _code(open(HEADER).read() + open(RUNTIME_HEADER).read())
    macros = set()   # the headers' macros and inline functions that do
    for m in re.finditer(r"^#define (SN_\w+)(.*?)(?<!\\)\n", header,
                         re.M | re.S):
        if _PY_API.search(m.group(2)) or calls(m.group(2)):
            macros.add(m.group(1))
    for m in re.finditer(r"^static inline [^;{(]*?\b(sn_\w+)\([^)]*\)\s*"
                         r"(\{.*?\}\n)", header, re.M | re.S):
        if _PY_API.search(m.group(2)) or calls(m.group(2)):
            macros.add(m.group(1))
    code = _code(source(name + ".c"))
    uses = set(_PY_API.findall(code)) | calls(code)
    uses |= {mac for mac in macros if re.search(r"\b" + mac + r"\b", code)}
    return sorted(uses)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)


def includes(path, _seen=None):
    """What the file at `path` includes, directly or through csrc/'s own
    headers, which are followed: {csrc/'s headers as paths, every other
    header by its name as written} (the system's, CUDA's, NCCL's,
    Python.h)."""
    seen = set() if _seen is None else _seen
    text = re.sub(r"/\*.*?\*/", "", open(path).read(), flags=re.S)
    for kind, name in _INCLUDE.findall(text):
        # "x.h": beside the including file, then csrc/ (-Icsrc); <x.h>:
        # csrc/ only
        dirs = ([os.path.dirname(path)] if kind == '"' else []) + [CSRC]
        found = [os.path.normpath(os.path.join(d, name)) for d in dirs
                 if os.path.exists(os.path.join(d, name))]
        if not found:
            seen.add(name)
        elif found[0] not in seen:
            seen.add(found[0])
            includes(found[0], seen)
    return seen
