// Shared by the libFuzzer targets: an invariant every accepted input must
// keep. A violation traps, so libFuzzer records it as a crash with the input.
#pragma once

#define KILN_FUZZ_CHECK(cond)          \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)
