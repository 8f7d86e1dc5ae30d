// --tensor-type-rules (io/tensor_type_rules.h): sd-cli's "PATTERN=TYPE,..."
// parsed and refused as a usage error when malformed; a loaded model's
// matrices typed by the first matching rule under any of the three
// spellings of their names, before --type; -M convert typing the file's
// names the same way; and the command line end to end.
#include "io/tensor_type_rules.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "golden.h"
#include "io/gguf_writer.h"
#include "pipeline/model.h"

namespace kiln {
namespace {

using io::TensorTypeRules;
using test::golden_path;

TensorTypeRules rules(const std::string& text) {
    auto parsed = TensorTypeRules::parse(text);
    EXPECT_TRUE(parsed.ok()) << parsed.error().message;
    return parsed.ok() ? std::move(parsed).value() : TensorTypeRules{};
}

std::string parse_error(const std::string& text) {
    auto parsed = TensorTypeRules::parse(text);
    EXPECT_FALSE(parsed.ok()) << text;
    if (parsed.ok()) return "";
    EXPECT_EQ(parsed.error().kind, ErrorKind::InvalidRequest);
    return parsed.error().message;
}

TEST(TensorTypeRules, ParsesSdCliSyntax) {
    const TensorTypeRules r = rules(" ^vae\\.=f16 ,, attn=Q4_K,x(?=y)=q8_0,");
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r.text(0), "^vae\\.=f16");
    EXPECT_EQ(r.type(0), GGML_TYPE_F16);
    EXPECT_EQ(r.type(1), GGML_TYPE_Q4_K);
    // The type follows the last '=': a pattern may hold one.
    EXPECT_EQ(r.type(2), GGML_TYPE_Q8_0);
    EXPECT_TRUE(rules("").empty());
    EXPECT_TRUE(rules(" , ").empty());
}

TEST(TensorTypeRules, FirstMatchingRuleDecidesUnderAnySpelling) {
    const TensorTypeRules r = rules("^vae\\.=f16,attn=q8_0,diffusion=bf16");
    EXPECT_EQ(r.match({"first_stage_model.decoder.conv_in.weight", "vae.decoder.conv_in.weight"}), 0u);
    EXPECT_EQ(r.match({"vae.mid.attn_1.q.weight"}), 0u);  // before attn
    EXPECT_EQ(r.match({"model.diffusion_model.x.attn1.to_q.weight"}), 1u);
    EXPECT_EQ(r.match({"model.diffusion_model.out.0.weight"}), 2u);
    EXPECT_EQ(r.match({"cond_stage_model.transformer.text_model.final_layer_norm.weight"}), std::nullopt);
    // Searched, not anchored unless the pattern says so.
    EXPECT_EQ(r.match({"my.vae.x"}), std::nullopt);
}

TEST(TensorTypeRules, MalformedRulesAreUsageErrorsNamingTheEntry) {
    EXPECT_EQ(parse_error("attn"), "--tensor-type-rules: 'attn' is not PATTERN=TYPE (e.g. \"^vae\\.=f16,attn=q8_0\")");
    EXPECT_EQ(parse_error("=f16").rfind("--tensor-type-rules: '=f16' is not PATTERN=TYPE", 0), 0u);
    EXPECT_EQ(parse_error("vae=").rfind("--tensor-type-rules: 'vae=' is not PATTERN=TYPE", 0), 0u);
    EXPECT_EQ(parse_error("vae=f16,attn=q9_9")
                  .rfind("--tensor-type-rules: 'attn=q9_9': unknown type 'q9_9' (valid: f32, "
                         "f16, bf16, q8_0",
                         0),
              0u);
    EXPECT_EQ(
        parse_error("(vae=f16").rfind("--tensor-type-rules: '(vae=f16': the pattern is not a regular expression", 0),
        0u);
    EXPECT_EQ(parse_error("[a-=q8_0").rfind("--tensor-type-rules: '[a-=q8_0': the pattern is not", 0), 0u);
}

// The tiny SD1 checkpoint (every tensor F16, widths of 32 and 64) loaded
// with `options`: each declared tensor's compute type by its name in the file.
std::map<std::string, ggml_type> loaded_types(pipeline::ModelOptions options,
                                              std::map<std::string, std::vector<size_t>>* matches = nullptr) {
    pipeline::ModelPaths paths;
    paths.model = {golden_path("models/sd1_tiny.safetensors")};
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    options.threads = 1;
    auto model = pipeline::Model::load(paths, options);
    EXPECT_TRUE(model.ok()) << model.error().message;
    std::map<std::string, ggml_type> types;
    if (!model.ok()) return types;
    for (const auto& module : (*model)->modules()) {
        for (const auto& [tensor, info] : module->weights().declared()) types[info->name] = tensor->type;
        if (matches) (*matches)[module->spec.name] = module->weights().rule_matches();
    }
    return types;
}

bool is_matrix(const std::string& name) { return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0; }

TEST(TensorTypeRules, TypeAModelsModulesBeforeType) {
    pipeline::ModelOptions options;
    options.weight_type = GGML_TYPE_F32;
    // sd-cli's spelling of the UNet, kiln's of the VAE, the file's of the CLIP.
    options.tensor_type_rules = rules(
        "^model\\.diffusion_model\\..*attn\\d\\.to_q=q8_0,^vae\\.=bf16,"
        "^text_encoders\\.clip_l\\..*fc1=f16,never_a_name=q4_0");
    std::map<std::string, std::vector<size_t>> matches;
    const auto types = loaded_types(options, &matches);
    ASSERT_FALSE(types.empty());
    int quantized = 0, vae = 0, fc1 = 0;
    for (const auto& [name, type] : types) {
        SCOPED_TRACE(name);
        const bool vector = type == GGML_TYPE_F32 && !is_matrix(name);
        if (name.find(".attn") != std::string::npos && name.find(".to_q.weight") != std::string::npos &&
            name.rfind("model.diffusion_model.", 0) == 0) {
            EXPECT_EQ(type, GGML_TYPE_Q8_0);  // rows of 32 and 64 fill Q8_0's blocks
            ++quantized;
        } else if (name.rfind("first_stage_model.", 0) == 0 && name.find("norm") == std::string::npos &&
                   is_matrix(name)) {
            EXPECT_EQ(type, GGML_TYPE_BF16);
            ++vae;
        } else if (name.find("mlp.fc1.") != std::string::npos) {
            EXPECT_EQ(type, name.find(".bias") == std::string::npos ? GGML_TYPE_F16 : GGML_TYPE_F32);
            ++fc1;  // the bias matches too, and stays F32
        } else if (!vector) {
            EXPECT_EQ(type, GGML_TYPE_F32) << "--type applies where no rule matched";
        }
    }
    EXPECT_GT(quantized, 0);
    EXPECT_GT(vae, 0);
    EXPECT_GT(fc1, 0);
    // Every rule's matches are counted per module; the last matched none.
    EXPECT_EQ(matches["unet"][0], static_cast<size_t>(quantized));
    EXPECT_EQ(matches["clip_l"][0] + matches["vae"][0], 0u);
    EXPECT_GT(matches["vae"][1], 0u);
    EXPECT_EQ(matches["clip_l"][2], static_cast<size_t>(fc1));
    EXPECT_EQ(matches["unet"][3] + matches["clip_l"][3] + matches["vae"][3], 0u);
}

TEST(TensorTypeRules, NoRulesLeaveTypeAlone) {
    pipeline::ModelOptions plain;
    plain.weight_type = GGML_TYPE_F16;
    pipeline::ModelOptions with_rules = plain;
    with_rules.tensor_type_rules = rules("matches_nothing=q8_0");
    EXPECT_EQ(loaded_types(plain), loaded_types(with_rules));
}

TEST(TensorTypeRules, ConvertTypesTheFilesNames) {
    test::TempDir dir;
    auto model = io::ModelFile::open({golden_path("models/sd1_tiny.safetensors")});
    ASSERT_TRUE(model.ok()) << model.error().message;
    io::GgufWriteOptions options;
    options.type = GGML_TYPE_Q8_0;
    options.rules = rules("^first_stage_model\\.=f16");
    ASSERT_TRUE(io::write_gguf(*model, dir.file("out.gguf"), options).ok());
    auto written = io::ModelFile::open({dir.file("out.gguf")});
    ASSERT_TRUE(written.ok()) << written.error().message;
    const io::TensorInfo* vae = written->find("first_stage_model.decoder.conv_in.weight");
    const io::TensorInfo* unet = written->find("model.diffusion_model.time_embed.0.weight");
    ASSERT_TRUE(vae && unet);
    EXPECT_EQ(vae->dtype, io::DType::F16);
    EXPECT_EQ(unet->dtype, io::dtype_from_ggml(GGML_TYPE_Q8_0));
}

TEST(TensorTypeRules, CommandLineEndToEnd) {
    test::TempDir dir;
    const std::string out = dir.file("rules.png");
    auto r = test::run_command(test::kiln_with_sd1_tiny("-p cat -W 64 -H 64 --steps 2 -v -o " + out +
                                                        " --tensor-type-rules '^vae\\.=f16,zzz=q8_0'"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string log = r.out + r.err;
    EXPECT_NE(log.find("--tensor-type-rules: '^vae\\.=f16' matches tensors of vae 124"), std::string::npos) << log;
    EXPECT_NE(log.find("--tensor-type-rules: 'zzz=q8_0' matches no tensor of SD1.x"), std::string::npos) << log;
    EXPECT_TRUE(std::ifstream(out).good());

    const std::string bad = dir.file("bad.png");
    r = test::run_command(
        test::kiln_with_sd1_tiny("-p cat -W 64 -H 64 --steps 2 -o " + bad + " --tensor-type-rules 'vae=f17'"));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("error: --tensor-type-rules: 'vae=f17': unknown type 'f17'", 0), 0u) << r.err;
    EXPECT_FALSE(std::ifstream(bad).good());
}

}  // namespace
}  // namespace kiln
