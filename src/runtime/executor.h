// Runs one module's graphs under the memory system (docs/architecture.md): resolves
// the graph's plan from the plan cache, decides from the device's live
// headroom whether it runs whole or in segments, makes each segment's
// weights resident (pinned while it runs), allocates or reuses the
// workspace, prefetches the next segment's weights while the current one
// computes, and keeps the activations later segments read ("carried"
// tensors) in a buffer of their own. Same inputs, same image, whatever the
// budget: segments run exactly the nodes of the whole graph, in its order.
//
// Layer split (add_split_device): the graph's segments are cut into
// contiguous ranges, one per device, sized by the devices' room; each
// range runs on its device under the same rules (segments, prefetch,
// budgets), and the tensors a range reads from another device (the residual
// stream at the boundary, the graph's inputs) are copied once per run into
// its kept buffer.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/compute.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "runtime/module_weights.h"
#include "runtime/sized_scheduler.h"
#include "runtime/weight_store.h"
#include "util/result.h"

namespace kiln::runtime {

class PlacementRestore;  // executor.cpp

struct ExecutorOptions {
    bool segmented = true;  // --disable-segmented-compute turns it off
    bool prefetch = true;   // --disable-prefetch turns it off
    // Set by another thread (kiln_cancel): run() returns a Cancelled error
    // before it starts computing a graph. Owned by the caller; may be null.
    const std::atomic<bool>* cancel = nullptr;
};

// One device's share of a layer split, as `kiln plan` prints it.
struct SplitShareForecast {
    std::string device;
    std::string first_segment, last_segment;  // empty: the device has no share
    uint64_t weight_bytes = 0;
    uint64_t crossing_bytes = 0;  // copied in from other devices per run
    int segments = 0;             // groups it runs at this limit
    uint64_t peak = 0;
    uint64_t limit = 0;
    bool fits = true;
};

// What a run would need, for `kiln plan` and the executor's own decisions.
struct RunForecast {
    uint64_t weight_bytes = 0;     // all weights the graph reads
    uint64_t whole_workspace = 0;  // compute buffers of the whole graph on the device
    uint64_t largest_segment = 0;  // weights + workspace + carried of the hungriest segment
    std::string largest_segment_name;
    int segments = 1;   // segments the run uses at this limit (1: whole)
    uint64_t peak = 0;  // managed bytes the run adds to `fixed` at its hungriest
    bool fits = true;
    uint64_t limit = 0;  // managed bytes the device allows
    uint64_t fixed = 0;  // managed bytes the run cannot evict (other modules' params, inputs)
    // A layer split's shares, in device order (empty: one device). The
    // fields above are then the first device's.
    std::vector<SplitShareForecast> split;
};

struct ExecutorStats {
    int runs = 0;
    int allocations = 0;  // workspace allocations (one per group that could not reuse the last)
    int reuses = 0;       // groups that reused the allocation in place
    int segmented_runs = 0;
    int last_segments = 0;
    uint64_t peak_workspace = 0;
    uint64_t crossing_bytes = 0;  // copied in from other devices by the last run (layer split)
    double crossing_seconds = 0;  // the time those copies took (the run waits for them)
    // Layer split: weight blocks of this device's first segment whose upload
    // started while the device before it computed its last group.
    int handoff_prefetches = 0;
};

class Executor {
  public:
    // `module`: "diffusion", "te", "vae" (for messages). The store belongs
    // to the compute's device; weights must already be placed.
    Executor(std::string module, std::unique_ptr<Compute> compute, ModuleWeights& weights, WeightStore& store,
             ExecutorOptions options);
    ~Executor();
    Executor(const Executor&) = delete;
    Executor& operator=(const Executor&) = delete;

    // Called once before the first run: loads the module's weights (lazy
    // loading; --eager-load calls it at start instead, with load_weights()).
    void set_loader(std::function<Status()> loader) { loader_ = std::move(loader); }
    // Runs the loader now, if it has not run.
    Status load_weights();

    // Runs the session's graph ending at `output` (built on first use).
    // An error leaves the executor ready for the next run.
    Status run(GraphSession& session, ggml_tensor* output);
    // Plans the session's graph at the device's current limit without
    // running it (nothing is uploaded or computed).
    Result<RunForecast> forecast(GraphSession& session, ggml_tensor* output);
    // Frees the workspace (the module is done for now).
    void release_workspace();

    // Layer split: `compute` (on another device, whose store is `store`)
    // runs the next contiguous range of every graph's segments. The
    // module's params must live off its compute device (RAM, another
    // device or disk): each device's store makes compute copies of its
    // range's weights. Before the first run.
    void add_split_device(std::unique_ptr<Compute> compute, WeightStore& store);
    // This executor and its split devices, in order (one when not split).
    std::vector<const Executor*> split_devices() const;
    // The segments [first, end) this executor ran last (all of them unless split).
    std::pair<int, int> segment_range() const { return {range_.first, range_.end}; }

    const std::string& module() const { return module_; }
    Compute& compute() { return *compute_; }
    WeightStore& store() { return store_; }
    const WeightStore& store() const { return store_; }
    const PlanCache& plans() const { return plans_; }
    const ExecutorStats& stats() const { return stats_; }

