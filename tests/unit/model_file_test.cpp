#include "io/model_file.h"

#include <gtest/gtest.h>

#include <cstring>

#include "io/model_summary.h"
#include "models/registry.h"
#include "test_files.h"

namespace kiln::io {
namespace {

using test::build_safetensors;
using test::f32_bytes;
using test::TempDir;

std::string error_of(const std::vector<std::string>& paths) {
    auto model = ModelFile::open(paths);
    return model.ok() ? std::string("(no error)") : model.error().message;
}

TEST(ModelFile, ServesTensorBytesFromTheMapping) {
    TempDir dir;
    const std::string path =
        dir.write("m.safetensors",
                  build_safetensors({{"a", "F32", {2}, f32_bytes(2, 1.0f)}, {"b", "F32", {3}, f32_bytes(3, 10.0f)}}));
    auto model = ModelFile::open({path});
    ASSERT_TRUE(model.ok()) << model.error().message;
    const TensorInfo* b = model->find("b");
    ASSERT_NE(b, nullptr);
    float values[3];
    std::memcpy(values, model->data(*b), sizeof values);
    EXPECT_EQ(values[0], 10.0f);
    EXPECT_EQ(values[2], 12.0f);
    EXPECT_EQ(model->find("missing"), nullptr);
}

TEST(ModelFile, MissingEmptyAndUnrecognisedFiles) {
    TempDir dir;
    EXPECT_EQ(error_of({dir.file("nope.safetensors")}), dir.file("nope.safetensors") + ": no such file or folder");
    const std::string empty = dir.write("empty.safetensors", std::string());
    EXPECT_EQ(error_of({empty}), empty + ": file is empty");
    const std::string text = dir.write("notes.txt", std::string("hello, this is not a model"));
    EXPECT_EQ(error_of({text}),
              text + ": unrecognised model format (expected safetensors, GGUF or a PyTorch checkpoint)");
}

// A header of 384 bytes starts the file 0x80 0x01, like a pickle stream; with
// any name (here .bin, which also names PyTorch checkpoints) it is still
// read as the safetensors file it is.
TEST(ModelFile, SafetensorsWhoseHeaderLengthLooksLikeAPickle) {
    TempDir dir;
    std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    header.resize(0x180, ' ');
    const std::vector<uint8_t> bytes = test::raw_safetensors(header, f32_bytes(2, 3.0f));
    ASSERT_EQ(bytes[0], 0x80);
    ASSERT_EQ(bytes[1], 0x01);
    for (const char* name : {"m.safetensors", "m.bin"}) {
        auto model = ModelFile::open({dir.write(name, bytes)});
        ASSERT_TRUE(model.ok()) << name << ": " << model.error().message;
        ASSERT_NE(model->find("w"), nullptr) << name;
        float values[2];
        std::memcpy(values, model->data(*model->find("w")), sizeof values);
        EXPECT_EQ(values[1], 4.0f) << name;
    }
}

TEST(ModelFile, SplitFilesAreOneModel) {
    TempDir dir;
    dir.write("m-00001-of-00002.safetensors", build_safetensors({{"a", "F32", {1}, f32_bytes(1)}}));
    dir.write("m-00002-of-00002.safetensors", build_safetensors({{"b", "F32", {1}, f32_bytes(1)}}));
    auto model = ModelFile::open({dir.file("m-00001-of-00002.safetensors")});
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ(model->sources().size(), 2u);
    ASSERT_NE(model->find("b"), nullptr);
    EXPECT_EQ(model->find("b")->source, 1u);
}

TEST(ModelFile, SplitFileWithMissingPart) {
    TempDir dir;
    dir.write("m-00001-of-00003.safetensors", build_safetensors({{"a", "F32", {1}, f32_bytes(1)}}));
    dir.write("m-00003-of-00003.safetensors", build_safetensors({{"c", "F32", {1}, f32_bytes(1)}}));
    EXPECT_EQ(error_of({dir.file("m-00001-of-00003.safetensors")}), dir.file("m-00002-of-00003.safetensors") +
                                                                        ": missing part 2 of 3 of " +
                                                                        dir.file("m-00001-of-00003.safetensors"));
}

TEST(ModelFile, SameTensorInTwoFilesIsAnError) {
    TempDir dir;
    const std::string a = dir.write("a.safetensors", build_safetensors({{"w", "F32", {1}, f32_bytes(1)}}));
    const std::string b = dir.write("b.safetensors", build_safetensors({{"w", "F32", {1}, f32_bytes(1)}}));
    EXPECT_EQ(error_of({a, b}), b + ": tensor 'w' is also defined in " + a);
}

TEST(ModelFile, BrokenFileInsideAFolderNamesThatFile) {
    TempDir dir;
    dir.write("pipe/model_index.json",
              std::string(R"({"_class_name":"StableDiffusionPipeline","vae":["diffusers","AutoencoderKL"]})"));
    const std::string broken =
        dir.write("pipe/vae/diffusion_pytorch_model.safetensors", std::vector<uint8_t>{9, 0, 0, 0, 0, 0, 0, 0, '{'});
    EXPECT_EQ(error_of({dir.file("pipe")}),
              broken + ": header length 9 is larger than the file (9 bytes): truncated or not a safetensors file");
}

TEST(ModelFile, MalformedModelIndex) {
    TempDir dir;
    const std::string index = dir.write("pipe/model_index.json", std::string("{\"unet\": ["));
    EXPECT_EQ(error_of({dir.file("pipe")}), index + ": malformed JSON");
}

TEST(ModelFile, FolderWithoutWeights) {
    TempDir dir;
    dir.write("empty/readme.txt", std::string("nothing here"));
    EXPECT_EQ(error_of({dir.file("empty")}),
              dir.file("empty") + ": no weight file (.safetensors, .bin, ...) in the folder");
}

// A diffusers SD1 folder in miniature: the names are real SD1 names, the
// shapes are small. It must come out under kiln's ldm names.
TEST(ModelFile, DiffusersFolderIsOneModelUnderLdmNames) {
    TempDir dir;
    dir.write("sd/model_index.json",
              std::string(R"({"_class_name":"StableDiffusionPipeline","_diffusers_version":"0.21.0",
        "unet":["diffusers","UNet2DConditionModel"],"vae":["diffusers","AutoencoderKL"],
        "text_encoder":["transformers","CLIPTextModel"],"tokenizer":["transformers","CLIPTokenizer"],
        "scheduler":["diffusers","PNDMScheduler"],"safety_checker":[null,null]})"));
    dir.write(
        "sd/unet/diffusion_pytorch_model.safetensors",
        build_safetensors(
            {{"conv_in.weight", "F32", {8, 4, 1, 1}, f32_bytes(32)},
             {"down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight", "F32", {8, 768}, f32_bytes(8 * 768)},
             {"down_blocks.0.resnets.0.norm1.weight", "F32", {8}, f32_bytes(8)},
             {"down_blocks.0.resnets.1.norm1.weight", "F32", {8}, f32_bytes(8)},
             {"down_blocks.1.resnets.0.norm1.weight", "F32", {8}, f32_bytes(8)}}));
    // Both a full-precision and an fp16 variant: the full-precision one is used.
    dir.write("sd/vae/diffusion_pytorch_model.safetensors",
              build_safetensors({{"decoder.up_blocks.0.resnets.0.conv1.weight", "F32", {2}, f32_bytes(2)},
                                 {"decoder.up_blocks.3.resnets.0.conv1.weight", "F32", {3}, f32_bytes(3)},
                                 {"encoder.mid_block.attentions.0.to_q.weight", "F32", {2, 2}, f32_bytes(4)}}));
    dir.write("sd/vae/diffusion_pytorch_model.fp16.safetensors",
              build_safetensors({{"decoder.up_blocks.0.resnets.0.conv1.weight", "F16", {2}, {0, 0, 0, 0}}}));
    // The text encoder is sharded with an index file.
    dir.write(
        "sd/text_encoder/model.safetensors.index.json",
        std::string(
            R"({"metadata":{},"weight_map":{"text_model.embeddings.token_embedding.weight":"model-00001-of-00002.safetensors",
                   "text_model.final_layer_norm.weight":"model-00002-of-00002.safetensors"}})"));
    dir.write(
        "sd/text_encoder/model-00001-of-00002.safetensors",
        build_safetensors({{"text_model.embeddings.token_embedding.weight", "F32", {4, 768}, f32_bytes(4 * 768)}}));
    dir.write("sd/text_encoder/model-00002-of-00002.safetensors",
              build_safetensors({{"text_model.final_layer_norm.weight", "F32", {768}, f32_bytes(768)}}));

