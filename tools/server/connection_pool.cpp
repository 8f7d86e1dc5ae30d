#include "connection_pool.h"

namespace kiln::server {

void ConnectionPool::enqueue(std::function<void()> fn) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        connections_.push_back(std::move(fn));
        // Every thread is busy with a connection: one more, up to the cap.
        if (!stopping_ && idle_ < connections_.size() && threads_.size() < max_threads_) {
            threads_.emplace_back([this] { work(); });
        }
    }
    wake_.notify_one();
}

void ConnectionPool::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    // No thread is started once stopping_ is set, so threads_ no longer changes.
    for (std::thread& t : threads_) t.join();
}

void ConnectionPool::work() {
    for (;;) {
        std::function<void()> serve;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            ++idle_;
            wake_.wait(lock, [this] { return !connections_.empty() || stopping_; });
            --idle_;
            if (connections_.empty()) return;  // stopping, and nothing left to serve
            serve = std::move(connections_.front());
            connections_.pop_front();
        }
        serve();
    }
}

}  // namespace kiln::server
