#include "io/name_map.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kiln::io {
namespace {

using Op = NameMapping::Op;

struct Pair {
    const char* diffusers;
    const char* ldm;
};

// Checks a one-to-one pair both ways.
void expect_pair(ModelFamily family, ModelComponent component, const Pair& pair) {
    SCOPED_TRACE(std::string(pair.diffusers) + " <-> " + pair.ldm);
    const std::optional<NameMapping> to_ldm = diffusers_to_ldm(family, component, pair.diffusers);
    ASSERT_TRUE(to_ldm.has_value());
    EXPECT_EQ(to_ldm->name, pair.ldm);
    EXPECT_EQ(to_ldm->op, Op::Same);
    EXPECT_EQ(to_ldm->sources, std::vector<std::string>{pair.diffusers});

    const std::optional<DiffusersNames> to_diffusers = ldm_to_diffusers(family, pair.ldm);
    ASSERT_TRUE(to_diffusers.has_value());
    EXPECT_EQ(to_diffusers->component, component);
    ASSERT_EQ(to_diffusers->tensors.size(), 1u);
    EXPECT_EQ(to_diffusers->tensors[0].name, pair.diffusers);
    EXPECT_EQ(to_diffusers->tensors[0].op, Op::Same);
    EXPECT_EQ(to_diffusers->tensors[0].sources, std::vector<std::string>{pair.ldm});
}

void expect_pairs(ModelFamily family, ModelComponent component, const std::vector<Pair>& pairs) {
    for (const Pair& pair : pairs) expect_pair(family, component, pair);
}

// ---------------------------------------------------------------------------
// Name lists generated from the architectures, each side in its own terms
// (ldm counts blocks as it appends them; diffusers nests them), so the
// round-trip tests do not reuse the mapping's index arithmetic.

struct UnetArch {
    std::vector<int> channels;  // per level
    int layers_per_block;
    std::vector<int> transformer_depth;  // per level; 0 = no attention
    int mid_depth;
    bool label_emb;
};

const UnetArch sd15_arch = {{320, 640, 1280, 1280}, 2, {1, 1, 1, 0}, 1, false};
const UnetArch sdxl_arch = {{320, 640, 1280}, 2, {0, 2, 10}, 10, true};

void add_leaves(std::vector<std::string>& out, const std::string& prefix, std::initializer_list<const char*> layers) {
    for (const char* layer : layers) {
        out.push_back(prefix + layer + ".weight");
        out.push_back(prefix + layer + ".bias");
    }
}

// A Transformer2DModel / SpatialTransformer: same names on both sides.
void add_transformer(std::vector<std::string>& out, const std::string& prefix, int depth) {
    add_leaves(out, prefix, {"norm", "proj_in", "proj_out"});
    for (int d = 0; d < depth; ++d) {
        const std::string block = prefix + "transformer_blocks." + std::to_string(d) + ".";
        for (const char* attn : {"attn1.", "attn2."}) {
            for (const char* w : {"to_q.weight", "to_k.weight", "to_v.weight"}) out.push_back(block + attn + w);
            add_leaves(out, block + attn, {"to_out.0"});
        }
        add_leaves(out, block, {"norm1", "norm2", "norm3", "ff.net.0.proj", "ff.net.2"});
    }
}

void add_ldm_resblock(std::vector<std::string>& out, const std::string& prefix, bool skip) {
    add_leaves(out, prefix, {"in_layers.0", "in_layers.2", "emb_layers.1", "out_layers.0", "out_layers.3"});
    if (skip) add_leaves(out, prefix, {"skip_connection"});
}

void add_diffusers_resnet(std::vector<std::string>& out, const std::string& prefix, bool shortcut) {
    add_leaves(out, prefix, {"norm1", "conv1", "time_emb_proj", "norm2", "conv2"});
    if (shortcut) add_leaves(out, prefix, {"conv_shortcut"});
}

UnetLayout layout_of(const UnetArch& arch) {
    UnetLayout layout;
    layout.levels = static_cast<int>(arch.channels.size());
    layout.layers_per_block = arch.layers_per_block;
    layout.attention_levels = 0;
    for (size_t i = 0; i < arch.channels.size(); ++i)
        if (arch.transformer_depth[i] > 0) layout.attention_levels |= 1u << i;
    return layout;
}

std::vector<std::string> ldm_unet_names(const UnetArch& arch) {
    const std::string p = "model.diffusion_model.";
    const int levels = static_cast<int>(arch.channels.size());
    std::vector<std::string> out;
    add_leaves(out, p, {"time_embed.0", "time_embed.2", "input_blocks.0.0", "out.0", "out.2"});
    if (arch.label_emb) add_leaves(out, p, {"label_emb.0.0", "label_emb.0.2"});
    int block = 1;
    int ch = arch.channels[0];
    for (int level = 0; level < levels; ++level) {
        for (int j = 0; j < arch.layers_per_block; ++j) {
            const std::string b = p + "input_blocks." + std::to_string(block++) + ".";
            add_ldm_resblock(out, b + "0.", ch != arch.channels[level]);
            ch = arch.channels[level];
            if (arch.transformer_depth[level] > 0) add_transformer(out, b + "1.", arch.transformer_depth[level]);
        }
        if (level + 1 < levels) add_leaves(out, p + "input_blocks." + std::to_string(block++) + ".0.", {"op"});
    }
    add_ldm_resblock(out, p + "middle_block.0.", false);
    add_transformer(out, p + "middle_block.1.", arch.mid_depth);
    add_ldm_resblock(out, p + "middle_block.2.", false);
    block = 0;
    for (int level = levels - 1; level >= 0; --level) {
        for (int j = 0; j <= arch.layers_per_block; ++j) {
            const std::string b = p + "output_blocks." + std::to_string(block++) + ".";
            add_ldm_resblock(out, b + "0.", true);  // the skip concat always changes the width
            int sub = 1;
            if (arch.transformer_depth[level] > 0)
                add_transformer(out, b + std::to_string(sub++) + ".", arch.transformer_depth[level]);
            if (j == arch.layers_per_block && level > 0) add_leaves(out, b + std::to_string(sub) + ".", {"conv"});
        }
    }
    return out;
}

std::vector<std::string> diffusers_unet_names(const UnetArch& arch) {
    const int levels = static_cast<int>(arch.channels.size());
    std::vector<std::string> out;
    add_leaves(out, "", {"time_embedding.linear_1", "time_embedding.linear_2", "conv_in", "conv_norm_out", "conv_out"});
    if (arch.label_emb) add_leaves(out, "", {"add_embedding.linear_1", "add_embedding.linear_2"});
    int ch = arch.channels[0];
    for (int i = 0; i < levels; ++i) {
        const std::string b = "down_blocks." + std::to_string(i) + ".";
        for (int j = 0; j < arch.layers_per_block; ++j) {
            add_diffusers_resnet(out, b + "resnets." + std::to_string(j) + ".", ch != arch.channels[i]);
            ch = arch.channels[i];
            if (arch.transformer_depth[i] > 0)
                add_transformer(out, b + "attentions." + std::to_string(j) + ".", arch.transformer_depth[i]);
        }
        if (i + 1 < levels) add_leaves(out, b + "downsamplers.0.", {"conv"});
    }
    add_diffusers_resnet(out, "mid_block.resnets.0.", false);
    add_transformer(out, "mid_block.attentions.0.", arch.mid_depth);
    add_diffusers_resnet(out, "mid_block.resnets.1.", false);
    for (int u = 0; u < levels; ++u) {
        const int level = levels - 1 - u;
        const std::string b = "up_blocks." + std::to_string(u) + ".";
        for (int j = 0; j <= arch.layers_per_block; ++j) {
            add_diffusers_resnet(out, b + "resnets." + std::to_string(j) + ".", true);
            if (arch.transformer_depth[level] > 0)
                add_transformer(out, b + "attentions." + std::to_string(j) + ".", arch.transformer_depth[level]);
        }
        if (u + 1 < levels) add_leaves(out, b + "upsamplers.0.", {"conv"});
    }
    return out;
}

std::vector<std::string> ldm_vae_names() {
    const std::string p = "first_stage_model.";
    const std::vector<int> ch = {128, 256, 512, 512};
    std::vector<std::string> out;
    auto resnet = [&](const std::string& prefix, bool shortcut) {
        add_leaves(out, prefix, {"norm1", "conv1", "norm2", "conv2"});
        if (shortcut) add_leaves(out, prefix, {"nin_shortcut"});
    };
    auto mid = [&](const std::string& prefix) {
        resnet(prefix + "mid.block_1.", false);
        add_leaves(out, prefix + "mid.attn_1.", {"norm", "q", "k", "v", "proj_out"});
        resnet(prefix + "mid.block_2.", false);
    };
    add_leaves(out, p,
               {"encoder.conv_in", "encoder.norm_out", "encoder.conv_out", "decoder.conv_in", "decoder.norm_out",
                "decoder.conv_out", "quant_conv", "post_quant_conv"});
    int c = ch[0];
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 2; ++j) {
            resnet(p + "encoder.down." + std::to_string(i) + ".block." + std::to_string(j) + ".", c != ch[i]);
            c = ch[i];
        }
        if (i < 3) add_leaves(out, p + "encoder.down." + std::to_string(i) + ".downsample.", {"conv"});
    }
    mid(p + "encoder.");
    mid(p + "decoder.");
    c = ch[3];
    for (int i = 3; i >= 0; --i) {  // ldm builds the decoder from the lowest resolution, indexing up[i]
        for (int j = 0; j < 3; ++j) {
            resnet(p + "decoder.up." + std::to_string(i) + ".block." + std::to_string(j) + ".", c != ch[i]);
            c = ch[i];
        }
        if (i > 0) add_leaves(out, p + "decoder.up." + std::to_string(i) + ".upsample.", {"conv"});
    }
    return out;
}

