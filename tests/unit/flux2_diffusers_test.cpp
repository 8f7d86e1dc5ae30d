// FLUX.2 [klein] and [dev] from their diffusers folders, as
// `huggingface-cli download black-forest-labs/FLUX.2-klein-4B` leaves it
// (Flux2KleinPipeline; [dev]'s Flux2Pipeline has Mistral 3 instead):
// model_index.json, transformer/ (Flux2Transformer2DModel), vae/
// (AutoencoderKLFlux2), text_encoder/ (Qwen3ForCausalLM, its lm_head never
// read), tokenizer/ and scheduler/. The tiny parts of flux2_pipeline_test.cpp
// in diffusers' names (training/make_flux2_diffusers_fixture.py, transcribed
// from diffusers' scripts/convert_flux2_to_diffusers.py) give the BFL-named
// parts' images exactly: the split qkv, the swapped final modulation, the
// renamed autoencoder (its 2 levels numbered from the lowest) and its latent
// statistics all land where BFL's names put them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "golden.h"
#include "image/image.h"
#include "io/model_file.h"
#include "pipeline/generate.h"
#include "pipeline/model.h"
#include "test_files.h"

namespace kiln::pipeline {
namespace {

using test::golden_path;

std::string model(const std::string& name) { return golden_path("models/" + name); }

// A release in BFL's names (the split files) and in diffusers' (the folder).
struct Release {
    const char* pipeline;      // model_index.json's _class_name
    const char* text_encoder;  // its transformers class
    const char* dit;           // BFL-named DiT, and its diffusers-named conversion
    const char* diffusers_dit;
    const char* llm;
    std::string tokenizer;  // a folder whose files tokenizer/ holds
    std::vector<const char*> tokenizer_files;
};

Release klein() {
    return {"Flux2KleinPipeline",
            "Qwen3ForCausalLM",
            "flux2_tiny.safetensors",
            "flux2_tiny_diffusers_transformer.safetensors",
            "flux2_klein_qwen3_tiny.safetensors",
            golden_path("pipeline/z_image_tiny/tokenizer"),
            {"vocab.json", "merges.txt", "tokenizer_config.json"}};
}

// [dev]: the guidance embedder, Mistral 3 (language_model.*, a vision tower
// kiln never reads) and a Tekken tokenizer.json.
Release dev() {
    return {"Flux2Pipeline",
            "Mistral3ForConditionalGeneration",
            "flux2_dev_tiny.safetensors",
            "flux2_dev_tiny_diffusers_transformer.safetensors",
            "flux2_dev_mistral_tiny.safetensors",
            golden_path("pipeline/flux2_dev_tiny/tokenizer"),
            {"tokenizer.json"}};
}

ModelPaths bfl_parts(const Release& release = klein()) {
    ModelPaths paths;
    paths.diffusion_model = model(release.dit);
    paths.vae = model("flux2_ae_tiny.safetensors");
    paths.llm = model(release.llm);
    paths.tokenizer = "llm=" + release.tokenizer;
    return paths;
}

// The release's tiny parts as a diffusers folder dir/root; returns its path.
std::string write_folder(const test::TempDir& dir, const std::string& root, const Release& release = klein()) {
    dir.write(root + "model_index.json", std::string(R"({"_class_name": ")") + release.pipeline +
                                             R"(", "_diffusers_version": "0.37.0",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", ")" +
                                             release.text_encoder +
                                             R"("],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"]})");
    dir.write(root + "scheduler/scheduler_config.json", R"({"_class_name": "FlowMatchEulerDiscreteScheduler"})");
    dir.write(root + "transformer/diffusion_pytorch_model.safetensors", test::read_bytes(model(release.diffusers_dit)));
    dir.write(root + "vae/diffusion_pytorch_model.safetensors",
              test::read_bytes(model("flux2_ae_tiny_diffusers.safetensors")));
    dir.write(root + "text_encoder/model.safetensors", test::read_bytes(model(release.llm)));
    for (const char* f : release.tokenizer_files)
        dir.write(root + "tokenizer/" + f, test::read_bytes(release.tokenizer + "/" + f));
    return dir.file(root);
}

std::vector<uint8_t> image_of(const ModelPaths& paths, const GenerationRequest& r, std::string* family = nullptr) {
    auto loaded = Model::load(paths, test::golden_model_options());
    EXPECT_TRUE(loaded.ok()) << loaded.error().message;
    if (!loaded.ok()) return {};
    if (family) *family = (*loaded)->family_label();
    auto images = generate(**loaded, r);
    EXPECT_TRUE(images.ok()) << images.error().message;
    return images.ok() ? images->front().image.pixels : std::vector<uint8_t>{};
}

