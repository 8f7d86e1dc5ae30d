#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <unordered_set>

#include "ggml-alloc.h"
#include "ggml-impl.h"  // struct ggml_cgraph: segment graphs need leafs
#include "util/format.h"
#include "util/log.h"

namespace kiln::runtime {
namespace {

constexpr size_t kMaxSubgraphNodes = 65536;

uint64_t sub_or_zero(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// The allocation size of `t` in `buft`, asked about a copy that points at
// nothing: a graph's nodes keep stale placements between runs, and a remote
// buffer type (RPC) would send them to its server.
uint64_t alloc_size(ggml_backend_buffer_type_t buft, const ggml_tensor* t) {
    ggml_tensor copy = *t;
    copy.buffer = nullptr;
    copy.data = nullptr;
    copy.view_src = nullptr;
    for (auto& src : copy.src) src = nullptr;
    const uint64_t alignment = ggml_backend_buft_get_alignment(buft);
    return (ggml_backend_buft_get_alloc_size(buft, &copy) + alignment - 1) / alignment * alignment;
}

// Re-derives a view's placement from its source (sources first).
void refresh_view(ggml_tensor* t) {
    if (!t->view_src) return;
    refresh_view(t->view_src);
    if (!t->view_src->buffer) return;
    t->data = nullptr;
    t->buffer = nullptr;
    ggml_backend_view_init(t);
}

uint64_t block_bytes(const std::vector<WeightBlock*>& blocks) {
    uint64_t total = 0;
    for (const WeightBlock* b : blocks) total += b->bytes;
    return total;
}

}  // namespace

// Saves tensors' placements and restores them when destroyed.
class PlacementRestore {
  public:
    void save(ggml_tensor* t) { saved_.push_back({t, t->data, t->buffer}); }
    ~PlacementRestore() {
        for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
            it->tensor->data = it->data;
            it->tensor->buffer = it->buffer;
        }
    }

  private:
    struct Saved {
        ggml_tensor* tensor;
        void* data;
        ggml_backend_buffer_t buffer;
    };
    std::vector<Saved> saved_;
};

Executor::Executor(std::string module, std::unique_ptr<Compute> compute, ModuleWeights& weights, WeightStore& store,
                   ExecutorOptions options)
    : module_(std::move(module)), compute_(std::move(compute)), weights_(weights), store_(store), options_(options) {
    plan_sched_ = std::make_unique<SizedScheduler>(std::vector<ggml_backend_t>{compute_->cpu()});
    placeholder_ = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), 1);
    ggml_init_params params{ggml_graph_overhead_custom(kMaxSubgraphNodes, false), nullptr, /*no_alloc=*/true};
    scratch_ = ggml_init(params);
    reclaimer_id_ = store_.add_reclaimer({[this] { return busy_ ? uint64_t{0} : workspace_registered_; },
                                          [this] {
                                              if (!busy_) release_workspace();
                                          }});
}

Executor::~Executor() {
    store_.remove_reclaimer(reclaimer_id_);
    release_workspace();
    if (placeholder_) ggml_backend_buffer_free(placeholder_);
    if (scratch_) ggml_free(scratch_);
}

void Executor::drop_workspace() {
    if (workspace_registered_ > 0) {
        (void)compute_->release_workspace();
        store_.ledger().release(workspace_registered_);
        workspace_registered_ = 0;
    }
    allocated_session_ = 0;
}

void Executor::release_workspace() {
    forget_carried();
    drop_workspace();
    for (auto& device : split_) device->release_workspace();
}

void Executor::forget_carried() {
    carried_nodes_.clear();
    bound_mirrors_.clear();
    mirror_buffer_ = nullptr;
    mirror_base_ = nullptr;
    carried_session_ = 0;
    allocated_session_ = 0;
}

ggml_cgraph* Executor::subgraph(ggml_cgraph* graph, int begin, int end) {
    ggml_reset(scratch_);
    ggml_cgraph* sub = ggml_new_graph_custom(scratch_, kMaxSubgraphNodes, false);
    std::unordered_set<const ggml_tensor*> seen;
    for (int i = begin; i < end; ++i) {
        ggml_tensor* node = ggml_graph_node(graph, i);
        ggml_graph_add_node(sub, node);
        seen.insert(node);
    }
    // What the nodes read from outside (weights, inputs, earlier segments'
    // activations) becomes the segment's leafs, so the scheduler places
    // them by their buffers as it does a whole graph's.
    auto add_leaf = [&](ggml_tensor* t) {
        if (!t || !seen.insert(t).second) return;
        sub->leafs[sub->n_leafs++] = t;
    };
    for (int i = begin; i < end; ++i) {
        ggml_tensor* node = ggml_graph_node(graph, i);
        for (ggml_tensor* src : node->src) add_leaf(src);
        add_leaf(node->view_src);
    }
    return sub;
}

std::vector<int> Executor::carried_out(const GraphPlan& plan, int first, int end) const {
    const int begin = plan.segments[first].begin, stop = plan.segments[end - 1].end;
    std::set<int> out;
    for (int k = stop; k < plan.n_nodes; ++k) {
        for (int r : plan.reads[k]) {
            if (r >= begin && r < stop) out.insert(r);
        }
    }
    // Outputs are read after the last group.
    for (int o : plan.outputs) {
        if (o >= begin && o < stop && stop < plan.n_nodes) out.insert(o);
    }
    return {out.begin(), out.end()};
}

