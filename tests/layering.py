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
