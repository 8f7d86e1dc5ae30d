// Wan from its diffusers folders, as `huggingface-cli download
// Wan-AI/Wan2.1-T2V-1.3B-Diffusers` (WanPipeline) and the I2V and VACE ones
// leave them: model_index.json, transformer/ (WanTransformer3DModel) in
// shards with their index, text_encoder/ (UMT5EncoderModel, HF's names),
// tokenizer/, vae/ (AutoencoderKLWan), image_encoder/ (I2V's
// CLIPVisionModelWithProjection) and scheduler/. The tiny Wan parts written
// so give the split files' clips exactly. The transformer's diffusers names
// are made here as diffusers' own conversion script makes them
// (scripts/convert_wan_to_diffusers.py: its rename table applied in order,
// by substring), so kiln's reverse table (io/name_map.cpp) is checked
// against that procedure, not against itself.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "golden.h"
#include "io/model_file.h"
#include "pipeline/generate.h"
#include "test_files.h"
#include "wan_tiny.h"

namespace kiln::pipeline {
namespace {

using test::module_named;
using test::SafetensorsEntry;
using test::wan_tiny_part;

// scripts/convert_wan_to_diffusers.py's TRANSFORMER_KEYS_RENAME_DICT with
// VACE_TRANSFORMER_KEYS_RENAME_DICT's two VACE entries, in the script's
// order: each key's every occurrence is replaced, one entry after another.
const std::vector<std::pair<std::string, std::string>>& diffusers_renames() {
    static const std::vector<std::pair<std::string, std::string>> renames = {
        {"time_embedding.0", "condition_embedder.time_embedder.linear_1"},
        {"time_embedding.2", "condition_embedder.time_embedder.linear_2"},
        {"text_embedding.0", "condition_embedder.text_embedder.linear_1"},
        {"text_embedding.2", "condition_embedder.text_embedder.linear_2"},
        {"time_projection.1", "condition_embedder.time_proj"},
        {"head.modulation", "scale_shift_table"},
        {"head.head", "proj_out"},
        {"modulation", "scale_shift_table"},
        {"ffn.0", "ffn.net.0.proj"},
        {"ffn.2", "ffn.net.2"},
        {"norm2", "norm__placeholder"},
        {"norm3", "norm2"},
        {"norm__placeholder", "norm3"},
        {"img_emb.proj.0", "condition_embedder.image_embedder.norm1"},
        {"img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"},
        {"img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"},
        {"img_emb.proj.4", "condition_embedder.image_embedder.norm2"},
        {"img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed"},
        {"self_attn.q", "attn1.to_q"},
        {"self_attn.k", "attn1.to_k"},
        {"self_attn.v", "attn1.to_v"},
        {"self_attn.o", "attn1.to_out.0"},
        {"self_attn.norm_q", "attn1.norm_q"},
        {"self_attn.norm_k", "attn1.norm_k"},
        {"cross_attn.q", "attn2.to_q"},
        {"cross_attn.k", "attn2.to_k"},
        {"cross_attn.v", "attn2.to_v"},
        {"cross_attn.o", "attn2.to_out.0"},
        {"cross_attn.norm_q", "attn2.norm_q"},
        {"cross_attn.norm_k", "attn2.norm_k"},
        {"attn2.to_k_img", "attn2.add_k_proj"},
        {"attn2.to_v_img", "attn2.add_v_proj"},
        {"attn2.norm_k_img", "attn2.norm_added_k"},
        {"before_proj", "proj_in"},
        {"after_proj", "proj_out"},
    };
    return renames;
}

std::string diffusers_name(std::string name) {
    for (const auto& [from, to] : diffusers_renames()) {
        for (size_t at = name.find(from); at != std::string::npos; at = name.find(from, at + to.size()))
            name.replace(at, from.size(), to);
    }
    return name;
}

std::vector<SafetensorsEntry> read_entries(const std::string& path,
                                           const std::function<std::string(const std::string&)>& rename) {
    std::vector<SafetensorsEntry> out;
    auto file = io::ModelFile::open({path});
    EXPECT_TRUE(file.ok()) << path;
    if (!file.ok()) return out;
    for (const io::TensorInfo& t : file->tensors()) out.push_back(test::copy_entry(*file, t, rename(t.name)));
    return out;
}

// The DiT file `dit` of the tiny parts in two shards of diffusers' names,
// with their index, under dir/folder.
void write_transformer(const test::TempDir& dir, const std::string& folder, const std::string& dit) {
    std::vector<SafetensorsEntry> shards[2];
    std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
    for (SafetensorsEntry& e : read_entries(wan_tiny_part(dit), diffusers_name)) {
        const int k = e.name.rfind("blocks.1.", 0) == 0 || e.name.rfind("blocks.3.", 0) == 0 ? 1 : 0;
        index += std::string(index.back() == '{' ? "" : ", ") + "\"" + e.name +
                 "\": \"diffusion_pytorch_model-0000" + std::to_string(k + 1) + "-of-00002.safetensors\"";
        shards[k].push_back(std::move(e));
    }
    auto file = io::ModelFile::open({wan_tiny_part(dit)});
    ASSERT_TRUE(file.ok());
    std::vector<std::pair<std::string, std::string>> metadata;
    for (const auto& [key, value] : file->metadata()) metadata.emplace_back(key, value.to_string());
    for (int k = 0; k < 2; ++k) {
        ASSERT_FALSE(shards[k].empty());
        dir.write(folder + "diffusion_pytorch_model-0000" + std::to_string(k + 1) + "-of-00002.safetensors",
                  test::build_safetensors(shards[k], metadata));
    }
    dir.write(folder + "diffusion_pytorch_model.safetensors.index.json", index + "}}");
    dir.write(folder + "config.json", R"({"_class_name": "WanTransformer3DModel"})");
}

// The tiny parts as a diffusers folder dir/root (`pipeline`: model_index's
// class; `image_encoder`: I2V's CLIP vision); returns its path.
std::string write_folder(const test::TempDir& dir, const std::string& root, const std::string& pipeline,
                         const std::string& dit, bool image_encoder) {
    dir.write(root + "model_index.json",
              R"({"_class_name": ")" + pipeline + R"(", "_diffusers_version": "0.33.0",)" +
                  (image_encoder ? R"( "image_encoder": ["transformers", "CLIPVisionModelWithProjection"],
                                     "image_processor": ["transformers", "CLIPImageProcessor"],)"
                                 : "") +
                  R"( "scheduler": ["diffusers", "UniPCMultistepScheduler"],
                      "text_encoder": ["transformers", "UMT5EncoderModel"],
                      "tokenizer": ["transformers", "T5TokenizerFast"],
                      "transformer": ["diffusers", "WanTransformer3DModel"],
                      "vae": ["diffusers", "AutoencoderKLWan"]})");
    dir.write(root + "scheduler/scheduler_config.json", R"({"_class_name": "UniPCMultistepScheduler"})");
    write_transformer(dir, root + "transformer/", dit);
    dir.write(root + "text_encoder/config.json", R"({"architectures": ["UMT5EncoderModel"]})");
    dir.write(root + "text_encoder/model.safetensors", test::read_bytes(wan_tiny_part("umt5.safetensors")));
    dir.write(root + "tokenizer/spiece.model", test::read_bytes(test::wan_tiny_spiece()));
    dir.write(root + "vae/config.json", R"({"_class_name": "AutoencoderKLWan"})");
    dir.write(root + "vae/diffusion_pytorch_model.safetensors",
              test::build_safetensors(test::wan_vae_in_diffusers_names(test::wan_tiny_vae())));
    if (image_encoder) {
        dir.write(root + "image_encoder/config.json", R"({"architectures": ["CLIPVisionModelWithProjection"]})");
        dir.write(root + "image_encoder/model.safetensors",
                  test::read_bytes(wan_tiny_part("clip_vision.safetensors")));
        dir.write(root + "image_processor/preprocessor_config.json", R"({"crop_size": 224})");
    }
    return dir.file(root.substr(0, root.size() - 1));  // without the trailing '/'
}