Executor::CarriedLayout Executor::layout_carried(ggml_cgraph* graph, const GraphPlan& plan,
                                                 const std::vector<Group>& groups) const {
    CarriedLayout layout;
    const int n = static_cast<int>(plan.segments.size());
    const bool everything = range_.first == 0 && range_.end == n;
    if (groups.size() < 2 && everything) return layout;
    // Nodes before the range belong to other devices; a node read after it
    // is read by another device, after this one's workspace has moved on,
    // so it is kept like one read by a later group.
    const int after = static_cast<int>(groups.size());
    const int range_begin = plan.segments[range_.first].begin, range_stop = plan.segments[range_.end - 1].end;
    std::vector<int> group_of(plan.n_nodes, -1);
    for (int i = range_stop; i < plan.n_nodes; ++i) group_of[i] = after;
    for (size_t g = 0; g < groups.size(); ++g) {
        for (int i = plan.segments[groups[g].first].begin; i < plan.segments[groups[g].end - 1].end; ++i) {
            group_of[i] = static_cast<int>(g);
        }
    }
    std::vector<int> last_reader(plan.n_nodes, -1);
    for (int k = 0; k < plan.n_nodes; ++k) {
        for (int r : plan.reads[k]) last_reader[r] = std::max(last_reader[r], group_of[k]);
    }
    // An output is read after the run: one an earlier group computes stays
    // to the end (the last group's own stay in its workspace, unless another
    // device's range follows).
    for (int o : plan.outputs) last_reader[o] = range_.end == n ? after - 1 : after;
    struct Placed {
        uint64_t offset, size;
        int from, to;
    };
    std::vector<Placed> placed;
    const ggml_backend_buffer_type_t buft = compute_->buffer_type();
    for (int i = range_begin; i < range_stop; ++i) {
        if (plan.base_node[i] != i || last_reader[i] <= group_of[i]) continue;
        const uint64_t size = alloc_size(buft, ggml_graph_node(graph, i));
        const int from = group_of[i], to = last_reader[i];
        // First fit among the tensors alive at the same time.
        std::vector<std::pair<uint64_t, uint64_t>> busy;
        for (const Placed& p : placed) {
            if (p.from <= to && from <= p.to) busy.emplace_back(p.offset, p.offset + p.size);
        }
        std::sort(busy.begin(), busy.end());
        uint64_t offset = 0;
        for (const auto& [b, e] : busy) {
            if (offset + size <= b) break;
            offset = std::max(offset, e);
        }
        placed.push_back({offset, size, from, to});
        layout.nodes.push_back(i);
        layout.offsets.push_back(offset);
        layout.size = std::max(layout.size, offset + size);
    }
    return layout;
}

uint64_t Executor::measure(ggml_cgraph* graph, const GraphPlan& plan, int first, int end) {
    const auto key = std::make_pair(plan.layout, std::make_pair(first, end));
    if (auto it = measured_.find(key); it != measured_.end()) return it->second;
    const int begin = plan.segments[first].begin, stop = plan.segments[end - 1].end;
    std::vector<char> kept(plan.n_nodes, 0);
    for (int i : carried_out(plan, first, end)) kept[i] = 1;
    uint64_t bytes = 0;
    {
        // What the real run finds placed (weights, inputs, earlier and kept
        // activations) goes on the placeholder; what the workspace will hold
        // is cleared. Everything is put back afterwards.
        PlacementRestore restore;
        std::unordered_set<const ggml_tensor*> inside;
        for (int i = begin; i < stop; ++i) {
            ggml_tensor* node = ggml_graph_node(graph, i);
            inside.insert(node);
            restore.save(node);
            node->data = nullptr;
            node->buffer = kept[i] ? placeholder_ : nullptr;
        }
        auto place_outside = [&](ggml_tensor* src) {
            // A view outside the group is placed with the tensor it views.
            for (; src && !inside.count(src); src = src->view_src) {
                restore.save(src);
                src->data = nullptr;
                src->buffer = placeholder_;
            }
        };
        for (int i = begin; i < stop; ++i) {
            ggml_tensor* node = ggml_graph_node(graph, i);
            for (ggml_tensor* src : node->src) place_outside(src);
            place_outside(node->view_src);
        }
        std::vector<size_t> sizes(1, 0);
        ggml_cgraph* sub = subgraph(graph, begin, stop);
        // A segment that cannot even be measured (no room for the scheduler) fits nowhere.
        auto sched = plan_sched_->fit(sub);
        if (sched.ok()) ggml_backend_sched_reserve_size(*sched, sub, sizes.data());
        bytes = sched.ok() ? sizes[0] : UINT64_MAX;
    }
    measured_[key] = bytes;
    return bytes;
}

void Executor::define_blocks(const GraphPlan& plan, const std::vector<Executor*>& others) {
    if (weights_.params_location() == ParamsLocation::ComputeDevice) return;
    for (int s = range_.first; s < range_.end; ++s) {
        std::vector<ggml_tensor*> tensors;
        for (int leaf : plan.segments[s].weights) {
            ggml_tensor* t = leafs_[leaf];
            const bool elsewhere =
                std::any_of(others.begin(), others.end(), [&](const Executor* e) { return e->store_.block_of(t); });
            if (!elsewhere) tensors.push_back(t);
        }
        store_.define_block(weights_, tensors, s);
    }
}

