// sd-cli's options for features kiln does not have. An sd-cli command line
// that uses one gets a usage error naming the option and the feature, not
// "unknown option": the user learns it is sd-cli's and what kiln lacks.
#pragma once

#include <optional>
#include <string>

namespace kiln::cli {

// Why kiln refuses sd-cli's `flag` ("--photo-maker"), or nullopt when
// `flag` is none of sd-cli's options that kiln lacks.
std::optional<std::string> sd_cli_feature_missing(const std::string& flag);

}  // namespace kiln::cli
