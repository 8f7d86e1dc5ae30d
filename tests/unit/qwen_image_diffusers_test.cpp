// Qwen-Image from its diffusers folder, as `huggingface-cli download
// Qwen/Qwen-Image` (QwenImagePipeline) and Qwen/Qwen-Image-Edit-2509
// (QwenImageEditPlusPipeline) leave it: model_index.json, transformer/ in
// shards with their index (the DiT's names are kiln's already),
// text_encoder/ (Qwen2_5_VLForConditionalGeneration: the text model under
// model. in older transformers' files, model.language_model. in newer ones,
// the vision tower under visual. or model.visual., lm_head), tokenizer/,
// vae/ (AutoencoderKLQwenImage: Wan 2.1's VAE in diffusers' names, which
// io/name_map.h maps to the original ones), scheduler/ and the edit
// pipelines' processor/. The tiny parts of qwen_image_pipeline_test.cpp and
// qwen_image_edit_test.cpp written as such folders give the split files'
// images exactly.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "golden.h"
#include "image/image_io.h"
#include "io/diffusers_names.h"
#include "io/model_file.h"
#include "io/name_map.h"
#include "pipeline/generate.h"
#include "test_files.h"

namespace kiln::pipeline {
namespace {

using test::golden_path;
using test::module_named;
using test::SafetensorsEntry;

std::string image_part(const std::string& name) { return golden_path("pipeline/qwen_image_tiny/" + name); }
std::string edit_part(const std::string& name) { return golden_path("pipeline/qwen_image_edit_tiny/" + name); }

// A file's tensors, renamed by `rename` ("" drops one), and its metadata
// (the tiny parts carry their few non-default sizes there; the real files'
// sizes are kiln's defaults).
struct Part {
    std::vector<SafetensorsEntry> tensors;
    std::vector<std::pair<std::string, std::string>> metadata;
};

Part read_part(const std::string& path, const std::function<std::string(const std::string&)>& rename) {
    Part part;
    auto file = io::ModelFile::open({path});
    EXPECT_TRUE(file.ok()) << path;
    if (!file.ok()) return part;
    for (const io::TensorInfo& t : file->tensors()) {
        const std::string name = rename(t.name);
        if (!name.empty()) part.tensors.push_back(test::copy_entry(*file, t, name));
    }
    for (const auto& [key, value] : file->metadata()) part.metadata.emplace_back(key, value.to_string());
    return part;
}

std::string same(const std::string& name) { return name; }

// `tensors` as HF and diffusers shard them: NAME-0000k-of-00002.EXT by
// `second` (false: the first shard), and NAME.EXT.index.json naming each
// tensor's shard.
void write_sharded(const test::TempDir& dir, const std::string& folder, const std::string& stem,
                   const std::vector<SafetensorsEntry>& tensors,
                   const std::vector<std::pair<std::string, std::string>>& metadata,
                   const std::function<bool(const std::string&)>& second) {
    std::vector<SafetensorsEntry> shards[2];
    std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
    for (const SafetensorsEntry& e : tensors) {
        const int k = second(e.name) ? 1 : 0;
        shards[k].push_back(e);
        index += std::string(index.back() == '{' ? "" : ", ") + "\"" + e.name + "\": \"" + stem + "-0000" +
                 std::to_string(k + 1) + "-of-00002.safetensors\"";
    }
    ASSERT_FALSE(shards[0].empty());
    ASSERT_FALSE(shards[1].empty());
    for (int k = 0; k < 2; ++k) {
        dir.write(folder + stem + "-0000" + std::to_string(k + 1) + "-of-00002.safetensors",
                  test::build_safetensors(shards[k], metadata));
    }
    dir.write(folder + stem + ".safetensors.index.json", index + "}}");
}

// The tiny VAE (original names) in diffusers' AutoencoderKLQwenImage names.
std::vector<SafetensorsEntry> diffusers_vae() {
    return test::wan_vae_in_diffusers_names(image_part("qwen_image_vae.safetensors"));
}

struct FolderOptions {
    // Qwen-Image-Edit-2509: the edit parts' LLM with its vision tower, a processor/.
    bool edit = false;
    // The first Edit release's folder (Qwen/Qwen-Image-Edit): QwenImageEditPipeline.
    bool first_edit_release = false;
    // The text encoder as newer transformers save it: model.language_model.*, model.visual.*.
    bool newer_hf_names = false;
    bool vae = true;
};

// The tiny parts as a diffusers folder dir/root; returns its path.
std::string write_folder(const test::TempDir& dir, const std::string& root, const FolderOptions& o) {
    const std::string pipeline = !o.edit                ? "QwenImagePipeline"
                                 : o.first_edit_release ? "QwenImageEditPipeline"
                                                        : "QwenImageEditPlusPipeline";
    dir.write(root + "model_index.json", R"({"_class_name": ")" + pipeline + R"(", "_diffusers_version": "0.35.1",)" +
                                             (o.edit ? R"( "processor": ["transformers", "Qwen2VLProcessor"],)" : "") +
                                             R"( "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                      "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
                      "tokenizer": ["transformers", "Qwen2Tokenizer"],
                      "transformer": ["diffusers", "QwenImageTransformer2DModel"],
                      "vae": ["diffusers", "AutoencoderKLQwenImage"]})");
    dir.write(root + "scheduler/scheduler_config.json", R"({"_class_name": "FlowMatchEulerDiscreteScheduler"})");
    if (o.edit) dir.write(root + "processor/preprocessor_config.json", R"({"patch_size": 14})");

