// The threads httplib serves connections on. httplib gives each connection
// one thread for as long as it lasts: while its request arrives, while a
// keep-alive connection idles, while an event stream runs. With a fixed
// pool, enough slow clients (a request sent a byte at a time, idle
// connections, streams) take every thread and /health waits behind them.
// This pool starts a thread whenever a connection comes and none is idle,
// up to a cap far above what clients hold open in normal use; past the cap
// connections wait for a thread as they did.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::server {

class ConnectionPool : public httplib::TaskQueue {
  public:
    explicit ConnectionPool(size_t max_threads) : max_threads_(max_threads) {}
    ~ConnectionPool() override = default;
    ConnectionPool(const ConnectionPool&) = delete;
    ConnectionPool& operator=(const ConnectionPool&) = delete;

    void enqueue(std::function<void()> fn) override;
    // Lets the threads finish their connections, then joins them.
    void shutdown() override;

  private:
    void work();

    const size_t max_threads_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::function<void()>> connections_;  // accepted, not yet served
    std::vector<std::thread> threads_;
    size_t idle_ = 0;  // threads waiting for a connection
    bool stopping_ = false;
};

}  // namespace kiln::server
