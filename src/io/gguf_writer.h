// Writes a model as one GGUF file, converting tensor by tensor (never the
// whole model in memory) to the compute types of tensor_convert.h, optionally
// re-quantised. The file appears only when complete: it is written under a
// temporary name and renamed at the end, so a failure leaves no partial file.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "io/model_file.h"
#include "io/tensor_type_rules.h"
#include "util/result.h"

namespace kiln::io {

struct GgufWriteOptions {
    std::optional<ggml_type> type;  // --type; nullopt keeps each tensor's compute type
    TensorTypeRules rules;          // --tensor-type-rules, matched on the file's names, before `type`
    // Called after each tensor with (done, total); may be empty.
    std::function<void(size_t, size_t)> progress;
    // Keys written after the model's own metadata, replacing any of the same
    // name (a tokenizer's tokenizer.ggml.* keys: text::T5Tokenizer::gguf_metadata()).
    Metadata extra_metadata;
};

Status write_gguf(const ModelFile& model, const std::string& path, const GgufWriteOptions& options);

}  // namespace kiln::io
