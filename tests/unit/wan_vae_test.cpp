// Wan 2.1's VAE against the PyTorch reference (training/reference/wan_vae.py,
// transcribed from wan/modules/vae.py) on the tiny fixture of
// training/make_wan_vae_fixtures.py: one-frame encode and decode through the
// AutoencoderNetwork interface (block by block at the cut markers), a clip
// decoded whole and chunk by chunk through the causal history, a clip
// encoded whole, the configuration read from the weights, bad files refused
// with the tensor named, the CPU's banded decode against the whole one, and
// the full-size decode's compute memory on the CPU.
#include "models/nets/wan_vae.h"

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <iostream>
#include <optional>

#include "cpu_graph.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "golden.h"
#include "random_model.h"
#include "runtime/graph_session.h"
#include "runtime/module_weights.h"
#include "test_files.h"
#include "wan_vae_golden.h"

namespace kiln {
namespace {

using test::DeclaredVae;
using test::kTolerance;
using test::open_file;

class WanVaeGolden : public test::WanVaeGoldenSuite {
  protected:
    WanVaeGolden() : WanVaeGoldenSuite("models/wan_vae_tiny.safetensors", "models/wan_vae_tiny_io.safetensors") {}
};

TEST_F(WanVaeGolden, ConfigurationIsReadFromTheWeights) {
    auto v = vae();
    const models::WanVaeConfig& c = v->config();
    EXPECT_EQ(c.dim, 4);
    EXPECT_EQ(c.dim_mult, (std::vector<int64_t>{1, 2, 3, 4}));
    EXPECT_EQ(c.res_blocks, 2);
    EXPECT_EQ(c.temporal_downsample, (std::vector<bool>{false, true, true}));
    EXPECT_EQ(c.z_dim, 16);
    EXPECT_TRUE(c.has_encoder);
    EXPECT_EQ(c.temporal_downscale(), 4);
    EXPECT_EQ(v->format().latent_channels, 16);
    EXPECT_EQ(v->format().image_channels, 3);
    EXPECT_EQ(v->format().downscale, 8);
    EXPECT_TRUE(v->format().has_encoder);
}

TEST_F(WanVaeGolden, OneFrameEncodeMatchesReference) {
    auto v = vae();
    const auto mean = run("image",
                          [&](ggml_context* ctx, ggml_tensor* in) {
                              return v->encode(ctx, in, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
                          },
                          {"encoder.downsamples.2", "encoder.downsamples.5", "encoder.downsamples.8",
                           "encoder.downsamples.10", "encoder.middle"});
    EXPECT_LT(test::relative_error(mean, test::fixture_tensor(io, "encoded").values), kTolerance);
    const auto moments = run("image", [&](ggml_context* ctx, ggml_tensor* in) {
        return v->encode(ctx, in, nn::ComputeTarget::Cpu, models::LatentEncoding::Moments);
    });
    ASSERT_EQ(moments.size(), 2 * mean.size());
    // Per batch item: 16 channels of the mean, then 16 of the log variance.
    const size_t item = mean.size() / 2;
    std::vector<float> moment_mean, log_var;
    for (size_t b = 0; b < 2; ++b) {
        const auto first = moments.begin() + static_cast<long>(2 * b * item);
        moment_mean.insert(moment_mean.end(), first, first + static_cast<long>(item));
        log_var.insert(log_var.end(), first + static_cast<long>(item), first + static_cast<long>(2 * item));
    }
    EXPECT_EQ(moment_mean, mean);
    EXPECT_LT(test::relative_error(log_var, test::fixture_tensor(io, "encoded.log_var").values), kTolerance);
}

TEST_F(WanVaeGolden, OneFrameDecodeMatchesReference) {
    auto v = vae();
    const auto image =
        run("z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode(ctx, in, nn::ComputeTarget::Cpu); },
            {"decoder.middle", "decoder.upsamples.3", "decoder.upsamples.7", "decoder.upsamples.11",
             "decoder.upsamples.14"});
    EXPECT_LT(test::relative_error(image, test::fixture_tensor(io, "decoded").values), kTolerance);
}

TEST_F(WanVaeGolden, ClipDecodedWholeMatchesTheReferenceChunkedDecode) {
    auto v = vae();
    const auto frames = run(
        "clip.z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode_clip(ctx, in, nn::ComputeTarget::Cpu); });
    const auto want = test::fixture_tensor(io, "clip.decoded");
    ASSERT_EQ(want.shape[0], 9);
    EXPECT_LT(test::relative_error(frames, want.values), kTolerance);
}

TEST_F(WanVaeGolden, ClipDecodedChunkByChunkMatchesTheReference) {
    auto v = vae();
    const auto want = test::fixture_tensor(io, "clip.decoded").values;
    // One latent frame a chunk, as the original decodes; then uneven chunks.
    EXPECT_LT(test::relative_error(decode_in_chunks(*v.vae, {1, 1, 1}), want), kTolerance);
    EXPECT_LT(test::relative_error(decode_in_chunks(*v.vae, {2, 1}), want), kTolerance);
}

TEST_F(WanVaeGolden, ClipEncodeMatchesReference) {
    auto v = vae();
    const auto latent = run("clip.video", [&](ggml_context* ctx, ggml_tensor* in) {
        return v->encode_clip(ctx, in, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
    });
    EXPECT_LT(test::relative_error(latent, test::fixture_tensor(io, "clip.encoded").values), kTolerance);
}

// The original's encode loop: the first frame, then four at a time, each
// chunk with the history the one before left: the whole clip's latent.
TEST_F(WanVaeGolden, ClipEncodedChunkByChunkMatchesTheReference) {
    auto v = vae();
    const auto want = test::fixture_tensor(io, "clip.encoded");
    const int64_t frames = test::fixture_tensor(io, "clip.video").shape[0];
    std::vector<int64_t> sizes = {1};
    while (1 + 4 * static_cast<int64_t>(sizes.size()) <= frames) sizes.push_back(4);
    ASSERT_GE(sizes.size(), 3u) << "a clip of at least two later chunks";
    const auto latent =
        run_in_chunks("clip.video", sizes, [&](ggml_context* ctx, ggml_tensor* in, const auto& history) {
            return v->encode_chunk(ctx, in, history, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
        });
    EXPECT_LT(test::relative_error(latent, want.values), kTolerance);
    // A later chunk is four frames, no other count.
    runtime::GraphSession session;
    ggml_tensor* one = ggml_new_tensor_4d(session.ctx(), GGML_TYPE_F32, 24, 16, 3, 1);
    ggml_tensor* three = ggml_new_tensor_4d(session.ctx(), GGML_TYPE_F32, 24, 16, 3, 3);
    const models::ClipChunk start =
        v->encode_chunk(session.ctx(), one, {}, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
    ASSERT_NE(start.frames, nullptr);
    EXPECT_EQ(v->encode_chunk(session.ctx(), three, start.history, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean)
                  .frames,
              nullptr);
}

TEST_F(WanVaeGolden, HistoryOfAnotherSizeIsRefused) {
    auto v = vae();
    // Graphs built, never run.
    runtime::GraphSession session;
    ggml_context* ctx = session.ctx();
    ggml_tensor* latent = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 3, 2, 16, 1);
    const models::ClipChunk chunk = v->decode_chunk(ctx, latent, {}, nn::ComputeTarget::Cpu);
    ASSERT_NE(chunk.frames, nullptr);
    ASSERT_FALSE(chunk.history.empty());
    std::vector<ggml_tensor*> history;
    for (const ggml_tensor* t : chunk.history) history.push_back(ggml_new_tensor(ctx, GGML_TYPE_F32, 4, t->ne));
    EXPECT_NE(v->decode_chunk(ctx, latent, history, nn::ComputeTarget::Cpu).frames, nullptr);
    ggml_tensor* wider = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 4, 2, 16, 1);  // not the size the history is for
    EXPECT_EQ(v->decode_chunk(ctx, wider, history, nn::ComputeTarget::Cpu).frames, nullptr);
    history.push_back(history.back());  // one more than the chunk leaves
    EXPECT_EQ(v->decode_chunk(ctx, latent, history, nn::ComputeTarget::Cpu).frames, nullptr);
    history.resize(history.size() - 2);  // one fewer
    EXPECT_EQ(v->decode_chunk(ctx, latent, history, nn::ComputeTarget::Cpu).frames, nullptr);
}

// The fixture's weights less `dropped` (and with `reshaped` given another
// shape), as a file of its own.
std::string altered_copy(const test::TempDir& dir, const std::string& dropped, const std::string& reshaped = "") {
    const io::ModelFile file = open_file(test::golden_path("models/wan_vae_tiny.safetensors"));
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : file.tensors()) {
        if (t.name == dropped) continue;
        test::SafetensorsEntry e = test::copy_entry(file, t, t.name);
        if (t.name == reshaped) e.shape = {e.shape[0] * e.shape[1], 1, e.shape[2], e.shape[3], e.shape[4]};
        entries.push_back(std::move(e));
    }
    return dir.write("wan_vae.safetensors", test::build_safetensors(entries));
}

TEST(WanVae, AMissingTensorIsNamed) {
    test::TempDir dir;
    const io::ModelFile file = open_file(altered_copy(dir, "decoder.upsamples.5.residual.6.bias"));
    runtime::ModuleWeights weights(file, "", GGML_TYPE_F32);
    auto vae = models::WanVae::create(weights);
    ASSERT_TRUE(vae.ok()) << vae.error().message;
    // One problem, the missing tensor by name.
    EXPECT_EQ(weights.declaration_status().error().message, "missing tensor 'decoder.upsamples.5.residual.6.bias'");
}

TEST(WanVae, AWrongShapeIsNamed) {
    test::TempDir dir;
    const io::ModelFile file = open_file(altered_copy(dir, "", "encoder.head.2.weight"));
    runtime::ModuleWeights weights(file, "", GGML_TYPE_F32);
    ASSERT_TRUE(models::WanVae::create(weights).ok());
    const std::string message = weights.declaration_status().error().message;
    EXPECT_EQ(message.find("tensor 'encoder.head.2.weight' has shape"), 0u) << message;
    EXPECT_EQ(message.find("more problems"), std::string::npos) << message;
}

TEST(WanVae, AFileWithoutTheTensorsTheLayoutIsReadFromIsRefused) {
    test::TempDir dir;
    {
        const io::ModelFile file = open_file(altered_copy(dir, "decoder.conv1.weight"));
        runtime::ModuleWeights weights(file, "", GGML_TYPE_F32);
        auto refused = models::WanVae::create(weights);
        ASSERT_FALSE(refused.ok());
        EXPECT_EQ(refused.error().kind, ErrorKind::BadFile);
        EXPECT_NE(refused.error().message.find("decoder.conv1.weight"), std::string::npos) << refused.error().message;
    }
    {
        // The decoder's first upsampler loses its time_conv: the encoder's
        // last downsampler still has one.
        const io::ModelFile file = open_file(altered_copy(dir, "decoder.upsamples.3.time_conv.weight"));
        runtime::ModuleWeights weights(file, "", GGML_TYPE_F32);
        auto refused = models::WanVae::create(weights);
        ASSERT_FALSE(refused.ok());
        EXPECT_NE(refused.error().message.find("encoder.downsamples.8.time_conv"), std::string::npos)
            << refused.error().message;
    }
}

// The compute memory of a one-frame decode of a w x h latent on the CPU
// target, measured as the planner measures a graph (runtime/executor.cpp):
// ggml-alloc's measure, with the weights and the latent placed outside the
// compute buffer (a placeholder buffer marks them).
size_t decode_compute_bytes(const models::WanVae& vae, int64_t w, int64_t h,
                            nn::ComputeTarget target = nn::ComputeTarget::Cpu) {
    runtime::GraphSession session;
    std::vector<float> zeros(static_cast<size_t>(w * h * 16));
    ggml_tensor* latent = session.input(GGML_TYPE_F32, {w, h, 16, 1}, zeros.data());
    return test::planned_compute_bytes(session.graph(vae.decode(session.ctx(), latent, target)));
}

// Qwen-Image's VAE at full size (tests/fixtures/qwen_image_vae.spec, a
// sparse file: shapes only, nothing read) decodes 1024x1024 in under 1.5 GiB
// of compute on the CPU (issue 26's goal, SD's VAE's figure). As one graph it
// took 1.5 GiB exactly: a 1 GiB block of attention scores (16384 tokens), and
// the top level's normalised inputs, each 384 MiB, beside its activations.
// Measured (2026-12-06): 1024x1024 1.50 GiB -> 874 MiB, 512x512 397 MiB ->
// 301 MiB.
TEST(WanVae, FullSizeDecodeFitsUnderOneAndAHalfGiBOnTheCpu) {
    test::TempDir dir;
    const std::string path = dir.file("qwen_image_vae.safetensors");
    ASSERT_TRUE(test::write_sparse_model(std::string(KILN_FIXTURES_DIR) + "/qwen_image_vae.spec", path).ok());
    const io::ModelFile file = open_file(path);
    runtime::ModuleWeights weights(file, "", std::nullopt);
    auto vae = models::WanVae::create(weights);
    ASSERT_TRUE(vae.ok()) << vae.error().message;
    ASSERT_EQ((*vae)->config().dim, 96);
    const size_t full = decode_compute_bytes(**vae, 128, 128);
    std::cout << "Wan VAE decode compute on the CPU: 1024x1024 " << full << " bytes, 512x512 "
              << decode_compute_bytes(**vae, 64, 64) << " bytes\n";
    EXPECT_LT(full, size_t{3} << 29);  // 1.5 GiB
}

// The same on the device target (a GPU's graph: ggml's own ops, measured
// here with the CPU's buffer type, as the planner measures it for a device
// of the same alignment). Whole, the top upsampler's patches alone were
// 6.75 GiB; in bands of rows (nn/layers.h's banded device convolution, each
// band's RMS norm and upsample made for its own rows). Measured
// (2026-12-06): 1024x1024 8.07 GiB -> 1.13 GiB, 512x512 283 MiB.
TEST(WanVae, FullSizeDecodeFitsUnderOneAndAHalfGiBOnADevice) {
    test::TempDir dir;
    const std::string path = dir.file("qwen_image_vae.safetensors");
    ASSERT_TRUE(test::write_sparse_model(std::string(KILN_FIXTURES_DIR) + "/qwen_image_vae.spec", path).ok());
    const io::ModelFile file = open_file(path);
    runtime::ModuleWeights weights(file, "", std::nullopt);
    auto vae = models::WanVae::create(weights);
    ASSERT_TRUE(vae.ok()) << vae.error().message;
    const size_t full = decode_compute_bytes(**vae, 128, 128, nn::ComputeTarget::Device);
    std::cout << "Wan VAE decode compute on a device: 1024x1024 " << full << " bytes, 512x512 "
              << decode_compute_bytes(**vae, 64, 64, nn::ComputeTarget::Device) << " bytes\n";
    EXPECT_LT(full, size_t{3} << 29);  // 1.5 GiB
}

// The banded forms (the RMS norm folded into each band's unfold, the
// upsamplers folded into theirs) give the whole graph's numbers: with bands
// of one row the tiny fixture goes through them everywhere.
TEST_F(WanVaeGolden, OneFrameDecodeInBandsIsTheWholeDecode) {
    auto v = vae();
    const auto whole =
        run("z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode(ctx, in, nn::ComputeTarget::Cpu); });
    const auto banded =
        run("z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode(ctx, in, nn::ComputeTarget::Cpu, 1); });
    EXPECT_EQ(banded, whole);
    EXPECT_LT(test::relative_error(banded, test::fixture_tensor(io, "decoded").values), kTolerance);
}

// A clip's chunk too: with bands of one row every temporal slice's
// convolution goes a band at a time, each added into the sum in place.
TEST_F(WanVaeGolden, ClipDecodeInBandsIsTheWholeDecode) {
    auto v = vae();
    const auto chunk = [&](int64_t max_patch_bytes) {
        return [&, max_patch_bytes](ggml_context* ctx, ggml_tensor* in) {
            return v->decode_chunk(ctx, in, {}, nn::ComputeTarget::Cpu, max_patch_bytes).frames;
        };
    };
    const auto whole = run("clip.z", chunk(models::WanVae::kMaxPatchBytes));
    const auto banded = run("clip.z", chunk(1));
    ASSERT_EQ(banded.size(), whole.size());
    EXPECT_LT(test::relative_error(banded, whole), 1e-6);
    EXPECT_LT(test::relative_error(banded, test::fixture_tensor(io, "clip.decoded").values), kTolerance);
}

// On the device target too (its graph computed here on the CPU): bands of
// one row, the RMS norm made a band at a time and each upsampler's rows
// upsampled a band at a time, give the whole graph's numbers.
TEST_F(WanVaeGolden, OneFrameDecodeInBandsIsTheWholeDecodeOnADevice) {
    auto v = vae();
    const auto whole =
        run("z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode(ctx, in, nn::ComputeTarget::Device); });
    const auto banded =
        run("z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode(ctx, in, nn::ComputeTarget::Device, 1); });
    EXPECT_EQ(banded, whole);
    EXPECT_LT(test::relative_error(banded, test::fixture_tensor(io, "decoded").values), kTolerance);
}

TEST(WanVae, AnSdVaeIsRefused) {
    const io::ModelFile file = open_file(test::golden_path("pipeline/flux_tiny/ae.safetensors"));
    runtime::ModuleWeights weights(file, "", GGML_TYPE_F32);
    auto refused = models::WanVae::create(weights);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("no decoder.conv1.weight"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace kiln
