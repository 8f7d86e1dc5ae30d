#include "server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "test_files.h"

namespace kiln::test {

ServerProcess::ServerProcess(const std::string& args) {
    char log_template[] = "/tmp/kiln-serve-test-XXXXXX";
    const int log_fd = mkstemp(log_template);
    log_path_ = log_template;
    int out[2];
    if (log_fd < 0 || pipe(out) != 0) return;
    const std::string command = std::string("exec ") + KILN_BIN + " serve --listen-port 0 " + args;
    pid_ = fork();
    if (pid_ == 0) {
        dup2(out[1], STDOUT_FILENO);
        dup2(log_fd, STDERR_FILENO);
        close(out[0]);
        execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    close(out[1]);
    close(log_fd);
    // The first line says where it listens; the server prints it once bound.
    std::string line;
    char c = 0;
    pollfd fd{out[0], POLLIN, 0};
    while (poll(&fd, 1, 60000) > 0 && read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    const auto colon = line.rfind(':');
    if (line.find("listening on http://") != std::string::npos && colon != std::string::npos) {
        port_ = std::atoi(line.c_str() + colon + 1);
    }
}

ServerProcess::~ServerProcess() {
    if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
    std::remove(log_path_.c_str());
}

int ServerProcess::stop(int signal) {
    if (pid_ <= 0) return -1;
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

uint64_t ServerProcess::resident_bytes() const { return resident_bytes_of(pid_); }

std::string ServerProcess::log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

}  // namespace kiln::test
