// The weight residency manager of one device (docs/architecture.md, "The memory system").
//
// Modules whose params live elsewhere (RAM or disk) get compute copies on
// the device in blocks: the weights a plan segment reads first. A block is
// loaded when a segment needs it, pinned while the segment runs, and stays
// for reuse afterwards until room is needed; then unpinned blocks are
// evicted, the one needed furthest in the future first: blocks of other
// modules, then this module's from the segment behind the running one
// backward (at the start of a pass: last segment first). Idle workspaces
// registered by runners are reclaimed after that. Every byte is counted in
// the device's ledger, so "managed bytes never exceed the budget" is checked
// from the store's own books.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ggml-backend.h"
#include "runtime/device_budget.h"
#include "runtime/module_weights.h"
#include "util/result.h"

namespace kiln::runtime {

struct WeightBlock {
    const ModuleWeights* module = nullptr;
    std::vector<ggml_tensor*> tensors;
    uint64_t bytes = 0;  // allocation size on the device
    int order = 0;       // the segment that defined it
    ggml_backend_buffer_t buffer = nullptr;
    int pins = 0;
    uint64_t last_use = 0;
    // An asynchronous upload in flight (prefetch): wait on `ready` first.
    ggml_backend_event_t ready = nullptr;
    std::vector<std::vector<uint8_t>> staging;  // host data the upload reads

    bool resident() const { return buffer != nullptr; }
};

// Where the runner is in its pass, for choosing what to evict.
struct EvictionHint {
    const ModuleWeights* module = nullptr;
    int position = 0;  // the segment running or about to run
    int cycle = 1;     // segments in a pass
};

struct StoreStats {
    int loads = 0;       // blocks uploaded synchronously
    int prefetches = 0;  // blocks uploaded asynchronously ahead of use
    int evictions = 0;
    uint64_t bytes_uploaded = 0;
};

class WeightStore {
  public:
    WeightStore(DeviceLedger& ledger, ggml_backend_buffer_type_t buft);
    ~WeightStore();
    WeightStore(const WeightStore&) = delete;
    WeightStore& operator=(const WeightStore&) = delete;

    DeviceLedger& ledger() { return ledger_; }
    const DeviceLedger& ledger() const { return ledger_; }
    ggml_backend_buffer_type_t buffer_type() const { return buft_; }

    // The block holding `weight`, or nullptr.
    WeightBlock* block_of(const ggml_tensor* weight) const;
    // Defines a block from the weights of `module` not yet in one; nullptr
    // when all of them already are.
    WeightBlock* define_block(const ModuleWeights& module, const std::vector<ggml_tensor*>& weights, int order);
    // Bytes of `blocks` that are not resident now.
    uint64_t missing_bytes(const std::vector<WeightBlock*>& blocks) const;
    // Bytes that eviction could free now (unpinned blocks).
    uint64_t evictable_bytes() const;

    // Frees unpinned blocks (furthest next use first) and reclaims idle
    // workspaces until `bytes` more fit under `limit`. False when they cannot.
    bool make_room(uint64_t bytes, uint64_t limit, const EvictionHint& hint);

    // Pinned blocks are never evicted.
    void pin(const std::vector<WeightBlock*>& blocks);
    void release(const std::vector<WeightBlock*>& blocks);
    // Makes `blocks` resident: uploads the missing ones on `backend` and
    // waits for prefetched ones. Room must have been made for them.
    Status load(const std::vector<WeightBlock*>& blocks, ggml_backend_t backend);
    // Starts uploading the missing `blocks` asynchronously, if `backend`
    // can and they fit in the room free under `limit` (a prefetch evicts
    // nothing: a graph is running). Returns how many were started.
    int prefetch(const std::vector<WeightBlock*>& blocks, ggml_backend_t backend, uint64_t limit);
    // Frees every unpinned compute copy (a job ends, or a module is done).
    void evict_all();
    // Frees and forgets every block of `module` (its model is going away;
    // the store lives on for other models on the device). None may be pinned.
    void drop_module(const ModuleWeights& module);

    // Bytes eviction and reclaiming could free now: unpinned blocks and the
    // idle workspaces of runners.
    uint64_t reclaimable_bytes() const;

    // Runners register their idle workspace: how many bytes it holds (0
    // while busy) and how to free it.
    struct Reclaimer {
        std::function<uint64_t()> idle_bytes;
        std::function<void()> reclaim;
    };
    int add_reclaimer(Reclaimer reclaimer);
    void remove_reclaimer(int id);

    const StoreStats& stats() const { return stats_; }

  private:
    Status upload(WeightBlock& block, ggml_backend_t backend, bool async);
    Status allocate(WeightBlock& block);
    void evict(WeightBlock& block);
    int distance(const WeightBlock& block, const EvictionHint& hint) const;

    DeviceLedger& ledger_;
    ggml_backend_buffer_type_t buft_;
    std::vector<std::unique_ptr<WeightBlock>> blocks_;
    std::unordered_map<const ggml_tensor*, WeightBlock*> by_tensor_;
    std::unordered_map<int, Reclaimer> reclaimers_;
    int next_reclaimer_ = 1;
    uint64_t clock_ = 0;
    StoreStats stats_;
};

}  // namespace kiln::runtime