std::vector<std::string> diffusers_vae_names() {
    const std::vector<int> ch = {128, 256, 512, 512};
    std::vector<std::string> out;
    auto resnet = [&](const std::string& prefix, bool shortcut) {
        add_leaves(out, prefix, {"norm1", "conv1", "norm2", "conv2"});
        if (shortcut) add_leaves(out, prefix, {"conv_shortcut"});
    };
    auto mid = [&](const std::string& prefix) {
        resnet(prefix + "mid_block.resnets.0.", false);
        add_leaves(out, prefix + "mid_block.attentions.0.", {"group_norm", "to_q", "to_k", "to_v", "to_out.0"});
        resnet(prefix + "mid_block.resnets.1.", false);
    };
    add_leaves(out, "",
               {"encoder.conv_in", "encoder.conv_norm_out", "encoder.conv_out", "decoder.conv_in",
                "decoder.conv_norm_out", "decoder.conv_out", "quant_conv", "post_quant_conv"});
    int c = ch[0];
    for (int i = 0; i < 4; ++i) {
        const std::string b = "encoder.down_blocks." + std::to_string(i) + ".";
        for (int j = 0; j < 2; ++j) {
            resnet(b + "resnets." + std::to_string(j) + ".", c != ch[i]);
            c = ch[i];
        }
        if (i < 3) add_leaves(out, b + "downsamplers.0.", {"conv"});
    }
    mid("encoder.");
    mid("decoder.");
    c = ch[3];
    for (int u = 0; u < 4; ++u) {
        const int level = 3 - u;
        const std::string b = "decoder.up_blocks." + std::to_string(u) + ".";
        for (int j = 0; j < 3; ++j) {
            resnet(b + "resnets." + std::to_string(j) + ".", c != ch[level]);
            c = ch[level];
        }
        if (u < 3) add_leaves(out, b + "upsamplers.0.", {"conv"});
    }
    return out;
}

