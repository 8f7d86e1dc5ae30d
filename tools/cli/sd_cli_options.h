// sd-cli's options that kiln has no flag of its own for. Each is either
// accepted and ignored (a choice kiln makes itself), with the reason in
// --help, or refused by name with the feature kiln lacks: an sd-cli command
// line never ends in "unknown option". docs/sd_cli.md lists every sd-cli
// option by what kiln does with it; tests/unit/sd_cli_options_test.cpp keeps
// the two and tests/fixtures/sd_cli_options.txt (sd-cli's own list) in step.
#pragma once

#include <string>
#include <vector>

namespace kiln::cli {

enum class SdCliStance {
    Ignored,  // accepted (with its value, if it takes one) and has no effect
    Refused,  // a usage error naming the option and the missing feature
};

struct SdCliOption {
    const char* name;  // "--mmap"
    bool takes_value;  // an ignored option's value is consumed with it
    SdCliStance stance;
    // Ignored: why kiln needs no such option ("kiln always maps model files").
    // Refused: completes "NAME ..." ("is for sd-cli's PhotoMaker; kiln has no PhotoMaker").
    const char* why;
};

// Every sd-cli option kiln ignores or refuses.
const std::vector<SdCliOption>& sd_cli_options_without_kiln_flag();

// The entry named `name`, or nullptr.
const SdCliOption* find_sd_cli_option(const std::string& name);

}  // namespace kiln::cli
