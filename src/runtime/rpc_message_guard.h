// The check kiln rpc-server's front (rpc_front.h) makes on the bytes a
// client sends, apart from the sockets so that it can be tested and fuzzed
// on its own. ggml's protocol, client to server, is a stream of messages
// | command (1 byte) | size (8 bytes, little-endian) | payload (size bytes) |,
// the first HELLO. The guard reads the stream in whatever pieces it comes
// and says how much of each piece may go on to ggml: everything up to the
// header of a message that claims more than the limit, nothing after it.
// It also zeroes HELLO's payload (the client's transport capabilities), so
// that ggml does not try to move the connection off the relayed socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace kiln::runtime {

class RpcMessageGuard {
  public:
    static constexpr uint8_t kHelloCommand = 14;  // RPC_CMD_HELLO, fixed by ggml for every version
    static constexpr size_t kHeaderBytes = 1 + 8;

    explicit RpcMessageGuard(uint64_t limit) : limit_(limit) {}

    struct Refusal {
        uint8_t command = 0;
        uint64_t claimed = 0;  // the size the header claimed
    };

    // The next `size` bytes of the stream, changed in place (HELLO's
    // payload zeroed). Returns how many of them may go on; fewer than
    // `size` only once refused(), after which every call returns 0. A
    // header split between pieces is judged when its last byte comes, so
    // its first bytes may have gone on: ggml waits for the rest, which never
    // comes, and allocates nothing.
    size_t feed(uint8_t* data, size_t size);
    const std::optional<Refusal>& refused() const { return refused_; }

  private:
    uint64_t limit_;
    uint8_t header_[kHeaderBytes] = {};
    size_t header_have_ = 0;
    uint64_t payload_left_ = 0;
    bool first_ = true;      // the next header is the stream's first (HELLO)
    bool in_hello_ = false;  // the payload going through is HELLO's
    std::optional<Refusal> refused_;
};

}  // namespace kiln::runtime
