// Wan 2.2's VAE (TI2V-5B's: patchified 2x2, a shortcut across every level,
// 48 channels) against the PyTorch reference (training/reference/wan22_vae.py,
// transcribed from wan/modules/vae2_2.py) on the tiny fixture of
// training/make_wan22_vae_fixtures.py: one-frame encode and decode, a clip
// decoded whole and chunk by chunk through the causal history (the level
// outputs at the cut markers too), a clip encoded whole and chunk by chunk,
// and the configuration read from the weights.
#include <gtest/gtest.h>

#include "models/nets/wan_vae.h"
#include "wan_vae_golden.h"

namespace kiln {
namespace {

using test::kTolerance;

class Wan22VaeGolden : public test::WanVaeGoldenSuite {
  protected:
    Wan22VaeGolden() : WanVaeGoldenSuite("models/wan22_vae_tiny.safetensors", "models/wan22_vae_tiny_io.safetensors") {}
};

TEST_F(Wan22VaeGolden, ConfigurationIsReadFromTheWeights) {
    auto v = vae();
    const models::WanVaeConfig& c = v->config();
    EXPECT_TRUE(c.wan22);
    EXPECT_EQ(c.patch, 2);
    EXPECT_EQ(c.z_dim, 48);
    EXPECT_EQ(c.res_blocks, 2);
    EXPECT_EQ(c.temporal_downsample, (std::vector<bool>{false, true, true}));
    const models::AutoencoderFormat& f = v->format();
    EXPECT_EQ(f.latent_channels, 48);
    EXPECT_EQ(f.downscale, 16);
    EXPECT_EQ(f.temporal_downscale, 4);
    EXPECT_TRUE(f.has_encoder);
}

TEST_F(Wan22VaeGolden, OneFrameDecodeAndEncodeMatchTheReference) {
    auto v = vae();
    const auto image =
        run("z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode(ctx, in, nn::ComputeTarget::Cpu); });
    EXPECT_LT(test::relative_error(image, test::fixture_tensor(io, "decoded").values), kTolerance);
    const auto latent = run("image", [&](ggml_context* ctx, ggml_tensor* in) {
        return v->encode(ctx, in, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
    });
    EXPECT_LT(test::relative_error(latent, test::fixture_tensor(io, "encoded").values), kTolerance);
}

TEST_F(Wan22VaeGolden, ClipDecodedWholeAndChunkByChunkMatchesTheReference) {
    auto v = vae();
    const auto want = test::fixture_tensor(io, "clip.decoded");
    ASSERT_EQ(want.shape[0], 9);
    const auto whole = run(
        "clip.z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode_clip(ctx, in, nn::ComputeTarget::Cpu); },
        {"decoder.upsamples.0", "decoder.upsamples.1", "decoder.upsamples.2", "decoder.upsamples.3"});
    EXPECT_LT(test::relative_error(whole, want.values), kTolerance);
    EXPECT_LT(test::relative_error(decode_in_chunks(*v.vae, {1, 1, 1}), want.values), kTolerance);
    EXPECT_LT(test::relative_error(decode_in_chunks(*v.vae, {2, 1}), want.values), kTolerance);
}

TEST_F(Wan22VaeGolden, ClipEncodedWholeAndChunkByChunkMatchesTheReference) {
    auto v = vae();
    const auto want = test::fixture_tensor(io, "clip.encoded");
    const auto whole =
        run("clip.video",
            [&](ggml_context* ctx, ggml_tensor* in) {
                return v->encode_clip(ctx, in, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
            },
            {"encoder.downsamples.0", "encoder.downsamples.1", "encoder.downsamples.2", "encoder.downsamples.3"});
    EXPECT_LT(test::relative_error(whole, want.values), kTolerance);
    const auto chunked =
        run_in_chunks("clip.video", {1, 4, 4}, [&](ggml_context* ctx, ggml_tensor* in, const auto& history) {
            return v->encode_chunk(ctx, in, history, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
        });
    EXPECT_LT(test::relative_error(chunked, want.values), kTolerance);
}

}  // namespace
}  // namespace kiln
