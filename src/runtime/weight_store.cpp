#include "runtime/weight_store.h"

#include <algorithm>
#include <climits>

#include "ggml-alloc.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::runtime {
namespace {

uint64_t aligned(uint64_t size, uint64_t alignment) { return (size + alignment - 1) / alignment * alignment; }

}  // namespace

WeightStore::WeightStore(DeviceLedger& ledger, ggml_backend_buffer_type_t buft) : ledger_(ledger), buft_(buft) {}

WeightStore::~WeightStore() {
    for (auto& block : blocks_) {
        if (block->ready) ggml_backend_event_synchronize(block->ready);
        if (block->resident()) evict(*block);
        if (block->ready) ggml_backend_event_free(block->ready);
    }
}

WeightBlock* WeightStore::block_of(const ggml_tensor* weight) const {
    auto it = by_tensor_.find(weight);
    return it == by_tensor_.end() ? nullptr : it->second;
}

WeightBlock* WeightStore::define_block(const ModuleWeights& module, const std::vector<ggml_tensor*>& weights,
                                       int order) {
    auto block = std::make_unique<WeightBlock>();
    block->module = &module;
    block->order = order;
    const uint64_t alignment = ggml_backend_buft_get_alignment(buft_);
    for (ggml_tensor* w : weights) {
        if (by_tensor_.count(w)) continue;
        block->tensors.push_back(w);
        block->bytes += aligned(ggml_backend_buft_get_alloc_size(buft_, w), alignment);
    }
    if (block->tensors.empty()) return nullptr;
    for (ggml_tensor* w : block->tensors) by_tensor_[w] = block.get();
    blocks_.push_back(std::move(block));
    return blocks_.back().get();
}

uint64_t WeightStore::missing_bytes(const std::vector<WeightBlock*>& blocks) const {
    uint64_t bytes = 0;
    for (const WeightBlock* b : blocks) bytes += b->resident() ? 0 : b->bytes;
    return bytes;
}

uint64_t WeightStore::evictable_bytes() const {
    uint64_t bytes = 0;
    for (const auto& b : blocks_) bytes += b->resident() && b->pins == 0 ? b->bytes : 0;
    return bytes;
}

int WeightStore::distance(const WeightBlock& block, const EvictionHint& hint) const {
    if (block.module != hint.module || hint.cycle <= 0) return INT_MAX;  // not in the running pass
    return ((block.order - hint.position) % hint.cycle + hint.cycle) % hint.cycle;
}

bool WeightStore::make_room(uint64_t bytes, uint64_t limit, const EvictionHint& hint) {
    auto fits = [&] { return ledger_.managed() + bytes <= limit; };
    while (!fits()) {
        WeightBlock* victim = nullptr;
        for (auto& b : blocks_) {
            if (!b->resident() || b->pins > 0) continue;
            const int d = distance(*b, hint);
            if (!victim || d > distance(*victim, hint) ||
                (d == distance(*victim, hint) && b->last_use < victim->last_use)) {
                victim = b.get();
            }
        }
        if (!victim) break;
        evict(*victim);
    }
    for (auto& [id, reclaimer] : reclaimers_) {
        if (fits()) break;
        if (reclaimer.idle_bytes() > 0) reclaimer.reclaim();
    }
    return fits();
}

Status WeightStore::allocate(WeightBlock& block) {
    block.buffer = ggml_backend_buft_alloc_buffer(buft_, block.bytes);
    if (!block.buffer) {
        return Error::out_of_memory("out of memory on " + ledger_.device_name() + " allocating " +
                                    human_bytes(block.bytes) + " of weights");
    }
    mark_weight_buffer(block.buffer);
    ggml_tallocr talloc = ggml_tallocr_new(block.buffer);
    for (ggml_tensor* w : block.tensors) {
        w->data = nullptr;  // views of it in old graphs are re-initialised by their allocator
        w->buffer = nullptr;
        if (ggml_tallocr_alloc(&talloc, w) != GGML_STATUS_SUCCESS) {
            evict(block);
            return Error{"cannot place weight '" + std::string(w->name) + "' in its block"};
        }
    }
    ledger_.add(block.bytes);
    return Status::Ok();
}

