"""Minimal safetensors writer and reader (pure Python + torch, no package).

Format: 8-byte little-endian header length N, N bytes of JSON
{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
 "__metadata__": {str: str}}, padded with spaces to a multiple of 8, then the
raw little-endian tensor bytes (offsets relative to the start of the data).

The writer is deterministic: like the safetensors package, it lays tensors
out by element size (largest first) and then by name, so every tensor starts at
an offset aligned to its element size (the format allows no gaps); the JSON has
sorted keys and no whitespace, so the same tensors give the same bytes.
``StreamWriter`` writes the header from (name, dtype, shape) specs first and
then accepts the tensors one by one in ``writer.order``, so huge files need
little memory.
"""

import json
import struct
import sys

import torch

DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}

assert sys.byteorder == "little", "this writer assumes a little-endian host"


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _element_size(dtype):
    return torch.tensor([], dtype=dtype).element_size()


def layout_order(specs):
    """specs sorted as they are laid out in the file: element size descending, then name."""
    return sorted(specs, key=lambda s: (-_element_size(s[1]), s[0]))


def _header_bytes(specs, metadata):
    """specs must already be in layout order."""
    header = {}
    offset = 0
    for name, dtype, shape in specs:
        if name == "__metadata__" or name in header:
            raise ValueError("bad or duplicate tensor name %r" % name)
        nbytes = _numel(shape) * _element_size(dtype)
        header[name] = {"dtype": DTYPES[dtype], "shape": [int(s) for s in shape],
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def file_bytes(specs, metadata=None):
    """Size in bytes of the file ``StreamWriter(path, specs, metadata)`` writes."""
    header, data = _header_bytes(layout_order(list(specs)), metadata)
    return len(header) + data


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


class StreamWriter:
    """with StreamWriter(path, specs, metadata) as w: for name in w.order: w.write(name, tensor)."""

    def __init__(self, path, specs, metadata=None):
        self.specs = layout_order([(n, d, tuple(int(s) for s in shape)) for n, d, shape in specs])
        self.order = [s[0] for s in self.specs]
        header, self.data_bytes = _header_bytes(self.specs, metadata)
        self.total_bytes = len(header) + self.data_bytes
        self.index = 0
        self.f = open(path, "wb")
        self.f.write(header)

    def write(self, name, tensor):
        want_name, want_dtype, want_shape = self.specs[self.index]
        if name != want_name or tensor.dtype != want_dtype or tuple(tensor.shape) != want_shape:
            raise ValueError("tensor %d: got %s %s %s, expected %s %s %s" % (
                self.index, name, tensor.dtype, tuple(tensor.shape), want_name, want_dtype, want_shape))
        self.f.write(_tensor_bytes(tensor))
        self.index += 1

    def close(self):
        if self.f is not None:
            complete = self.index == len(self.specs)
            self.f.close()
            self.f = None
            if not complete:
                raise ValueError("only %d of %d tensors written" % (self.index, len(self.specs)))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.f.close()
            self.f = None
            return False
        self.close()
        return False


def save_file(tensors, path, metadata=None):
    """tensors: a mapping name -> tensor."""
    specs = [(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    with StreamWriter(path, specs, metadata) as w:
        for name in w.order:
            w.write(name, tensors[name])


def load_file(path):
    """Returns (dict name -> tensor in file order, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype = TORCH_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        buf = bytearray(data[base + begin:base + end])
        if dtype == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if buf else torch.empty(0, dtype=dtype)
        else:
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape)
    return out, metadata
