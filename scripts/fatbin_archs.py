"""Which GPU code a shared library carries, without cuobjdump: walks the
fat binaries in its .nv_fatbin section and counts the entries per kind
(elf = SASS cubin, ptx) and architecture.

    python scripts/fatbin_archs.py ~/.cache/symnccl/nccl/2.30/nvidia/nccl/lib/libnccl.so.2

Layout read here (CUDA's fatbin container, as cuobjdump lists it): a
header (magic 0xBA55ED50, u16 version, u16 header size, u64 size of the
entries), then entries of (u16 kind: 1 PTX, 2 ELF; u16; u32 header size;
u64 payload size; ...; u32 at byte 28: the SM number)."""
import collections
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}


def _section(data, want):
    """(offset, size) of ELF64 section `want`."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
             for i in range(shnum)]
    names = heads[shstrndx][4]
    for h in heads:
        name = data[names + h[0]:data.index(b"\0", names + h[0])].decode()
        if name == want:
            return h[4], h[5]
    raise SystemExit(f"no {want} section")


def archs(path):
    """Counter of (kind, sm) over every fatbin entry of the library."""
    with open(path, "rb") as f:
        data = f.read()
    off, size = _section(data, ".nv_fatbin")
    end, p, tally = off + size, off, collections.Counter()
    while p + 16 <= end:
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", data, p)
        if magic != FATBIN_MAGIC:
            p += 8   # fat binaries are 8-byte aligned
            continue
        q, qend = p + hsize, p + hsize + fsize
        while q + 32 <= qend:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, q)
            if ehsize == 0:
                break
            sm = struct.unpack_from("<I", data, q + 28)[0]
            tally[(KINDS.get(kind, str(kind)), sm)] += 1
            q += ehsize + psize
        p = qend
    return tally


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(path)
        for (kind, sm), count in sorted(archs(path).items()):
            print(f"  {kind:>4} sm_{sm}: {count}")