// HF CLIPTextModel names for `layers` encoder layers.
std::vector<std::string> hf_clip_names(int layers, bool projection) {
    std::vector<std::string> out = {"text_model.embeddings.token_embedding.weight",
                                    "text_model.embeddings.position_embedding.weight"};
    for (int l = 0; l < layers; ++l) {
        const std::string b = "text_model.encoder.layers." + std::to_string(l) + ".";
        add_leaves(out, b,
                   {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "layer_norm1",
                    "layer_norm2", "mlp.fc1", "mlp.fc2"});
    }
    add_leaves(out, "", {"text_model.final_layer_norm"});
    if (projection) out.push_back("text_projection.weight");
    return out;
}

std::set<std::string> as_set(const std::vector<std::string>& names) { return {names.begin(), names.end()}; }

// Maps every diffusers name to ldm (collecting the distinct ldm names) and every
// resulting ldm name back, checking that the back-mapping reproduces the diffusers names.
std::set<std::string> round_trip(const NameMap& map, ModelComponent component, const std::vector<std::string>& names) {
    std::set<std::string> ldm;
    for (const std::string& name : names) {
        const std::optional<NameMapping> m = map.diffusers_to_ldm(component, name);
        EXPECT_TRUE(m.has_value()) << name;
        if (m) ldm.insert(m->name);
    }
    std::set<std::string> back;
    for (const std::string& name : ldm) {
        const std::optional<DiffusersNames> d = map.ldm_to_diffusers(name);
        EXPECT_TRUE(d.has_value()) << name;
        if (!d) continue;
        EXPECT_EQ(d->component, component) << name;
        for (const NameMapping& t : d->tensors) {
            EXPECT_TRUE(back.insert(t.name).second) << "duplicate " << t.name;
            EXPECT_EQ(t.sources, std::vector<std::string>{name});
        }
    }
    EXPECT_EQ(back, as_set(names));
    return ldm;
}

// ---------------------------------------------------------------------------
// UNet

TEST(NameMapUnet, Sd1Pairs) {
    expect_pairs(
        ModelFamily::SD1, ModelComponent::Unet,
        {
            {"conv_in.weight", "model.diffusion_model.input_blocks.0.0.weight"},
            {"conv_in.bias", "model.diffusion_model.input_blocks.0.0.bias"},
            {"time_embedding.linear_1.weight", "model.diffusion_model.time_embed.0.weight"},
            {"time_embedding.linear_2.bias", "model.diffusion_model.time_embed.2.bias"},
            {"down_blocks.0.resnets.0.norm1.weight", "model.diffusion_model.input_blocks.1.0.in_layers.0.weight"},
            {"down_blocks.0.resnets.1.conv1.bias", "model.diffusion_model.input_blocks.2.0.in_layers.2.bias"},
            {"down_blocks.1.resnets.0.time_emb_proj.weight",
             "model.diffusion_model.input_blocks.4.0.emb_layers.1.weight"},
            {"down_blocks.1.resnets.0.conv_shortcut.weight",
             "model.diffusion_model.input_blocks.4.0.skip_connection.weight"},
            {"down_blocks.2.resnets.1.norm2.weight", "model.diffusion_model.input_blocks.8.0.out_layers.0.weight"},
            {"down_blocks.3.resnets.1.conv2.weight", "model.diffusion_model.input_blocks.11.0.out_layers.3.weight"},
            {"down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj.weight",
             "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.ff.net.0.proj.weight"},
            {"down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight",
             "model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn1.to_q.weight"},
            {"down_blocks.2.attentions.1.proj_out.bias", "model.diffusion_model.input_blocks.8.1.proj_out.bias"},
            {"down_blocks.0.downsamplers.0.conv.weight", "model.diffusion_model.input_blocks.3.0.op.weight"},
            {"down_blocks.1.downsamplers.0.conv.weight", "model.diffusion_model.input_blocks.6.0.op.weight"},
            {"down_blocks.2.downsamplers.0.conv.bias", "model.diffusion_model.input_blocks.9.0.op.bias"},
            {"mid_block.resnets.0.norm1.weight", "model.diffusion_model.middle_block.0.in_layers.0.weight"},
            {"mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight",
             "model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight"},
            {"mid_block.resnets.1.conv2.bias", "model.diffusion_model.middle_block.2.out_layers.3.bias"},
            {"up_blocks.0.resnets.0.conv_shortcut.weight",
             "model.diffusion_model.output_blocks.0.0.skip_connection.weight"},
            {"up_blocks.0.resnets.2.conv1.weight", "model.diffusion_model.output_blocks.2.0.in_layers.2.weight"},
            {"up_blocks.0.upsamplers.0.conv.weight", "model.diffusion_model.output_blocks.2.1.conv.weight"},
            {"up_blocks.1.resnets.0.norm1.bias", "model.diffusion_model.output_blocks.3.0.in_layers.0.bias"},
            {"up_blocks.1.attentions.2.norm.weight", "model.diffusion_model.output_blocks.5.1.norm.weight"},
            {"up_blocks.1.upsamplers.0.conv.weight", "model.diffusion_model.output_blocks.5.2.conv.weight"},
            {"up_blocks.2.upsamplers.0.conv.bias", "model.diffusion_model.output_blocks.8.2.conv.bias"},
            {"up_blocks.3.resnets.2.norm2.bias", "model.diffusion_model.output_blocks.11.0.out_layers.0.bias"},
            {"up_blocks.3.attentions.2.transformer_blocks.0.norm3.weight",
             "model.diffusion_model.output_blocks.11.1.transformer_blocks.0.norm3.weight"},
            {"conv_norm_out.weight", "model.diffusion_model.out.0.weight"},
            {"conv_out.bias", "model.diffusion_model.out.2.bias"},
        });
}