void Executor::prefetch_handoff(const GraphPlan& plan) {
    if (!options_.prefetch || !compute_->device_backend() || range_.first == range_.end) return;
    const std::vector<WeightBlock*> first = blocks_for(plan, range_.first, range_.first + 1);
    // Into free room only (WeightStore::prefetch): what this device's own
    // run then needs room for may evict it again, which costs an upload,
    // never a wrong result.
    stats_.handoff_prefetches += store_.prefetch(first, compute_->device_backend(), store_.ledger().limit());
}

std::vector<WeightBlock*> Executor::blocks_for(const GraphPlan& plan, int first, int end) {
    std::vector<WeightBlock*> blocks;
    if (weights_.params_location() == ParamsLocation::ComputeDevice) return blocks;
    for (int s = first; s < end; ++s) {
        for (int leaf : plan.segments[s].weights) {
            WeightBlock* b = store_.block_of(leafs_[leaf]);
            if (b && std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
        }
    }
    return blocks;
}

uint64_t Executor::group_cost(ggml_cgraph* graph, const GraphPlan& plan, int first, int end, uint64_t carried) {
    return block_bytes(blocks_for(plan, first, end)) + measure(graph, plan, first, end) + carried;
}

Result<Executor::Choice> Executor::choose_groups(ggml_cgraph* graph, const GraphPlan& plan, uint64_t room,
                                                 RunForecast* forecast) {
    const int lo = range_.first, hi = range_.end;
    // A split device's range keeps what later devices read even when it runs whole.
    const CarriedLayout whole_layout = layout_carried(graph, plan, {{lo, hi}});
    const uint64_t whole = group_cost(graph, plan, lo, hi, whole_layout.size);
    if (forecast) forecast->whole_workspace = measure(graph, plan, lo, hi);
    const bool can_segment = plan.valid && options_.segmented && hi - lo > 1;
    if (whole <= room || !can_segment) {
        if (forecast) {
            forecast->largest_segment = forecast->peak = whole;
            forecast->largest_segment_name = "whole graph";
            forecast->fits = whole <= room;
        }
        if (whole > room && !forecast) {
            const std::string why = !plan.valid           ? " (it cannot be segmented: " + plan.invalid_reason + ")"
                                    : !options_.segmented ? " (segmented compute is disabled)"
                                                          : "";
            return Error::out_of_memory("out of memory: " + module_ + " needs " + human_bytes(whole) + " on " +
                                        store_.ledger().device_name() + " to run whole" + why + ", the budget leaves " +
                                        human_bytes(room));
        }
        return Choice{{{lo, hi}}, whole_layout};
    }

    // Greedy: each group takes segments while they fit with `carried` bytes
    // of kept activations. The carried buffer's size depends on the groups,
    // so start from the finest grouping's and iterate to a grouping whose
    // carried buffer is no larger than the one it was planned with.
    std::vector<Group> fine;
    for (int s = lo; s < hi; ++s) fine.push_back({s, s + 1});
    const uint64_t fine_carried = layout_carried(graph, plan, fine).size;
    auto greedy = [&](uint64_t carried, int* failed) {
        std::vector<Group> groups;
        for (int first = lo; first < hi;) {
            if (group_cost(graph, plan, first, first + 1, carried) > room) {
                *failed = first;
                return groups;
            }
            int end = first + 1;
            while (end < hi && group_cost(graph, plan, first, end + 1, carried) <= room) ++end;
            groups.push_back({first, end});
            first = end;
        }
        *failed = -1;
        return groups;
    };
    std::optional<Choice> best;
    uint64_t carried = fine_carried;
    int failed = -1;
    for (int round = 0; round < 4; ++round) {
        std::vector<Group> groups = greedy(carried, &failed);
        if (failed >= 0) break;
        CarriedLayout layout = layout_carried(graph, plan, groups);
        const uint64_t actual = layout.size;
        if (actual <= carried) {
            const bool same = best && best->groups.size() == groups.size();
            best = Choice{std::move(groups), std::move(layout)};
            if (actual == carried || same) break;
        }
        carried = actual;
    }
    if (!best && failed < 0) {  // the finest grouping always fits its own carried buffer
        best = Choice{fine, layout_carried(graph, plan, fine)};
        for (int s = lo; s < hi && failed < 0; ++s) {
            if (group_cost(graph, plan, s, s + 1, best->carried.size) > room) failed = s;
        }
    }
    if (failed >= 0 || !best) {
        const int s = failed >= 0 ? failed : lo;
        const uint64_t need = group_cost(graph, plan, s, s + 1, fine_carried);
        if (forecast) {
            forecast->fits = false;
            forecast->largest_segment = forecast->peak = need;
            forecast->largest_segment_name = plan.segments[s].name;
            forecast->segments = hi - lo;
            return Choice{fine, layout_carried(graph, plan, fine)};
        }
        if (measure(graph, plan, s, s + 1) == UINT64_MAX) {
            return Error::out_of_memory("out of memory: " + module_ + " segment '" + plan.segments[s].name +
                                        "' cannot be measured: no room for a ggml scheduler (an address-space "
                                        "limit such as ulimit -v?)");
        }
        return Error::out_of_memory("out of memory: " + module_ + " segment '" + plan.segments[s].name + "' needs " +
                                    human_bytes(need) + " on " + store_.ledger().device_name() + " (weights " +
                                    human_bytes(block_bytes(blocks_for(plan, s, s + 1))) + ", compute " +
                                    human_bytes(measure(graph, plan, s, s + 1)) + ", kept activations " +
                                    human_bytes(fine_carried) + "), but the budget leaves " + human_bytes(room) +
                                    (store_.ledger().budget() ? " of " + human_bytes(*store_.ledger().budget()) : ""));
    }
    if (forecast) {
        for (const Group& g : best->groups) {
            const uint64_t single = group_cost(graph, plan, g.first, g.end, best->carried.size);
            forecast->peak = std::max(forecast->peak, single);
        }
        for (int s = lo; s < hi; ++s) {
            const uint64_t single = group_cost(graph, plan, s, s + 1, best->carried.size);
            if (single > forecast->largest_segment) {
                forecast->largest_segment = single;
                forecast->largest_segment_name = plan.segments[s].name;
            }
        }
    }
    return std::move(best).value();
}

Status Executor::bind_carried(GraphSession& session, ggml_cgraph* graph, const CarriedLayout& layout) {
    forget_carried();
    // Nothing of this graph may stay placed in the buffer being replaced.
    if (ggml_backend_buffer_t old = session.kept_buffer(kept_slot_)) {
        for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
            ggml_tensor* node = ggml_graph_node(graph, i);
            if (node->buffer == old) {
                node->data = nullptr;
                node->buffer = nullptr;
            }
        }
    }
    session.adopt_kept_buffer(nullptr, store_.ledger(), kept_slot_);
    carried_session_ = session.id();
    const uint64_t mirrors_at = kept_bytes(layout) - mirrors_.size;
    if (kept_bytes(layout) == 0) return Status::Ok();
    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(compute_->buffer_type(), kept_bytes(layout));
    if (!buffer) {
        return Error::out_of_memory("out of memory on " + store_.ledger().device_name() + " allocating " +
                                    human_bytes(kept_bytes(layout)) + " of kept activations for " + module_);
    }
    session.adopt_kept_buffer(buffer, store_.ledger(), kept_slot_);
    auto* base = static_cast<uint8_t*>(ggml_backend_buffer_get_base(buffer));
    for (size_t k = 0; k < layout.nodes.size(); ++k) {
        ggml_tensor* t = ggml_graph_node(graph, layout.nodes[k]);
        t->data = nullptr;
        t->buffer = nullptr;
        if (ggml_backend_tensor_alloc(buffer, t, base + layout.offsets[k]) != GGML_STATUS_SUCCESS) {
            forget_carried();
            return Error{"cannot place the kept activations of " + module_};
        }
    }
    carried_nodes_ = layout.nodes;
    mirror_buffer_ = buffer;
    mirror_base_ = base + mirrors_at;
    return Status::Ok();
}

