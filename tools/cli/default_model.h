// Where kiln finds its default model when no -m is given.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln::cli {

constexpr const char* kDefaultModelFile = "kiln-tiny.gguf";

// Candidate paths in search order: next to the binary, the build tree's
// source checkout, the install prefix.
std::vector<std::string> default_model_candidates();
// The first candidate that exists.
std::optional<std::string> find_default_model();

}  // namespace kiln::cli