TEST(NameMapUnet, Sd2Pairs) {
    // SD2 keeps SD1's block layout; its linear proj_in/proj_out change shapes, not names.
    expect_pairs(
        ModelFamily::SD2, ModelComponent::Unet,
        {
            {"down_blocks.0.attentions.1.proj_in.weight", "model.diffusion_model.input_blocks.2.1.proj_in.weight"},
            {"down_blocks.3.resnets.0.norm1.weight", "model.diffusion_model.input_blocks.10.0.in_layers.0.weight"},
            {"up_blocks.0.upsamplers.0.conv.weight", "model.diffusion_model.output_blocks.2.1.conv.weight"},
            {"up_blocks.2.attentions.0.transformer_blocks.0.attn2.to_v.weight",
             "model.diffusion_model.output_blocks.6.1.transformer_blocks.0.attn2.to_v.weight"},
            {"mid_block.attentions.0.proj_out.weight", "model.diffusion_model.middle_block.1.proj_out.weight"},
        });
}

TEST(NameMapUnet, SdxlPairs) {
    expect_pairs(
        ModelFamily::SDXL, ModelComponent::Unet,
        {
            {"add_embedding.linear_1.weight", "model.diffusion_model.label_emb.0.0.weight"},
            {"add_embedding.linear_2.bias", "model.diffusion_model.label_emb.0.2.bias"},
            {"time_embedding.linear_1.bias", "model.diffusion_model.time_embed.0.bias"},
            {"conv_in.weight", "model.diffusion_model.input_blocks.0.0.weight"},
            {"down_blocks.0.resnets.1.conv1.weight", "model.diffusion_model.input_blocks.2.0.in_layers.2.weight"},
            {"down_blocks.0.downsamplers.0.conv.weight", "model.diffusion_model.input_blocks.3.0.op.weight"},
            {"down_blocks.1.resnets.0.conv_shortcut.bias",
             "model.diffusion_model.input_blocks.4.0.skip_connection.bias"},
            {"down_blocks.1.attentions.0.transformer_blocks.1.attn1.to_q.weight",
             "model.diffusion_model.input_blocks.4.1.transformer_blocks.1.attn1.to_q.weight"},
            {"down_blocks.1.downsamplers.0.conv.weight", "model.diffusion_model.input_blocks.6.0.op.weight"},
            {"down_blocks.2.attentions.1.transformer_blocks.9.ff.net.2.weight",
             "model.diffusion_model.input_blocks.8.1.transformer_blocks.9.ff.net.2.weight"},
            {"mid_block.attentions.0.transformer_blocks.9.norm2.bias",
             "model.diffusion_model.middle_block.1.transformer_blocks.9.norm2.bias"},
            {"mid_block.resnets.1.time_emb_proj.weight", "model.diffusion_model.middle_block.2.emb_layers.1.weight"},
            {"up_blocks.0.attentions.2.proj_in.weight", "model.diffusion_model.output_blocks.2.1.proj_in.weight"},
            {"up_blocks.0.upsamplers.0.conv.weight", "model.diffusion_model.output_blocks.2.2.conv.weight"},
            {"up_blocks.1.resnets.1.norm2.weight", "model.diffusion_model.output_blocks.4.0.out_layers.0.weight"},
            {"up_blocks.1.upsamplers.0.conv.bias", "model.diffusion_model.output_blocks.5.2.conv.bias"},
            {"up_blocks.2.resnets.2.conv2.weight", "model.diffusion_model.output_blocks.8.0.out_layers.3.weight"},
            {"conv_out.weight", "model.diffusion_model.out.2.weight"},
        });
}

TEST(NameMapUnet, BlocksOutsideTheLayoutAreUnknown) {
    // SD1: the lowest-resolution level has no attention and no downsampler; the last up block no upsampler.
    for (const char* name : {"down_blocks.3.attentions.0.norm.weight", "down_blocks.3.downsamplers.0.conv.weight",
                             "up_blocks.0.attentions.0.norm.weight", "up_blocks.3.upsamplers.0.conv.weight",
                             "down_blocks.4.resnets.0.norm1.weight", "down_blocks.0.resnets.2.norm1.weight",
                             "up_blocks.0.resnets.3.norm1.weight"})
        EXPECT_FALSE(diffusers_to_ldm(ModelFamily::SD1, ModelComponent::Unet, name)) << name;
    // SDXL: no attention at full resolution, no downsampler after the third level.
    for (const char* name : {"down_blocks.0.attentions.0.norm.weight", "down_blocks.2.downsamplers.0.conv.weight",
                             "up_blocks.2.attentions.0.norm.weight", "up_blocks.2.upsamplers.0.conv.weight",
                             "down_blocks.3.resnets.0.norm1.weight"})
        EXPECT_FALSE(diffusers_to_ldm(ModelFamily::SDXL, ModelComponent::Unet, name)) << name;
    for (const char* name :
         {"model.diffusion_model.input_blocks.9.0.op.weight", "model.diffusion_model.input_blocks.1.1.norm.weight",
          "model.diffusion_model.output_blocks.9.0.in_layers.0.weight",
          "model.diffusion_model.output_blocks.2.1.conv.weight"})
        EXPECT_FALSE(ldm_to_diffusers(ModelFamily::SDXL, name)) << name;
}

