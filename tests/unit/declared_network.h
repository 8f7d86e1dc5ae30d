// A network and the weights it declared, held together as the pipeline's
// Module holds them (pipeline/model.h): the weights first, since the
// network's tensors live in them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "io/model_file.h"
#include "runtime/module_weights.h"
#include "util/result.h"

namespace kiln::test {

template <class Net>
struct DeclaredNetwork {
    std::unique_ptr<runtime::ModuleWeights> params;
    std::unique_ptr<Net> net;

    Net* operator->() const { return net.get(); }
    Net& operator*() const { return *net; }
    runtime::ModuleWeights& weights() const { return *params; }
};

// Net::create over the tensors under `prefix` of `file`, with --type
// `weight_type`; `args` follow the weights (LlmEncoder's unused layers).
template <class Net, class... Args>
Result<DeclaredNetwork<Net>> declare_network(const io::ModelFile& file, const std::string& prefix,
                                             std::optional<ggml_type> weight_type, Args... args) {
    DeclaredNetwork<Net> d;
    d.params = std::make_unique<runtime::ModuleWeights>(file, prefix, weight_type);
    auto net = Net::create(*d.params, args...);
    if (!net.ok()) return net.error();
    d.net = std::move(net).value();
    return d;
}

}  // namespace kiln::test
