// libFuzzer target for kiln rpc-server's message loop: the check its front
// makes on a client's byte stream (runtime/rpc_message_guard.h) before
// ggml's server reads it. The first byte picks the size of the pieces the
// stream comes in (1 to 256 bytes; recv() splits anywhere), the next two
// the limit (0 to 65535 bytes); the rest is the stream.
//
// Invariants: what the guard passes on is the stream's prefix (HELLO's
// payload zeroed, nothing else changed); every whole header in it claims
// at most the limit; once it refuses, nothing more passes, and the refused
// header is the one after the passed whole messages.
//
// Build and run: scripts/fuzz.sh rpc_messages SECONDS
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "runtime/rpc_message_guard.h"

using kiln::runtime::RpcMessageGuard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) return 0;
    const size_t piece = size_t(data[0]) + 1;
    const uint64_t limit = uint64_t(data[1]) | (uint64_t(data[2]) << 8);
    const std::vector<uint8_t> stream(data + 3, data + size);

    RpcMessageGuard guard(limit);
    std::vector<uint8_t> bytes = stream, passed;
    for (size_t at = 0; at < bytes.size(); at += piece) {
        const size_t n = std::min(piece, bytes.size() - at);
        const size_t allowed = guard.feed(bytes.data() + at, n);
        KILN_FUZZ_CHECK(allowed <= n);
        KILN_FUZZ_CHECK(allowed == n || guard.refused().has_value());
        passed.insert(passed.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at),
                      bytes.begin() + static_cast<std::ptrdiff_t>(at + allowed));
        if (guard.refused()) KILN_FUZZ_CHECK(guard.feed(bytes.data(), bytes.size()) == 0);
        if (allowed < n) break;
    }

    // Walk the passed bytes as ggml would, against the original stream.
    size_t at = 0;
    bool first = true;
    while (at + RpcMessageGuard::kHeaderBytes <= passed.size()) {
        KILN_FUZZ_CHECK(std::equal(passed.begin() + static_cast<std::ptrdiff_t>(at),
                                   passed.begin() + static_cast<std::ptrdiff_t>(at + RpcMessageGuard::kHeaderBytes),
                                   stream.begin() + static_cast<std::ptrdiff_t>(at)));
        uint64_t claimed = 0;
        std::memcpy(&claimed, passed.data() + at + 1, sizeof claimed);
        KILN_FUZZ_CHECK(claimed <= limit);
        const bool hello = first && passed[at] == RpcMessageGuard::kHelloCommand;
        first = false;
        at += RpcMessageGuard::kHeaderBytes;
        const size_t payload = static_cast<size_t>(std::min<uint64_t>(claimed, passed.size() - at));
        for (size_t k = 0; k < payload; ++k) KILN_FUZZ_CHECK(passed[at + k] == (hello ? 0 : stream[at + k]));
        at += payload;
    }
    // A partial header at the end is the stream's own bytes.
    for (size_t k = at; k < passed.size(); ++k) KILN_FUZZ_CHECK(passed[k] == stream[k]);
    if (const auto& refused = guard.refused()) {
        KILN_FUZZ_CHECK(refused->claimed > limit);
        KILN_FUZZ_CHECK(at < stream.size() && stream[at] == refused->command);
    } else {
        KILN_FUZZ_CHECK(passed.size() == stream.size());
    }
    return 0;
}
