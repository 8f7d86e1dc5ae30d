#include "pipeline/embeddings.h"

#include <gtest/gtest.h>

#include <cstring>

#include "golden.h"
#include "pipeline/conditioner.h"
#include "test_files.h"

namespace kiln::pipeline {
namespace {

TEST(Embeddings, ReadsA1111PtFiles) {
    auto vectors = read_embedding(std::string(KILN_FIXTURES_DIR) + "/embedding_a1111.pt", {"clip_l", 64});
    ASSERT_TRUE(vectors.ok()) << vectors.error().message;
    ASSERT_EQ(vectors->size(), 128u);
    EXPECT_FLOAT_EQ((*vectors)[0], 0.0f);
    EXPECT_FLOAT_EQ((*vectors)[127], 1.27f);
    auto wrong = read_embedding(std::string(KILN_FIXTURES_DIR) + "/embedding_a1111.pt", {"clip_l", 768});
    ASSERT_FALSE(wrong.ok());
    EXPECT_NE(wrong.error().message.find("no embedding vectors of width 768 (the clip_l text encoder's)"),
              std::string::npos)
        << wrong.error().message;
}

std::unique_ptr<Model> load_tiny(const std::string& embeddings, const std::string& model = "sd1_tiny") {
    ModelPaths paths;
    paths.model = {test::golden_path("models/" + model + ".safetensors")};
    // The tiny SDXL has no VAE of its own; conditioning needs none.
    if (model != "sd1_tiny") paths.vae = test::golden_path("models/sd1_tiny.safetensors");
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    paths.embeddings = embeddings;
    ModelOptions options;
    options.threads = 1;
    auto m = Model::load(paths, options);
    EXPECT_TRUE(m.ok()) << m.error().message;
    return m.ok() ? std::move(m).value() : nullptr;
}

// An embedding whose vectors are the token rows of "a" and "b</w>" must
// condition exactly like the prompt "ab".
TEST(Embeddings, EmbeddingWordEncodesLikeTheTokensItCopies) {
    auto plain = load_tiny("");
    ASSERT_TRUE(plain);
    const text::ClipTokenizer& tok = plain->tokenizer();
    const std::vector<int32_t> ids = tok.encode("ab");
    ASSERT_EQ(ids.size(), 2u);

    auto file = io::ModelFile::open({test::golden_path("models/sd1_tiny.safetensors")});
    ASSERT_TRUE(file.ok());
    const io::TensorInfo* table =
        file->find("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight");
    ASSERT_NE(table, nullptr);
    const int64_t width = table->shape[1];
    std::vector<uint8_t> rows;
    for (int32_t id : ids) {
        const uint8_t* row = file->data(*table) + static_cast<size_t>(id) * static_cast<size_t>(width) * 2;  // F16
        rows.insert(rows.end(), row, row + width * 2);
    }
    test::TempDir dir;
    dir.write("embd/mytoken.safetensors", test::build_safetensors({{"emb_params", "F16", {2, width}, rows}}));

    auto with_embedding = load_tiny(dir.file("embd"));
    ASSERT_TRUE(with_embedding);
    ASSERT_EQ(with_embedding->tokenizer().embeddings().size(), 1u);
    EXPECT_EQ(
        with_embedding->tokenizer().encode("mytoken"),
        (std::vector<int32_t>{with_embedding->tokenizer().vocab_size(), with_embedding->tokenizer().vocab_size() + 1}));

    auto expected = encode_prompt(*plain, "ab", 1);
    auto actual = encode_prompt(*with_embedding, "mytoken", 1);
    ASSERT_TRUE(expected.ok() && actual.ok());
    EXPECT_EQ(actual->hidden, expected->hidden);
    auto other = encode_prompt(*with_embedding, "zz", 1);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->hidden, expected->hidden);
}

// The token-table rows of `ids` in `table` (F16), as raw bytes.
std::vector<uint8_t> token_rows(const io::ModelFile& file, const std::string& table, const std::vector<int32_t>& ids) {
    const io::TensorInfo* t = file.find(table);
    EXPECT_NE(t, nullptr) << table;
    if (!t) return {};
    const auto row_bytes = static_cast<size_t>(t->shape[1]) * 2;
    std::vector<uint8_t> rows;
    for (int32_t id : ids) {
        const uint8_t* row = file.data(*t) + static_cast<size_t>(id) * row_bytes;
        rows.insert(rows.end(), row, row + row_bytes);
    }
    return rows;
}

// SDXL's embedding files carry a clip_l and a clip_g tensor: each encoder
// takes its own. An embedding made of each table's rows of "a" and "b</w>"
// conditions exactly like "ab" (context and pooled vector); swapping the
// two tensors' names would not.
TEST(Embeddings, SdxlEncodersEachTakeTheirOwnVectors) {
    auto plain = load_tiny("", "sdxl_tiny");
    ASSERT_TRUE(plain);
    const std::vector<int32_t> ids = plain->tokenizer().encode("ab");
    ASSERT_EQ(ids.size(), 2u);
    auto file = io::ModelFile::open({test::golden_path("models/sdxl_tiny.safetensors")});
    ASSERT_TRUE(file.ok());
    const auto clip_l =
        token_rows(*file, "conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight", ids);
    const auto clip_g = token_rows(*file, "conditioner.embedders.1.model.token_embedding.weight", ids);
    ASSERT_NE(clip_l, clip_g);
    const int64_t width = static_cast<int64_t>(clip_l.size() / 4);  // two F16 rows

    // "mytoken" encoded with an embedding whose clip_l and clip_g tensors hold `l` and `g`.
    auto encode_with = [&](const std::vector<uint8_t>& l, const std::vector<uint8_t>& g) -> Result<Conditioning> {
        test::TempDir dir;
        dir.write("embd/mytoken.safetensors",
                  test::build_safetensors({{"clip_g", "F16", {2, width}, g}, {"clip_l", "F16", {2, width}, l}}));
        auto model = load_tiny(dir.file("embd"), "sdxl_tiny");
        if (!model) return Error{"the model did not load"};
        return encode_prompt(*model, "mytoken", 0);
    };
    auto expected = encode_prompt(*plain, "ab", 0);
    auto actual = encode_with(clip_l, clip_g);
    ASSERT_TRUE(expected.ok() && actual.ok());
    EXPECT_EQ(actual->hidden, expected->hidden);
    EXPECT_EQ(actual->pooled, expected->pooled);
    auto swapped = encode_with(clip_g, clip_l);
    ASSERT_TRUE(swapped.ok());
    EXPECT_NE(swapped->hidden, expected->hidden);
}

// A shared folder: an embedding made for another model (no vectors of this
// model's widths) is skipped, as A1111 skips it; its word stays plain text,
// and the folder's other embeddings load.
TEST(Embeddings, FileForAnotherModelIsSkipped) {
    auto plain = load_tiny("", "sdxl_tiny");
    ASSERT_TRUE(plain);
    test::TempDir dir;
    dir.write("embd/other.safetensors", test::build_safetensors({{"emb_params", "F32", {2, 7}, test::f32_bytes(14)}}));
    auto model = load_tiny(dir.file("embd"), "sdxl_tiny");
    ASSERT_TRUE(model);
    auto expected = encode_prompt(*plain, "other", 0);
    auto actual = encode_prompt(*model, "other", 0);
    ASSERT_TRUE(expected.ok() && actual.ok());
    EXPECT_EQ(actual->hidden, expected->hidden);
}

// A file that gives the two encoders different numbers of vectors is an
// error naming the file and both encoders.
TEST(Embeddings, SdxlFileWithUnequalVectorCountsIsAnError) {
    test::TempDir dir;
    const std::string path = dir.write("embd/uneven.safetensors",
                                       test::build_safetensors({{"clip_l", "F32", {2, 32}, test::f32_bytes(64)},
                                                                {"clip_g", "F32", {3, 32}, test::f32_bytes(96)}}));
    ModelPaths paths;
    paths.model = {test::golden_path("models/sdxl_tiny.safetensors")};
    paths.vae = test::golden_path("models/sd1_tiny.safetensors");
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    paths.embeddings = dir.file("embd");
    ModelOptions options;
    options.threads = 1;
    auto m = Model::load(paths, options);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().message, path + ": 2 vectors for clip_l but 3 for clip_g");
}

TEST(Embeddings, BadFolderOrFileIsAnError) {
    ModelPaths paths;
    test::TempDir dir;
    dir.write("embd/broken.safetensors", std::string("not a model"));
    auto tok = text::ClipTokenizer::load(std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer");
    ASSERT_TRUE(tok.ok());
    auto table = load_embeddings(dir.file("embd"), {{"clip_l", 64}}, *tok);
    ASSERT_FALSE(table.ok());
    EXPECT_NE(table.error().message.find("broken.safetensors"), std::string::npos) << table.error().message;
    auto missing = load_embeddings(dir.file("nope"), {{"clip_l", 64}}, *tok);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.error().message.find("--embd-dir is not a folder"), std::string::npos);
}

}  // namespace
}  // namespace kiln::pipeline
