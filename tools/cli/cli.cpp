#include "cli.h"

#include <iostream>

#include "args.h"
#include "convert_command.h"
#include "generate_command.h"
#include "info_command.h"
#include "pull_command.h"
#include "rpc_server_command.h"
#include "upscale_command.h"
#include "serve_command.h"
#include "util/log.h"

namespace kiln::cli {

int run_cli(const std::vector<std::string>& args) {
    auto parsed = parse_args(args);
    if (auto* usage = std::get_if<UsageError>(&parsed)) {
        KILN_LOG_ERROR("%s (%s)", usage->message.c_str(), usage->hint.c_str());
        return kExitUsage;
    }
    const Options& options = std::get<Options>(parsed);
    log_set_level(options.log_level);
    log_set_color(options.color);
    log_capture_ggml();

    switch (options.command) {
        case Command::Help: std::cout << help_text(options.help_topic); return kExitOk;
        case Command::Version:
            std::cout << "kiln " << KILN_VERSION << " (ggml " << KILN_GGML_COMMIT << ")\n";
            return kExitOk;
        case Command::Info: return run_info(options, std::cout);
        case Command::Convert: return run_convert(options);
        case Command::Generate:
        case Command::Plan: return run_generate(options);
        case Command::Metadata: return run_metadata(options);
        case Command::Upscale: return run_upscale(options);
        case Command::ListDevices: return run_list_devices(options, std::cout);
        case Command::RpcServer: return run_rpc_server(options);
        case Command::Pull: return run_pull(options);
        case Command::Serve: return run_serve(options);
    }
    return kExitFailure;
}

}  // namespace kiln::cli
