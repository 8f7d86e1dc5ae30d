// FLUX.2 [dev] through the pipeline on tiny random-weight parts
// (training/make_flux2_dev_fixtures.py): a DiT with guidance_in by
// --diffusion-model, FLUX.2's autoencoder by --vae, a 32-layer Mistral in
// Mistral3ForConditionalGeneration's names (with a vision tower kiln never
// loads) by --llm, and a tiny Tekken tokenizer. The conditioning (BFL's
// system message under Mistral's template, hidden_states 10, 20, 30 side by
// side, zeros to 512 tokens) against the fixture, whose ids come from
// training/reference/tekken.py (Python's regex and tiktoken's merge rule)
// and whose states from training/reference/qwen3.py's Llama; the family's
// defaults; guidance through the DiT; and the parts that do not go together
// refused with one clear error each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "golden.h"
#include "image/image.h"
#include "models/nets/llm_encoder.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/model.h"
#include "shared_model_suite.h"
#include "test_files.h"
#include "text/byte_level.h"
#include "text/llm_tokenizer.h"
#include "util/base64.h"

namespace kiln {
namespace {

using pipeline::GenerationRequest;
using pipeline::Model;
using pipeline::ModelPaths;
using test::golden_path;

std::string model(const std::string& name) { return golden_path("models/" + name); }
std::string tekken_tokenizer() { return golden_path("pipeline/flux2_dev_tiny/tokenizer"); }

ModelPaths dev_parts() {
    ModelPaths paths;
    paths.diffusion_model = model("flux2_dev_tiny.safetensors");
    paths.vae = model("flux2_ae_tiny.safetensors");
    paths.llm = model("flux2_dev_mistral_tiny.safetensors");
    paths.tokenizer = "llm=" + tekken_tokenizer();
    return paths;
}

using Flux2DevPipeline = test::SharedModelSuite<dev_parts>;

TEST_F(Flux2DevPipeline, IsDevWithItsDefaults) {
    EXPECT_EQ(model_->family_label(), "FLUX.2-dev");
    EXPECT_EQ(model_->defaults().steps, 50);
    EXPECT_EQ(model_->defaults().cfg_scale, 1.0f);
    EXPECT_EQ(model_->defaults().guidance, 4.0f);
    ASSERT_EQ(model_->text_encoders().size(), 1u);
    EXPECT_EQ(model_->text_encoders().front().width(), 48);
    EXPECT_EQ(pipeline::context_length(*model_, nullptr), 512);
    const std::string prompt = "a red fox in the snow";
    EXPECT_EQ(pipeline::context_length(*model_, &prompt), 512);
    const auto* llm = dynamic_cast<const models::LlmEncoder*>(model_->text_encoders().front().network);
    ASSERT_NE(llm, nullptr);
    EXPECT_EQ(llm->declared_layers(), 30) << "the layers after hidden_states 30 are never loaded";
    EXPECT_TRUE(model_->family().reference_images);
}

// The prompt's ids are the reference tokenizer's, template included, and
// its context is the reference's rows then zeros to 512.
TEST_F(Flux2DevPipeline, ConditioningIsTheReferencesStatesPaddedWithZeros) {
    auto io = io::ModelFile::open({model("flux2_dev_mistral_tiny_io.safetensors")});
    ASSERT_TRUE(io.ok()) << io.error().message;
    const auto ids = test::fixture_tensor(*io, "ids").values;
    const auto want = test::fixture_tensor(*io, "out").values;
    const std::string prompt = "a red fox in the snow";

    const pipeline::LlmPrompt input =
        pipeline::llm_prompt(model_->llm_tokenizer(), *model_->text_encoders().front().use, prompt);
    EXPECT_EQ(input.ids, std::vector<int32_t>(ids.begin(), ids.end()));
    EXPECT_EQ(input.ids.front(), 1) << "<s>";
    EXPECT_TRUE(input.real.empty()) << "dev's ids are not padded: its states are";

    auto c = pipeline::encode_prompt(*model_, prompt, 0, {});
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_EQ(c->tokens, 512);
    ASSERT_EQ(c->width, 48);
    const std::vector<float> real(c->hidden.begin(), c->hidden.begin() + static_cast<long>(want.size()));
    EXPECT_LT(test::relative_error(real, want), 1e-4);
    EXPECT_TRUE(std::all_of(c->hidden.begin() + static_cast<long>(want.size()), c->hidden.end(),
                            [](float v) { return v == 0.0f; }));
}

// BFL's text_encoder/ safetensors carry no metadata: the family's Mistral
// theta (1e9) and epsilon (1e-5) stand in, and the context is the same.
TEST(Flux2DevPipelineFiles, MistralWithoutMetadataTakesTheFamilysRopeAndEpsilon) {
    std::vector<uint8_t> bytes = test::read_bytes(model("flux2_dev_mistral_tiny.safetensors"));
    uint64_t header_size = 0;
    std::memcpy(&header_size, bytes.data(), 8);
    nlohmann::json header =
        nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(header_size));
    ASSERT_EQ(header["__metadata__"].erase("llama.rope.freq_base"), 1u);
    ASSERT_EQ(header["__metadata__"].erase("llama.attention.layer_norm_rms_epsilon"), 1u);
    std::string text = header.dump();
    text.resize(header_size, ' ');  // the same length: the data offsets stay
    ASSERT_EQ(text.size(), header_size) << "the edited header is longer";
    std::memcpy(bytes.data() + 8, text.data(), text.size());
    test::TempDir dir;
    ModelPaths paths = dev_parts();
    paths.llm = dir.write("text_encoder.safetensors", bytes);
    auto loaded = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    const auto* llm = dynamic_cast<const models::LlmEncoder*>((*loaded)->text_encoders().front().network);
    ASSERT_NE(llm, nullptr);
    EXPECT_EQ(llm->config().rope_theta, 1e9f);
    EXPECT_EQ(llm->config().norm_eps, 1e-5f);