// The job's clip from a model loaded from `paths`.
std::vector<image::Image> clip(const ModelPaths& paths, const GenerationRequest& job,
                               std::unique_ptr<Model>* keep = nullptr) {
    auto model = Model::load(paths, test::golden_model_options());
    EXPECT_TRUE(model.ok()) << model.error().message;
    if (!model.ok()) return {};
    auto clips = generate(**model, job);
    EXPECT_TRUE(clips.ok()) << clips.error().message;
    if (keep) *keep = std::move(model).value();
    if (!clips.ok() || clips->empty()) return {};
    return clips->front().frames;
}

void expect_same_clip(const std::vector<image::Image>& got, const std::vector<image::Image>& want) {
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(got.size(), want.size());
    for (size_t f = 0; f < want.size(); ++f) EXPECT_TRUE(got[f].pixels == want[f].pixels) << "frame " << f;
}

// Wan-AI/Wan2.1-T2V-1.3B-Diffusers' layout: the split files' clip, its
// tokenizer found in tokenizer/, and the DiT under ComfyUI's prefix.
TEST(WanDiffusers, TextToVideoFolderGivesTheSplitFilesClip) {
    test::TempDir dir;
    const std::string path = write_folder(dir, "Wan2.1-T2V-Diffusers/", "WanPipeline", "wan_dit.safetensors", false);
    std::unique_ptr<Model> model;
    const std::vector<image::Image> frames = clip(test::model_at(path), test::wan_tiny_request(), &model);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->family_label(), "Wan");
    const Module* dit = module_named(*model, "wan");
    ASSERT_NE(dit, nullptr);
    EXPECT_EQ(dit->prefix, "model.diffusion_model.");
    EXPECT_EQ(dit->file->sources().size(), 2u + 1u + 1u);  // the DiT's shards, umT5, the VAE
    const Module* vae = module_named(*model, "vae");
    ASSERT_NE(vae, nullptr);
    EXPECT_EQ(vae->prefix, "first_stage_model.");
    expect_same_clip(frames, clip(test::wan_tiny_parts(), test::wan_tiny_request()));
}

