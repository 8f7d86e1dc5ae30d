// Random-weight model files written at test time from a committed spec
// (tests/fixtures/*.spec: "name dtype dim..." per line, outermost first),
// so tests can use a model larger than the fixtures worth committing.
#pragma once

#include <string>

#include "util/result.h"

namespace kiln::test {

// Writes a safetensors file with the spec's tensors (F16 or F32; I64 index
// buffers such as position_ids count 0, 1, ... along their last dimension), each
// filled deterministically from its name: linear and conv weights
// ~N(0, 1/fan_in), norm scales ~1, biases small, embeddings ~N(0, 1) (the
// initialisation training/make_model_fixtures.py uses).
Status write_random_model(const std::string& spec_path, const std::string& out_path);

// Writes the spec's header only and extends the file to its full size
// without writing data (a sparse file: no disk blocks, zeros when read), for
// tests that read names and shapes alone (kiln info, kiln plan). Also takes
// BF16 tensors.
Status write_sparse_model(const std::string& spec_path, const std::string& out_path);

}  // namespace kiln::test
