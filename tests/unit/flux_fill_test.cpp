// Flux.1-Fill-dev on the tiny Flux parts: detected from its img_in's width,
// its defaults, and an inpainting job (-i, --mask, --strength 1) against
// training/make_flux_fill_fixtures.py, which builds the DiT's image tokens as
// BFL's prepare_fill does (the packed latent joined with the packed
// masked-image latent and the packed pixel mask) and samples with BFL's Euler
// steps in float64; then the bad input: reference images, a DiT that takes
// a control image (Canny, Depth), and a VAE whose downscale is not the mask's.
#include <gtest/gtest.h>

#include "flux_tiny.h"
#include "golden.h"
#include "pipeline/generate.h"
#include "test_files.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_image;
using test::golden_path;

Result<std::unique_ptr<Model>> load(const ModelPaths& paths) {
    ModelOptions options;
    options.weight_type = GGML_TYPE_F32;  // the reference computes with the stored weights widened
    options.threads = 1;
    return Model::load(paths, options);
}

class FluxFill : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto loaded = load(test::flux_tiny_parts("fill_dit.safetensors"));
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        io_ = new io::ModelFile(io::ModelFile::open({golden_path("pipeline/flux_tiny_fill.safetensors")}).value());
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
    }
    static GenerationRequest job() {
        GenerationRequest r;
        r.prompt = io_->metadata_string("prompt", "");
        r.width = r.height = 32;
        r.seed = 11;
        r.steps = 4;
        r.init_image = fixture_image(*io_, "init_pixels");
        r.mask = fixture_image(*io_, "mask_pixels");
        r.strength = 1.0f;  // BFL's Fill starts from noise
        return r;
    }
    static Model* model_;
    static io::ModelFile* io_;
};
Model* FluxFill::model_ = nullptr;
io::ModelFile* FluxFill::io_ = nullptr;

TEST_F(FluxFill, IsDetectedWithItsDefaults) {
    ASSERT_NE(model_, nullptr);
    EXPECT_EQ(model_->family_label(), "Flux.1-Fill-dev");
    EXPECT_FLOAT_EQ(model_->defaults().guidance, 30.0f);
    const models::DiffusionCapabilities& can = model_->diffusion().capabilities();
    EXPECT_EQ(can.in_channels, 16 + 16 + 4);  // the tiny autoencoder's 2x2 mask pixels
    EXPECT_EQ(can.out_channels, 16);
    EXPECT_EQ(can.concat, models::LatentConcat::MaskedImageThenPixelMask);
    EXPECT_FALSE(can.reference_images);
}

TEST_F(FluxFill, InpaintingMatchesBflsPrepareFill) {
    ASSERT_NE(model_, nullptr);
    auto images = generate(*model_, job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io_), 1) << "largest pixel difference";
    // The mask matters: without it (sd-cli's "repaint everything": masked
    // image 0, mask 1) the image is another.
    GenerationRequest unmasked = job();
    unmasked.mask.reset();
    auto other = generate(*model_, unmasked);
    ASSERT_TRUE(other.ok()) << other.error().message;
    EXPECT_GT(difference_from_reference(other->front().image, *io_), 8);
}

TEST_F(FluxFill, RefusesReferenceImages) {
    ASSERT_NE(model_, nullptr);
    GenerationRequest r = job();
    r.ref_images.push_back(image::make_image(32, 32, 3));
    auto refused = generate(*model_, r);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(refused.error().message.find("takes no reference images"), std::string::npos) << refused.error().message;
}

// The Fill DiT with img_in taking `features` inputs, written to `dir`.
std::string dit_taking(test::TempDir& dir, int64_t features) {
    return dir.write("dit.safetensors",
                     test::with_tensor_shape(test::flux_tiny_part("fill_dit.safetensors"), "img_in.weight",
                                             {64, features}, {{"kiln.flux.axes_dim", "8,12,12"}}));
}

TEST(FluxFillFiles, ControlModelsAndMismatchedVaesAreRefused) {
    test::TempDir dir;
    ModelPaths paths = test::flux_tiny_parts("fill_dit.safetensors");
    // Canny and Depth: the latent and a control image's latent, 2 x 64 features.
    paths.diffusion_model = dit_taking(dir, 128);
    auto canny = load(paths);
    ASSERT_FALSE(canny.ok());
    EXPECT_EQ(canny.error().kind, ErrorKind::BadFile);
    EXPECT_NE(canny.error().message.find("img_in takes 128 features for 16 latent channels; kiln runs Flux.1 (64) "
                                         "and Flux.1-Fill (384), not the Canny or Depth models (128)"),
              std::string::npos)
        << canny.error().message;
    // BFL's 8x8 mask planes (384 features) with the tiny 2x autoencoder.
    paths.diffusion_model = dit_taking(dir, 384);
    auto mismatched = load(paths);
    ASSERT_FALSE(mismatched.ok());
    EXPECT_NE(mismatched.error().message.find("takes 64 mask planes per latent pixel, but the VAE downscales 2x (4 "
                                              "pixels)"),
              std::string::npos)
        << mismatched.error().message;
}

}  // namespace
}  // namespace kiln::pipeline
