"""DLPack producers built field by field (ctypes), for the tests of what
symnccl's import refuses: shapes, strides, offsets and flags no real
framework hands out (dlpack.c, docs/FAILURES.md "Input limits")."""
import ctypes

import numpy as np

READ_ONLY = 1 << 0
IS_COPIED = 1 << 1
CPU, CUDA = 1, 2


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device),
                ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_NAME = b"dltensor_versioned"
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# DLPack type codes and bits of the dtypes the crafted tensors use
DTYPES = {"float32": (2, 32), "int64": (0, 64), "uint8": (1, 8),
          "bfloat16": (4, 16), "float16": (2, 16), "int32": (0, 32)}


class Crafted:
    """A producer whose __dlpack__ hands out exactly these fields. `data`
    defaults to a small host array's address (kept alive here); the
    capsule has no deleter, so nothing is freed when it is consumed."""

    def __init__(self, shape, dtype="float32", strides=None, data=None,
                 byte_offset=0, flags=0, device=(CPU, 0)):
        self._backing = np.zeros(64, np.uint8)
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = None if strides is None else \
            (ctypes.c_int64 * max(len(strides), 1))(*strides)
        code, bits = DTYPES[dtype]
        self._m = _Versioned()
        self._m.major, self._m.minor, self._m.flags = 1, 0, flags
        t = self._m.dl_tensor
        t.data = self._backing.ctypes.data if data is None else data
        t.device = _Device(*device)
        t.ndim = len(shape)
        t.dtype = _DType(code, bits, 1)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        if self._strides is not None:
            t.strides = ctypes.cast(self._strides,
                                    ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = byte_offset
        self.device = device

    def __dlpack__(self, stream=None, max_version=None, **kw):
        return _new_capsule(ctypes.addressof(self._m), _NAME, None)

    def __dlpack_device__(self):
        return self.device


def flagged(obj, flags):
    """A producer that hands out obj's own (versioned) capsule with `flags`
    set: obj's memory, shape and deleter, as a framework that copied would
    mark it."""
    class Flagged:
        def __dlpack__(self, stream=None, max_version=None, **kw):
            cap = obj.__dlpack__(stream=stream, max_version=(1, 0))
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype = ctypes.c_void_p
            get.argtypes = [ctypes.py_object, ctypes.c_char_p]
            m = _Versioned.from_address(get(cap, _NAME))
            m.flags |= flags
            return cap

        def __dlpack_device__(self):
            return obj.__dlpack_device__()
    return Flagged()
