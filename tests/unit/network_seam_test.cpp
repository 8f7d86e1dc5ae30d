// The seam of models/network.h: every network kind has its registry line,
// the registry's networks fill the role interfaces, and the conditioner's
// two ways of joining encoders.
#include <gtest/gtest.h>

#include "golden.h"
#include "models/nets/registry.h"
#include "pipeline/conditioner.h"
#include "runtime/module_weights.h"

namespace kiln {
namespace {

TEST(NetworkRegistry, EveryKindHasItsOwnLine) {
    for (models::NetworkKind kind :
         {models::NetworkKind::ClipText, models::NetworkKind::Unet, models::NetworkKind::Vae, models::NetworkKind::T5,
          models::NetworkKind::FluxDit, models::NetworkKind::Llm, models::NetworkKind::ZImageDit,
          models::NetworkKind::ControlNet, models::NetworkKind::Taesd, models::NetworkKind::Flux2Dit,
          models::NetworkKind::Flux2Vae}) {
        const models::NetworkEntry& entry = models::network_entry(kind);
        EXPECT_EQ(entry.kind, kind) << static_cast<int>(kind);
        EXPECT_FALSE(entry.probes.empty()) << static_cast<int>(kind);
        EXPECT_NE(entry.create, nullptr) << static_cast<int>(kind);
    }
}

// The tiny SD1 checkpoint through the registry: the UNet is a diffusion
// network that states its capabilities, the CLIP a text encoder, the VAE
// neither; and a network refuses tensors that are not its own.
TEST(NetworkRegistry, NetworksStateTheirRolesAndCapabilities) {
    auto opened = io::ModelFile::open({test::golden_path("models/sd1_tiny.safetensors")});
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    const io::ModelFile& file = *opened;
    runtime::ModuleWeights unet_weights(file, "model.diffusion_model.", std::nullopt);
    auto unet = models::network_entry(models::NetworkKind::Unet).create(unet_weights, {});
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    const models::DiffusionNetwork* diffusion = (*unet)->as_diffusion();
    ASSERT_NE(diffusion, nullptr);
    EXPECT_EQ((*unet)->as_text_encoder(), nullptr);
    const models::DiffusionCapabilities& can = diffusion->capabilities();
    EXPECT_STREQ(can.label, "UNet");
    EXPECT_EQ(can.in_channels, 4);
    EXPECT_EQ(can.out_channels, 4);
    EXPECT_TRUE(can.control_residuals);
    EXPECT_FALSE(can.guidance);
    EXPECT_FALSE(can.skip_layers);
    EXPECT_TRUE(diffusion->unet_layout().has_value());

    runtime::ModuleWeights clip_weights(file, "cond_stage_model.transformer.", std::nullopt);
    auto clip = models::network_entry(models::NetworkKind::ClipText).create(clip_weights, {});
    ASSERT_TRUE(clip.ok()) << clip.error().message;
    const models::TextEncoderNetwork* encoder = (*clip)->as_text_encoder();
    ASSERT_NE(encoder, nullptr);
    EXPECT_EQ(encoder->width(), can.context_width);
    EXPECT_EQ(encoder->max_length(), 77);
    EXPECT_EQ((*clip)->as_diffusion(), nullptr);

    // The UNet checks itself against what the encoders and the VAE make.
    models::ConditioningShape shape;
    shape.family = shape.family_label = "SD1.x";
    shape.encoders.push_back({"clip_l", encoder->label(), encoder->width(), encoder->pooled_width(), true, false});
    shape.latent_channels = 4;
    EXPECT_TRUE(diffusion->check_conditioning(shape).ok());
    shape.latent_channels = 16;
    const Status wrong_vae = diffusion->check_conditioning(shape);
    ASSERT_FALSE(wrong_vae.ok());
    EXPECT_NE(wrong_vae.error().message.find("VAE's latent channels (16)"), std::string::npos);

    runtime::ModuleWeights not_a_dit(file, "model.diffusion_model.", std::nullopt);
    EXPECT_FALSE(models::network_entry(models::NetworkKind::FluxDit).create(not_a_dit, {}).ok());
}

TEST(ConditioningJoin, SideBySideAlongTheWidth) {
    std::vector<pipeline::EncoderStates> states = {{{1, 2, 3, 4}, 2, 2}, {{5, 6, 7, 8, 9, 10}, 3, 2}};
    pipeline::Conditioning c;
    pipeline::join_encoder_states(states, 0, c);
    EXPECT_EQ(c.width, 5);
    EXPECT_EQ(c.tokens, 2);
    EXPECT_EQ(c.hidden, (std::vector<float>{1, 2, 5, 6, 7, 3, 4, 8, 9, 10}));
}

// Groups one after the other along the tokens, each row zero-padded to the
// widest (or the context width); a width-0 member is zero rows (an absent
// encoder).
TEST(ConditioningJoin, GroupsOneAfterTheOtherAlongTheTokens) {
    std::vector<pipeline::EncoderStates> states = {{{5, 6, 7}, 3, 1, 1}, {{1, 2, 3, 4}, 2, 2, 0}};
    pipeline::Conditioning c;
    pipeline::join_encoder_states(states, 0, c);
    EXPECT_EQ(c.width, 3);
    EXPECT_EQ(c.tokens, 3);
    EXPECT_EQ(c.hidden, (std::vector<float>{1, 2, 0, 3, 4, 0, 5, 6, 7}));

    std::vector<pipeline::EncoderStates> absent = {{{1, 2}, 1, 2, 0}, {{}, 0, 2, 1}};
    pipeline::join_encoder_states(absent, 2, c);
    EXPECT_EQ(c.width, 2);
    EXPECT_EQ(c.tokens, 4);
    EXPECT_EQ(c.hidden, (std::vector<float>{1, 0, 2, 0, 0, 0, 0, 0}));
}

// Side-by-side members of different lengths: the group is as long as the
// longest, the shorter member's missing rows zero.
TEST(ConditioningJoin, AGroupIsAsLongAsItsLongestMember) {
    std::vector<pipeline::EncoderStates> states = {{{1, 2}, 1, 2, 0}, {{3, 4, 5}, 1, 3, 0}, {{6}, 1, 1, 1}};
    pipeline::Conditioning c;
    pipeline::join_encoder_states(states, 0, c);
    EXPECT_EQ(c.width, 2);
    EXPECT_EQ(c.tokens, 4);
    EXPECT_EQ(c.hidden, (std::vector<float>{1, 3, 2, 4, 0, 5, 6, 0}));
}

TEST(ConditioningJoin, OneEncoderIsTakenAsItIs) {
    std::vector<pipeline::EncoderStates> states = {{{1, 2, 3, 4, 5, 6}, 3, 2}};
    pipeline::Conditioning c;
    pipeline::join_encoder_states(states, 3, c);
    EXPECT_EQ(c.width, 3);
    EXPECT_EQ(c.tokens, 2);
    EXPECT_EQ(c.hidden, (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace kiln
