// A `kiln serve` process for tests: started on a free 127.0.0.1 port (the
// server prints the one it got), talked to with cpp-httplib's client, and
// stopped by signal with its exit status checked.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace kiln::test {

class ServerProcess {
  public:
    // Runs `kiln serve --listen-port 0 ARGS` and waits until it listens.
    explicit ServerProcess(const std::string& args);
    ~ServerProcess();  // SIGKILL if still running
    ServerProcess(const ServerProcess&) = delete;
    ServerProcess& operator=(const ServerProcess&) = delete;

    bool started() const { return port_ > 0; }
    int port() const { return port_; }
    pid_t pid() const { return pid_; }
    // The server's resident memory now (VmRSS in /proc/PID/status), 0 when it cannot be read.
    uint64_t resident_bytes() const;
    // Sends `signal` and returns the exit status (-1 when killed by a signal).
    int stop(int signal);
    // What the server wrote to stderr so far.
    std::string log() const;

  private:
    pid_t pid_ = -1;
    int port_ = 0;
    std::string log_path_;
};

}  // namespace kiln::test
