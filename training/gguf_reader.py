"""Reads a GGUF file's metadata and its F32/F16 tensors (no gguf package here).

    meta, tensors = gguf_reader.load("models/kiln-tiny.gguf")

The layout export_gguf.py writes and ggml's gguf.cpp reads: "GGUF", version
(u32, 2 or 3), tensor count and key/value count (u64), the key/value pairs
(u64-length strings, a u32 type, the value), the tensor infos (name, n_dims,
ne innermost first, ggml type, offset), padding to general.alignment (default
32), then the data, each tensor at its offset from the start of the data.
Tensors come back as float32 torch tensors in PyTorch's order (ne reversed);
any other ggml type is an error naming the tensor.
"""

import struct

import numpy as np
import torch

GGML_F32, GGML_F16 = 0, 1
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
T_STRING, T_ARRAY = 8, 9


class _Cursor:
    def __init__(self, data, path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError("%s: truncated GGUF header at byte %d" % (self.path, self.pos))
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return v

    def string(self):
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise ValueError("%s: string of %d bytes runs past the end of the file" % (self.path, n))
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY:
            item_type, n = self.take("<I"), self.take("<Q")
            return [self.value(item_type) for _ in range(n)]
        if vtype not in _SCALARS:
            raise ValueError("%s: unknown GGUF value type %d" % (self.path, vtype))
        return self.take(_SCALARS[vtype])


def load(path):
    """(metadata dict, {name: float32 tensor}) of a GGUF holding F32/F16 tensors."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        raise ValueError("%s: not a GGUF file (magic %r)" % (path, data[:4]))
    c = _Cursor(data, path)
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise ValueError("%s: GGUF version %d (2 or 3 expected)" % (path, version))
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        ne = [c.take("<Q") for _ in range(c.take("<I"))]
        infos.append((name, ne, c.take("<I"), c.take("<Q")))
    align = int(meta.get("general.alignment", 32))
    base = c.pos + (-c.pos % align)
    tensors = {}
    for name, ne, gtype, offset in infos:
        if gtype not in (GGML_F32, GGML_F16):
            raise ValueError("%s: tensor %s has ggml type %d; only F32 and F16 are read" % (path, name, gtype))
        dtype = np.float32 if gtype == GGML_F32 else np.float16
        count = int(np.prod(ne))
        begin = base + offset
        if begin + count * np.dtype(dtype).itemsize > len(data):
            raise ValueError("%s: tensor %s runs past the end of the file" % (path, name))
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=begin)
        tensors[name] = torch.from_numpy(arr.astype(np.float32)).reshape(list(reversed(ne)))
    return meta, tensors


def split_prefix(tensors, prefix):
    """The tensors whose names start with `prefix`, the prefix removed (a state_dict)."""
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