    // transformer/: the DiT's names as they are, in two shards.
    const Part dit = read_part(image_part("qwen_image_dit.safetensors"), same);
    dir.write(root + "transformer/config.json", R"({"_class_name": "QwenImageTransformer2DModel"})");
    write_sharded(dir, root + "transformer/", "diffusion_pytorch_model", dit.tensors, dit.metadata,
                  [](const std::string& n) { return n.rfind("transformer_blocks.1.", 0) == 0; });

    // text_encoder/: the text model, the vision tower (edit), lm_head.
    const std::string parts_llm = o.edit ? edit_part("qwen_2.5_vl.safetensors") : image_part("qwen_2.5_vl.safetensors");
    const bool newer = o.newer_hf_names;
    Part llm = read_part(parts_llm, [newer](const std::string& n) {
        return newer && n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n;
    });
    for (const SafetensorsEntry& e : llm.tensors) {
        if (e.name.size() >= 19 && e.name.compare(e.name.size() - 19, 19, "embed_tokens.weight") == 0) {
            SafetensorsEntry head = e;
            head.name = "lm_head.weight";
            llm.tensors.push_back(std::move(head));
            break;
        }
    }
    if (o.edit) {
        const Part vision = read_part(edit_part("qwen_2.5_vl_vision.safetensors"), [newer](const std::string& n) {
            return newer ? "model." + n : n;  // visual.* -> model.visual.*
        });
        for (const auto& e : vision.tensors) llm.tensors.push_back(e);
        for (const auto& m : vision.metadata) llm.metadata.push_back(m);
    }
    dir.write(root + "text_encoder/config.json", R"({"architectures": ["Qwen2_5_VLForConditionalGeneration"]})");
    write_sharded(dir, root + "text_encoder/", "model", llm.tensors, llm.metadata, [](const std::string& n) {
        return n.find("visual.") != std::string::npos || n == "lm_head.weight" ||
               n.find("layers.2.") != std::string::npos;
    });

    const std::string tokenizer = o.edit ? edit_part("tokenizer/") : image_part("tokenizer/");
    for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
        dir.write(root + "tokenizer/" + f, test::read_bytes(tokenizer + f));
    }
    if (o.vae) {
        dir.write(root + "vae/config.json", R"({"_class_name": "AutoencoderKLQwenImage"})");
        dir.write(root + "vae/diffusion_pytorch_model.safetensors", test::build_safetensors(diffusers_vae()));
    }
    return dir.file(root);
}

// The split files, as qwen_image_pipeline_test.cpp and qwen_image_edit_test.cpp pass them.
ModelPaths split_parts(bool edit) {
    ModelPaths paths;
    paths.diffusion_model = image_part("qwen_image_dit.safetensors");
    paths.vae = image_part("qwen_image_vae.safetensors");
    if (edit) {
        paths.llm = edit_part("qwen_2.5_vl.safetensors");
        paths.llm_vision = edit_part("qwen_2.5_vl_vision.safetensors");
        paths.tokenizer = "llm=" + edit_part("tokenizer");
    } else {
        paths.llm = image_part("qwen_2.5_vl.safetensors");
        paths.tokenizer = "llm=" + image_part("tokenizer");
    }
    return paths;
}

