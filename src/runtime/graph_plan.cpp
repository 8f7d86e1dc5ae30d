#include "runtime/graph_plan.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "runtime/module_weights.h"
#include "util/log.h"

namespace kiln::runtime {

bool is_cut_marker(const ggml_tensor* t) {
    // ggml names a view, reshape or copy of a tensor after it ("cut:x (view)"):
    // only the marked tensor itself is the cut. Marker names have no spaces.
    return std::strncmp(t->name, "cut:", 4) == 0 && std::strchr(t->name, ' ') == nullptr;
}
namespace {

struct Fnv {
    uint64_t h = 1469598103934665603ull;
    void bytes(const void* data, size_t n) {
        const auto* p = static_cast<const uint8_t*>(data);
        for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    }
    template <typename T>
    void value(const T& v) {
        bytes(&v, sizeof(v));
    }
};

bool is_cut(const ggml_tensor* t) { return is_cut_marker(t); }

// Sources of `node`, its view source included.
template <typename F>
void for_each_source(const ggml_tensor* node, F&& f) {
    for (int s = 0; s < GGML_MAX_SRC; ++s) {
        if (node->src[s]) f(node->src[s]);
    }
    if (node->view_src) f(node->view_src);
}

}  // namespace

std::vector<ggml_tensor*> graph_leafs(ggml_cgraph* graph) {
    const int n = ggml_graph_n_nodes(graph);
    std::unordered_set<const ggml_tensor*> nodes;
    for (int i = 0; i < n; ++i) nodes.insert(ggml_graph_node(graph, i));
    std::vector<ggml_tensor*> leafs;
    std::unordered_set<const ggml_tensor*> seen;
    for (int i = 0; i < n; ++i) {
        for_each_source(ggml_graph_node(graph, i), [&](ggml_tensor* src) {
            if (!nodes.count(src) && seen.insert(src).second) leafs.push_back(src);
        });
    }
    return leafs;
}

uint64_t graph_layout_hash(ggml_cgraph* graph) {
    const int n = ggml_graph_n_nodes(graph);
    std::unordered_map<const ggml_tensor*, int64_t> index;  // nodes >= 0, leafs < 0
    for (int i = 0; i < n; ++i) index[ggml_graph_node(graph, i)] = i;
    const std::vector<ggml_tensor*> leafs = graph_leafs(graph);
    for (size_t j = 0; j < leafs.size(); ++j) index[leafs[j]] = -1 - static_cast<int64_t>(j);
    Fnv f;
    auto tensor = [&](const ggml_tensor* t) {
        f.value(t->type);
        f.value(t->op);
        f.value(t->flags);
        f.bytes(t->ne, sizeof(t->ne));
        f.bytes(t->nb, sizeof(t->nb));
        f.bytes(t->op_params, sizeof(t->op_params));
        f.value(t->view_offs);
    };
    f.value(n);
    f.value(leafs.size());
    for (const ggml_tensor* leaf : leafs) {
        tensor(leaf);
        f.bytes(leaf->name, std::strlen(leaf->name));
    }
    for (int i = 0; i < n; ++i) {
        const ggml_tensor* node = ggml_graph_node(graph, i);
        tensor(node);
        for (int s = 0; s < GGML_MAX_SRC; ++s) f.value(node->src[s] ? index[node->src[s]] : INT64_MAX);
        f.value(node->view_src ? index[node->view_src] : INT64_MAX);
        if (is_cut(node)) f.bytes(node->name, std::strlen(node->name));
    }
    return f.h;
}

GraphPlan build_graph_plan(ggml_cgraph* graph, const ModuleWeights& weights) {
    GraphPlan plan;
    plan.layout = graph_layout_hash(graph);
    const int n = ggml_graph_n_nodes(graph);
    plan.n_nodes = n;
    std::unordered_map<const ggml_tensor*, int> node_index, leaf_index;
    for (int i = 0; i < n; ++i) node_index[ggml_graph_node(graph, i)] = i;
    const std::vector<ggml_tensor*> leafs = graph_leafs(graph);
    for (size_t j = 0; j < leafs.size(); ++j) leaf_index[leafs[j]] = static_cast<int>(j);

    std::string problem;
    // A segment can only start from what the executor places itself.
    for (const ggml_tensor* leaf : leafs) {
        if (!weights.owns(leaf) && !(leaf->flags & GGML_TENSOR_FLAG_INPUT)) {
            problem = std::string("leaf '") + leaf->name + "' is neither a weight nor an input";
            break;
        }
    }

    // The tensor that holds a node's data: follow views to their base.
    plan.base_node.resize(n);
    for (int i = 0; i < n; ++i) {
        const ggml_tensor* t = ggml_graph_node(graph, i);
        while (t->view_src) t = t->view_src;
        auto it = node_index.find(t);
        plan.base_node[i] = it == node_index.end() ? -1 : it->second;
    }
    for (int i = 0; i < n; ++i) {
        const bool output = ggml_graph_node(graph, i)->flags & GGML_TENSOR_FLAG_OUTPUT;
        if (output && plan.base_node[i] >= 0) plan.outputs.push_back(plan.base_node[i]);
    }
    plan.reads.resize(n);
    for (int i = 0; i < n; ++i) {
        for_each_source(ggml_graph_node(graph, i), [&](ggml_tensor* src) {
            auto it = node_index.find(src);
            if (it != node_index.end() && plan.base_node[it->second] >= 0) {
                plan.reads[i].push_back(plan.base_node[it->second]);
            }
        });
    }

    // Segments end after each cut marker.
    int begin = 0;
    for (int i = 0; i < n; ++i) {
        const ggml_tensor* node = ggml_graph_node(graph, i);
        const bool last = i == n - 1;
        if (!is_cut(node) && !last) continue;
        PlanSegment segment;
        segment.begin = begin;
        segment.end = i + 1;
        segment.name = is_cut(node) ? std::string(node->name + 4) : "output";
        std::unordered_set<int> seen;
        for (int k = segment.begin; k < segment.end; ++k) {
            // A weight read through a view made elsewhere is read here too.
            for_each_source(ggml_graph_node(graph, k), [&](ggml_tensor* src) {
                for (ggml_tensor* t = src; t; t = t->view_src) {
                    auto it = leaf_index.find(t);
                    if (it != leaf_index.end() && weights.owns(t) && seen.insert(it->second).second) {
                        segment.weights.push_back(it->second);
                    }
                }
            });
        }
        plan.segments.push_back(std::move(segment));
        begin = i + 1;
    }
    if (problem.empty() && plan.segments.size() < 2) problem = "the graph has no cut marker";
    plan.valid = problem.empty();
    plan.invalid_reason = problem;
    return plan;
}

const GraphPlan& PlanCache::get(ggml_cgraph* graph, const ModuleWeights& weights) {
    const uint64_t layout = graph_layout_hash(graph);
    for (auto it = plans_.begin(); it != plans_.end(); ++it) {
        if ((*it)->layout == layout) {
            ++hits_;
            plans_.splice(plans_.begin(), plans_, it);  // most recent first
            KILN_LOG_DEBUG("plan cache hit (%d hits, %d builds)", hits_, builds_);
            return *plans_.front();
        }
    }
    ++builds_;
    plans_.push_front(std::make_unique<GraphPlan>(build_graph_plan(graph, weights)));
    if (plans_.size() > capacity_) plans_.pop_back();
    const GraphPlan& plan = *plans_.front();
    if (!plan.valid && plan.segments.size() > 1) {
        KILN_LOG_WARN("graph plan: %s; the graph can only run whole", plan.invalid_reason.c_str());
    }
    KILN_LOG_VERBOSE("plan built: %d nodes, %zu segments%s%s (%d hits, %d builds)", plan.n_nodes, plan.segments.size(),
                     plan.valid ? "" : ", whole graph only: ", plan.invalid_reason.c_str(), hits_, builds_);
    return plan;
}

}  // namespace kiln::runtime
