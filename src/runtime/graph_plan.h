// The graph planner: cuts a module's graph into segments at its cut markers
// ("cut:<name>" tensors, nn::mark_cut) so a graph whose weights do not fit a
// device can run a few blocks at a time (docs/architecture.md, "The memory system").
//
// A plan is index-based (node and leaf positions), so one plan serves every
// graph with the same layout: the conditional and unconditional CFG passes,
// every sampling step, the next image. PlanCache keys plans by the layout
// hash: ops, types, shapes, strides, sources, op parameters, flags, leaf
// names and cut markers.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "ggml.h"

namespace kiln::runtime {

class ModuleWeights;

// Whether `t` is a block boundary a network marked with nn::mark_cut ("cut:NAME"),
// not a view or copy of one (which ggml names after it).
bool is_cut_marker(const ggml_tensor* t);

struct PlanSegment {
    int begin = 0;             // first node
    int end = 0;               // one past the last node
    std::string name;          // the cut marker that ends it ("input_blocks.3"), or "output"
    std::vector<int> weights;  // leaf indices (graph_leafs) of the weights its nodes read
};

struct GraphPlan {
    uint64_t layout = 0;
    int n_nodes = 0;
    std::vector<PlanSegment> segments;
    // Per node, the index of the tensor holding its data: itself, or the
    // node its view chain ends in (-1 when that is a leaf).
    std::vector<int> base_node;
    // Per node, the nodes (bases) it reads from.
    std::vector<std::vector<int>> reads;
    // The nodes (bases) flagged as graph outputs: read after the run, so
    // kept to the end (GraphSession::add_output).
    std::vector<int> outputs;
    bool valid = false;
    std::string invalid_reason;  // why segments cannot be used (whole-graph only)
};

// The graph's leafs: tensors its nodes read that no node computes, in the
// order the nodes first read them (so equal layouts list them alike).
std::vector<ggml_tensor*> graph_leafs(ggml_cgraph* graph);

// Hash of everything that makes two graphs computationally the same.
uint64_t graph_layout_hash(ggml_cgraph* graph);

// Builds the plan of `graph`, whose weights are `weights`' tensors. A plan
// is invalid (and runs whole) when a leaf is neither a weight nor an input,
// or when the graph has no cut marker.
GraphPlan build_graph_plan(ggml_cgraph* graph, const ModuleWeights& weights);

// A few plans, most recent first; counts hits and builds.
class PlanCache {
  public:
    explicit PlanCache(size_t capacity = 4) : capacity_(capacity) {}
    // The plan for `graph`, built on a miss.
    const GraphPlan& get(ggml_cgraph* graph, const ModuleWeights& weights);
    // A hit found without hashing: the caller reruns the very graph it got
    // `plan` for last (a sampling run's every step).
    const GraphPlan& rerun(const GraphPlan& plan) {
        ++hits_;
        return plan;
    }
    int hits() const { return hits_; }
    int builds() const { return builds_; }

  private:
    size_t capacity_;
    std::list<std::unique_ptr<GraphPlan>> plans_;
    int hits_ = 0;
    int builds_ = 0;
};

}  // namespace kiln::runtime