    auto model = ModelFile::open({dir.file("sd")});
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_TRUE(model->is_diffusers());
    EXPECT_EQ(model->sources().size(), 4u);
    EXPECT_EQ(model->metadata().at("diffusers.pipeline").str, "StableDiffusionPipeline");
    EXPECT_NE(model->find("model.diffusion_model.input_blocks.0.0.weight"), nullptr);
    EXPECT_NE(model->find("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"), nullptr);
    EXPECT_NE(model->find("model.diffusion_model.input_blocks.2.0.in_layers.0.weight"), nullptr);
    EXPECT_NE(model->find("model.diffusion_model.input_blocks.4.0.in_layers.0.weight"), nullptr);
    // The decoder's up blocks are numbered the other way round in ldm (the SD VAE has 4 levels,
    // counted from the file's up_blocks).
    const TensorInfo* lowest = model->find("first_stage_model.decoder.up.3.block.0.conv1.weight");
    const TensorInfo* highest = model->find("first_stage_model.decoder.up.0.block.0.conv1.weight");
    ASSERT_TRUE(lowest && highest);
    EXPECT_EQ(lowest->shape, (std::vector<int64_t>{2}));
    EXPECT_EQ(highest->shape, (std::vector<int64_t>{3}));
    const TensorInfo* q = model->find("first_stage_model.encoder.mid.attn_1.q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->shape, (std::vector<int64_t>{2, 2, 1, 1}));
    EXPECT_EQ(q->dtype, DType::F32);
    EXPECT_NE(model->find("cond_stage_model.transformer.text_model.final_layer_norm.weight"), nullptr);

    const ModelSummary summary = summarize_model(*model);
    models::FileSet files;
    files.files.push_back(&*model);
    EXPECT_EQ(models::detect_family(files).label, "SD1.x");
    ASSERT_EQ(summary.components.size(), 3u);
    EXPECT_EQ(summary.components[0].kind, ComponentKind::DiffusionModel);
    EXPECT_EQ(summary.components[0].tensor_count, 5u);
    EXPECT_EQ(summary.components[1].name, "clip_l");
    EXPECT_EQ(summary.components[1].bytes, (4u * 768 + 768) * 4);
    EXPECT_EQ(summary.components[2].kind, ComponentKind::Vae);
}

TEST(ModelSummary, DetectsFamiliesAndComponentsOfSingleFiles) {
    TempDir dir;
    auto family_of = [&](const std::vector<test::SafetensorsEntry>& entries) {
        const std::string path = dir.write("m.safetensors", build_safetensors(entries));
        auto model = ModelFile::open({path});
        EXPECT_TRUE(model.ok());
        if (!model.ok()) return std::string();
        models::FileSet files;
        files.files.push_back(&*model);
        return models::detect_family(files).label;
    };
    const std::string k = "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight";
    EXPECT_EQ(family_of({{k, "F16", {4, 768}, std::vector<uint8_t>(4 * 768 * 2)}}), "SD1.x");
    EXPECT_EQ(family_of({{k, "F16", {4, 1024}, std::vector<uint8_t>(4 * 1024 * 2)}}), "SD2.x");
    EXPECT_EQ(
        family_of({{k, "F16", {4, 768}, std::vector<uint8_t>(4 * 768 * 2)},
                   {"model.diffusion_model.input_blocks.0.0.weight", "F16", {2, 9, 1, 1}, std::vector<uint8_t>(36)}}),
        "SD1.x inpainting");
    EXPECT_EQ(family_of({{"model.diffusion_model.label_emb.0.0.weight", "F16", {2}, std::vector<uint8_t>(4)}}), "SDXL");
    EXPECT_EQ(family_of({{"double_blocks.0.img_attn.qkv.weight", "F16", {2}, std::vector<uint8_t>(4)}}),
              "Flux.1-schnell");
    EXPECT_EQ(family_of({{"double_blocks.0.img_attn.qkv.weight", "F16", {2}, std::vector<uint8_t>(4)},
                         {"guidance_in.in_layer.weight", "F16", {2}, std::vector<uint8_t>(4)}}),
              "Flux.1-dev");
    EXPECT_EQ(family_of({{"double_blocks.0.img_attn.qkv.weight", "F16", {2}, std::vector<uint8_t>(4)},
                         {"distilled_guidance_layer.in_proj.weight", "F16", {2}, std::vector<uint8_t>(4)}}),
              "Chroma");
    // SD3's variants from the MMDiT's weights: no QK norm, QK norm, MMDiT-X's attn2.
    const test::SafetensorsEntry mmdit{"joint_blocks.0.x_block.attn.qkv.weight", "F16", {2}, std::vector<uint8_t>(4)};
    const test::SafetensorsEntry ln_q{"joint_blocks.0.x_block.attn.ln_q.weight", "F16", {2}, std::vector<uint8_t>(4)};
    const test::SafetensorsEntry attn2{"joint_blocks.0.x_block.attn2.qkv.weight", "F16", {2}, std::vector<uint8_t>(4)};
    EXPECT_EQ(family_of({mmdit}), "SD3-Medium");
    EXPECT_EQ(family_of({mmdit, ln_q}), "SD3.5-Large");
    EXPECT_EQ(family_of({mmdit, ln_q, attn2}), "SD3.5-Medium");
    EXPECT_EQ(family_of({{"encoder.conv_in.weight", "F16", {2}, std::vector<uint8_t>(4)},
                         {"decoder.conv_out.weight", "F16", {2}, std::vector<uint8_t>(4)}}),
              "VAE");
}

}  // namespace
}  // namespace kiln::io
