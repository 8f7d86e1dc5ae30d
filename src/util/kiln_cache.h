// kiln's cache folder: where `kiln pull` puts what it downloads, and the last
// place model loading looks for a tokenizer (docs/pull.md):
//   $KILN_CACHE, else $HOME/.cache/kiln;
//   CACHE/tokenizers/NAME/          one tokenizer (NAME: clip-l, clip-g, t5xxl, qwen3)
//   CACHE/models/OWNER/NAME/REV/    one repository at one revision
// The tokenizer names are shared with tools/cli/tokenizer_sources.cpp, which
// says which hub files fill each folder.
#pragma once

#include <optional>
#include <string>

namespace kiln {

// The cache root; nullopt when neither KILN_CACHE nor HOME is set (or set
// empty). Nothing is created.
std::optional<std::string> kiln_cache_root();

// CACHE/tokenizers/NAME, or nullopt without a cache root.
std::optional<std::string> tokenizer_cache_folder(const std::string& name);

}  // namespace kiln
