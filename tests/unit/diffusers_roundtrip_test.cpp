// A single-file checkpoint rewritten as a diffusers folder (with the name map
// run backwards, q/k/v split, VAE attention weights reshaped) must load to the
// same model and make the same image: the diffusers path end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "golden.h"
#include "io/name_map.h"
#include "pipeline/generate.h"
#include "pixel_difference.h"
#include "test_files.h"

namespace kiln {
namespace {

const char* st_dtype(io::DType d) { return d == io::DType::F16 ? "F16" : d == io::DType::F32 ? "F32" : "I64"; }

// Writes `file` (an SD2 tiny checkpoint) as a diffusers folder under `root`.
void write_diffusers(const io::ModelFile& file, const io::UnetLayout& layout, const test::TempDir& dir,
                     const std::string& root) {
    const io::NameMap map(io::ModelFamily::SD2, layout);
    std::map<std::string, std::vector<test::SafetensorsEntry>> components;
    for (const io::TensorInfo& t : file.tensors()) {
        auto names = map.ldm_to_diffusers(t.name);
        if (!names) continue;  // extras such as logit_scale
        const uint8_t* data = file.data(t);
        for (const io::NameMapping& m : names->tensors) {
            test::SafetensorsEntry e;
            e.name = m.name;
            e.dtype = st_dtype(t.dtype);
            e.shape = t.shape;
            if (m.op == io::NameMapping::Op::Slice3) {
                e.shape[0] /= 3;
                const size_t bytes = t.nbytes / 3;
                e.data.assign(data + bytes * static_cast<size_t>(m.part),
                              data + bytes * static_cast<size_t>(m.part + 1));
            } else if (m.op == io::NameMapping::Op::Transpose) {
                const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
                const size_t es = t.nbytes / (rows * cols);
                e.shape = {t.shape[1], t.shape[0]};
                e.data.resize(t.nbytes);
                for (size_t r = 0; r < rows; ++r) {
                    for (size_t c = 0; c < cols; ++c)
                        std::memcpy(&e.data[(c * rows + r) * es], data + (r * cols + c) * es, es);
                }
            } else {
                if (io::vae_attention_needs_reshape(t.name)) e.shape.resize(2);
                e.data.assign(data, data + t.nbytes);
            }
            components[std::string(io::diffusers_folder(names->component))].push_back(std::move(e));
        }
    }
    for (auto& [folder, entries] : components) {
        const char* file_name =
            folder == "unet" || folder == "vae" ? "diffusion_pytorch_model.safetensors" : "model.safetensors";
        // The tiny model's head counts travel in metadata (real models follow width / 64).
        dir.write(root + "/" + folder + "/" + file_name,
                  test::build_safetensors(entries, {{"kiln.unet.heads", "2"}, {"kiln.clip.heads", "2"}}));
    }
    dir.write(root + "/model_index.json",
              std::string(R"({"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
                              "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
                              "scheduler": ["diffusers", "DDIMScheduler"]})"));
}

Result<std::unique_ptr<pipeline::Model>> load(const std::string& path) {
    pipeline::ModelPaths paths;
    paths.model = {path};
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    pipeline::ModelOptions options;
    options.threads = 1;
    return pipeline::Model::load(paths, options);
}

TEST(DiffusersRoundTrip, Sd2FolderMakesTheSameImageAsTheCheckpoint) {
    const std::string checkpoint = test::golden_path("models/sd2_tiny.safetensors");
    auto file = io::ModelFile::open({checkpoint});
    ASSERT_TRUE(file.ok());
    test::TempDir dir;
    write_diffusers(*file, io::UnetLayout{2, 1, 0b11}, dir, "sd2");

    auto original = load(checkpoint);
    ASSERT_TRUE(original.ok()) << original.error().message;
    auto converted = load(dir.file("sd2"));
    ASSERT_TRUE(converted.ok()) << converted.error().message;
    EXPECT_EQ((*converted)->family_label(), "SD2.x");
    EXPECT_EQ((*converted)->diffusion_weights().count(), (*original)->diffusion_weights().count());
    EXPECT_EQ((*converted)->vae_weights().count(), (*original)->vae_weights().count());

    auto ca = pipeline::encode_prompt(**original, "a red circle", 0);
    auto cb = pipeline::encode_prompt(**converted, "a red circle", 0);
    ASSERT_TRUE(ca.ok() && cb.ok());
    // The folder keeps q, k, v apart, so its attention runs three products
    // where the checkpoint runs one fused: equal up to float rounding.
    EXPECT_LT(test::relative_error(cb->hidden, ca->hidden), 1e-5) << "text encoder";

    pipeline::GenerationRequest request;
    request.prompt = "a red circle";
    request.width = request.height = 32;
    request.steps = 2;
    request.sampler = "euler";
    auto a = pipeline::generate(**original, request);
    auto b = pipeline::generate(**converted, request);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(b.ok()) << b.error().message;
    ASSERT_EQ(a->front().image.pixels.size(), b->front().image.pixels.size());
    EXPECT_LE(test::pixel_difference(a->front().image, b->front().image).max, 1)
        << "pixels differ by more than rounding";

    // The folder's vae/ file alone with --vae beside the checkpoint (as
    // madebyollin's sdxl-vae-fp16-fix and stabilityai's sd-vae-ft-mse are
    // published): renamed as in the folder, the same image.
    pipeline::ModelPaths vae_alone;
    vae_alone.model = {checkpoint};
    vae_alone.vae = dir.file("sd2/vae/diffusion_pytorch_model.safetensors");
    vae_alone.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    pipeline::ModelOptions options;
    options.threads = 1;
    auto with_vae = pipeline::Model::load(vae_alone, options);
    ASSERT_TRUE(with_vae.ok()) << with_vae.error().message;
    auto d = pipeline::generate(**with_vae, request);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_TRUE(d->front().image.pixels == a->front().image.pixels) << "the diffusers VAE decodes differently";

    // A1111's "Model hash" (io/file_hashes.h): the checkpoint file's; a
    // folder has no one file to hash; none without file hashes.
    const auto has_model_hash = [](const image::GenerationInfo& info) {
        return std::any_of(info.extra.begin(), info.extra.end(), [](const auto& e) { return e.first == "Model hash"; });
    };
    EXPECT_EQ((*original)->model_file(), checkpoint);
    EXPECT_EQ((*converted)->model_file(), "");
    EXPECT_TRUE(has_model_hash(a->front().info));
    EXPECT_FALSE(has_model_hash(b->front().info));
    request.file_hashes = false;
    auto c = pipeline::generate(**original, request);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_FALSE(has_model_hash(c->front().info));
}

}  // namespace
}  // namespace kiln
