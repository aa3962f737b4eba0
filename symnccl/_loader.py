"""Find and load libnccl.so.2 before the extension module is imported.

symnccl's device code is compiled against a few NCCL releases' headers (the
device API's structs change between minor versions) and the module uses
the build that may run on the libnccl it loads (csrc/runtime/abi.c, which refuses
the import when none may). In order of preference:

1. a libnccl.so.2 already loaded in this process (torch and jaxlib load the
   nvidia-nccl-cu13 wheel's): reused, so one process has one NCCL;
2. $NCCL_HOME/lib/libnccl.so.2 when NCCL_HOME is set;
3. the nvidia-nccl-cu13 wheel's copy, preloaded with RTLD_GLOBAL.
"""
from __future__ import annotations

import ctypes
import os

__all__ = ["preload", "loaded_nccl_path", "wheel_nccl_path",
           "version_tuple"]


def loaded_nccl_path() -> str | None:
    """Path of a libnccl.so already mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(" ")[-1]
                if os.path.basename(path).startswith("libnccl.so"):
                    return path
    except OSError:
        pass
    return None


def wheel_nccl_path() -> str | None:
    """libnccl.so.2 of the installed nvidia-nccl-cu13 wheel, if any."""
    try:
        import nvidia.nccl as m
    except ImportError:
        return None
    for root in getattr(m, "__path__", []):
        p = os.path.join(root, "lib", "libnccl.so.2")
        if os.path.exists(p):
            return p
    return None


def preload() -> str | None:
    """Make sure a libnccl.so.2 is loaded; returns its path (None if the
    dynamic linker will find one through the extension's rpath)."""
    already = loaded_nccl_path()
    if already is not None:
        return already
    home = os.environ.get("NCCL_HOME")
    path = os.path.join(home, "lib", "libnccl.so.2") if home else None
    if path is None or not os.path.exists(path):
        path = wheel_nccl_path()
    if path is None:
        return None
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return path


def version_tuple(code: int) -> tuple[int, int, int]:
    """NCCL_VERSION_CODE (e.g. 22809) -> (2, 28, 9)."""
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100   # pre-2.9 scheme