Status WeightStore::upload(WeightBlock& block, ggml_backend_t backend, bool async) {
    KILN_TRY(allocate(block));
    block.staging.clear();
    for (ggml_tensor* w : block.tensors) {
        std::vector<uint8_t> staging;
        auto data = block.module->params_data(w, staging);
        if (!data.ok()) {
            evict(block);
            return data.error();
        }
        if (async) {
            ggml_backend_tensor_set_async(backend, w, *data, 0, ggml_nbytes(w));
            if (!staging.empty()) block.staging.push_back(std::move(staging));
        } else {
            ggml_backend_tensor_set(w, *data, 0, ggml_nbytes(w));
        }
    }
    stats_.bytes_uploaded += block.bytes;
    return Status::Ok();
}

void WeightStore::pin(const std::vector<WeightBlock*>& blocks) {
    for (WeightBlock* b : blocks) {
        ++b->pins;
        b->last_use = ++clock_;
    }
}

Status WeightStore::load(const std::vector<WeightBlock*>& blocks, ggml_backend_t backend) {
    for (WeightBlock* b : blocks) {
        if (b->ready) {  // prefetched: wait for the upload to land
            ggml_backend_event_synchronize(b->ready);
            ggml_backend_event_free(b->ready);
            b->ready = nullptr;
            b->staging.clear();
        }
        if (!b->resident()) {
            if (Status s = upload(*b, backend, /*async=*/false); !s.ok()) {
                return s;
            }
            ++stats_.loads;
        }
    }
    return Status::Ok();
}

void WeightStore::release(const std::vector<WeightBlock*>& blocks) {
    for (WeightBlock* b : blocks) b->pins = std::max(0, b->pins - 1);
}

int WeightStore::prefetch(const std::vector<WeightBlock*>& blocks, ggml_backend_t backend, uint64_t limit) {
    ggml_backend_dev_t device = ggml_backend_get_device(backend);
    ggml_backend_dev_props props;
    ggml_backend_dev_get_props(device, &props);
    if (!props.caps.async || !props.caps.events) return 0;
    int started = 0;
    for (WeightBlock* b : blocks) {
        if (b->resident()) continue;
        // Only into free room: nothing is evicted while a graph is in flight
        // (an eviction then broke the RPC server's view of a running graph).
        if (ledger_.managed() + b->bytes > limit) break;
        if (!upload(*b, backend, /*async=*/true).ok()) break;  // the synchronous load will report it
        b->ready = ggml_backend_event_new(device);
        if (b->ready) ggml_backend_event_record(b->ready, backend);
        ++stats_.prefetches;
        ++started;
    }
    return started;
}

void WeightStore::evict(WeightBlock& block) {
    if (block.ready) {
        ggml_backend_event_synchronize(block.ready);
        ggml_backend_event_free(block.ready);
        block.ready = nullptr;
    }
    block.staging.clear();
    for (ggml_tensor* w : block.tensors) {
        w->data = nullptr;
        w->buffer = nullptr;
    }
    if (block.buffer) {
        ggml_backend_buffer_free(block.buffer);
        block.buffer = nullptr;
        ledger_.release(block.bytes);
        ++stats_.evictions;
    }
}

void WeightStore::drop_module(const ModuleWeights& module) {
    for (auto& b : blocks_) {
        if (b->module != &module) continue;
        evict(*b);
        for (ggml_tensor* w : b->tensors) by_tensor_.erase(w);
        b.reset();
    }
    blocks_.erase(std::remove(blocks_.begin(), blocks_.end(), nullptr), blocks_.end());
}

void WeightStore::evict_all() {
    for (auto& b : blocks_) {
        if (b->pins == 0 && b->resident()) evict(*b);
    }
}

uint64_t WeightStore::reclaimable_bytes() const {
    uint64_t bytes = evictable_bytes();
    for (const auto& [id, reclaimer] : reclaimers_) bytes += reclaimer.idle_bytes();
    return bytes;
}

int WeightStore::add_reclaimer(Reclaimer reclaimer) {
    const int id = next_reclaimer_++;
    reclaimers_.emplace(id, std::move(reclaimer));
    return id;
}

void WeightStore::remove_reclaimer(int id) { reclaimers_.erase(id); }

}  // namespace kiln::runtime