uint64_t Executor::kept_bytes(const CarriedLayout& layout) const {
    if (mirrors_.size == 0) return layout.size;
    const uint64_t alignment = ggml_backend_buft_get_alignment(compute_->buffer_type());
    return (layout.size + alignment - 1) / alignment * alignment + mirrors_.size;
}

Status Executor::run_group(ggml_cgraph* graph, const GraphPlan& plan, const std::vector<Group>& groups, int index,
                           uint64_t limit) {
    const Group& group = groups[index];
    const int n = static_cast<int>(plan.segments.size());
    const int begin = plan.segments[group.first].begin, stop = plan.segments[group.end - 1].end;
    const std::vector<WeightBlock*> blocks = blocks_for(plan, group.first, group.end);
    const EvictionHint hint{&weights_, group.first, n};
    const int evictions_before = store_.stats().evictions;
    bool reuse = allocated_session_ != 0 && allocated_session_ == carried_session_ &&
                 allocated_group_ == std::make_pair(group.first, group.end) &&
                 allocated_evictions_ == evictions_before && store_.missing_bytes(blocks) == 0;

    store_.pin(blocks);
    struct Unpin {
        WeightStore& store;
        const std::vector<WeightBlock*>& blocks;
        ~Unpin() { store.release(blocks); }
    } unpin{store_, blocks};

    const uint64_t workspace = measure(graph, plan, group.first, group.end);
    auto make_room = [&](uint64_t workspace_need) -> Status {
        uint64_t need = store_.missing_bytes(blocks) + sub_or_zero(workspace_need, workspace_registered_);
        if (store_.make_room(need, limit, hint)) return Status::Ok();
        // The workspace keeps the capacity of the hungriest group so far;
        // give it back and size it for this one.
        if (workspace_registered_ > 0) {
            drop_workspace();
            need = store_.missing_bytes(blocks) + workspace_need;
            if (store_.make_room(need, limit, hint)) return Status::Ok();
        }
        return Error::out_of_memory("out of memory: " + module_ + " segment '" + plan.segments[group.first].name +
                                    "' needs " + human_bytes(need) + " more on " + store_.ledger().device_name() +
                                    ", the budget leaves " +
                                    human_bytes(sub_or_zero(limit, store_.ledger().managed())));
    };
    if (!reuse) KILN_TRY(make_room(workspace));
    KILN_TRY(store_.load(blocks, compute_->device_backend()));

    const bool whole = group.first == 0 && group.end == n;
    ggml_cgraph* sub = whole ? graph : subgraph(graph, begin, stop);
    PlacementRestore mirrored;  // declared after `unpin`: restored first
    place_mirrors(graph, plan, sub, mirrored);
    bool grew = false;
    auto fitted = compute_->sched_for(sub, &grew);
    if (!fitted.ok()) return fitted.error();
    ggml_backend_sched_t sched = *fitted;
    // A scheduler made anew for a larger graph holds no allocation to reuse
    // (a reused allocation's graph fitted it before, so this is a safeguard).
    if (grew) reuse = false;
    if (!reuse || store_.stats().evictions != evictions_before) {
        allocated_session_ = 0;
        std::vector<char> kept(plan.n_nodes, 0);
        for (int i : carried_nodes_) kept[i] = 1;
        for (int i = begin; i < stop; ++i) {
            if (kept[i]) continue;
            ggml_tensor* node = ggml_graph_node(graph, i);
            node->data = nullptr;
            node->buffer = nullptr;
        }
        // Views computed by earlier groups point where their source was
        // then; a weight block may have moved since. Place them again.
        for (int i = 0; i < sub->n_leafs; ++i) refresh_view(sub->leafs[i]);
        // The device's own measure, now that everything the group reads is
        // in place (the estimate was the CPU's); sizes do not depend on
        // where things are, so once per layout and group.
        const auto key = std::make_pair(plan.layout, std::make_pair(group.first, group.end));
        auto known = measured_on_device_.find(key);
        if (known == measured_on_device_.end()) {
            auto measuring = compute_->measure_sched_for(sub);
            if (!measuring.ok()) return measuring.error();
            ggml_backend_sched_t measure_sched = *measuring;
            std::vector<size_t> sizes(static_cast<size_t>(ggml_backend_sched_get_n_backends(measure_sched)), 0);
            ggml_backend_sched_reserve_size(measure_sched, sub, sizes.data());
            uint64_t bytes = 0;
            if (compute_->device_backend()) {
                bytes = sizes[0];
            } else {
                for (size_t size : sizes) bytes += size;
            }
            known = measured_on_device_.emplace(key, bytes).first;
        }
        const uint64_t exact = known->second;
        if (exact > workspace) KILN_TRY(make_room(exact));
        ggml_backend_sched_reset(sched);
        if (!ggml_backend_sched_reserve(sched, sub) || !ggml_backend_sched_alloc_graph(sched, sub)) {
            return Error::out_of_memory("out of memory on " + store_.ledger().device_name() + " allocating " +
                                        human_bytes(exact) + " of compute buffers for " + module_);
        }
        const uint64_t now = compute_->workspace_bytes();
        if (now > workspace_registered_) store_.ledger().add(now - workspace_registered_);
        if (now < workspace_registered_) store_.ledger().release(workspace_registered_ - now);
        workspace_registered_ = now;
        stats_.peak_workspace = std::max(stats_.peak_workspace, now);
        ++stats_.allocations;
        allocated_session_ = carried_session_;
        allocated_group_ = {group.first, group.end};
    } else {
        ++stats_.reuses;
    }
    const ggml_status status = ggml_backend_sched_graph_compute_async(sched, sub);
    if (status == GGML_STATUS_SUCCESS && options_.prefetch && compute_->device_backend()) {
        // The next group with weights still to upload (weightless groups and
        // resident weights need nothing).
        bool started = false;
        for (size_t next = static_cast<size_t>(index) + 1; next < groups.size() && !started; ++next) {
            const std::vector<WeightBlock*> upcoming = blocks_for(plan, groups[next].first, groups[next].end);
            if (store_.missing_bytes(upcoming) == 0) continue;
            store_.prefetch(upcoming, compute_->device_backend(), limit);
            started = true;
        }
        // This device's last group: the next device of a layer split starts
        // on its first segment's weights meanwhile.
        if (!started && next_device_) next_device_->prefetch_handoff(plan);
    }
    ggml_backend_sched_synchronize(sched);
    allocated_evictions_ = store_.stats().evictions;
    if (index + 1 < static_cast<int>(groups.size())) {
        // The next group reuses this workspace: what this group computed
        // and nobody keeps must not look placed any more (ggml's RPC client
        // sends a graph's whole ancestry, placements included). That covers
        // earlier groups' nodes too: a view of a weight that an earlier
        // group made and this one read was placed again as this group's
        // leaf, and its weight's block may be freed before the next group
        // runs, leaving the view pointing at a freed buffer.
        std::vector<char> kept(plan.n_nodes, 0);
        for (int i : carried_nodes_) kept[i] = 1;
        for (int i = plan.segments[range_.first].begin; i < stop; ++i) {
            ggml_tensor* node = ggml_graph_node(graph, i);
            if (kept[i]) continue;
            node->data = nullptr;
            node->buffer = nullptr;
        }
        allocated_session_ = 0;
    }
    if (status != GGML_STATUS_SUCCESS) {
        allocated_session_ = 0;
        return Error{module_ + ": graph compute failed on " + store_.ledger().device_name() + ": " +
                     ggml_status_to_string(status)};
    }
    return Status::Ok();
}

