#include "rpc_child.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

namespace kiln::test {
namespace {

std::string slurp(const std::string& path) {
    auto b = read_bytes(path);
    return std::string(b.begin(), b.end());
}

}  // namespace

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
}

int connect_loopback(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
}

bool accepts_connections(int port) {
    const int fd = connect_loopback(port);
    if (fd >= 0) ::close(fd);
    return fd >= 0;
}

KilnChild::KilnChild(const std::vector<std::string>& args)
    : out_path_(dir_.file("stdout")), err_path_(dir_.file("stderr")) {
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
        // The child dies with the test process (a test killed by its
        // timeout must not leave a server behind), and keeps none of its
        // descriptors: an inherited lock (flock around ctest) would be held
        // for as long as an orphan lived.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);
        ::close_range(3, ~0u, 0);
        const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(out, STDOUT_FILENO);
        ::dup2(err, STDERR_FILENO);
        std::vector<char*> argv;
        argv.push_back(const_cast<char*>(KILN_BIN));
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(KILN_BIN, argv.data());
        ::_exit(127);
    }
}

bool KilnChild::exited() {
    if (pid_ <= 0) return true;
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) pid_ = -1;
    return pid_ <= 0;
}

bool KilnChild::wait_listening(int port, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (exited()) return false;
        if (accepts_connections(port)) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
}

void KilnChild::stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100 && !exited(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status_, 0);
        pid_ = -1;
    }
}

std::string KilnChild::out() const { return slurp(out_path_); }
std::string KilnChild::err() const { return slurp(err_path_); }

RpcServer::RpcServer(const std::vector<std::string>& options) {
    // Another test process may take the free port between free_port() and
    // the child's bind; the port then answers, but not from this child. Only
    // the child's own "serving ... on 127.0.0.1:PORT" line proves the port is
    // its; a child that could not listen exits, and another port is tried.
    for (int attempt = 0; attempt < 5 && !ok_; ++attempt) {
        port_ = free_port();
        if (port_ <= 0) return;
        endpoint_ = "127.0.0.1:" + std::to_string(port_);
        std::vector<std::string> args{"rpc-server", "--port", std::to_string(port_), "-t", "1"};
        args.insert(args.end(), options.begin(), options.end());
        child_ = std::make_unique<KilnChild>(args);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < deadline && !child_->exited()) {
            if (child_->out().find("on " + endpoint_) != std::string::npos && accepts_connections(port_)) {
                ok_ = true;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
}

}  // namespace kiln::test
