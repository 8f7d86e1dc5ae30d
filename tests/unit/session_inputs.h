// nn::GraphInputs over a test's runtime::GraphSession: a network's inputs
// become the session's leaves, zeros where the network gives no data (as
// the pipeline's graphs fill them).
#pragma once

#include <cstdint>
#include <vector>

#include "nn/graph_inputs.h"
#include "runtime/graph_session.h"

namespace kiln::test {

class SessionInputs final : public nn::GraphInputs {
  public:
    explicit SessionInputs(runtime::GraphSession& session) : session_(session) {}
    ggml_context* ctx() override { return session_.ctx(); }
    ggml_tensor* input(ggml_type type, const std::vector<int64_t>& ne, const void* data, const char* name) override {
        std::vector<uint8_t> zeros;
        if (!data) {
            int64_t n = 1;
            for (int64_t d : ne) n *= d;
            zeros.assign(static_cast<size_t>(n) * ggml_type_size(type), 0);
            data = zeros.data();
        }
        return session_.input(type, ne, data, name);
    }

  private:
    runtime::GraphSession& session_;
};

}  // namespace kiln::test
