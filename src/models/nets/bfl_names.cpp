#include "models/nets/bfl_names.h"

namespace kiln::models {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::vector<std::string>* find_in(const BflRenames::Table& table, const std::string& stem) {
    for (const auto& [from, to] : table)
        if (stem == from) return &to;
    return nullptr;
}

// The blocks' names in each naming, and their table of renames.
struct BlockNames {
    std::string bfl, diffusers;
    const BflRenames::Table BflRenames::*table;
};
const BlockNames kBlocks[] = {{"double_blocks.", "transformer_blocks.", &BflRenames::double_block},
                              {"single_blocks.", "single_transformer_blocks.", &BflRenames::single_block}};

// "double_blocks.3.img_attn.qkv" under "double_blocks.": index "3.", leaf
// "img_attn.qkv"; nullopt when `stem` is not under `head`.
struct BlockLeaf {
    std::string index, leaf;
};
std::optional<BlockLeaf> under_block(const std::string& stem, const std::string& head) {
    if (stem.rfind(head, 0) != 0) return std::nullopt;
    const size_t dot = stem.find('.', head.size());
    if (dot == std::string::npos) return std::nullopt;
    return BlockLeaf{stem.substr(head.size(), dot + 1 - head.size()), stem.substr(dot + 1)};
}

}  // namespace

const BflRenames::Table& diffusers_joint_attention() {
    static const BflRenames::Table table = {
        {"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
        {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
        {"img_attn.norm.query_norm.scale", {"attn.norm_q.weight"}},
        {"img_attn.norm.key_norm.scale", {"attn.norm_k.weight"}},
        {"txt_attn.norm.query_norm.scale", {"attn.norm_added_q.weight"}},
        {"txt_attn.norm.key_norm.scale", {"attn.norm_added_k.weight"}},
        {"img_attn.proj", {"attn.to_out.0"}},
        {"txt_attn.proj", {"attn.to_add_out"}},
    };
    return table;
}

std::vector<std::string> BflNaming::parts(const std::string& bfl) const {
    if (!diffusers_) return {bfl};
    for (const std::string suffix : {"", ".weight", ".bias"}) {
        if (!ends_with(bfl, suffix)) continue;
        const std::string stem = bfl.substr(0, bfl.size() - suffix.size());
        auto with_suffix = [&](const std::string& head, const std::vector<std::string>& stems) {
            std::vector<std::string> out;
            for (const std::string& s : stems) out.push_back(head + s + suffix);
            return out;
        };
        if (const auto* to = find_in(diffusers_->global, stem)) return with_suffix("", *to);
        for (const BlockNames& b : kBlocks) {
            if (const auto at = under_block(stem, b.bfl)) {
                if (const auto* to = find_in(diffusers_->*b.table, at->leaf))
                    return with_suffix(b.diffusers + at->index, *to);
            }
        }
    }
    return {bfl};
}

std::optional<DiffusionNetwork::LoraFusedLayer> BflNaming::bfl_of(const std::string& diffusers_stem) const {
    if (!diffusers_) return std::nullopt;
    // The table's layer that lists `leaf` as part i of its parts.
    auto find_part = [](const BflRenames::Table& table, const std::string& leaf,
                        const std::string& bfl_head) -> std::optional<DiffusionNetwork::LoraFusedLayer> {
        for (const auto& [from, to] : table) {
            for (size_t i = 0; i < to.size(); ++i) {
                if (to[i] == leaf) {
                    return DiffusionNetwork::LoraFusedLayer{bfl_head + from, static_cast<int>(i),
                                                            static_cast<int>(to.size())};
                }
            }
        }
        return std::nullopt;
    };
    if (auto found = find_part(diffusers_->global, diffusers_stem, "")) return found;
    for (const BlockNames& b : kBlocks) {
        if (const auto at = under_block(diffusers_stem, b.diffusers)) {
            if (auto found = find_part(diffusers_->*b.table, at->leaf, b.bfl + at->index)) return found;
        }
    }
    return std::nullopt;
}

bool BflNaming::swaps_halves(const std::string& stem) const {
    if (!diffusers_) return false;
    for (const std::string& bfl : diffusers_->swapped_halves) {
        if (stem == bfl || parts(bfl) == std::vector<std::string>{stem}) return true;
    }
    return false;
}

nn::Linear FusedLinear::part(ggml_context* ctx, size_t i) const {
    if (!split.empty()) return split[i];
    int64_t first = 0;
    for (size_t j = 0; j < i; ++j) first += widths[j];
    return nn::linear_rows(ctx, whole, first, widths[i]);
}

FusedLinear declare_fused(io::WeightDeclarer& w, const BflNaming& names, const std::string& stem, int64_t in,
                          const std::vector<int64_t>& widths, bool bias) {
    FusedLinear f;
    f.widths = widths;
    const std::vector<std::string> stems = names.parts(stem);
    if (stems.size() == 1) {
        int64_t total = 0;
        for (int64_t width : widths) total += width;
        f.whole = nn::declare_linear(w, stems.front(), in, total, bias);
        return f;
    }
    // Each part has the bias the fused weight has (diffusers' split keeps it).
    for (size_t i = 0; i < stems.size(); ++i) f.split.push_back(nn::declare_linear(w, stems[i], in, widths[i], bias));
    return f;
}

}  // namespace kiln::models
