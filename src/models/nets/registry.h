// The networks kiln can build, one line each (src/models/nets/registry.cpp):
// the tensor names that mark a network in a file and the call that
// configures it from its weights. Adding a network: its pair under
// src/models/nets/ filling one of the interfaces of models/network.h, a
// NetworkKind (models/family.h), and its line here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/weight_declarer.h"
#include "models/family.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

// What the family asks of a network beyond its weights.
struct NetworkOptions {
    // Layers at the end the family never reads (Z-Image's hidden_states[-2]
    // never needs the LLM's last layer), left undeclared.
    int unused_last_layers = 0;
};

struct NetworkEntry {
    NetworkKind kind;
    // Tensor names that mark the network in a file, after its prefix.
    std::vector<std::string> probes;
    // Configures the network from the tensors under weights.prefix() and
    // declares them; an error when they are not this network.
    Result<std::unique_ptr<Network>> (*create)(io::WeightDeclarer& weights, const NetworkOptions& options);
};

const NetworkEntry& network_entry(NetworkKind kind);

}  // namespace kiln::models
