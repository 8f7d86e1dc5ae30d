// A graph session as a network's source of inputs (nn::GraphInputs): the
// network's host tables are copied into the session, and an input given no
// data starts as zeros (the caller sets it before each run).
#pragma once

#include <cstdint>
#include <vector>

#include "nn/graph_inputs.h"
#include "runtime/graph_session.h"

namespace kiln::pipeline {

class SessionInputs final : public nn::GraphInputs {
  public:
    explicit SessionInputs(runtime::GraphSession& session) : session_(session) {}
    ggml_context* ctx() override { return session_.ctx(); }
    ggml_tensor* input(ggml_type type, const std::vector<int64_t>& ne, const void* data, const char* name) override {
        if (data) return session_.input(type, ne, data, name);
        int64_t count = 1;
        for (int64_t n : ne) count *= n;
        const std::vector<uint8_t> zeros(static_cast<size_t>(count) * ggml_type_size(type) /
                                         static_cast<size_t>(ggml_blck_size(type)));
        return session_.input(type, ne, zeros.data(), name);
    }

  private:
    runtime::GraphSession& session_;
};

}  // namespace kiln::pipeline