    auto io = io::ModelFile::open({model("flux2_dev_mistral_tiny_io.safetensors")});
    ASSERT_TRUE(io.ok()) << io.error().message;
    const auto want = test::fixture_tensor(*io, "out").values;
    auto c = pipeline::encode_prompt(**loaded, "a red fox in the snow", 0, {});
    ASSERT_TRUE(c.ok()) << c.error().message;
    const std::vector<float> real(c->hidden.begin(), c->hidden.begin() + static_cast<long>(want.size()));
    EXPECT_LT(test::relative_error(real, want), 1e-4);
}

// Mistral's own tekken.json (raw bytes by rank, special tokens apart), made
// here from the fixture's tokenizer.json as mistral_common lays one out:
// the same ids as tokenizer.json and as the reference tokenizer, and found
// in a folder as Mistral Small's repository has it.
TEST(Flux2DevPipelineFiles, TekkenJsonGivesTheIdsOfTokenizerJson) {
    const nlohmann::json tj = nlohmann::json::parse(test::read_bytes(tekken_tokenizer() + "/tokenizer.json"));
    constexpr int kSpecial = 1000;
    nlohmann::json vocab = nlohmann::json::array(), specials = nlohmann::json::array();
    for (const auto& [text, id] : tj["model"]["vocab"].items()) {
        const int rank = id.get<int>() - kSpecial;
        if (rank < 0) continue;
        std::string bytes;
        text::append_token_bytes(text, bytes);
        vocab.push_back({{"rank", rank},
                         {"token_bytes", base64_encode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())},
                         {"token_str", nullptr}});
    }
    for (const auto& added : tj["added_tokens"]) {
        if (added["content"].get<std::string>().rfind("<SPECIAL_", 0) == 0) continue;  // filled in by the reader
        specials.push_back({{"rank", added["id"]}, {"token_str", added["content"]}, {"is_control", true}});
    }
    const int vocab_size = kSpecial + static_cast<int>(vocab.size());
    vocab.push_back({{"rank", vocab_size}, {"token_bytes", "eHl6"}, {"token_str", "xyz"}});  // past the used size
    const nlohmann::json tekken = {{"config",
                                    {{"pattern", std::string(text::tekken_split_pattern())},
                                     {"num_vocab_tokens", vocab_size + 1},
                                     {"default_vocab_size", vocab_size},
                                     {"default_num_special_tokens", kSpecial},
                                     {"version", "v7"}}},
                                   {"vocab", vocab},
                                   {"special_tokens", specials}};
    test::TempDir dir;
    dir.write("Mistral-Small/tekken.json", tekken.dump());