TEST(NameMapUnet, UnknownNames) {
    for (const char* name : {"", "conv_in", "conv_in.", "garbage.weight", "down_blocks.x.resnets.0.norm1.weight",
                             "down_blocks.0.resnets.0.norm3.weight", "down_blocks.0.resnets.0.",
                             "time_embedding.linear_3.weight", "down_blocks.0.attentions.0.conv.weight",
                             "down_blocks.0.attentions.0.transformer_blocks.0.attn3.to_q.weight"})
        EXPECT_FALSE(diffusers_to_ldm(ModelFamily::SD1, ModelComponent::Unet, name)) << name;
    for (const char* name :
         {"", "model.diffusion_model.", "model.diffusion_model.input_blocks.1.0.in_layers.1.weight", "model_ema.decay",
          "alphas_cumprod", "model.diffusion_model.middle_block.3.in_layers.0.weight",
          "diffusion_model.input_blocks.0.0.weight"})
        EXPECT_FALSE(ldm_to_diffusers(ModelFamily::SD1, name)) << name;
}

TEST(NameMapUnet, Sd15FullRoundTrip) {
    const std::vector<std::string> diffusers = diffusers_unet_names(sd15_arch);
    const std::vector<std::string> ldm = ldm_unet_names(sd15_arch);
    ASSERT_EQ(diffusers.size(), 686u);  // the SD1.5 UNet's tensor count
    ASSERT_EQ(as_set(diffusers).size(), diffusers.size());
    ASSERT_EQ(as_set(ldm).size(), diffusers.size());
    EXPECT_EQ(round_trip(NameMap(ModelFamily::SD1), ModelComponent::Unet, diffusers), as_set(ldm));
}

TEST(NameMapUnet, SdxlFullRoundTrip) {
    const std::vector<std::string> diffusers = diffusers_unet_names(sdxl_arch);
    const std::vector<std::string> ldm = ldm_unet_names(sdxl_arch);
    ASSERT_EQ(diffusers.size(), 1680u);  // the SDXL base UNet's tensor count
    ASSERT_EQ(as_set(ldm).size(), diffusers.size());
    EXPECT_EQ(round_trip(NameMap(ModelFamily::SDXL), ModelComponent::Unet, diffusers), as_set(ldm));
}

TEST(NameMapUnet, CustomLayout) {
    // Two levels, one layer per block, attention on the lower resolution only.
    const UnetArch arch = {{64, 128}, 1, {0, 1}, 1, false};
    const UnetLayout layout = layout_of(arch);
    const NameMap map(ModelFamily::SD1, layout);
    EXPECT_EQ(map.diffusers_to_ldm(ModelComponent::Unet, "down_blocks.0.downsamplers.0.conv.weight")->name,
              "model.diffusion_model.input_blocks.2.0.op.weight");
    EXPECT_EQ(map.diffusers_to_ldm(ModelComponent::Unet, "down_blocks.1.attentions.0.norm.weight")->name,
              "model.diffusion_model.input_blocks.3.1.norm.weight");
    EXPECT_EQ(map.diffusers_to_ldm(ModelComponent::Unet, "up_blocks.0.upsamplers.0.conv.weight")->name,
              "model.diffusion_model.output_blocks.1.2.conv.weight");
    EXPECT_EQ(map.diffusers_to_ldm(ModelComponent::Unet, "up_blocks.1.resnets.1.conv1.weight")->name,
              "model.diffusion_model.output_blocks.3.0.in_layers.2.weight");
    EXPECT_EQ(round_trip(map, ModelComponent::Unet, diffusers_unet_names(arch)), as_set(ldm_unet_names(arch)));
}

TEST(NameMapUnet, LayoutDefaults) {
    const UnetLayout sd1 = UnetLayout::for_family(ModelFamily::SD1);
    EXPECT_EQ(sd1.levels, 4);
    EXPECT_EQ(sd1.layers_per_block, 2);
    EXPECT_TRUE(sd1.has_attention(0));
    EXPECT_TRUE(sd1.has_attention(2));
    EXPECT_FALSE(sd1.has_attention(3));
    const UnetLayout sdxl = UnetLayout::for_family(ModelFamily::SDXL);
    EXPECT_EQ(sdxl.levels, 3);
    EXPECT_FALSE(sdxl.has_attention(0));
    EXPECT_TRUE(sdxl.has_attention(1));
    EXPECT_TRUE(sdxl.has_attention(2));
    EXPECT_FALSE(sdxl.has_attention(-1));
    EXPECT_FALSE(sdxl.has_attention(40));
}

// ---------------------------------------------------------------------------
// VAE