Status Executor::load_weights() {
    if (!loader_) return Status::Ok();
    KILN_TRY(loader_());
    loader_ = nullptr;
    return Status::Ok();
}

Status Executor::run(GraphSession& session, ggml_tensor* output) {
    busy_ = true;
    struct Idle {
        bool& busy;
        ~Idle() { busy = false; }
    } idle{busy_};
    KILN_TRY(load_weights());
    ggml_cgraph* graph = session.graph(output);
    // A session's graph is built once: its next runs (every sampling step)
    // skip hashing it, listing its leafs and defining its blocks again.
    const bool same_graph = planned_session_ == session.id() && planned_ != nullptr;
    const GraphPlan& plan = same_graph ? plans_.rerun(*planned_) : plans_.get(graph, weights_);
    if (!same_graph) {
        leafs_ = graph_leafs(graph);
        split_segments(graph, plan);
        planned_session_ = session.id();
        planned_ = &plan;
    }
    DeviceLedger& ledger = store_.ledger();
    const EvictionHint start_of_pass{&weights_, 0, static_cast<int>(plan.segments.size())};
    if (!session.inputs_bound()) {
        const uint64_t bytes = session.input_bytes(compute_->buffer_type());
        if (!store_.make_room(bytes, ledger.limit(), start_of_pass)) {
            return Error::out_of_memory("out of memory: " + module_ + " needs " + human_bytes(bytes) + " on " +
                                        ledger.device_name() + " for its inputs, the budget leaves " +
                                        human_bytes(sub_or_zero(ledger.limit(), ledger.managed())));
        }
        KILN_TRY(session.bind_inputs(compute_->buffer_type(), ledger));
    }
    session.upload_inputs();
    const std::vector<Executor*> devices = all_devices();
    // Each device's successor with segments to run (more devices than
    // segments leaves some without).
    Executor* following = nullptr;
    for (auto it = devices.rbegin(); it != devices.rend(); ++it) {
        (*it)->next_device_ = following;
        if ((*it)->range_.first < (*it)->range_.end) following = *it;
    }
    for (Executor* device : devices) {
        if (device->range_.first == device->range_.end) continue;  // more devices than segments
        if (Status s = device->run_range(session, graph, plan, devices); !s.ok()) {
            allocated_session_ = 0;
            return s;
        }
    }
    return Status::Ok();
}

