// The compute devices ggml knows about, remote ggml RPC servers added to them
// (`--rpc-servers`), and the module -> device assignments of `--backend`.
//
// Devices live in ggml's process-wide registry: once an RPC server has been
// added its devices (named RPC0, RPC1, ... in the order they were added) stay
// registered for the life of the process.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ggml-backend.h"
#include "util/result.h"

namespace kiln::runtime {

struct DeviceInfo {
    enum Type { Cpu, Gpu, Accelerator, Other };

    std::string name;         // ggml's name: "CPU", "CUDA0", "RPC0", ...
    std::string description;  // ggml's description (for RPC devices: the endpoint)
    Type type = Other;
    uint64_t free = 0;   // bytes, as the device reports them now
    uint64_t total = 0;  // bytes
};

// "CPU", "GPU", "accelerator", "other".
const char* device_type_name(DeviceInfo::Type type);

// Every registered ggml device, in ggml's order (GPUs first, the CPU last).
// Memory of an RPC device is asked from its server.
std::vector<DeviceInfo> list_devices();
// Their names, in the same order.
std::vector<std::string> registered_device_names();

// Splits and validates `--rpc-servers host:port[,host:port]` without connecting:
// every endpoint needs a non-empty host (no ':' in it: ggml's RPC client speaks
// IPv4 and host names only) and a decimal port from 1 to 65535. Duplicates are
// dropped. Errors name the bad endpoint, prefixed with "--rpc-servers: ".
Result<std::vector<std::string>> parse_rpc_endpoints(std::string_view endpoints);

// Connects to each server of `--rpc-servers` and registers its devices with ggml.
// Before ggml sees an endpoint (ggml aborts the process on a failed connection
// or handshake), kiln connects to it itself with a short timeout and performs
// the RPC handshake, so an unreachable, silent or incompatible server is an
// Error naming the endpoint. Adding an endpoint twice is harmless.
// A server that dies later, mid-run, still makes ggml abort the process
// (ggml-rpc.cpp has no error path there); the ggml abort hook installed here
// prints one line naming the RPC servers and their devices before it does.
// Adding servers also sets SIGPIPE to be ignored in the process (ggml's
// client would otherwise die of it, silently, writing to a dead server).
Status add_rpc_servers(const std::string& endpoints);

// The registered device called `name` (case-insensitive: "cpu", "rpc0"); the
// error lists the valid names.
Result<ggml_backend_dev_t> find_device(std::string_view name);

}  // namespace kiln::runtime
