// PyTorch checkpoints (.ckpt, .pt, .pth, .bin written by torch.save >= 1.6):
// a zip archive of stored entries, <prefix>/data.pkl (a pickle of the saved
// object) and <prefix>/data/<key> (the raw bytes of each storage). The pickle
// is read by the restricted unpickler in io/pickle.h, so loading a file never
// runs code from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/tensor_info.h"
#include "util/result.h"

namespace kiln::io {

// Parses the checkpoint held in [data, data + size) into a tensor index.
//
// The state dict is the pickled top-level dict itself, or, when that is a
// training wrapper, its "state_dict" entry (preferred), else the first of
// "model", "module", "ema" that is a dict, used only when the top level holds
// no tensors directly. Nested dicts flatten to dotted names ("a.b.weight");
// values that are not tensors or dicts (ints, strings, placeholders) are
// skipped. Each tensor must be contiguous and lie inside its storage entry;
// several tensors may share a storage. TensorInfo::offset is the absolute
// file offset of the tensor's first byte, source is 0, shape is outermost
// first. Reads no tensor data; the returned index owns nothing in `data`.
//
// Errors start with `label` (the file path) followed by ": ", e.g.
// "model.ckpt: pickle: forbidden global 'os.system' at byte 57". The legacy
// pre-zip format (torch < 1.6) is an error that says how to re-save the file.
Result<ParsedFile> parse_ckpt(const uint8_t* data, size_t size, const std::string& label);

}  // namespace kiln::io