Status Executor::run_range(GraphSession& session, ggml_cgraph* graph, const GraphPlan& plan,
                           const std::vector<Executor*>& devices) {
    busy_ = true;
    struct Idle {
        bool& busy;
        ~Idle() { busy = false; }
    } idle{busy_};
    DeviceLedger& ledger = store_.ledger();
    const uint64_t limit = ledger.limit();
    const EvictionHint start_of_pass{&weights_, range_.first, static_cast<int>(plan.segments.size())};
    mirrors_ = devices.size() > 1 ? find_mirrors(graph, plan) : Mirrors{};
    const uint64_t kept = session.id() == carried_session_ && session.kept_buffer(kept_slot_)
                              ? ggml_backend_buffer_get_size(session.kept_buffer(kept_slot_))
                              : 0;
    const uint64_t fixed = sub_or_zero(ledger.managed(), store_.reclaimable_bytes() + workspace_registered_ + kept);
    auto choice = choose_groups(graph, plan, sub_or_zero(limit, fixed + mirrors_.size), nullptr);
    if (!choice.ok()) return choice.error();
    const std::vector<Group>& groups = choice->groups;

    if (carried_session_ != session.id() || choice->carried.nodes != carried_nodes_ ||
        mirrors_.tensors != bound_mirrors_) {
        const uint64_t replaced =
            session.kept_buffer(kept_slot_) ? ggml_backend_buffer_get_size(session.kept_buffer(kept_slot_)) : 0;
        const uint64_t need = sub_or_zero(kept_bytes(choice->carried), replaced);
        if (!store_.make_room(need, limit, start_of_pass)) {
            return Error::out_of_memory("out of memory: " + module_ + " needs " + human_bytes(need) + " on " +
                                        ledger.device_name() + " for kept activations, the budget leaves " +
                                        human_bytes(sub_or_zero(limit, ledger.managed())));
        }
        KILN_TRY(bind_carried(session, graph, choice->carried));
        bound_mirrors_ = mirrors_.tensors;
    }
    KILN_TRY(fill_mirrors(devices));

    if (options_.cancel && options_.cancel->load()) {
        allocated_session_ = 0;
        return Error::cancelled("cancelled before " + module_ + " ran");
    }
    ++stats_.runs;
    stats_.last_segments = static_cast<int>(groups.size());
    if (groups.size() > 1) ++stats_.segmented_runs;
    KILN_LOG_DEBUG("%s: %zu group(s) of segments %d..%d of %zu, limit %s on %s", module_.c_str(), groups.size(),
                   range_.first, range_.end - 1, plan.segments.size(), human_bytes(limit).c_str(),
                   ledger.device_name().c_str());
    for (size_t g = 0; g < groups.size(); ++g) {
        if (Status s = run_group(graph, plan, groups, static_cast<int>(g), limit); !s.ok()) {
            allocated_session_ = 0;
            return s;
        }
    }
    return Status::Ok();
}

Result<RunForecast> Executor::forecast(GraphSession& session, ggml_tensor* output) {
    ggml_cgraph* graph = session.graph(output);
    const GraphPlan& plan = plans_.get(graph, weights_);
    leafs_ = graph_leafs(graph);
    split_segments(graph, plan);
    planned_ = nullptr;  // leafs_ are this graph's now
    auto f = forecast_range(session, graph, plan, /*holds_inputs=*/true);
    if (!f.ok() || split_.empty()) return f;
    for (Executor* device : all_devices()) {
        SplitShareForecast share;
        share.device = device->store_.ledger().device_name();
        share.limit = device->store_.ledger().limit();
        if (device->range_.first < device->range_.end) {
            auto own = device == this ? f : device->forecast_range(session, graph, plan, false);
            if (!own.ok()) return own.error();
            share.first_segment = plan.segments[device->range_.first].name;
            share.last_segment = plan.segments[device->range_.end - 1].name;
            share.weight_bytes = own->weight_bytes;
            share.crossing_bytes = device->mirrors_.size;
            share.segments = own->segments;
            share.peak = own->peak;
            share.fits = own->fits;
            f->fits = f->fits && own->fits;
        }
        f->split.push_back(share);
    }
    return f;
}

