// kiln's T5Tokenizer on a umT5-shaped SentencePiece model (unigram, byte
// fallback, nmt_nfkc rules) against sentencepiece itself: the model and the
// ids sentencepiece gave for each text were written by
// training/make_umt5_tokenizer_fixture.py (tests/golden/text/).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "golden.h"
#include "text/t5_tokenizer.h"

namespace kiln::text {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

struct Case {
    std::string text;
    Ids ids;
    std::string decoded;
};

std::vector<Case> cases() {
    const std::string path = test::golden_path("text/umt5_like_ids.json");
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << "cannot open " << path;
    const json doc = json::parse(in);
    std::vector<Case> out;
    for (const json& c : doc.at("cases")) {
        out.push_back({c.at("text").get<std::string>(), c.at("ids").get<Ids>(), c.at("decoded").get<std::string>()});
    }
    EXPECT_FALSE(out.empty());
    return out;
}

T5Tokenizer umt5_like() {
    auto t = T5Tokenizer::load(test::golden_path("text/umt5_like_spiece.model"));
    if (!t.ok()) throw std::runtime_error(t.error().message);
    return std::move(t).value();
}

TEST(Umt5Tokenizer, LoadsWithByteFallbackAndT5Ids) {
    const T5Tokenizer t = umt5_like();
    EXPECT_EQ(t.size(), 500);
    EXPECT_EQ(t.pad_id(), 0);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_EQ(t.unk_id(), 2);
    EXPECT_EQ(t.piece_id("<0x00>"), 3);
    EXPECT_EQ(t.piece_id("<0xFF>"), 258);
}

TEST(Umt5Tokenizer, IdsMatchSentencepiece) {
    const T5Tokenizer t = umt5_like();
    bool bytes_seen = false;
    for (const Case& c : cases()) {
        SCOPED_TRACE("text: \"" + c.text + "\"");
        const Ids ids = t.encode(c.text);
        EXPECT_EQ(ids, c.ids);
        for (int32_t id : ids) bytes_seen |= id >= 3 && id <= 258;
    }
    // Characters outside the vocabulary (CJK, emoji) were spelled as bytes.
    EXPECT_TRUE(bytes_seen);
}

TEST(Umt5Tokenizer, DecodeMatchesSentencepiece) {
    const T5Tokenizer t = umt5_like();
    for (const Case& c : cases()) {
        SCOPED_TRACE("text: \"" + c.text + "\"");
        EXPECT_EQ(t.decode(c.ids), c.decoded);
    }
}

// A GGUF (city96's umt5-xxl-encoder files carry the tokenizer) keeps the
// byte pieces and the charsmap: the same ids.
TEST(Umt5Tokenizer, GgufMetadataGivesTheSameIds) {
    const T5Tokenizer t = umt5_like();
    auto from_gguf = T5Tokenizer::from_gguf_metadata(t.gguf_metadata(), "umt5 gguf");
    ASSERT_TRUE(from_gguf.ok()) << from_gguf.error().message;
    for (const Case& c : cases()) {
        SCOPED_TRACE("text: \"" + c.text + "\"");
        EXPECT_EQ(from_gguf->encode(c.text), c.ids);
    }
}

}  // namespace
}  // namespace kiln::text
