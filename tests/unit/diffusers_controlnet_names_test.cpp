// A diffusers ControlNetModel's tensor names to the original releases' ldm
// names (io/diffusers_names.h). The expected pairs follow diffusers'
// convert_original_stable_diffusion_to_diffusers.py (controlnet=True) for
// lllyasviel's sd-controlnet-* layout: 4 levels of 2 resnets, attention on
// the first three, six hint blocks.
#include <gtest/gtest.h>

#include <map>

#include "io/diffusers_names.h"

namespace kiln::io {
namespace {

TEST(DiffusersControlNetNames, Sd15ControlNetPairs) {
    const std::map<std::string, std::string> pairs = {
        {"controlnet_cond_embedding.conv_in.weight", "control_model.input_hint_block.0.weight"},
        {"controlnet_cond_embedding.blocks.0.bias", "control_model.input_hint_block.2.bias"},
        {"controlnet_cond_embedding.blocks.5.weight", "control_model.input_hint_block.12.weight"},
        {"controlnet_cond_embedding.conv_out.weight", "control_model.input_hint_block.14.weight"},
        {"controlnet_down_blocks.0.weight", "control_model.zero_convs.0.0.weight"},
        {"controlnet_down_blocks.11.bias", "control_model.zero_convs.11.0.bias"},
        {"controlnet_mid_block.weight", "control_model.middle_block_out.0.weight"},
        {"conv_in.weight", "control_model.input_blocks.0.0.weight"},
        {"time_embedding.linear_2.bias", "control_model.time_embed.2.bias"},
        {"down_blocks.0.resnets.0.norm1.weight", "control_model.input_blocks.1.0.in_layers.0.weight"},
        {"down_blocks.1.attentions.0.proj_in.weight", "control_model.input_blocks.4.1.proj_in.weight"},
        {"down_blocks.2.downsamplers.0.conv.weight", "control_model.input_blocks.9.0.op.weight"},
        {"down_blocks.3.resnets.1.conv2.weight", "control_model.input_blocks.11.0.out_layers.3.weight"},
        {"mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight",
         "control_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight"},
        {"mid_block.resnets.1.time_emb_proj.weight", "control_model.middle_block.2.emb_layers.1.weight"},
    };
    std::vector<TensorInfo> tensors;
    for (const auto& [diffusers, ldm] : pairs) tensors.push_back(TensorInfo{diffusers, DType::F16, {4}});
    // The rest of the layout the block numbering is read from.
    for (int level = 0; level < 4; ++level) {
        for (int j = 0; j < 2; ++j) {
            const std::string down = "down_blocks." + std::to_string(level);
            tensors.push_back(TensorInfo{down + ".resnets." + std::to_string(j) + ".conv1.weight", DType::F16, {4}});
            if (level < 3) {
                tensors.push_back(
                    TensorInfo{down + ".attentions." + std::to_string(j) + ".proj_out.weight", DType::F16, {4}});
            }
        }
    }
    ASSERT_TRUE(is_diffusers_controlnet(tensors));
    rename_diffusers_controlnet(tensors);
    for (size_t i = 0; i < pairs.size(); ++i) {
        const auto& [diffusers, ldm] = *std::next(pairs.begin(), static_cast<long>(i));
        EXPECT_EQ(tensors[i].name, ldm) << diffusers;
    }
    // The original names are not a diffusers ControlNet.
    EXPECT_FALSE(is_diffusers_controlnet({TensorInfo{"control_model.input_hint_block.0.weight", DType::F16, {4}}}));
}

}  // namespace
}  // namespace kiln::io
