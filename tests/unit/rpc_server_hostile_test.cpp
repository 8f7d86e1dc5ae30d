// `kiln rpc-server` against clients that misbehave: it must outlive them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "ggml-rpc.h"
#include "rpc_child.h"
#include "runtime/rpc_message_guard.h"
#include "test_files.h"

namespace kiln {
namespace {

void put_command(std::vector<uint8_t>& out, uint8_t command, const std::vector<uint8_t>& payload) {
    out.push_back(command);
    test::put_u64(out, payload.size());
    out.insert(out.end(), payload.begin(), payload.end());
}

// ggml's RPC protocol (ggml-rpc.cpp): HELLO is command 14 with a 24-byte
// request, DEVICE_COUNT command 15 with none; each answer has an 8-byte size.
std::vector<uint8_t> hello_and_device_counts(int count) {
    std::vector<uint8_t> bytes;
    put_command(bytes, 14, std::vector<uint8_t>(24, 0));
    for (int i = 0; i < count; ++i) put_command(bytes, 15, {});
    return bytes;
}

// The client sends many requests and closes without reading an answer: the
// server's writes then hit a closed socket (EPIPE, or SIGPIPE if not ignored).
TEST(RpcServerHostile, SurvivesAClientThatWritesThenCloses) {
    const int port = test::free_port();
    ASSERT_GT(port, 0);
    test::KilnChild server({"rpc-server", "--port", std::to_string(port), "-t", "1"});
    ASSERT_TRUE(server.wait_listening(port)) << server.err();
    const std::vector<uint8_t> bytes = hello_and_device_counts(1000);
    for (int trial = 0; trial < 3; ++trial) {
        const int fd = test::connect_loopback(port);
        ASSERT_GE(fd, 0);
        size_t sent = 0;
        while (sent < bytes.size()) {
            const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) break;
            sent += static_cast<size_t>(n);
        }
        ::close(fd);
        ::usleep(300 * 1000);  // the server answers into the closed socket meanwhile
        ASSERT_FALSE(server.exited()) << "trial " << trial << ": " << server.err();
    }
    // And it still serves: a well-behaved client gets its device count.
    const int fd = test::connect_loopback(port);
    ASSERT_GE(fd, 0);
    const std::vector<uint8_t> one = hello_and_device_counts(1);
    ASSERT_EQ(::send(fd, one.data(), one.size(), MSG_NOSIGNAL), static_cast<ssize_t>(one.size()));
    std::vector<uint8_t> answer(8 + 28 + 8 + 4);  // hello: size + 4 version bytes + 24 caps; count: size + u32
    size_t got = 0;
    while (got < answer.size()) {
        const ssize_t n = ::recv(fd, answer.data() + got, answer.size() - got, 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    ::close(fd);
    ASSERT_EQ(got, answer.size());
    uint32_t devices = 0;
    std::memcpy(&devices, answer.data() + 8 + 28 + 8, 4);
    EXPECT_EQ(devices, 1u);
    EXPECT_FALSE(server.exited());
}

// Reads exactly `size` bytes of answer, or fewer if the server hangs up.
std::vector<uint8_t> read_answer(int fd, size_t size) {
    std::vector<uint8_t> answer(size);
    size_t got = 0;
    while (got < size) {
        const ssize_t n = ::recv(fd, answer.data() + got, size - got, 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    answer.resize(got);
    return answer;
}

uint64_t u64_at(const std::vector<uint8_t>& bytes, size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
}

// ALLOC_BUFFER (command 0) asks for {u32 device, u64 size} and gets {u64
// remote pointer, u64 size}, zero when refused; GET_MAX_SIZE (command 2)
// asks for {u32 device} and gets {u64 max size}.
TEST(RpcServerHostile, MaxAllocRefusesLargerBuffers) {
    const int port = test::free_port();
    ASSERT_GT(port, 0);
    test::KilnChild server({"rpc-server", "--port", std::to_string(port), "-t", "1", "--max-alloc", "64M"});
    ASSERT_TRUE(server.wait_listening(port)) << server.err();
    const int fd = test::connect_loopback(port);
    ASSERT_GE(fd, 0);
    auto alloc = [](uint64_t size) {
        std::vector<uint8_t> payload(4, 0);  // device 0
        test::put_u64(payload, size);
        std::vector<uint8_t> bytes;
        put_command(bytes, 0, payload);
        return bytes;
    };
    std::vector<uint8_t> bytes;
    put_command(bytes, 14, std::vector<uint8_t>(24, 0));
    const std::vector<uint8_t> huge = alloc(4ull << 30), small = alloc(1 << 20);
    bytes.insert(bytes.end(), huge.begin(), huge.end());
    bytes.insert(bytes.end(), small.begin(), small.end());
    put_command(bytes, 2, std::vector<uint8_t>(4, 0));
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    const size_t hello = 8 + 28, alloc_answer = 8 + 16;
    const std::vector<uint8_t> answer = read_answer(fd, hello + 2 * alloc_answer + 8 + 8);
    ::close(fd);
    ASSERT_EQ(answer.size(), hello + 2 * alloc_answer + 16) << server.err();
    EXPECT_EQ(u64_at(answer, hello + 8), 0u) << "the 4 GiB buffer was allocated";
    EXPECT_EQ(u64_at(answer, hello + 16), 0u);
    EXPECT_NE(u64_at(answer, hello + alloc_answer + 8), 0u) << "the 1 MiB buffer was refused";
    EXPECT_EQ(u64_at(answer, hello + alloc_answer + 16), 1u << 20);
    EXPECT_EQ(u64_at(answer, hello + 2 * alloc_answer + 8), 64u << 20) << "max size";
    EXPECT_FALSE(server.exited());
    const std::string log = server.out() + server.err();
    EXPECT_NE(log.find("refused a 4.00 GiB buffer on CPU: --max-alloc is 64.00 MiB"), std::string::npos) << log;
}

// SET_TENSOR (command 6) is the one message whose size is the client's to
// choose. A header claiming 1 GiB under --max-alloc 64M closes the
// connection before the server allocates anything; the server stays small
// and serves the next client.
TEST(RpcServerHostile, AMessageOverMaxAllocIsRefusedBeforeAllocating) {
    const int port = test::free_port();
    ASSERT_GT(port, 0);
    test::KilnChild server({"rpc-server", "--port", std::to_string(port), "-t", "1", "--max-alloc", "64M"});
    ASSERT_TRUE(server.wait_listening(port)) << server.err();
    const uint64_t before = server.resident_bytes();
    ASSERT_GT(before, 0u);
    const int fd = test::connect_loopback(port);
    ASSERT_GE(fd, 0);
    // Not a measure of speed: only so that a server that waits for the payload fails the test.
    const timeval patience{60, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
    std::vector<uint8_t> bytes;
    put_command(bytes, 14, std::vector<uint8_t>(24, 0));
    bytes.push_back(6);
    test::put_u64(bytes, 1ull << 30);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    EXPECT_EQ(read_answer(fd, 8 + 28).size(), 8u + 28u) << "no HELLO answer";
    uint8_t more = 0;
    const ssize_t after_header = ::recv(fd, &more, 1, 0);
    const uint64_t during = server.resident_bytes();
    ::close(fd);
    EXPECT_EQ(after_header, 0) << "the connection was not closed (errno " << errno << ")";
    EXPECT_LT(during, before + (256ull << 20)) << "before " << before << ", with the header sent " << during;
    const std::string log = server.out() + server.err();
    EXPECT_NE(log.find("sent command 6 claiming 1.00 GiB, over the limit of 65.00 MiB (--max-alloc)"),
              std::string::npos)
        << log;

    // The next client is served.
    const int next = test::connect_loopback(port);
    ASSERT_GE(next, 0);
    const std::vector<uint8_t> one = hello_and_device_counts(1);
    ASSERT_EQ(::send(next, one.data(), one.size(), MSG_NOSIGNAL), static_cast<ssize_t>(one.size()));
    const std::vector<uint8_t> answer = read_answer(next, 8 + 28 + 8 + 4);
    ::close(next);
    EXPECT_EQ(answer.size(), 8u + 28u + 8u + 4u);
    EXPECT_FALSE(server.exited());
}

// The front's check on its own: the stream cut into pieces at every
// point, HELLO's capabilities zeroed, everything before the oversized
// header passed on, nothing from it on.
TEST(RpcMessageGuard, PassesMessagesInAnyPiecesAndStopsAtAnOversizedHeader) {
    std::vector<uint8_t> stream;
    put_command(stream, 14, std::vector<uint8_t>(24, 0xab));  // HELLO with capabilities
    put_command(stream, 15, {});                              // DEVICE_COUNT
    put_command(stream, 6, std::vector<uint8_t>(100, 7));     // SET_TENSOR within the limit
    const size_t good = stream.size();
    stream.push_back(6);
    test::put_u64(stream, 1ull << 30);  // then one claiming 1 GiB
    stream.resize(stream.size() + 50, 9);
    std::vector<uint8_t> expected(stream.begin(), stream.begin() + static_cast<std::ptrdiff_t>(good));
    std::fill(expected.begin() + 9, expected.begin() + 9 + 24, 0);
    for (size_t cut = 1; cut < stream.size(); ++cut) {
        runtime::RpcMessageGuard guard(1000);
        std::vector<uint8_t> bytes = stream, passed;
        for (size_t at = 0; at < bytes.size(); at += cut) {
            const size_t n = std::min(cut, bytes.size() - at);
            const size_t allowed = guard.feed(bytes.data() + at, n);
            passed.insert(passed.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at),
                          bytes.begin() + static_cast<std::ptrdiff_t>(at + allowed));
            if (allowed < n) break;
        }
        ASSERT_TRUE(guard.refused().has_value()) << "pieces of " << cut;
        EXPECT_EQ(guard.refused()->command, 6);
        EXPECT_EQ(guard.refused()->claimed, 1ull << 30);
        // A header split between pieces may have its first bytes passed on, never the whole.
        ASSERT_GE(passed.size(), good) << "pieces of " << cut;
        ASSERT_LT(passed.size(), good + runtime::RpcMessageGuard::kHeaderBytes) << "pieces of " << cut;
        EXPECT_TRUE(std::equal(expected.begin(), expected.end(), passed.begin())) << "pieces of " << cut;
    }
}

// A job whose buffers exceed the server's limit fails as out of memory on
// that device: exit 1, the device named, no image.
TEST(RpcServerHostile, AJobOverMaxAllocIsOutOfMemory) {
    const int port = test::free_port();
    ASSERT_GT(port, 0);
    test::KilnChild server({"rpc-server", "--port", std::to_string(port), "-t", "1", "--max-alloc", "1M"});
    ASSERT_TRUE(server.wait_listening(port)) << server.err();
    test::TempDir dir;
    const std::string out = dir.file("out.png");
    auto r = test::run_command(std::string(KILN_BIN) + " -p x --steps 1 --rpc-servers 127.0.0.1:" +
                               std::to_string(port) + " --backend rpc0 -o " + out);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("error: out of memory on RPC0"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out));
    EXPECT_FALSE(server.exited()) << server.err();
}

TEST(RpcServerHostile, ABadMaxAllocOrMemIsAUsageError) {
    for (const char* flag : {"--max-alloc", "--mem"}) {
        for (const char* bad : {"0", "-1", "5X", "nan", "''"}) {
            auto r = test::run_command(std::string(KILN_BIN) + " rpc-server --port 1 " + flag + " " + bad);
            EXPECT_EQ(r.exit_code, 2) << flag << " " << bad << ": " << r.err;
            EXPECT_NE(r.err.find(std::string(flag) + ": "), std::string::npos) << r.err;
        }
    }
}

// A fake RPC server: it answers each connection's HELLO like ggml's, then
// hangs up, as a server that dies right after the handshake would. kiln's
// own probe passes; ggml's next request fails inside ggml-rpc.cpp, which
// aborts the process, and kiln's abort hook names the server first.
class DyingServer {
  public:
    DyingServer() {
        listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
        socklen_t len = sizeof addr;
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
        port_ = ntohs(addr.sin_port);
        ::listen(listen_fd_, 4);
        thread_ = std::thread([this] { serve(); });
    }
    ~DyingServer() {
        ::shutdown(listen_fd_, SHUT_RDWR);
        ::close(listen_fd_);
        thread_.join();
    }
    int port() const { return port_; }

  private:
    void serve() {
        for (;;) {
            const int fd = ::accept(listen_fd_, nullptr, nullptr);
            if (fd < 0) return;
            uint8_t hello[1 + 8 + 24];
            size_t got = 0;
            while (got < sizeof hello) {
                const ssize_t n = ::recv(fd, hello + got, sizeof hello - got, 0);
                if (n <= 0) break;
                got += static_cast<size_t>(n);
            }
            std::vector<uint8_t> reply;
            test::put_u64(reply, 28);
            reply.push_back(RPC_PROTO_MAJOR_VERSION);
            reply.push_back(RPC_PROTO_MINOR_VERSION);
            reply.push_back(RPC_PROTO_PATCH_VERSION);
            reply.resize(8 + 28, 0);
            if (got == sizeof hello) ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
            ::close(fd);
        }
    }
    int listen_fd_ = -1;
    int port_ = 0;
    std::thread thread_;
};

TEST(RpcServerHostile, ADeadServerIsNamedBeforeGgmlAborts) {
    DyingServer server;
    const std::string endpoint = "127.0.0.1:" + std::to_string(server.port());
    auto r = test::run_command(std::string(KILN_BIN) + " --rpc-servers " + endpoint + " --list-devices");
    EXPECT_EQ(r.exit_code, 134) << r.out << r.err;  // the shell's 128 + SIGABRT: ggml aborts; SIGPIPE would be 141
    EXPECT_NE(r.err.find("error: lost the ggml RPC server " + endpoint), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("ggml cannot recover from that, so kiln stops"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kiln
