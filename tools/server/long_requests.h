// httplib serves each connection on a thread of its own (connection_pool.h).
// An event stream, or a synchronous A1111/OpenAI request waiting for its
// images, holds its thread for as long as the job takes; left unbounded,
// enough of them take every thread and /health, cancel and polling time
// out. So they share a limit of their own, far below the pool's cap, and
// one past it gets 503: quick routes always find a thread.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>

namespace kiln::server {

// Connections served at once; more wait for a thread.
constexpr size_t kMaxConnectionThreads = 256;
// The rest serve quick requests, idle keep-alive connections and slow senders.
constexpr int kMaxLongRequests = 32;

class LongRequests {
  public:
    explicit LongRequests(int limit) : limit_(limit) {}
    // A held place, given back when its last copy is destroyed (an event
    // stream keeps it in its content provider); throws a 503 RequestError
    // when all are held.
    std::shared_ptr<void> hold();

  private:
    std::mutex mutex_;
    int limit_;
    int held_ = 0;
};

}  // namespace kiln::server
