// The model families kiln runs (one line each in registry.cpp) and the one
// detection path that `kiln info`, the loader and `kiln plan` share.
#pragma once

#include <string>
#include <vector>

#include "models/family.h"
#include "util/result.h"

namespace kiln::models {

// Every registered family, in registry order.
const std::vector<const Family*>& families();

struct Detection {
    const Family* family = nullptr;  // null: no family kiln runs
    // What `kiln info` prints: the family's name and its variant
    // ("SD1.x inpainting"), or what kiln recognises without running it
    // ("Flux", "VAE", "unknown").
    std::string label;
};

// The family the files hold (the highest detect() score), read from tensor
// names and shapes alone.
Detection detect_family(const FileSet& files);

// The family registered under `name` ("SD1.x", "sdxl"; case-insensitive), or an
// error listing the names.
Result<const Family*> find_family(const std::string& name);

}  // namespace kiln::models