Result<RunForecast> Executor::forecast_range(GraphSession& session, ggml_cgraph* graph, const GraphPlan& plan,
                                             bool holds_inputs) {
    DeviceLedger& ledger = store_.ledger();
    RunForecast f;
    f.limit = ledger.limit();
    f.fixed = sub_or_zero(ledger.managed(), store_.reclaimable_bytes());  // idle: its own workspace counts too
    // The run places its inputs before it plans.
    if (holds_inputs && !session.inputs_bound()) f.fixed += session.input_bytes(compute_->buffer_type());
    mirrors_ = split_.empty() && kept_slot_ == 0 ? Mirrors{} : find_mirrors(graph, plan);
    f.weight_bytes = weights_.params_location() == ParamsLocation::ComputeDevice
                         ? weights_.declared_bytes()
                         : block_bytes(blocks_for(plan, range_.first, range_.end));
    auto choice = choose_groups(graph, plan, sub_or_zero(f.limit, f.fixed + mirrors_.size), &f);
    if (!choice.ok()) return choice.error();
    f.segments = static_cast<int>(choice->groups.size());
    return f;
}

void Executor::add_split_device(std::unique_ptr<Compute> compute, WeightStore& store) {
    split_.push_back(std::make_unique<Executor>(module_, std::move(compute), weights_, store, options_));
    split_.back()->kept_slot_ = split_.size();
}

std::vector<Executor*> Executor::all_devices() {
    std::vector<Executor*> devices{this};
    for (auto& device : split_) devices.push_back(device.get());
    return devices;
}

std::vector<const Executor*> Executor::split_devices() const {
    std::vector<const Executor*> devices{this};
    for (const auto& device : split_) devices.push_back(device.get());
    return devices;
}

void Executor::split_segments(ggml_cgraph* graph, const GraphPlan& plan) {
    const int n = static_cast<int>(plan.segments.size());
    const std::vector<Executor*> devices = all_devices();
    for (Executor* device : devices) device->range_ = {n, n};
    range_ = {0, n};
    if (!split_.empty() && (!plan.valid || n < 2)) {
        if (!split_fallback_said_) {
            KILN_LOG_WARN("%s: the graph cannot be split across devices (%s); it runs on %s alone", module_.c_str(),
                          plan.valid ? "it has one segment" : plan.invalid_reason.c_str(),
                          store_.ledger().device_name().c_str());
            split_fallback_said_ = true;
        }
    } else if (auto known = split_ranges_.find(n); known != split_ranges_.end()) {
        // A graph like one split before (another size, the other CFG pass):
        // the same cut, so each weight stays with the device that holds it.
        for (size_t k = 0; k < devices.size(); ++k) devices[k]->range_ = known->second[k];
    } else if (!split_.empty()) {
        // Contiguous ranges whose weights are in proportion to the devices'
        // room; each weight counts in the first segment that reads it.
        std::vector<uint64_t> before(static_cast<size_t>(n) + 1, 0);  // weight bytes of segments [0, s)
        std::unordered_set<const ggml_tensor*> counted;
        for (int s = 0; s < n; ++s) {
            uint64_t bytes = 0;
            for (int leaf : plan.segments[s].weights) {
                if (counted.insert(leafs_[leaf]).second) bytes += ggml_nbytes(leafs_[leaf]);
            }
            before[s + 1] = before[s] + bytes;
        }
        // Each device's room for weights: its limit less the compute of the
        // hungriest segment (the compute reserve; kept activations are small
        // next to it).
        uint64_t reserve = 0;
        for (int s = 0; s < n; ++s) reserve = std::max(reserve, measure(graph, plan, s, s + 1));
        std::vector<double> share;
        double total_limit = 0;
        for (Executor* device : devices) {
            share.push_back(static_cast<double>(sub_or_zero(device->store_.ledger().limit(), reserve)));
            total_limit += share.back();
        }
        int first = 0;
        double cumulative = 0;
        for (size_t k = 0; k < devices.size(); ++k) {
            int end = n;
            if (k + 1 < devices.size()) {
                cumulative += total_limit > 0 ? share[k] / total_limit : 1.0 / static_cast<double>(devices.size());
                const double target = cumulative * static_cast<double>(before[n]);
                end = first;
                while (end < n && static_cast<double>(before[end + 1]) <= target) ++end;
                // The boundary nearer the target, and at least one segment each while they last.
                if (end < n &&
                    target - static_cast<double>(before[end]) > static_cast<double>(before[end + 1]) - target) {
                    ++end;
                }
                if (end == first && first < n) ++end;
            }
            devices[k]->range_ = {first, end};
            if (first < end) {
                KILN_LOG_VERBOSE("%s: layer split: %s runs segments '%s'..'%s' (%s of weights)", module_.c_str(),
                                 devices[k]->store_.ledger().device_name().c_str(), plan.segments[first].name.c_str(),
                                 plan.segments[end - 1].name.c_str(), human_bytes(before[end] - before[first]).c_str());
            }
            first = end;
        }
        for (Executor* device : devices) split_ranges_[n].push_back(device->range_);
    }
    for (Executor* device : devices) {
        std::vector<Executor*> others;
        for (Executor* other : devices) {
            if (other != device) others.push_back(other);
        }
        device->leafs_ = leafs_;
        device->define_blocks(plan, others);
    }
}