GenerationRequest tiny_job() {
    GenerationRequest r;
    r.prompt = "a red cat on a blue square";
    r.width = 64;
    r.height = 48;
    r.seed = 11;
    r.steps = 3;
    r.rng = RngKind::Cuda;
    return r;
}

GenerationRequest edit_job() {
    GenerationRequest r = tiny_job();
    r.prompt = "make the cat blue";
    auto ref = image::read_image(edit_part("ref.png"));
    EXPECT_TRUE(ref.ok());
    if (ref.ok()) r.ref_images = {std::move(ref).value()};
    return r;
}

// The job's image from a model loaded from `paths`; empty when either fails.
image::Image run(const ModelPaths& paths, const GenerationRequest& job, std::unique_ptr<Model>* keep = nullptr) {
    auto model = Model::load(paths, test::golden_model_options());
    EXPECT_TRUE(model.ok()) << model.error().message;
    if (!model.ok()) return {};
    auto images = generate(**model, job);
    EXPECT_TRUE(images.ok()) << images.error().message;
    if (keep) *keep = std::move(model).value();
    if (!images.ok() || images->empty()) return {};
    return std::move(images->front().image);
}

void expect_same_image(const image::Image& got, const image::Image& want) {
    ASSERT_FALSE(want.pixels.empty());
    EXPECT_EQ(got.width, want.width);
    EXPECT_EQ(got.height, want.height);
    EXPECT_EQ(got.channels, want.channels);
    EXPECT_TRUE(got.pixels == want.pixels) << "the folder's image differs from the split files'";
}

// ---------------------------------------------------------------------------
// The VAE's name map.

// Every tensor of the tiny VAE (Qwen-Image's layout: 4 levels, 2 residual
// blocks per encoder level, 3 per decoder level, shortcuts where the widths
// change, temporal resamples) has one diffusers name, which maps back to it
// with the same shape; no two share a diffusers name.
TEST(QwenImageDiffusersNames, VaeNameMapRoundTripsEveryTensor) {
    auto vae = io::ModelFile::open({image_part("qwen_image_vae.safetensors")});
    ASSERT_TRUE(vae.ok()) << vae.error().message;
    const io::NameMap map(io::ModelFamily::QwenImage);
    std::set<std::string> diffusers_names;
    for (const io::TensorInfo& t : vae->tensors()) {
        const std::string ldm = "first_stage_model." + t.name;
        auto to = map.ldm_to_diffusers(ldm);
        ASSERT_TRUE(to.has_value()) << t.name;
        EXPECT_EQ(to->component, io::ModelComponent::Vae) << t.name;
        ASSERT_EQ(to->tensors.size(), 1u) << t.name;
        const io::NameMapping& d = to->tensors.front();
        EXPECT_EQ(d.op, io::NameMapping::Op::Same) << t.name;
        EXPECT_TRUE(diffusers_names.insert(d.name).second) << "two tensors map to " << d.name;
        auto back = map.diffusers_to_ldm(io::ModelComponent::Vae, d.name);
        ASSERT_TRUE(back.has_value()) << d.name;
        EXPECT_EQ(back->name, ldm) << d.name;
        EXPECT_EQ(back->op, io::NameMapping::Op::Same) << d.name;
    }
    EXPECT_EQ(diffusers_names.size(), vae->tensors().size());

    // A folder's vae/ renamed: every tensor under its original name, shapes kept
    // (the RMS norms' gamma [C, 1, 1, 1] and [C, 1, 1], the 5-D convolutions).
    std::vector<io::TensorInfo> folder;
    for (const SafetensorsEntry& e : diffusers_vae()) {
        io::TensorInfo t;
        t.name = "vae/" + e.name;
        t.shape = e.shape;
        folder.push_back(t);
    }
    io::TensorInfo dit;
    dit.name = "transformer/transformer_blocks.0.img_mod.1.weight";
    dit.shape = {384, 64};
    folder.push_back(dit);
    ASSERT_EQ(io::detect_diffusers_family(folder), io::ModelFamily::QwenImage);
    io::rename_diffusers_tensors(io::ModelFamily::QwenImage, folder);
    EXPECT_EQ(folder.back().name, dit.name);  // the DiT keeps its names
    folder.pop_back();
    ASSERT_EQ(folder.size(), vae->tensors().size());
    for (const io::TensorInfo& t : folder) {
        ASSERT_EQ(t.name.rfind("first_stage_model.", 0), 0u) << t.name;
        const io::TensorInfo* original = vae->find(t.name.substr(18));
        ASSERT_NE(original, nullptr) << t.name;
        EXPECT_EQ(t.shape, original->shape) << t.name;
    }
}