TEST(NameMapVae, Pairs) {
    for (ModelFamily family : {ModelFamily::SD1, ModelFamily::SD2, ModelFamily::SDXL}) {
        expect_pairs(
            family, ModelComponent::Vae,
            {
                {"encoder.conv_in.weight", "first_stage_model.encoder.conv_in.weight"},
                {"encoder.down_blocks.0.resnets.1.norm1.weight",
                 "first_stage_model.encoder.down.0.block.1.norm1.weight"},
                {"encoder.down_blocks.1.resnets.0.conv_shortcut.weight",
                 "first_stage_model.encoder.down.1.block.0.nin_shortcut.weight"},
                {"encoder.down_blocks.2.downsamplers.0.conv.bias",
                 "first_stage_model.encoder.down.2.downsample.conv.bias"},
                {"encoder.down_blocks.3.resnets.1.conv2.weight",
                 "first_stage_model.encoder.down.3.block.1.conv2.weight"},
                {"encoder.mid_block.resnets.0.conv1.weight", "first_stage_model.encoder.mid.block_1.conv1.weight"},
                {"encoder.mid_block.resnets.1.norm2.bias", "first_stage_model.encoder.mid.block_2.norm2.bias"},
                {"encoder.mid_block.attentions.0.group_norm.weight",
                 "first_stage_model.encoder.mid.attn_1.norm.weight"},
                {"encoder.mid_block.attentions.0.to_q.weight", "first_stage_model.encoder.mid.attn_1.q.weight"},
                {"encoder.mid_block.attentions.0.to_k.bias", "first_stage_model.encoder.mid.attn_1.k.bias"},
                {"encoder.mid_block.attentions.0.to_out.0.bias", "first_stage_model.encoder.mid.attn_1.proj_out.bias"},
                {"encoder.conv_norm_out.weight", "first_stage_model.encoder.norm_out.weight"},
                {"encoder.conv_out.bias", "first_stage_model.encoder.conv_out.bias"},
                {"quant_conv.weight", "first_stage_model.quant_conv.weight"},
                {"post_quant_conv.bias", "first_stage_model.post_quant_conv.bias"},
                {"decoder.conv_in.weight", "first_stage_model.decoder.conv_in.weight"},
                {"decoder.mid_block.attentions.0.to_v.weight", "first_stage_model.decoder.mid.attn_1.v.weight"},
                {"decoder.up_blocks.0.resnets.2.conv2.weight", "first_stage_model.decoder.up.3.block.2.conv2.weight"},
                {"decoder.up_blocks.0.upsamplers.0.conv.weight", "first_stage_model.decoder.up.3.upsample.conv.weight"},
                {"decoder.up_blocks.1.upsamplers.0.conv.bias", "first_stage_model.decoder.up.2.upsample.conv.bias"},
                {"decoder.up_blocks.2.resnets.0.conv_shortcut.bias",
                 "first_stage_model.decoder.up.1.block.0.nin_shortcut.bias"},
                {"decoder.up_blocks.2.upsamplers.0.conv.weight", "first_stage_model.decoder.up.1.upsample.conv.weight"},
                {"decoder.up_blocks.3.resnets.0.norm1.weight", "first_stage_model.decoder.up.0.block.0.norm1.weight"},
                {"decoder.conv_norm_out.bias", "first_stage_model.decoder.norm_out.bias"},
                {"decoder.conv_out.weight", "first_stage_model.decoder.conv_out.weight"},
            });
    }
}

TEST(NameMapVae, OldAttentionNamesReadAsNew) {
    const std::vector<Pair> old_names = {
        {"encoder.mid_block.attentions.0.query.weight", "first_stage_model.encoder.mid.attn_1.q.weight"},
        {"encoder.mid_block.attentions.0.key.bias", "first_stage_model.encoder.mid.attn_1.k.bias"},
        {"decoder.mid_block.attentions.0.value.weight", "first_stage_model.decoder.mid.attn_1.v.weight"},
        {"decoder.mid_block.attentions.0.proj_attn.bias", "first_stage_model.decoder.mid.attn_1.proj_out.bias"},
        {"decoder.mid_block.attentions.0.group_norm.bias", "first_stage_model.decoder.mid.attn_1.norm.bias"},
    };
    for (const Pair& pair : old_names) {
        const std::optional<NameMapping> m = diffusers_to_ldm(ModelFamily::SD1, ModelComponent::Vae, pair.diffusers);
        ASSERT_TRUE(m) << pair.diffusers;
        EXPECT_EQ(m->name, pair.ldm);
        EXPECT_EQ(m->op, Op::Same);
    }
    // Back to diffusers always gives the current names.
    const std::optional<DiffusersNames> d =
        ldm_to_diffusers(ModelFamily::SD1, "first_stage_model.decoder.mid.attn_1.proj_out.bias");
    ASSERT_TRUE(d);
    ASSERT_EQ(d->tensors.size(), 1u);
    EXPECT_EQ(d->tensors[0].name, "decoder.mid_block.attentions.0.to_out.0.bias");
}

TEST(NameMapVae, UnknownNames) {
    for (const char* name :
         {"decoder.up_blocks.3.upsamplers.0.conv.weight", "encoder.down_blocks.3.downsamplers.0.conv.weight",
          "encoder.down_blocks.0.resnets.2.norm1.weight", "decoder.up_blocks.4.resnets.0.norm1.weight",
          "encoder.mid_block.resnets.0.time_emb_proj.weight", "encoder.mid_block.attentions.1.to_q.weight",
          "decoder.mid_block.attentions.0.to_out.1.weight"})
        EXPECT_FALSE(diffusers_to_ldm(ModelFamily::SD1, ModelComponent::Vae, name)) << name;
    for (const char* name : {"first_stage_model.decoder.up.0.upsample.conv.weight",
                             "first_stage_model.encoder.down.3.downsample.conv.weight",
                             "first_stage_model.decoder.up.0.block.3.norm1.weight", "first_stage_model.loss.logvar"})
        EXPECT_FALSE(ldm_to_diffusers(ModelFamily::SD1, name)) << name;
}

TEST(NameMapVae, FullRoundTrip) {
    const std::vector<std::string> diffusers = diffusers_vae_names();
    ASSERT_EQ(diffusers.size(), 248u);  // AutoencoderKL's tensor count in SD checkpoints
    EXPECT_EQ(round_trip(NameMap(ModelFamily::SD1), ModelComponent::Vae, diffusers), as_set(ldm_vae_names()));
}

TEST(NameMapVae, AttentionReshape) {
    for (const char* name :
         {"first_stage_model.encoder.mid.attn_1.q.weight", "first_stage_model.decoder.mid.attn_1.k.weight",
          "first_stage_model.decoder.mid.attn_1.v.weight", "first_stage_model.encoder.mid.attn_1.proj_out.weight",
          "decoder.mid.attn_1.q.weight"})
        EXPECT_TRUE(vae_attention_needs_reshape(name)) << name;
    for (const char* name :
         {"first_stage_model.encoder.mid.attn_1.q.bias", "first_stage_model.encoder.mid.attn_1.norm.weight",
          "first_stage_model.encoder.mid.block_1.conv1.weight", "model.diffusion_model.out.2.weight",
          "first_stage_model.encoder.mid.attn_1.q.weight.x", ""})
        EXPECT_FALSE(vae_attention_needs_reshape(name)) << name;
}

