// `kiln pull`: files from a Hugging Face-style hub into kiln's cache or a
// folder (docs/pull.md).
//   kiln pull REPO [--include PATTERN]... [--revision R] [--hub-url URL] [--to DIR]
//       REPO's files (those matching a pattern) into CACHE/models/REPO/REV/
//       or DIR;
//   kiln pull --tokenizer NAME [--hub-url URL] [--to DIR]
//       the tokenizer files NAME's repository holds for kiln
//       (tokenizer_sources.h) into CACHE/tokenizers/NAME/ or DIR, where
//       model loading finds them without --tokenizer.
#pragma once

#include <string>

#include "args.h"

namespace kiln::cli {

// Returns the exit code: 0 when every file is there and verified; 2 for a
// request to fix (no cache folder and no --to, a pattern matching nothing);
// 1 for everything else (network, HTTP 401/403/404, a bad size or sha256, a
// disk error), after logging one error that names the repository or file.
int run_pull(const Options& options);

// The folder a revision's files go to under CACHE/models/REPO/: the
// revision with each '/' written as "--" ("refs/pr/3" -> "refs--pr--3").
std::string revision_folder_name(const std::string& revision);

}  // namespace kiln::cli
