// Whether an image file can be written at a path, checked before any model
// is loaded: a missing or read-only folder, or a name that is a folder,
// found only once the job is done loses minutes of work on real models.
// The check cannot promise the write (the disk may fill meanwhile), but it
// catches every mistake a command line can make.
#pragma once

#include <optional>
#include <string>

namespace kiln::cli {

// What stops an image being written at `path` ("the folder /no/such does
// not exist"), or nullopt when nothing does.
std::optional<std::string> output_path_problem(const std::string& path);

}  // namespace kiln::cli