// ---------------------------------------------------------------------------
// Text encoders

TEST(NameMapText, Sd1Clip) {
    expect_pairs(
        ModelFamily::SD1, ModelComponent::TextEncoder,
        {
            {"text_model.embeddings.token_embedding.weight",
             "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight"},
            {"text_model.embeddings.position_embedding.weight",
             "cond_stage_model.transformer.text_model.embeddings.position_embedding.weight"},
            {"text_model.embeddings.position_ids", "cond_stage_model.transformer.text_model.embeddings.position_ids"},
            {"text_model.encoder.layers.0.self_attn.q_proj.weight",
             "cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight"},
            {"text_model.encoder.layers.11.mlp.fc2.bias",
             "cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc2.bias"},
            {"text_model.final_layer_norm.weight", "cond_stage_model.transformer.text_model.final_layer_norm.weight"},
        });
    EXPECT_FALSE(
        diffusers_to_ldm(ModelFamily::SD1, ModelComponent::TextEncoder2, "text_model.final_layer_norm.weight"));
    EXPECT_FALSE(diffusers_to_ldm(ModelFamily::SD1, ModelComponent::TextEncoder, "text_projection.weight"));
    EXPECT_FALSE(ldm_to_diffusers(ModelFamily::SD1, "cond_stage_model.model.ln_final.weight"));
}

TEST(NameMapText, Sd1ClipFullRoundTrip) {
    const std::vector<std::string> names = hf_clip_names(12, false);
    EXPECT_EQ(round_trip(NameMap(ModelFamily::SD1), ModelComponent::TextEncoder, names).size(), names.size());
}

TEST(NameMapText, Sd2OpenClipRenames) {
    expect_pairs(ModelFamily::SD2, ModelComponent::TextEncoder,
                 {
                     {"text_model.embeddings.token_embedding.weight", "cond_stage_model.model.token_embedding.weight"},
                     {"text_model.embeddings.position_embedding.weight", "cond_stage_model.model.positional_embedding"},
                     {"text_model.encoder.layers.3.layer_norm1.weight",
                      "cond_stage_model.model.transformer.resblocks.3.ln_1.weight"},
                     {"text_model.encoder.layers.22.layer_norm2.bias",
                      "cond_stage_model.model.transformer.resblocks.22.ln_2.bias"},
                     {"text_model.encoder.layers.0.self_attn.out_proj.weight",
                      "cond_stage_model.model.transformer.resblocks.0.attn.out_proj.weight"},
                     {"text_model.encoder.layers.10.mlp.fc1.bias",
                      "cond_stage_model.model.transformer.resblocks.10.mlp.c_fc.bias"},
                     {"text_model.encoder.layers.10.mlp.fc2.weight",
                      "cond_stage_model.model.transformer.resblocks.10.mlp.c_proj.weight"},
                     {"text_model.final_layer_norm.weight", "cond_stage_model.model.ln_final.weight"},
                 });
}

TEST(NameMapText, Sd2OpenClipFusedQkv) {
    const std::string layer = "text_model.encoder.layers.5.self_attn.";
    const std::vector<std::string> weights = {layer + "q_proj.weight", layer + "k_proj.weight",
                                              layer + "v_proj.weight"};
    for (int part = 0; part < 3; ++part) {
        const std::optional<NameMapping> m =
            diffusers_to_ldm(ModelFamily::SD2, ModelComponent::TextEncoder, weights[static_cast<size_t>(part)]);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->name, "cond_stage_model.model.transformer.resblocks.5.attn.in_proj_weight");
        EXPECT_EQ(m->op, Op::Concat3);
        EXPECT_EQ(m->part, part);
        EXPECT_EQ(m->sources, weights);
    }
    const std::optional<NameMapping> bias =
        diffusers_to_ldm(ModelFamily::SD2, ModelComponent::TextEncoder, layer + "k_proj.bias");
    ASSERT_TRUE(bias);
    EXPECT_EQ(bias->name, "cond_stage_model.model.transformer.resblocks.5.attn.in_proj_bias");
    EXPECT_EQ(bias->op, Op::Concat3);
    EXPECT_EQ(bias->part, 1);
    EXPECT_EQ(bias->sources,
              (std::vector<std::string>{layer + "q_proj.bias", layer + "k_proj.bias", layer + "v_proj.bias"}));

    const std::string fused = "cond_stage_model.model.transformer.resblocks.5.attn.in_proj_weight";
    const std::optional<DiffusersNames> d = ldm_to_diffusers(ModelFamily::SD2, fused);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->component, ModelComponent::TextEncoder);
    ASSERT_EQ(d->tensors.size(), 3u);
    for (int part = 0; part < 3; ++part) {
        const NameMapping& t = d->tensors[static_cast<size_t>(part)];
        EXPECT_EQ(t.name, weights[static_cast<size_t>(part)]);
        EXPECT_EQ(t.op, Op::Slice3);
        EXPECT_EQ(t.part, part);
        EXPECT_EQ(t.sources, std::vector<std::string>{fused});
    }
}

TEST(NameMapText, Sd2OpenClipTextProjectionTransposed) {
    const std::optional<NameMapping> m =
        diffusers_to_ldm(ModelFamily::SD2, ModelComponent::TextEncoder, "text_projection.weight");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->name, "cond_stage_model.model.text_projection");
    EXPECT_EQ(m->op, Op::Transpose);
    EXPECT_EQ(m->sources, std::vector<std::string>{"text_projection.weight"});
    const std::optional<DiffusersNames> d =
        ldm_to_diffusers(ModelFamily::SD2, "cond_stage_model.model.text_projection");
    ASSERT_TRUE(d);
    ASSERT_EQ(d->tensors.size(), 1u);
    EXPECT_EQ(d->tensors[0].name, "text_projection.weight");
    EXPECT_EQ(d->tensors[0].op, Op::Transpose);
}

