// FLUX.2's autoencoder against the PyTorch reference
// (training/reference/flux2.py, written from BFL's flux2 autoencoder.py) on
// the tiny fixtures of training/make_flux2_fixtures.py: the encode to the
// normalised 128-channel latent and the decode back, for the full autoencoder
// and the small-decoder layout (a narrower decoder than its encoder).
#include "models/nets/flux2_vae.h"

#include <gtest/gtest.h>

#include "declared_network.h"
#include "golden.h"
#include "runtime/graph_session.h"

namespace kiln {
namespace {

constexpr double kTolerance = 1e-4;

io::ModelFile open_file(const std::string& name) {
    auto file = io::ModelFile::open({test::golden_path("models/" + name)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

class Flux2VaeGolden : public ::testing::TestWithParam<std::string> {
  protected:
    io::ModelFile weights = open_file(GetParam() + ".safetensors");
    io::ModelFile io = open_file(GetParam() + "_io.safetensors");
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    test::DeclaredNetwork<models::Flux2Vae> vae() {
        auto v = test::declare_network<models::Flux2Vae>(weights, "", GGML_TYPE_F32);
        if (!v.ok()) throw std::runtime_error(v.error().message);
        auto status = v->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(v).value();
    }

    // Runs `build` on the fixture's `input`; returns its output.
    template <class Build>
    std::vector<float> run(const std::string& input, Build build) {
        runtime::GraphSession session;
        const auto v = test::fixture_tensor(io, input);
        ggml_tensor* in = session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
        ggml_tensor* out = build(session.ctx(), in);
        EXPECT_TRUE(session.run(*compute, out).ok());
        return runtime::GraphSession::read(out);
    }
};

TEST_P(Flux2VaeGolden, FormatIsTheNormalisedPatchLatent) {
    auto v = vae();
    EXPECT_EQ(v->format().latent_channels, 128);
    EXPECT_EQ(v->format().downscale, 4);  // the tiny KL autoencoder's 2, times the 2x2 patches
    EXPECT_TRUE(v->format().has_encoder);
    EXPECT_EQ(v->kl().config().latent_channels, 32);
}

TEST_P(Flux2VaeGolden, EncodeMatchesReference) {
    auto v = vae();
    const auto mean = run("image", [&](ggml_context* ctx, ggml_tensor* in) {
        return v->encode(ctx, in, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
    });
    EXPECT_LT(test::relative_error(mean, test::fixture_tensor(io, "encoded").values), kTolerance);
    // The moments' mean half is the same latent.
    const auto moments = run("image", [&](ggml_context* ctx, ggml_tensor* in) {
        return v->encode(ctx, in, nn::ComputeTarget::Cpu, models::LatentEncoding::Moments);
    });
    ASSERT_EQ(moments.size(), 2 * mean.size());
    EXPECT_EQ(std::vector<float>(moments.begin(), moments.begin() + static_cast<long>(mean.size())), mean);
}

TEST_P(Flux2VaeGolden, DecodeMatchesReference) {
    auto v = vae();
    const auto image =
        run("z", [&](ggml_context* ctx, ggml_tensor* in) { return v->decode(ctx, in, nn::ComputeTarget::Cpu); });
    EXPECT_LT(test::relative_error(image, test::fixture_tensor(io, "decoded").values), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Flux2Vae, Flux2VaeGolden, ::testing::Values("flux2_ae_tiny", "flux2_ae_small_decoder_tiny"));

TEST(Flux2Vae, AFluxOneAutoencoderIsRefused) {
    auto opened = io::ModelFile::open({test::golden_path("pipeline/flux_tiny/ae.safetensors")});
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    const io::ModelFile& flux1 = *opened;
    auto refused = test::declare_network<models::Flux2Vae>(flux1, "", std::nullopt);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::BadFile);
    EXPECT_NE(refused.error().message.find("no bn.running_mean"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace kiln
