// BFL's DiT names (Flux.1's and FLUX.2's own files, ComfyUI's, GGUF) and
// diffusers' renames of them (a diffusers folder's transformer/). The DiTs
// declare their weights by BFL's names; a BflNaming turns each into the
// file's. diffusers splits some fused projections (a double block's qkv into
// to_q, to_k, to_v), so a fused layer is declared as a FusedLinear whose
// parts read the same either way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ggml.h"
#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"

namespace kiln::models {

// One family's diffusers renames, each BFL stem to its diffusers stems (one,
// or a fused layer's parts in row order). ".weight" and ".bias" travel
// along; a leaf that is a whole name (".scale" -> ".weight") is listed whole.
struct BflRenames {
    using Table = std::vector<std::pair<std::string, std::vector<std::string>>>;
    Table global;        // names outside the blocks
    Table double_block;  // leaves of double_blocks.N. in transformer_blocks.N.
    Table single_block;  // leaves of single_blocks.N. in single_transformer_blocks.N.
    // BFL stems whose diffusers weight holds the rows' two halves swapped
    // (the final adaLN's shift and scale).
    std::vector<std::string> swapped_halves;
};

// A double block's joint attention as diffusers' Flux and FLUX.2
// transformers both name it: each stream's qkv split (add_*_proj for the
// text stream), its QK norms and its output projection.
const BflRenames::Table& diffusers_joint_attention();

class BflNaming {
  public:
    // BFL's own names when `diffusers` is null.
    explicit BflNaming(const BflRenames* diffusers = nullptr) : diffusers_(diffusers) {}

    // A BFL name (a whole tensor name, or a layer's stem) in the file: its
    // first part's name where diffusers splits it.
    std::string operator()(const std::string& bfl) const { return parts(bfl).front(); }
    // The stems of a layer's parts in the file: one, or diffusers' split.
    std::vector<std::string> parts(const std::string& bfl) const;
    // The other way: the BFL layer a diffusers stem is (a part of); nullopt
    // when no rename names it.
    std::optional<DiffusionNetwork::LoraFusedLayer> bfl_of(const std::string& diffusers_stem) const;
    // Whether the two namings of layer `stem` (either one's) hold its rows'
    // halves the other way round.
    bool swaps_halves(const std::string& stem) const;

  private:
    const BflRenames* diffusers_;
};

// A projection whose output is several parts side by side: BFL stores it as
// one weight (qkv, linear1), diffusers as one weight or one per part.
struct FusedLinear {
    nn::Linear whole;               // one weight; null when split
    std::vector<nn::Linear> split;  // one per part, in order
    std::vector<int64_t> widths;    // output rows of each part

    // Part i as a linear layer either way.
    nn::Linear part(ggml_context* ctx, size_t i) const;
};

// The fused projection `stem` (BFL) of the given part widths, declared as the
// file names it.
FusedLinear declare_fused(io::WeightDeclarer& w, const BflNaming& names, const std::string& stem, int64_t in,
                          const std::vector<int64_t>& widths, bool bias);

}  // namespace kiln::models