TEST(NameMapText, Sd2OpenClipUnknownNames) {
    for (const char* name :
         {"cond_stage_model.model.logit_scale", "cond_stage_model.model.transformer.resblocks.0.attn.in_proj",
          "cond_stage_model.model.transformer.resblocks.x.ln_1.weight",
          "cond_stage_model.model.transformer.resblocks.0.ln_3.weight",
          "cond_stage_model.model.positional_embedding.weight",
          "cond_stage_model.transformer.text_model.final_layer_norm.weight"})
        EXPECT_FALSE(ldm_to_diffusers(ModelFamily::SD2, name)) << name;
    for (const char* name :
         {"text_model.encoder.layers.0.self_attn.qkv_proj.weight", "text_model.encoder.layers..mlp.fc1.weight",
          "text_model.embeddings.position_embedding", "text_projection"})
        EXPECT_FALSE(diffusers_to_ldm(ModelFamily::SD2, ModelComponent::TextEncoder, name)) << name;
}

TEST(NameMapText, Sd2OpenClipFullRoundTrip) {
    // Diffusers' SD2 text encoder stores 23 of OpenCLIP's 24 layers (SD2 conditions on the penultimate one).
    const std::vector<std::string> names = hf_clip_names(23, false);
    const std::set<std::string> ldm = round_trip(NameMap(ModelFamily::SD2), ModelComponent::TextEncoder, names);
    EXPECT_EQ(ldm.size(), 2u + 23u * 12u + 2u);  // q/k/v fuse: 16 HF tensors per layer become 12
    EXPECT_EQ(ldm.count("cond_stage_model.model.transformer.resblocks.22.attn.in_proj_bias"), 1u);
}

TEST(NameMapText, SdxlBothEmbedders) {
    expect_pairs(ModelFamily::SDXL, ModelComponent::TextEncoder,
                 {
                     {"text_model.encoder.layers.0.self_attn.q_proj.weight",
                      "conditioner.embedders.0.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight"},
                     {"text_model.final_layer_norm.bias",
                      "conditioner.embedders.0.transformer.text_model.final_layer_norm.bias"},
                 });
    expect_pairs(
        ModelFamily::SDXL, ModelComponent::TextEncoder2,
        {
            {"text_model.embeddings.token_embedding.weight", "conditioner.embedders.1.model.token_embedding.weight"},
            {"text_model.embeddings.position_embedding.weight", "conditioner.embedders.1.model.positional_embedding"},
            {"text_model.encoder.layers.31.mlp.fc2.bias",
             "conditioner.embedders.1.model.transformer.resblocks.31.mlp.c_proj.bias"},
            {"text_model.final_layer_norm.weight", "conditioner.embedders.1.model.ln_final.weight"},
        });
    const std::optional<NameMapping> qkv = diffusers_to_ldm(ModelFamily::SDXL, ModelComponent::TextEncoder2,
                                                            "text_model.encoder.layers.31.self_attn.v_proj.bias");
    ASSERT_TRUE(qkv);
    EXPECT_EQ(qkv->name, "conditioner.embedders.1.model.transformer.resblocks.31.attn.in_proj_bias");
    EXPECT_EQ(qkv->op, Op::Concat3);
    EXPECT_EQ(qkv->part, 2);

    const std::optional<NameMapping> projection =
        diffusers_to_ldm(ModelFamily::SDXL, ModelComponent::TextEncoder2, "text_projection.weight");
    ASSERT_TRUE(projection);
    EXPECT_EQ(projection->name, "conditioner.embedders.1.model.text_projection");
    EXPECT_EQ(projection->op, Op::Transpose);

    const std::optional<DiffusersNames> d = ldm_to_diffusers(
        ModelFamily::SDXL, "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight");
    ASSERT_TRUE(d);
    EXPECT_EQ(d->component, ModelComponent::TextEncoder2);
    EXPECT_EQ(d->tensors.size(), 3u);
    // SD1/SD2 prefixes mean nothing in SDXL.
    EXPECT_FALSE(
        ldm_to_diffusers(ModelFamily::SDXL, "cond_stage_model.transformer.text_model.final_layer_norm.weight"));
    EXPECT_FALSE(ldm_to_diffusers(ModelFamily::SDXL, "conditioner.embedders.1.model.logit_scale"));
}

TEST(NameMapText, SdxlFullRoundTrip) {
    const NameMap map(ModelFamily::SDXL);
    const std::vector<std::string> clip_l = hf_clip_names(12, false);
    EXPECT_EQ(round_trip(map, ModelComponent::TextEncoder, clip_l).size(), clip_l.size());
    const std::vector<std::string> big_g = hf_clip_names(32, true);
    EXPECT_EQ(round_trip(map, ModelComponent::TextEncoder2, big_g).size(), 2u + 32u * 12u + 2u + 1u);
}

TEST(NameMap, Prefixes) {
    EXPECT_EQ(ldm_prefix(ModelFamily::SD1, ModelComponent::Unet), "model.diffusion_model.");
    EXPECT_EQ(ldm_prefix(ModelFamily::SDXL, ModelComponent::Vae), "first_stage_model.");
    EXPECT_EQ(ldm_prefix(ModelFamily::SD2, ModelComponent::TextEncoder), "cond_stage_model.model.");
    EXPECT_EQ(ldm_prefix(ModelFamily::SD2, ModelComponent::TextEncoder2), "");
    EXPECT_EQ(ldm_prefix(ModelFamily::SDXL, ModelComponent::TextEncoder2), "conditioner.embedders.1.model.");
    EXPECT_EQ(diffusers_folder(ModelComponent::TextEncoder2), "text_encoder_2");
    EXPECT_EQ(diffusers_folder(ModelComponent::Unet), "unet");
}

}  // namespace
}  // namespace kiln::io