// A folder's parts given alone, as the two-expert folder below must be
// passed: transformer/ and vae/ in diffusers' names are renamed as the
// folder's are, and text_encoder/ finds tokenizer/ beside it.
TEST(WanDiffusers, ItsPartsGivenAloneAreRenamed) {
    test::TempDir dir;
    const std::string path = write_folder(dir, "Wan2.1-T2V-Diffusers/", "WanPipeline", "wan_dit.safetensors", false);
    ModelPaths paths;
    paths.diffusion_model = path + "/transformer";
    paths.vae = path + "/vae/diffusion_pytorch_model.safetensors";
    paths.t5xxl = path + "/text_encoder";  // its tokenizer/ beside it
    expect_same_clip(clip(paths, test::wan_tiny_request()), clip(test::wan_tiny_parts(), test::wan_tiny_request()));
}

// VACE's folder (WanVACEPipeline): the VACE blocks' proj_in and proj_out
// are the original's before_proj and after_proj.
TEST(WanDiffusers, VaceFolderGivesTheSplitFilesClip) {
    test::TempDir dir;
    const std::string path =
        write_folder(dir, "Wan2.1-VACE-Diffusers/", "WanVACEPipeline", "wan_dit_vace.safetensors", false);
    auto job_io = io::ModelFile::open({test::golden_path("pipeline/wan_tiny_vace.safetensors")});
    ASSERT_TRUE(job_io.ok());
    GenerationRequest job = test::wan_tiny_request();
    job.init_image = test::wan_tiny_frame(*job_io, "ref_image");
    for (int i = 0; i < 3; ++i) job.control_frames.push_back(test::wan_tiny_frame(*job_io, ("control" + std::to_string(i)).c_str()));
    job.vace_strength = 0.8f;
    expect_same_clip(clip(test::model_at(path), job), clip(test::wan_tiny_parts("wan_dit_vace.safetensors"), job));
}

// Wan 2.1 I2V's folder (WanImageToVideoPipeline): the image context's MLP
// and keys (condition_embedder.image_embedder, attn2.add_k_proj) and the
// CLIP vision tower from image_encoder/.
TEST(WanDiffusers, ImageToVideoFolderGivesTheSplitFilesClip) {
    test::TempDir dir;
    const std::string path = write_folder(dir, "Wan2.1-I2V-Diffusers/", "WanImageToVideoPipeline",
                                          "wan_dit_i2v21.safetensors", true);
    auto job_io = io::ModelFile::open({test::golden_path("pipeline/wan_tiny_i2v21.safetensors")});
    ASSERT_TRUE(job_io.ok());
    GenerationRequest job = test::wan_tiny_request();
    job.init_image = test::wan_tiny_frame(*job_io, "image");
    std::unique_ptr<Model> model;
    const std::vector<image::Image> frames = clip(test::model_at(path), job, &model);
    ASSERT_NE(model, nullptr);
    const Module* vision = module_named(*model, "clip_vision");
    ASSERT_NE(vision, nullptr);
    EXPECT_EQ(vision->prefix.rfind("image_encoder/", 0), 0u) << vision->prefix;
    ModelPaths split = test::wan_tiny_parts("wan_dit_i2v21.safetensors");
    split.clip_vision = wan_tiny_part("clip_vision.safetensors");
    expect_same_clip(frames, clip(split, job));
}

// Wan 2.2 A14B's folder holds both experts (transformer/ the high-noise
// one, transformer_2/ the low-noise one): one error that says which flags
// take them, and those flags give the split files' clip.
TEST(WanDiffusers, TwoExpertFolderSaysHowToPassIt) {
    test::TempDir dir;
    const std::string path =
        write_folder(dir, "Wan2.2-T2V-A14B-Diffusers/", "WanPipeline", "wan_dit_high_noise.safetensors", false);
    write_transformer(dir, "Wan2.2-T2V-A14B-Diffusers/transformer_2/", "wan_dit.safetensors");
    dir.write("Wan2.2-T2V-A14B-Diffusers/model_index.json", R"({"_class_name": "WanPipeline", "boundary_ratio": 0.875,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"], "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"], "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"]})");
    auto refused = Model::load(test::model_at(path), test::golden_model_options());
    ASSERT_FALSE(refused.ok());
    const std::string& message = refused.error().message;
    EXPECT_NE(message.find("--high-noise-diffusion-model " + path + "/transformer"), std::string::npos) << message;
    EXPECT_NE(message.find("--diffusion-model " + path + "/transformer_2"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;

    ModelPaths paths;
    paths.diffusion_model = path + "/transformer_2";
    paths.high_noise_diffusion_model = path + "/transformer";
    paths.vae = path + "/vae";
    paths.t5xxl = path + "/text_encoder";
    GenerationRequest job = test::wan_tiny_request();
    job.steps = 2;
    job.high_noise.steps = 2;
    job.high_noise.cfg_scale = 4.0f;
    ModelPaths split = test::wan_tiny_parts();
    split.high_noise_diffusion_model = wan_tiny_part("wan_dit_high_noise.safetensors");
    expect_same_clip(clip(paths, job), clip(split, job));
}

}  // namespace
}  // namespace kiln::pipeline
