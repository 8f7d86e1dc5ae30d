// Device commands: `kiln --list-devices` and `kiln rpc-server`.
#pragma once

#include <ostream>

#include "args.h"

namespace kiln::cli {

// `kiln --list-devices [--rpc-servers HOST:PORT,...]`: adds the --rpc-servers servers, then
// prints one line per ggml device to `out`: name, type, free and total memory,
// description. An unreachable --rpc-servers server: exit 1, nothing listed.
int run_list_devices(const Options& options, std::ostream& out);

// `kiln rpc-server [--host ADDRESS] [--port N] [--device NAME]`: serves one
// device of this machine (default: the CPU) to other kiln processes over
// ggml's RPC protocol, until the process is killed. Listens on 127.0.0.1
// unless --host says otherwise; any other address prints a warning, since the
// protocol has no authentication. An unknown device: exit 2; a port that
// cannot be bound: exit 1. Returns only on failure.
int run_rpc_server(const Options& options);

}  // namespace kiln::cli