// The image `paths` make of `r` is the BFL-named split files' of `release`,
// byte for byte; returns the family `paths` loaded as.
std::string expect_the_split_files_image(const ModelPaths& paths, const GenerationRequest& r,
                                         const Release& release = klein()) {
    std::string family;
    const auto got = image_of(paths, r, &family);
    const auto want = image_of(bfl_parts(release), r);
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(got, want);
    return family;
}

GenerationRequest tiny_job() {
    GenerationRequest r;
    r.prompt = "a red circle";
    r.width = 16;
    r.height = 24;
    r.steps = 2;
    r.seed = 11;
    return r;
}

// A reference image goes through the autoencoder's encoder (quant_conv, the
// latent statistics) as well as its decoder.
GenerationRequest edit_job() {
    GenerationRequest r = tiny_job();
    image::Image ref = image::make_image(16, 16, 3);
    for (size_t i = 0; i < ref.pixels.size(); ++i) ref.pixels[i] = static_cast<uint8_t>((i * 53) % 256);
    r.ref_images.push_back(ref);
    return r;
}

TEST(Flux2Diffusers, FolderGivesTheSplitFilesImages) {
    test::TempDir dir;
    ModelPaths folder;
    folder.model = {write_folder(dir, "FLUX.2-klein-4B/")};
    for (const GenerationRequest& r : {tiny_job(), edit_job()}) {
        SCOPED_TRACE(r.ref_images.empty() ? "text to image" : "with a reference image");
        EXPECT_EQ(expect_the_split_files_image(folder, r), "FLUX.2-klein");
    }
}

// [dev]'s folder: guidance through the renamed guidance embedder, Mistral
// from text_encoder/, the Tekken tokenizer from tokenizer/.
TEST(Flux2Diffusers, DevFolderGivesTheSplitFilesImage) {
    test::TempDir dir;
    ModelPaths folder;
    folder.model = {write_folder(dir, "FLUX.2-dev/", dev())};
    GenerationRequest r = tiny_job();
    r.guidance = 2.5f;
    EXPECT_EQ(expect_the_split_files_image(folder, r, dev()), "FLUX.2-dev");
}

// klein base's repository (FLUX.2-klein-base-4B/) gives base's defaults, as
// its file name does.
TEST(Flux2Diffusers, BaseFolderIsKleinBase) {
    test::TempDir dir;
    ModelPaths folder;
    folder.model = {write_folder(dir, "FLUX.2-klein-base-4B/")};
    auto loaded = Model::load(folder, test::golden_model_options());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    EXPECT_EQ((*loaded)->family_label(), "FLUX.2-klein-base");
    EXPECT_EQ((*loaded)->defaults().cfg_scale, 4.0f);
}

// The converted transformer alone (--diffusion-model), beside BFL's
// autoencoder and the LLM, is the same DiT.
TEST(Flux2Diffusers, TransformerFileAloneIsTheSameDit) {
    ModelPaths paths = bfl_parts();
    paths.diffusion_model = model("flux2_tiny_diffusers_transformer.safetensors");
    expect_the_split_files_image(paths, tiny_job());
}

// The converted autoencoder alone (--vae, a folder's vae/ file) is FLUX.2's.
TEST(Flux2Diffusers, AutoencoderFileAloneIsTheSameAutoencoder) {
    ModelPaths paths = bfl_parts();
    paths.vae = model("flux2_ae_tiny_diffusers.safetensors");
    expect_the_split_files_image(paths, edit_job());
}

// Half a transformer: the file's own name of what is missing.
TEST(Flux2Diffusers, AMissingTensorIsNamedAsTheFileNamesIt) {
    auto file = io::ModelFile::open({model("flux2_tiny_diffusers_transformer.safetensors")});
    ASSERT_TRUE(file.ok());
    std::vector<test::SafetensorsEntry> kept;
    for (const io::TensorInfo& t : file->tensors()) {
        if (t.name != "transformer_blocks.1.attn.add_k_proj.weight") kept.push_back(test::copy_entry(*file, t, t.name));
    }
    std::vector<std::pair<std::string, std::string>> metadata;
    for (const auto& [key, value] : file->metadata()) metadata.emplace_back(key, value.to_string());
    test::TempDir dir;
    ModelPaths paths = bfl_parts();
    paths.diffusion_model = dir.write("broken.safetensors", test::build_safetensors(kept, metadata));
    auto refused = Model::load(paths, test::golden_model_options());
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::BadFile);
    EXPECT_NE(refused.error().message.find("transformer_blocks.1.attn.add_k_proj.weight"), std::string::npos)
        << refused.error().message;
}

}  // namespace
}  // namespace kiln::pipeline
