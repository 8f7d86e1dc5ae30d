#include "rpc_server_command.h"

#include <cstdio>

#include "cli.h"
#include "kiln.h"
#include "util/kiln_cache.h"
#include "util/log.h"

namespace kiln::cli {

int run_list_devices(const Options& options, std::ostream& out) {
    char* text = nullptr;
    char* error = nullptr;
    const kiln_status status =
        kiln_list_devices(options.rpc_servers.empty() ? nullptr : options.rpc_servers.c_str(), &text, &error);
    if (status != KILN_OK) {
        KILN_LOG_ERROR("%s", error ? error : "listing devices failed");
        kiln_free_string(error);
        return status == KILN_ERROR_INVALID_REQUEST ? kExitUsage : kExitFailure;
    }
    out << text;
    kiln_free_string(text);
    return kExitOk;
}

int run_rpc_server(const Options& options) {
    if (!options.rpc_servers.empty()) {
        KILN_LOG_ERROR("--rpc-servers: rpc-server serves this machine's own devices; it cannot relay remote ones");
        return kExitUsage;
    }
    std::string cache_dir = options.rpc_cache_dir;
    if (cache_dir.empty() && options.rpc_cache) {
        const std::optional<std::string> root = kiln_cache_root();
        if (!root) {
            KILN_LOG_ERROR("--cache: neither KILN_CACHE nor HOME is set; give the folder with --cache-dir DIR");
            return kExitUsage;
        }
        cache_dir = *root + "/rpc";
    }
    char* error = nullptr;
    std::fflush(stdout);
    const kiln_status status = kiln_rpc_server_run(
        options.rpc_host.c_str(), options.rpc_port, options.rpc_device.empty() ? nullptr : options.rpc_device.c_str(),
        options.threads, options.rpc_max_alloc.empty() ? nullptr : options.rpc_max_alloc.c_str(),
        options.rpc_mem.empty() ? nullptr : options.rpc_mem.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(),
        &error);
    KILN_LOG_ERROR("%s", error ? error : "rpc-server stopped");
    kiln_free_string(error);
    return status == KILN_ERROR_INVALID_REQUEST ? kExitUsage : kExitFailure;
}

}  // namespace kiln::cli
