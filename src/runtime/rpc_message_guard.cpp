#include "runtime/rpc_message_guard.h"

#include <algorithm>
#include <cstring>

namespace kiln::runtime {

size_t RpcMessageGuard::feed(uint8_t* data, size_t size) {
    if (refused_) return 0;
    size_t at = 0;
    size_t header_start = 0;  // where the header being read began in this piece (0: in an earlier one)
    while (at < size) {
        if (payload_left_ > 0) {
            const size_t take = static_cast<size_t>(std::min<uint64_t>(payload_left_, size - at));
            if (in_hello_) std::memset(data + at, 0, take);
            payload_left_ -= take;
            at += take;
            continue;
        }
        if (header_have_ == 0) header_start = at;
        header_[header_have_++] = data[at++];
        if (header_have_ < kHeaderBytes) continue;
        header_have_ = 0;
        uint64_t claimed = 0;
        std::memcpy(&claimed, header_ + 1, sizeof claimed);  // little-endian, as ggml sends it on every host it runs on
        if (claimed > limit_) {
            refused_ = Refusal{header_[0], claimed};
            return header_start;
        }
        in_hello_ = first_ && header_[0] == kHelloCommand;
        first_ = false;
        payload_left_ = claimed;
    }
    return size;
}

}  // namespace kiln::runtime