Executor::Mirrors Executor::find_mirrors(ggml_cgraph* graph, const GraphPlan& plan) const {
    Mirrors mirrors;
    if (range_.first == range_.end) return mirrors;
    const int begin = plan.segments[range_.first].begin, stop = plan.segments[range_.end - 1].end;
    std::unordered_set<const ggml_tensor*> inside, seen;
    for (int i = begin; i < stop; ++i) inside.insert(ggml_graph_node(graph, i));
    const ggml_backend_buffer_type_t buft = compute_->buffer_type();
    auto consider = [&](ggml_tensor* t) {
        while (t && !inside.count(t) && t->view_src) t = t->view_src;
        if (!t || inside.count(t) || !seen.insert(t).second) return;
        const bool foreign = weights_.owns(t) ? store_.block_of(t) == nullptr
                                              : kept_slot_ > 0;  // an input, or a node of an earlier range
        if (!foreign) return;
        mirrors.tensors.push_back(t);
        mirrors.offsets.push_back(mirrors.size);
        mirrors.size += alloc_size(buft, t);  // aligned already
    };
    for (int i = begin; i < stop; ++i) {
        ggml_tensor* node = ggml_graph_node(graph, i);
        for (ggml_tensor* src : node->src) consider(src);
        consider(node->view_src);
    }
    return mirrors;
}

Status Executor::fill_mirrors(const std::vector<Executor*>& devices) {
    stats_.crossing_bytes = 0;
    // A device may still be computing what a mirror copies (ggml's RPC
    // client returns before its server has run a graph): a byte read from
    // each source waits for that, so the time below is the copies' own.
    std::unordered_set<ggml_backend_buffer_t> settled;
    for (ggml_tensor* from : mirrors_.tensors) {
        if (!from->buffer || ggml_backend_buffer_is_host(from->buffer) || !settled.insert(from->buffer).second)
            continue;
        uint8_t byte = 0;
        ggml_backend_tensor_get(from, &byte, 0, 1);
    }
    const auto start = std::chrono::steady_clock::now();
    struct Timed {
        double& seconds;
        std::chrono::steady_clock::time_point start;
        ~Timed() { seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
    } timed{stats_.crossing_seconds, start};
    for (size_t k = 0; k < mirrors_.tensors.size(); ++k) {
        ggml_tensor* from = mirrors_.tensors[k];
        // A weight another device's store holds may have been evicted there
        // since it ran: that store makes it resident for the copy.
        WeightStore* owner = nullptr;
        WeightBlock* block = nullptr;
        for (Executor* device : devices) {
            if ((block = device->store_.block_of(from))) {
                owner = &device->store_;
                break;
            }
        }
        struct Unpin {
            WeightStore* store;
            WeightBlock* block;
            ~Unpin() {
                if (store) store->release({block});
            }
        } unpin{nullptr, nullptr};
        if (owner && !block->resident()) {
            Executor* holder =
                *std::find_if(devices.begin(), devices.end(), [&](Executor* d) { return &d->store_ == owner; });
            owner->pin({block});
            unpin = {owner, block};
            if (!owner->make_room(block->bytes, owner->ledger().limit(), {&weights_, block->order, 1})) {
                return Error::out_of_memory("out of memory: " + module_ + " reads a weight held on " +
                                            owner->ledger().device_name() + " that no longer fits there");
            }
            KILN_TRY(owner->load({block}, holder->compute_->device_backend()));
        }
        if (!from->buffer) return Error{module_ + ": '" + std::string(ggml_get_name(from)) + "' is not placed"};
        ggml_tensor to = *from;
        to.view_src = nullptr;
        to.buffer = mirror_buffer_;
        to.data = mirror_base_ + mirrors_.offsets[k];
        ggml_backend_tensor_copy(from, &to);
        stats_.crossing_bytes += ggml_nbytes(from);
    }
    return Status::Ok();
}

void Executor::place_mirrors(ggml_cgraph* graph, const GraphPlan& plan, ggml_cgraph* sub,
                             PlacementRestore& restore) const {
    if (mirrors_.tensors.empty()) return;
    std::unordered_set<const ggml_tensor*> mirrored(mirrors_.tensors.begin(), mirrors_.tensors.end());
    // The graph before this range is other devices' work: nothing of it may
    // look placed here (ggml's RPC client sends the group's whole ancestry,
    // placements included, to this device's server).
    for (int i = 0; i < plan.segments[range_.first].begin; ++i) {
        ggml_tensor* node = ggml_graph_node(graph, i);
        restore.save(node);
        if (!mirrored.count(node)) {
            node->data = nullptr;
            node->buffer = nullptr;
        }
    }
    for (size_t k = 0; k < mirrors_.tensors.size(); ++k) {
        ggml_tensor* t = mirrors_.tensors[k];
        restore.save(t);
        t->data = mirror_base_ + mirrors_.offsets[k];
        t->buffer = mirror_buffer_;
    }
    // The group's leafs that view a mirrored tensor follow it.
    for (int i = 0; i < sub->n_leafs; ++i) {
        ggml_tensor* leaf = sub->leafs[i];
        ggml_tensor* base = leaf;
        while (base->view_src) base = base->view_src;
        if (base == leaf || !mirrored.count(base)) continue;
        for (ggml_tensor* v = leaf; v != base; v = v->view_src) restore.save(v);
        refresh_view(leaf);
    }
}

}  // namespace kiln::runtime
