// A `kiln` child process (an RPC server in the device and memory tests) and
// the socket helpers to start one on a free loopback port.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "test_files.h"

namespace kiln::test {

// A TCP port nobody listens on right now: bind port 0, read it, release it.
int free_port();
bool accepts_connections(int port);
// A connected socket to 127.0.0.1:port, or -1.
int connect_loopback(int port);

// `kiln ARGS...` as a child process with stdout/stderr in files; killed and
// reaped on destruction, whatever happened in the test.
class KilnChild {
  public:
    explicit KilnChild(const std::vector<std::string>& args);
    ~KilnChild() { stop(); }
    KilnChild(const KilnChild&) = delete;
    KilnChild& operator=(const KilnChild&) = delete;

    bool started() const { return pid_ > 0; }
    uint64_t resident_bytes() const { return resident_bytes_of(pid_); }
    // True once the child has exited (and was reaped).
    bool exited();
    // Polls until `port` accepts connections, for at most `timeout`; false if
    // the child exited or the time ran out.
    bool wait_listening(int port, std::chrono::milliseconds timeout = std::chrono::seconds(10));
    void stop();
    std::string out() const;
    std::string err() const;

  private:
    TempDir dir_;
    std::string out_path_, err_path_;
    pid_t pid_ = -1;
    int status_ = 0;
};

// `kiln rpc-server` on a free loopback port; "127.0.0.1:PORT" once listening.
class RpcServer {
  public:
    // `options`: more of kiln rpc-server's options ("--mem", "40G").
    explicit RpcServer(const std::vector<std::string>& options = {});
    bool ok() const { return ok_; }
    const std::string& endpoint() const { return endpoint_; }
    std::string log() { return child_->out() + child_->err(); }

  private:
    int port_ = 0;
    std::unique_ptr<KilnChild> child_;
    std::string endpoint_;
    bool ok_ = false;
};

}  // namespace kiln::test