// The names of diffusers' AutoencoderKLQwenImage, as its modules name them
// (encoder.down_blocks flat as the original's downsamples, decoder.up_blocks
// nested), and as convert_wan_to_diffusers.py pairs them.
TEST(QwenImageDiffusersNames, VaeNamesAreDiffusers) {
    const std::pair<const char*, const char*> pairs[] = {
        {"encoder.conv1.weight", "encoder.conv_in.weight"},
        {"encoder.downsamples.0.residual.0.gamma", "encoder.down_blocks.0.norm1.gamma"},
        {"encoder.downsamples.3.residual.2.weight", "encoder.down_blocks.3.conv1.weight"},
        {"encoder.downsamples.3.residual.3.gamma", "encoder.down_blocks.3.norm2.gamma"},
        {"encoder.downsamples.3.residual.6.bias", "encoder.down_blocks.3.conv2.bias"},
        {"encoder.downsamples.3.shortcut.weight", "encoder.down_blocks.3.conv_shortcut.weight"},
        {"encoder.downsamples.2.resample.1.weight", "encoder.down_blocks.2.resample.1.weight"},
        {"encoder.downsamples.8.time_conv.bias", "encoder.down_blocks.8.time_conv.bias"},
        {"encoder.downsamples.10.residual.6.weight", "encoder.down_blocks.10.conv2.weight"},
        {"encoder.middle.0.residual.0.gamma", "encoder.mid_block.resnets.0.norm1.gamma"},
        {"encoder.middle.1.norm.gamma", "encoder.mid_block.attentions.0.norm.gamma"},
        {"encoder.middle.1.to_qkv.weight", "encoder.mid_block.attentions.0.to_qkv.weight"},
        {"encoder.middle.1.proj.bias", "encoder.mid_block.attentions.0.proj.bias"},
        {"encoder.middle.2.residual.6.weight", "encoder.mid_block.resnets.1.conv2.weight"},
        {"encoder.head.0.gamma", "encoder.norm_out.gamma"},
        {"encoder.head.2.weight", "encoder.conv_out.weight"},
        {"conv1.weight", "quant_conv.weight"},
        {"conv2.bias", "post_quant_conv.bias"},
        {"decoder.conv1.weight", "decoder.conv_in.weight"},
        {"decoder.middle.1.to_qkv.bias", "decoder.mid_block.attentions.0.to_qkv.bias"},
        {"decoder.upsamples.0.residual.0.gamma", "decoder.up_blocks.0.resnets.0.norm1.gamma"},
        {"decoder.upsamples.2.residual.6.bias", "decoder.up_blocks.0.resnets.2.conv2.bias"},
        {"decoder.upsamples.3.resample.1.weight", "decoder.up_blocks.0.upsamplers.0.resample.1.weight"},
        {"decoder.upsamples.3.time_conv.weight", "decoder.up_blocks.0.upsamplers.0.time_conv.weight"},
        {"decoder.upsamples.4.shortcut.weight", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight"},
        {"decoder.upsamples.7.time_conv.bias", "decoder.up_blocks.1.upsamplers.0.time_conv.bias"},
        {"decoder.upsamples.8.shortcut.bias", "decoder.up_blocks.2.resnets.0.conv_shortcut.bias"},
        {"decoder.upsamples.11.resample.1.bias", "decoder.up_blocks.2.upsamplers.0.resample.1.bias"},
        {"decoder.upsamples.14.residual.3.gamma", "decoder.up_blocks.3.resnets.2.norm2.gamma"},
        {"decoder.head.0.gamma", "decoder.norm_out.gamma"},
        {"decoder.head.2.bias", "decoder.conv_out.bias"},
    };
    for (const auto& [original, diffusers] : pairs) {
        auto to_ldm = io::diffusers_to_ldm(io::ModelFamily::QwenImage, io::ModelComponent::Vae, diffusers);
        ASSERT_TRUE(to_ldm.has_value()) << diffusers;
        EXPECT_EQ(to_ldm->name, std::string("first_stage_model.") + original);
        auto to_diffusers =
            io::ldm_to_diffusers(io::ModelFamily::QwenImage, std::string("first_stage_model.") + original);
        ASSERT_TRUE(to_diffusers.has_value()) << original;
        ASSERT_EQ(to_diffusers->tensors.size(), 1u);
        EXPECT_EQ(to_diffusers->tensors.front().name, diffusers);
    }
    // Names neither side has: no last level's upsampler, no SD VAE names.
    for (const char* stray :
         {"decoder.up_blocks.3.upsamplers.0.resample.1.weight", "decoder.up.0.block.0.conv1.weight",
          "encoder.down_blocks.0.resnets.0.norm1.gamma", "decoder.mid_block.attentions.0.to_q.weight"}) {
        EXPECT_FALSE(io::diffusers_to_ldm(io::ModelFamily::QwenImage, io::ModelComponent::Vae, stray).has_value())
            << stray;
    }
    // The other families' tables are untouched: SD's VAE keeps its names.
    auto sd = io::diffusers_to_ldm(io::ModelFamily::SD1, io::ModelComponent::Vae, "encoder.conv_in.weight");
    ASSERT_TRUE(sd.has_value());
    EXPECT_EQ(sd->name, "first_stage_model.encoder.conv_in.weight");
    // Only vae/ has a table in a Qwen-Image folder.
    EXPECT_FALSE(
        io::diffusers_to_ldm(io::ModelFamily::QwenImage, io::ModelComponent::TextEncoder, "model.embed_tokens.weight"));
    EXPECT_FALSE(io::diffusers_to_ldm(io::ModelFamily::QwenImage, io::ModelComponent::Unet, "conv_in.weight"));
}

// ---------------------------------------------------------------------------
// Whole folders.

class QwenImageDiffusers : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { split_image_ = new image::Image(run(split_parts(false), tiny_job())); }
    static void TearDownTestSuite() {
        delete split_image_;
        split_image_ = nullptr;
    }
    test::TempDir dir_;
    static image::Image* split_image_;
};
image::Image* QwenImageDiffusers::split_image_ = nullptr;

