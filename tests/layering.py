"""The layers of csrc/'s C files, as csrc/symnccl.h's header comment
declares them: the one declaration of the order, read by the layering test
(tests/test_cpu.py, which also checks that it names every file) and by
ARCHITECTURE.md's test (tests/test_docs.py)."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "csrc", "symnccl.h")
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
