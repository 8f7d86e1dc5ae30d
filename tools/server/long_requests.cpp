#include "long_requests.h"

#include <string>

#include "job_request.h"

namespace kiln::server {

std::shared_ptr<void> LongRequests::hold() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (held_ >= limit_) {
            throw RequestError{503, "",
                               "the server has " + std::to_string(limit_) +
                                   " event streams and waiting requests open, its limit; retry later",
                               1};
        }
        ++held_;
    }
    return std::shared_ptr<void>(nullptr, [this](void*) {
        std::lock_guard<std::mutex> lock(mutex_);
        --held_;
    });
}

}  // namespace kiln::server