// Qwen/Qwen-Image's folder: the text-to-image job's image is the split files' exactly.
TEST_F(QwenImageDiffusers, FolderGivesTheSplitFilesImage) {
    const std::string path = write_folder(dir_, "Qwen-Image/", {});
    std::unique_ptr<Model> model;
    const image::Image img = run(test::model_at(path), tiny_job(), &model);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->family_label(), "Qwen-Image");
    const Module* vae = module_named(*model, "vae");
    ASSERT_NE(vae, nullptr);
    EXPECT_EQ(vae->prefix, "first_stage_model.");
    const Module* llm = module_named(*model, "llm");
    ASSERT_NE(llm, nullptr);
    EXPECT_EQ(llm->prefix, "text_encoder/model.");
    const Module* dit = module_named(*model, "qwen_image");
    ASSERT_NE(dit, nullptr);
    EXPECT_EQ(dit->prefix, "transformer/");
    EXPECT_EQ(dit->file->sources().size(), 2u + 2u + 1u);  // the DiT's shards, the LLM's, the VAE
    EXPECT_FALSE(model->has_vision());
    expect_same_image(img, *split_image_);
}

// --vae (or any part's flag) beside the folder takes that part from its
// file, in the original names or diffusers'; without it, a folder missing
// vae/ is one error naming the VAE and the flag that supplies it.
TEST_F(QwenImageDiffusers, PartsBesideTheFolderOverrideItAndAMissingVaeIsOneClearError) {
    const std::string full = write_folder(dir_, "Qwen-Image/", {});
    ModelPaths paths = test::model_at(full);
    paths.vae = image_part("qwen_image_vae.safetensors");
    std::unique_ptr<Model> model;
    expect_same_image(run(paths, tiny_job(), &model), *split_image_);
    ASSERT_NE(model, nullptr);
    const Module* vae = module_named(*model, "vae");
    ASSERT_NE(vae, nullptr);
    EXPECT_EQ(vae->file->sources().front().path, paths.vae);
    EXPECT_EQ(vae->prefix, "");

    FolderOptions no_vae;
    no_vae.vae = false;
    const std::string partial = write_folder(dir_, "Qwen-Image-no-vae/", no_vae);
    auto refused = Model::load(test::model_at(partial), test::golden_model_options());
    ASSERT_FALSE(refused.ok());
    const std::string& message = refused.error().message;
    EXPECT_NE(message.find("no vae found"), std::string::npos) << message;
    EXPECT_NE(message.find("Qwen-Image"), std::string::npos) << message;
    EXPECT_NE(message.find("--vae"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;

    paths = test::model_at(partial);
    paths.vae = image_part("qwen_image_vae.safetensors");
    expect_same_image(run(paths, tiny_job()), *split_image_);
    // A vae/ file alone, in diffusers' names, is renamed as the folder's is.
    paths.vae = dir_.write("vae/diffusion_pytorch_model.safetensors", test::build_safetensors(diffusers_vae()));
    expect_same_image(run(paths, tiny_job()), *split_image_);
}

// Qwen-Image-Edit-2509's folder, its text encoder in newer transformers'
// names (model.language_model.*, model.visual.*): the vision tower comes
// from text_encoder/, processor/ holds no weights, and the edit job's image
// is the split files' (--llm, --llm_vision) exactly.
TEST_F(QwenImageDiffusers, EditFolderGivesTheSplitFilesImage) {
    FolderOptions edit;
    edit.edit = true;
    edit.newer_hf_names = true;
    const std::string path = write_folder(dir_, "Qwen-Image-Edit-2509/", edit);
    std::unique_ptr<Model> model;
    const image::Image img = run(test::model_at(path), edit_job(), &model);
    ASSERT_NE(model, nullptr);
    EXPECT_TRUE(model->has_vision());
    EXPECT_EQ(model->family_label(), "Qwen-Image");
    const Module* llm = module_named(*model, "llm");
    ASSERT_NE(llm, nullptr);
    EXPECT_EQ(llm->prefix, "text_encoder/model.language_model.");
    const Module* vision = module_named(*model, "llm_vision");
    ASSERT_NE(vision, nullptr);
    EXPECT_EQ(vision->prefix, "text_encoder/model.visual.");
    expect_same_image(img, run(split_parts(true), edit_job()));

    // Older transformers' names (model.*, visual.*) in the same folder layout.
    edit.newer_hf_names = false;
    const std::string older = write_folder(dir_, "Qwen-Image-Edit-2509-older/", edit);
    model.reset();
    const image::Image older_img = run(test::model_at(older), edit_job(), &model);
    ASSERT_NE(model, nullptr);
    vision = module_named(*model, "llm_vision");
    ASSERT_NE(vision, nullptr);
    EXPECT_EQ(vision->prefix, "text_encoder/visual.");
    expect_same_image(older_img, img);
}

// The first Edit release's folder: model_index.json's QwenImageEditPipeline
// picks its own pipeline (training/make_qwen_image_edit_first_fixtures.py's
// job), though its weights are 2509's in shape.
TEST_F(QwenImageDiffusers, FirstEditReleaseFolderTakesItsOwnPipeline) {
    FolderOptions edit;
    edit.edit = true;
    edit.first_edit_release = true;
    const std::string path = write_folder(dir_, "Qwen-Image-Edit/", edit);
    std::unique_ptr<Model> model;
    const image::Image img = run(test::model_at(path), edit_job(), &model);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->family_label(), "Qwen-Image-Edit");
    const io::ModelFile job = *io::ModelFile::open({edit_part("qwen_image_edit_first_job.safetensors")});
    EXPECT_LE(test::difference_from_reference(img, job), 4);
}

}  // namespace
}  // namespace kiln::pipeline
