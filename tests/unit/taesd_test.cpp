// The tiny autoencoder's decoder (models/nets/taesd) against the PyTorch
// reference written from madebyollin's taesd.py (training/reference/taesd.py,
// fixtures by training/make_taesd_fixtures.py): a TAESD-shaped decoder in
// madebyollin's names and a TAEF1-shaped one (16 latent channels) in
// diffusers' AutoencoderTiny names, each configured from its weights.
#include "models/nets/taesd.h"

#include <gtest/gtest.h>

#include <fstream>

#include "declared_network.h"
#include "golden.h"
#include "runtime/graph_session.h"

namespace kiln {
namespace {

using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr double kTolerance = 1e-4;

io::ModelFile open_fixture(const std::string& name) {
    auto file = io::ModelFile::open({golden_path("models/" + name + ".safetensors")});
    EXPECT_TRUE(file.ok()) << name << ": " << file.error().message;
    return std::move(file).value();
}

// Decodes `prefix`.latent of the io fixture with `file`'s decoder and
// compares with `prefix`.decoded.
void expect_matches_reference(const io::ModelFile& file, const std::string& prefix) {
    auto taesd = test::declare_network<models::Taesd>(file, "", GGML_TYPE_F32);
    ASSERT_TRUE(taesd.ok()) << taesd.error().message;
    auto compute = test::golden_cpu();
    ASSERT_TRUE(taesd->weights().load(compute->weights_backend()).ok());
    io::ModelFile io = open_fixture("taesd_tiny_io");
    const auto latent = fixture_tensor(io, prefix + ".latent");
    const auto expected = fixture_tensor(io, prefix + ".decoded");
    runtime::GraphSession session;
    ggml_tensor* out = (*taesd)->build_decoder(
        session.ctx(), session.input(GGML_TYPE_F32, test::ggml_ne(latent.shape), latent.values.data()));
    ASSERT_TRUE(session.run(*compute, out, true).ok());
    EXPECT_EQ(std::vector<int64_t>(out->ne, out->ne + 4), test::ggml_ne(expected.shape));
    EXPECT_LT(relative_error(runtime::GraphSession::read(out), expected.values), kTolerance);
}

TEST(Taesd, MadebyollinNamesConfiguredFromWeightsMatchReference) {
    io::ModelFile file = open_fixture("taesd_tiny");
    auto taesd = test::declare_network<models::Taesd>(file, "", GGML_TYPE_F32);
    ASSERT_TRUE(taesd.ok()) << taesd.error().message;
    const models::TaesdConfig& c = (*taesd)->config();
    EXPECT_EQ(c.latent_channels, 4);
    EXPECT_EQ(c.channels, 8);
    EXPECT_EQ(c.blocks_per_stage, (std::vector<int>{3, 3, 3, 1}));
    EXPECT_EQ(c.upscale(), 8);
    expect_matches_reference(file, "taesd");
}

TEST(Taesd, DiffusersNamesWithSixteenChannelsMatchReference) {
    io::ModelFile file = open_fixture("taef1_tiny");
    auto taesd = test::declare_network<models::Taesd>(file, "", GGML_TYPE_F32);
    ASSERT_TRUE(taesd.ok()) << taesd.error().message;
    EXPECT_EQ((*taesd)->config().latent_channels, 16);
    EXPECT_EQ((*taesd)->config().blocks_per_stage, (std::vector<int>{2, 1, 1, 1}));
    expect_matches_reference(file, "taef1");
}

TEST(Taesd, FilesThatAreNoDecoderAreRefusedByName) {
    // A VAE is not a tiny autoencoder.
    io::ModelFile vae = open_fixture("sd1_tiny");
    auto refused = test::declare_network<models::Taesd>(vae, "", GGML_TYPE_F32);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("no tiny autoencoder decoder"), std::string::npos)
        << refused.error().message;

    // The decoder without its last convolution (layer 19).
    io::ModelFile full = open_fixture("taesd_tiny");
    std::vector<test::SafetensorsEntry> kept;
    for (const io::TensorInfo& t : full.tensors()) {
        if (t.name.rfind("19.", 0) != 0) kept.push_back(test::copy_entry(full, t, t.name));
    }
    test::TempDir dir;
    const std::string path = dir.file("cut.safetensors");
    const std::vector<uint8_t> bytes = test::build_safetensors(kept);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    auto cut = io::ModelFile::open({path});
    ASSERT_TRUE(cut.ok()) << cut.error().message;
    auto truncated = test::declare_network<models::Taesd>(*cut, "", GGML_TYPE_F32);
    ASSERT_FALSE(truncated.ok());
    EXPECT_NE(truncated.error().message.find("tiny autoencoder: no layer 20"), std::string::npos)
        << truncated.error().message;
}

}  // namespace
}  // namespace kiln
