"""A copy of a libnccl.so.2 that carries device code for one GPU
architecture only, the same size and layout as the original, for the
device machines' 64 MiB carry (tools/gpu/other_nccl.sh).

NCCL's wheels hold SASS for sm_75 to sm_120 and PTX for the newest, in
two fatbin sections (.nv_fatbin, __nv_relfatbin), plus host debug
information. A GPU runs only the SASS of its own major architecture (an
sm_90 H100 or H200 never loads sm_100 code, and compute_120 PTX cannot be
compiled for it), so the payloads of every other entry are overwritten
with zeros, as are the .debug_* sections (never loaded): every offset,
size and entry header stays as it was, and the zeros compress to almost
nothing. The sm_90 entries and everything else are byte for byte the
original's. A 2.31.2 library: 299 MB, 253 MB gzipped; this copy: 37 MB
gzipped.

    python3 tools/gpu/nccl_sm_only.py IN OUT [--arch 90]
"""
from __future__ import annotations

import argparse
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
SHF_ALLOC = 0x2
SHT_NOBITS = 8


def sections(b):
    """(name, flags, offset, size) of every section of an ELF64 file that
    has bytes in it (not SHT_NOBITS: .bss)."""
    if b[:4] != b"\x7fELF" or b[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3a)
    raw = [struct.unpack_from("<IIQQQQ", b, shoff + i * shentsize)
           for i in range(shnum)]
    names = raw[shstrndx][4]
    for name, typ, flags, _addr, off, size in raw:
        if typ == SHT_NOBITS:
            continue
        end = b.index(b"\0", names + name)
        yield bytes(b[names + name:end]).decode(), flags, off, size


def fatbin_entries(b, off, size):
    """(payload offset, payload size, kind, arch) of every entry of the
    fatbins in b[off:off + size] (kind 1: PTX, 2: SASS)."""
    p, end = off, off + size
    while p + 16 <= end:
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", b, p)
        if magic != FATBIN_MAGIC:
            p += 8   # fatbins are 8-byte aligned in their section
            continue
        q, qend = p + hsize, p + hsize + fsize
        while q < qend:
            kind, _, ehs, psize = struct.unpack_from("<HHIQ", b, q)
            arch, = struct.unpack_from("<I", b, q + 28)
            yield q + ehs, psize, kind, arch
            q += ehs + psize
        if q != qend:
            raise ValueError(f"fatbin at {p:#x}: entries overrun it")
        p = qend


def prune(data: bytes, arch: int):
    """(pruned copy, bytes kept of `arch`, bytes zeroed)."""
    b = bytearray(data)
    kept = zeroed = 0
    for name, flags, off, size in list(sections(b)):
        if name.startswith(".debug_") and not flags & SHF_ALLOC:
            b[off:off + size] = bytes(size)
            zeroed += size
        elif name in FATBIN_SECTIONS:
            for p, n, _kind, a in list(fatbin_entries(b, off, size)):
                if a == arch:
                    kept += n
                else:
                    b[p:p + n] = bytes(n)
                    zeroed += n
    if kept == 0:
        raise ValueError(f"no sm_{arch} device code in this library")
    return bytes(b), kept, zeroed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--arch", type=int, default=90,
                   help="the SASS architecture to keep (default: 90)")
    a = p.parse_args(argv)
    with open(a.src, "rb") as f:
        data = f.read()
    out, kept, zeroed = prune(data, a.arch)
    with open(a.dst, "wb") as f:
        f.write(out)
    print(f"{a.dst}: sm_{a.arch} device code kept ({kept >> 20} MiB), "
          f"{zeroed >> 20} MiB of other architectures and debug "
          f"information zeroed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
