#include "pipeline/embeddings.h"

#include <gtest/gtest.h>

#include <cstring>

#include "golden.h"
#include "pipeline/conditioner.h"
#include "test_files.h"

namespace kiln::pipeline {
namespace {

TEST(Embeddings, ReadsA1111PtFiles) {
    auto vectors = read_embedding(std::string(KILN_FIXTURES_DIR) + "/embedding_a1111.pt", 64);
    ASSERT_TRUE(vectors.ok()) << vectors.error().message;
    ASSERT_EQ(vectors->size(), 128u);
    EXPECT_FLOAT_EQ((*vectors)[0], 0.0f);
    EXPECT_FLOAT_EQ((*vectors)[127], 1.27f);
    auto wrong = read_embedding(std::string(KILN_FIXTURES_DIR) + "/embedding_a1111.pt", 768);
    ASSERT_FALSE(wrong.ok());
    EXPECT_NE(wrong.error().message.find("no embedding vectors of width 768"), std::string::npos)
        << wrong.error().message;
}

std::unique_ptr<Model> load_tiny(const std::string& embeddings) {
    ModelPaths paths;
    paths.model = {test::golden_path("models/sd1_tiny.safetensors")};
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
    const ClipTokenizer& tok = plain->tokenizer();
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

TEST(Embeddings, BadFolderOrFileIsAnError) {
    ModelPaths paths;
    test::TempDir dir;
    dir.write("embd/broken.safetensors", std::string("not a model"));
    auto tok = ClipTokenizer::load(std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer");
    ASSERT_TRUE(tok.ok());
    auto table = load_embeddings(dir.file("embd"), 64, *tok);
    ASSERT_FALSE(table.ok());
    EXPECT_NE(table.error().message.find("broken.safetensors"), std::string::npos) << table.error().message;
    auto missing = load_embeddings(dir.file("nope"), 64, *tok);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.error().message.find("--embd-dir is not a folder"), std::string::npos);
}

}  // namespace
}  // namespace kiln::pipeline
