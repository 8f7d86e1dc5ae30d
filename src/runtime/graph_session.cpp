#include "runtime/graph_session.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "runtime/executor.h"
#include "runtime/graph_plan.h"

namespace kiln::runtime {

namespace {
std::atomic<uint64_t> g_next_session_id{1};
}  // namespace

GraphSession::GraphSession(size_t max_nodes) : max_nodes_(max_nodes), id_(g_next_session_id++) {
    const size_t bytes = ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false);
    ggml_init_params params{bytes, nullptr, /*no_alloc=*/true};
    ctx_ = ggml_init(params);
}

GraphSession::~GraphSession() {
    for (size_t slot = 0; slot < kept_.size(); ++slot) {
        if (kept_[slot].buffer) adopt_kept_buffer(nullptr, *kept_[slot].ledger, slot);
    }
    if (input_buffer_) {
        input_ledger_->release(ggml_backend_buffer_get_size(input_buffer_));
        ggml_backend_buffer_free(input_buffer_);
    }
    if (ctx_) ggml_free(ctx_);
}

Status GraphSession::bind_inputs(ggml_backend_buffer_type_t buft, DeviceLedger& ledger) {
    if (input_buffer_) return Status::Ok();
    input_buffer_ = ggml_backend_buft_alloc_buffer(buft, std::max<size_t>(input_bytes(buft), 1));
    if (!input_buffer_)
        return Error::out_of_memory("out of memory on " + ledger.device_name() + " allocating the graph's inputs");
    input_ledger_ = &ledger;
    ledger.add(ggml_backend_buffer_get_size(input_buffer_));
    ggml_tallocr talloc = ggml_tallocr_new(input_buffer_);
    for (auto& [t, bytes] : inputs_) {
        t->data = nullptr;
        t->buffer = nullptr;
        if (ggml_tallocr_alloc(&talloc, t) != GGML_STATUS_SUCCESS) return Error{"cannot place the graph's inputs"};
    }
    return Status::Ok();
}

void GraphSession::adopt_kept_buffer(ggml_backend_buffer_t buffer, DeviceLedger& ledger, size_t slot) {
    if (slot >= kept_.size()) kept_.resize(slot + 1);
    Kept& kept = kept_[slot];
    if (kept.buffer) {
        kept.ledger->release(ggml_backend_buffer_get_size(kept.buffer));
        ggml_backend_buffer_free(kept.buffer);
    }
    kept.buffer = buffer;
    kept.ledger = &ledger;
    if (buffer) ledger.add(ggml_backend_buffer_get_size(buffer));
}

uint64_t GraphSession::input_bytes(ggml_backend_buffer_type_t buft) const {
    const uint64_t alignment = ggml_backend_buft_get_alignment(buft);
    uint64_t size = 0;
    for (const auto& [t, bytes] : inputs_) {
        size += (ggml_backend_buft_get_alloc_size(buft, t) + alignment - 1) / alignment * alignment;
    }
    return size;
}

void GraphSession::upload_inputs() {
    for (auto& [tensor, data] : inputs_) {
        if (data.empty()) {
            ggml_backend_tensor_memset(tensor, 0, 0, ggml_nbytes(tensor));
        } else {
            ggml_backend_tensor_set(tensor, data.data(), 0, data.size());
        }
    }
}

ggml_tensor* GraphSession::input(ggml_type type, const std::vector<int64_t>& ne, const void* data, const char* name) {
    ggml_tensor* t = ggml_new_tensor(ctx_, type, static_cast<int>(ne.size()), ne.data());
    ggml_set_input(t);
    if (name) ggml_set_name(t, name);
    const auto* bytes = static_cast<const uint8_t*>(data);
    inputs_.emplace_back(t, bytes ? std::vector<uint8_t>(bytes, bytes + ggml_nbytes(t)) : std::vector<uint8_t>{});
    return t;
}

void GraphSession::set_input(ggml_tensor* tensor, const void* data) {
    for (auto& [t, bytes] : inputs_) {
        if (t != tensor) continue;
        bytes.resize(ggml_nbytes(t));
        std::memcpy(bytes.data(), data, bytes.size());
    }
}

ggml_cgraph* GraphSession::graph(ggml_tensor* output, bool keep_cuts) {
    if (!graph_) {
        graph_ = ggml_new_graph_custom(ctx_, max_nodes_, false);
        for (ggml_tensor* extra : extra_outputs_) {
            ggml_set_output(extra);
            ggml_build_forward_expand(graph_, extra);
        }
        ggml_set_output(output);
        ggml_build_forward_expand(graph_, output);
        if (keep_cuts) {
            for (int i = 0; i < ggml_graph_n_nodes(graph_); ++i) {
                ggml_tensor* node = ggml_graph_node(graph_, i);
                if (is_cut_marker(node)) ggml_set_output(node);
            }
        }
    }
    return graph_;
}

Status GraphSession::run(Compute& compute, ggml_tensor* output, bool keep_cuts) {
    return compute.compute(graph(output, keep_cuts), id_, [this] { upload_inputs(); });
}

Status GraphSession::run(Executor& executor, ggml_tensor* output) { return executor.run(*this, output); }

ggml_tensor* GraphSession::find(const std::string& name) const {
    return graph_ ? ggml_graph_get_tensor(graph_, name.c_str()) : nullptr;
}

std::vector<float> GraphSession::read(const ggml_tensor* tensor) {
    std::vector<float> out(static_cast<size_t>(ggml_nelements(tensor)));
    ggml_backend_tensor_get(tensor, out.data(), 0, out.size() * sizeof(float));
    return out;
}

}  // namespace kiln::runtime
