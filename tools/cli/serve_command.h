// `kiln serve`: kiln-server, the HTTP server with kiln's, OpenAI's and
// A1111's APIs (tools/server/, docs/server.md).
#pragma once

#include "args.h"

namespace kiln::cli {

// Checks the flags (bad ones: exit 2), then serves until SIGINT/SIGTERM (exit 0).
int run_serve(const Options& options);

}  // namespace kiln::cli