    auto from_tekken = text::LlmTokenizer::load(dir.file("Mistral-Small"));
    ASSERT_TRUE(from_tekken.ok()) << from_tekken.error().message;
    auto from_json = text::LlmTokenizer::load(tekken_tokenizer());
    ASSERT_TRUE(from_json.ok()) << from_json.error().message;
    EXPECT_EQ(from_tekken->pre_tokenizer(), text::LlmPreTokenizer::Tekken);
    EXPECT_EQ(from_tekken->size(), vocab_size) << "the rank past default_vocab_size is cut";
    EXPECT_EQ(from_tekken->token_text(20), "<SPECIAL_20>");
    for (const std::string text :
         {std::string("<s>[SYSTEM_PROMPT]You are an AI that reasons about image descriptions.[/SYSTEM_PROMPT]"),
          std::string("[INST]a red fox in the snow, HELLO world\n\n  3.14 caf\xC3\xA9[/INST]")}) {
        EXPECT_EQ(from_tekken->encode(text), from_json->encode(text)) << text;
    }
    auto io = io::ModelFile::open({model("flux2_dev_mistral_tiny_io.safetensors")});
    ASSERT_TRUE(io.ok()) << io.error().message;
    const auto ids = test::fixture_tensor(*io, "ids").values;
    const std::string chat = std::string(
        "<s>[SYSTEM_PROMPT]You are an AI that reasons about image descriptions. You "
        "give structured responses focusing on object relationships, object\n"
        "attribution and actions without speculation.[/SYSTEM_PROMPT][INST]a red "
        "fox in the snow[/INST]");
    EXPECT_EQ(from_tekken->encode(chat), std::vector<int32_t>(ids.begin(), ids.end()));

    // Beside the weights, as Mistral's repository keeps it: found without --tokenizer.
    ModelPaths beside = dev_parts();
    beside.tokenizer.clear();
    beside.llm =
        dir.write("Mistral-Small/model.safetensors", test::read_bytes(model("flux2_dev_mistral_tiny.safetensors")));
    auto loaded = Model::load(beside, test::golden_model_options());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    EXPECT_EQ(pipeline::llm_prompt((*loaded)->llm_tokenizer(), *(*loaded)->text_encoders().front().use,
                                   "a red fox in the snow")
                  .ids,
              std::vector<int32_t>(ids.begin(), ids.end()));

    nlohmann::json other = tekken;
    other["config"]["pattern"] = "\\s+";
    dir.write("other/tekken.json", other.dump());
    auto refused = text::LlmTokenizer::load(dir.file("other/tekken.json"));
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(
        refused.error().message.find("tekken.json: config.pattern is \"\\x5c\\x5cs+\", not Tekken's split pattern"),
        std::string::npos)
        << refused.error().message;
}

// Guidance reaches the DiT's embedding: the family's 4 and 1 give other
// images; the same seed gives the same image.
TEST_F(Flux2DevPipeline, TextToImageTakesGuidance) {
    GenerationRequest r;
    r.prompt = "a red fox in the snow";
    r.width = r.height = 16;
    r.steps = 2;
    r.seed = 7;
    auto a = pipeline::generate(*model_, r);
    ASSERT_TRUE(a.ok()) << a.error().message;
    auto b = pipeline::generate(*model_, r);
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ((*a)[0].image.pixels, (*b)[0].image.pixels);
    r.guidance = 1.0f;
    auto c = pipeline::generate(*model_, r);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_NE((*a)[0].image.pixels, (*c)[0].image.pixels);
}

// Parts of klein and dev do not mix: each one clear error.
TEST(Flux2DevPipelineParts, KleinAndDevPartsAreRefused) {
    // dev's DiT with klein's Qwen3 (and its tokenizer): dev reads a layer
    // klein's encoder does not have.
    ModelPaths qwen = dev_parts();
    qwen.llm = model("flux2_klein_qwen3_tiny.safetensors");
    qwen.tokenizer = "llm=" + golden_path("pipeline/z_image_tiny/tokenizer");
    auto refused = Model::load(qwen, test::golden_model_options());
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::BadFile);
    EXPECT_NE(refused.error().message.find("the first 30 layers are read, but the file has 28"), std::string::npos)
        << refused.error().message;

    // Mistral with Qwen's tokenizer: Qwen has no [INST].
    ModelPaths wrong_tokenizer = dev_parts();
    wrong_tokenizer.tokenizer = "llm=" + golden_path("pipeline/z_image_tiny/tokenizer");
    auto mixed = Model::load(wrong_tokenizer, test::golden_model_options());
    ASSERT_FALSE(mixed.ok());
    EXPECT_NE(mixed.error().message.find("the llm tokenizer has no <s> token, which FLUX.2-dev's prompt template is "
                                         "written in"),
              std::string::npos)
        << mixed.error().message;

    // klein's DiT with Mistral and its Tekken tokenizer: no Qwen padding.
    ModelPaths klein = dev_parts();
    klein.diffusion_model = model("flux2_tiny.safetensors");
    auto klein_mistral = Model::load(klein, test::golden_model_options());
    ASSERT_FALSE(klein_mistral.ok());
    EXPECT_NE(klein_mistral.error().message.find("has no <|endoftext|> token to pad FLUX.2-klein's prompts"),
              std::string::npos)
        << klein_mistral.error().message;
}

}  // namespace
}  // namespace kiln