  private:
    struct Group {
        int first = 0, end = 0;  // segments [first, end)
    };
    // Where each carried activation sits in the carried buffer: tensors
    // whose lifetimes (producing group to last reading group) do not
    // overlap share bytes.
    struct CarriedLayout {
        std::vector<int> nodes;
        std::vector<uint64_t> offsets;
        uint64_t size = 0;
    };
    struct Choice {
        std::vector<Group> groups;
        CarriedLayout carried;
    };
    // What a split device reads from other devices (the residual stream
    // entering its range, inputs, weights another device holds): each
    // tensor's copy sits in the kept buffer after the carried activations.
    struct Mirrors {
        std::vector<ggml_tensor*> tensors;  // bases (no views)
        std::vector<uint64_t> offsets;
        uint64_t size = 0;
    };
    // Compute-buffer bytes of segments [first, end) on the device,
    // estimated on the CPU (no device is asked) and cached per layout.
    uint64_t measure(ggml_cgraph* graph, const GraphPlan& plan, int first, int end);
    // Nodes (bases) of segments [first, end) read by nodes after them.
    std::vector<int> carried_out(const GraphPlan& plan, int first, int end) const;
    CarriedLayout layout_carried(ggml_cgraph* graph, const GraphPlan& plan, const std::vector<Group>& groups) const;
    std::vector<WeightBlock*> blocks_for(const GraphPlan& plan, int first, int end);
    // Starts uploading the weights of the first segment of this device's
    // range into free room, while the device before it computes.
    void prefetch_handoff(const GraphPlan& plan);
    uint64_t group_cost(ggml_cgraph* graph, const GraphPlan& plan, int first, int end, uint64_t carried);
    Result<Choice> choose_groups(ggml_cgraph* graph, const GraphPlan& plan, uint64_t room, RunForecast* forecast);
    Status run_group(ggml_cgraph* graph, const GraphPlan& plan, const std::vector<Group>& groups, int index,
                     uint64_t limit);
    Status bind_carried(GraphSession& session, ggml_cgraph* graph, const CarriedLayout& layout);
    // Runs the segments of range_ (inputs already bound and uploaded).
    // `devices`: every device of the split, to find who holds a weight.
    Status run_range(GraphSession& session, ggml_cgraph* graph, const GraphPlan& plan,
                     const std::vector<Executor*>& devices);
    Result<RunForecast> forecast_range(GraphSession& session, ggml_cgraph* graph, const GraphPlan& plan,
                                       bool holds_inputs);
    // Cuts the plan's segments into one range per device (range_ of each).
    void split_segments(ggml_cgraph* graph, const GraphPlan& plan);
    Mirrors find_mirrors(ggml_cgraph* graph, const GraphPlan& plan) const;
    // Copies what the mirrors stand for into them (once per run).
    Status fill_mirrors(const std::vector<Executor*>& devices);
    // Points the mirrored tensors (and the group's leafs that view them) at
    // their copies, and unplaces the graph before range_, until `restore`
    // is destroyed.
    void place_mirrors(ggml_cgraph* graph, const GraphPlan& plan, ggml_cgraph* sub, PlacementRestore& restore) const;
    // Bytes of the kept buffer: carried activations, then the mirrors.
    uint64_t kept_bytes(const CarriedLayout& layout) const;
    std::vector<Executor*> all_devices();
    void forget_carried();
    // Defines the blocks of range_'s segments, leaving out weights that
    // another split device's store already holds.
    void define_blocks(const GraphPlan& plan, const std::vector<Executor*>& others);
    ggml_cgraph* subgraph(ggml_cgraph* graph, int begin, int end);
    // Gives the workspace back to the device (the scheduler starts empty).
    void drop_workspace();

    std::string module_;
    std::function<Status()> loader_;
    // Layer split: the devices after this one, and the segments each runs.
    std::vector<std::unique_ptr<Executor>> split_;
    struct SegmentRange {
        int first = 0, end = 0;
    } range_;
    std::map<int, std::vector<SegmentRange>> split_ranges_;  // by the number of segments: the cut made first
    size_t kept_slot_ = 0;                                   // this device's place in the split
    Executor* next_device_ = nullptr;                        // during a split run: the device whose range comes next
    Mirrors mirrors_;                                        // of the session that ran last
    std::vector<ggml_tensor*> bound_mirrors_;                // the mirrors the kept buffer has room for
    ggml_backend_buffer_t mirror_buffer_ = nullptr;
    uint8_t* mirror_base_ = nullptr;
    bool split_fallback_said_ = false;
    std::unique_ptr<Compute> compute_;
    ModuleWeights& weights_;
    WeightStore& store_;
    ExecutorOptions options_;
    PlanCache plans_;
    ExecutorStats stats_;
    int reclaimer_id_ = 0;
    bool busy_ = false;
    uint64_t workspace_registered_ = 0;
    // Planning measures on a CPU-only scheduler, with a CPU placeholder
    // buffer marking tensors that the real run finds already placed.
    std::unique_ptr<SizedScheduler> plan_sched_;  // measures segments on the CPU
    ggml_backend_buffer_t placeholder_ = nullptr;
    // The kept activations of the session that ran last (their buffer is
    // the session's: runtime/graph_session.h).
    std::vector<int> carried_nodes_;
    uint64_t carried_session_ = 0;
    ggml_context* scratch_ = nullptr;  // sub-graphs
    std::vector<ggml_tensor*> leafs_;  // of the graph being run (graph_leafs)
    // The plan of the session that ran last; the cache may drop it only on a
    // get() for another graph, which replaces this.
    const GraphPlan* planned_ = nullptr;
    uint64_t planned_session_ = 0;
    std::map<std::pair<uint64_t, std::pair<int, int>>, uint64_t> measured_;            // (layout, group) -> bytes
    std::map<std::pair<uint64_t, std::pair<int, int>>, uint64_t> measured_on_device_;  // the same, exact
    // The allocation the scheduler holds: (session id, group), reusable when
    // nothing moved since.
    uint64_t allocated_session_ = 0;
    std::pair<int, int> allocated_group_{-1, -1};
    int allocated_evictions_ = 0;
};

}  // namespace kiln::runtime
