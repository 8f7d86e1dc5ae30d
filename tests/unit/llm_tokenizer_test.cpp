#include "text/llm_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gguf.h"
#include "io/model_file.h"
#include "test_files.h"
#include "text/utf8.h"

namespace kiln::text {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
using Pieces = std::vector<std::string>;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

LlmTokenizer must_load(Result<LlmTokenizer> t) {
    if (!t.ok()) ADD_FAILURE() << t.error().message;
    return std::move(t).value();
}

Error load_error(const Result<LlmTokenizer>& t) {
    if (t.ok()) {
        ADD_FAILURE() << "loaded, but an error was expected";
        return Error{"(loaded)"};
    }
    return t.error();
}

// ---- the test's own vocabulary ----
//
// Ids 0..255: GPT-2's byte characters in bytes_to_unicode order (the
// layout of every GPT-2-family vocabulary), then the merges' results, then
// the added tokens.

std::string byte_char(int b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return u32_to_utf8(std::u32string(1, static_cast<char32_t>(b)));
    int extra = 0;
    for (int x = 0; x < b; ++x) {
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++extra;
    }
    return u32_to_utf8(std::u32string(1, static_cast<char32_t>(256 + extra)));
}

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"},      // 256 he
    {"l", "l"},      // 257 ll
    {"he", "ll"},    // 258 hell
    {"hell", "o"},   // 259 hello
    {"Ġ", "w"},      // 260 Ġw
    {"o", "r"},      // 261 or
    {"Ġw", "or"},    // 262 Ġwor
    {"Ġwor", "l"},   // 263 Ġworl
    {"Ġworl", "d"},  // 264 Ġworld
    {"Ġ", "Ġ"},      // 265 ĠĠ
    {"Ċ", "Ċ"},      // 266 ĊĊ
    {"Ġ", "h"},      // 267 Ġh
    {"Ġh", "ello"},  // 268 Ġhello (needs "ello": never formed, so never used)
    {"e", "l"},      // 269 el
    {"el", "lo"},    // 270 ello (needs "lo": never formed)
    {"l", "o"},      // 271 lo
    {"u", "s"},      // 272 us
    {"e", "r"},      // 273 er
    {"us", "er"},    // 274 user
    {"ä", "¸"},      // 275: the first two bytes of 中 (E4 B8 AD)
    {"ä¸", "Ń"},     // 276 中
};
const std::vector<std::string> kAdded = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"};
constexpr int32_t kEndOfText = 277, kImStart = 278, kImEnd = 279, kThink = 280;

std::vector<std::string> test_tokens() {
    // bytes_to_unicode order: the printable bytes first, then the others.
    std::vector<std::string> tokens;
    std::vector<int> order;
    for (int b = 0; b < 256; ++b) {
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) order.push_back(b);
    }
    for (int b = 0; b < 256; ++b) {
        if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) order.push_back(b);
    }
    for (int b : order) tokens.push_back(byte_char(b));
    for (const auto& [a, b] : kMerges) tokens.push_back(a + b);
    for (const std::string& a : kAdded) tokens.push_back(a);
    return tokens;
}

int32_t id_of(const std::string& token) {
    const auto tokens = test_tokens();
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] == token) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no test token " << token;
    return -1;
}

int32_t byte_id(char c) { return id_of(byte_char(static_cast<uint8_t>(c))); }

json tokenizer_json() {
    const auto tokens = test_tokens();
    json vocab = json::object();
    for (size_t i = 0; i < tokens.size() - kAdded.size(); ++i) vocab[tokens[i]] = i;
    json merges = json::array();
    for (size_t i = 0; i < kMerges.size(); ++i) {
        // Both spellings HF writes: "a b" strings (older files) and pairs.
        if (i % 2 == 0) {
            merges.push_back(kMerges[i].first + " " + kMerges[i].second);
        } else {
            merges.push_back(json::array({kMerges[i].first, kMerges[i].second}));
        }
    }
    json added = json::array();
    for (size_t i = 0; i < kAdded.size(); ++i) {
        added.push_back({{"id", tokens.size() - kAdded.size() + i},
                         {"content", kAdded[i]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", kAdded[i] != "<think>"}});
    }
    return {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", {{"type", "NFC"}}},
            {"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers", json::array({{{"type", "Split"},
                                              {"pattern",
                                               {{"Regex",
                                                 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                                              {"behavior", "Isolated"},
                                              {"invert", false}},
                                             {{"type", "ByteLevel"},
                                              {"add_prefix_space", false},
                                              {"trim_offsets", false},
                                              {"use_regex", false}}})}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", ""},
              {"end_of_word_suffix", ""},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", merges}}}};
}

// vocab.json (no added tokens, as Qwen's), merges.txt, tokenizer_config.json.
void write_vocab_merges(const test::TempDir& dir, const std::string& sub, bool with_config) {
    const auto tokens = test_tokens();
    json vocab = json::object();
    for (size_t i = 0; i < tokens.size() - kAdded.size(); ++i) vocab[tokens[i]] = i;
    dir.write(sub + "vocab.json", vocab.dump());
    std::string merges = "#version: 0.2\n";
    for (const auto& [a, b] : kMerges) merges += a + " " + b + "\n";
    dir.write(sub + "merges.txt", merges);
    if (with_config) {
        json decoder = json::object();
        for (size_t i = 0; i < kAdded.size(); ++i) {
            decoder[std::to_string(tokens.size() - kAdded.size() + i)] = {{"content", kAdded[i]},
                                                                          {"special", kAdded[i] != "<think>"}};
        }
        dir.write(sub + "tokenizer_config.json",
                  json({{"tokenizer_class", "Qwen2Tokenizer"}, {"added_tokens_decoder", decoder}}).dump());
    }
}

// llama.cpp's keys as convert_hf_to_gguf.py writes them.
io::Metadata gguf_metadata() {
    io::Metadata m;
    const auto tokens = test_tokens();
    io::MetaValue t, types, merges;
    t.kind = types.kind = merges.kind = io::MetaValue::Kind::Array;
    for (size_t i = 0; i < tokens.size(); ++i) {
        t.array.push_back(io::MetaValue::of_string(tokens[i]));
        const bool added = i >= tokens.size() - kAdded.size();
        types.array.push_back(io::MetaValue::of_int(!added ? 1 : tokens[i] == "<think>" ? 4 : 3));
    }
    for (const auto& [a, b] : kMerges) merges.array.push_back(io::MetaValue::of_string(a + " " + b));
    m["tokenizer.ggml.model"] = io::MetaValue::of_string("gpt2");
    m["tokenizer.ggml.pre"] = io::MetaValue::of_string("qwen2");
    m["tokenizer.ggml.tokens"] = t;
    m["tokenizer.ggml.token_type"] = types;
    m["tokenizer.ggml.merges"] = merges;
    return m;
}

// The same as a vocab-only GGUF file written by ggml's own writer.
std::string write_gguf(const test::TempDir& dir, const std::string& name) {
    const io::Metadata m = gguf_metadata();
    gguf_context* ctx = gguf_init_empty();
    gguf_set_val_str(ctx, "general.architecture", "qwen2");
    gguf_set_val_str(ctx, "tokenizer.ggml.model", "gpt2");
    gguf_set_val_str(ctx, "tokenizer.ggml.pre", "qwen2");
    std::vector<const char*> tokens, merges;
    std::vector<int32_t> types;
    for (const auto& v : m.at("tokenizer.ggml.tokens").array) tokens.push_back(v.str.c_str());
    for (const auto& v : m.at("tokenizer.ggml.merges").array) merges.push_back(v.str.c_str());
    for (const auto& v : m.at("tokenizer.ggml.token_type").array) types.push_back(static_cast<int32_t>(v.i));
    gguf_set_arr_str(ctx, "tokenizer.ggml.tokens", tokens.data(), tokens.size());
    gguf_set_arr_str(ctx, "tokenizer.ggml.merges", merges.data(), merges.size());
    gguf_set_arr_data(ctx, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
    const std::string path = dir.file(name);
    EXPECT_TRUE(gguf_write_to_file(ctx, path.c_str(), true));
    gguf_free(ctx);
    return path;
}

LlmTokenizer test_tokenizer() {
    test::TempDir dir;
    return must_load(LlmTokenizer::from_tokenizer_json(dir.write("tokenizer.json", tokenizer_json().dump())));
}

// ---- pre-tokenisation ----

// The expected pieces are what Python's `regex` module gives for the
// patterns of Qwen2's tokenizer.json and GPT-2's (regex.findall).
TEST(LlmTokenizer, Qwen2PatternSplitsAsTheRegex) {
    const LlmTokenizer t = test_tokenizer();
    ASSERT_EQ(t.pre_tokenizer(), LlmPreTokenizer::Qwen2);
    const std::vector<std::pair<std::string, Pieces>> cases = {
        {"Hello world", {"Hello", " world"}},
        {"  Hello", {" ", " Hello"}},
        {"I'M here, you'Re 'll", {"I", "'M", " here", ",", " you", "'Re", " '", "ll"}},
        {"x\n\n  y", {"x", "\n\n", " ", " y"}},
        {"a  \n b", {"a", "  \n", " b"}},
        {"12345 abc", {"1", "2", "3", "4", "5", " abc"}},
        {" ((x)) \r\n\r\nz", {" ((", "x", "))", " \r\n\r\n", "z"}},
        {"\tword", {"\tword"}},
        {"end   ", {"end", "   "}},
        {"\xE4\xB8\xAD\xE6\x96\x87\xE5\xAD\x97\xE7\xAC\xA6"
         "123",
         {"\xE4\xB8\xAD\xE6\x96\x87\xE5\xAD\x97\xE7\xAC\xA6", "1", "2", "3"}},
        {"a\xE3\x80\x80"
         "b",
         {"a",
          "\xE3\x80\x80"
          "b"}},
        {"  !!\n\n", {" ", " !!\n\n"}},
        {"don't 'S", {"don", "'t", " '", "S"}},
        {"", {}},
    };
    for (const auto& [text, pieces] : cases) EXPECT_EQ(t.pre_tokenize(text), pieces) << text;
}

TEST(LlmTokenizer, Gpt2PatternSplitsAsTheRegex) {
    LlmBpeVocab v;
    v.tokens = {"a"};
    v.pre = LlmPreTokenizer::Gpt2;
    const LlmTokenizer t = must_load(LlmTokenizer::from_vocab(v, "gpt2"));
    ASSERT_EQ(t.pre_tokenizer(), LlmPreTokenizer::Gpt2);
    const std::vector<std::pair<std::string, Pieces>> cases = {
        {"Hello world", {"Hello", " world"}},
        {"  Hello", {" ", " Hello"}},
        {"I'M here, you'Re 'll", {"I", "'", "M", " here", ",", " you", "'", "Re", " '", "ll"}},
        {"x\n\n  y", {"x", "\n\n ", " y"}},
        {"a  \n b", {"a", "  \n", " b"}},
        {"12345 abc", {"12345", " abc"}},
        {" ((x)) \r\n\r\nz", {" ((", "x", "))", " \r\n\r", "\n", "z"}},
        {"\tword", {"\t", "word"}},
        {"end   ", {"end", "   "}},
        {"a\xE3\x80\x80"
         "b",
         {"a", "\xE3\x80\x80", "b"}},
        {"  !!\n\n", {" ", " !!", "\n\n"}},
        {"don't 'S", {"don", "'t", " '", "S"}},
    };
    for (const auto& [text, pieces] : cases) EXPECT_EQ(t.pre_tokenize(text), pieces) << text;
}

// Mistral's Tekken pattern: the expected pieces are Python's `regex` module
// (2022.10.31) running the pattern as Mistral's tokenizer.json writes it,
// regex.findall(pattern, text): an implementation kiln's does not share.
// Case, title case (U+01C5), modifier letters (U+02B0), combining marks
// (U+0301, Devanagari's vowel signs), CJK, emoji and the '/' after symbols.
TEST(LlmTokenizer, TekkenPatternSplitsAsTheRegex) {
    LlmBpeVocab v;
    v.tokens = {"a"};
    v.pre = LlmPreTokenizer::Tekken;
    const LlmTokenizer t = must_load(LlmTokenizer::from_vocab(v, "tekken"));
    ASSERT_EQ(t.pre_tokenizer(), LlmPreTokenizer::Tekken);
    const std::vector<std::pair<std::string, Pieces>> cases = {
        {"Hello World", {"Hello", " World"}},
        {"HELLOworld", {"HELLOworld"}},
        {"CamelCaseWord (ABCdef)", {"Camel", "Case", "Word", " (", "ABCdef", ")"}},
        {"don't stop", {"don", "'t", " stop"}},
        {"path/to/file\n/x", {"path", "/to", "/file", "\n", "/x"}},
        {"a\r\n\r\nb", {"a", "\r\n\r\n", "b"}},
        {"numbers 12345 and 3.14", {"numbers", " ", "1", "2", "3", "4", "5", " and", " ", "3", ".", "1", "4"}},
        {"\u01c4ungla \u01c5ungla", {"\u01c4ungla", " \u01c5ungla"}},
        {"\u02b0ello", {"\u02b0ello"}},
        {"e\u0301cole \u0301abc", {"e\u0301cole", " \u0301abc"}},
        {"\u4e2d\u6587\u5b57\u7b26", {"\u4e2d\u6587\u5b57\u7b26"}},
        {"\u00c0\u00c9\u00ce lower", {"\u00c0\u00c9\u00ce", " lower"}},
        {"mixed\U0001F600emoji", {"mixed", "\U0001F600emoji"}},
        {"tab\tx  trailing   ", {"tab", "\tx", " ", " trailing", "   "}},
        {"  leading", {" ", " leading"}},
        {"AB", {"AB"}},
        {"aB", {"a", "B"}},
        {"\u0301", {"\u0301"}},
        {".\u0301A", {".\u0301", "A"}},
        {"x\n\n  y", {"x", "\n\n", " ", " y"}},
        {"\u00ab\u00bbQu\u00e9bec", {"\u00ab\u00bb", "Qu\u00e9bec"}},
        {"I'M OK", {"I", "'M", " OK"}},
        {"\u0915\u093f\u0924\u093e\u092c", {"\u0915\u093f\u0924\u093e\u092c"}},
    };
    for (const auto& [text, pieces] : cases) EXPECT_EQ(t.pre_tokenize(text), pieces) << text;
}

// ignore_merges (Tekken's, tiktoken's rule): a piece that is a token whole is
// that token even where no merge leads to it; without it, merges decide.
TEST(LlmTokenizer, IgnoreMergesTakesWholePiecesFromTheVocabulary) {
    LlmBpeVocab v;
    v.tokens = {"a", "b", "c", "ab", "abc", "<s>"};
    v.merges = {{"a", "b"}};
    v.added_ids = {5};
    v.pre = LlmPreTokenizer::Tekken;
    const LlmTokenizer merged = must_load(LlmTokenizer::from_vocab(v, "merges"));
    EXPECT_EQ(merged.encode("abc"), (Ids{3, 2}));
    v.ignore_merges = true;
    const LlmTokenizer whole = must_load(LlmTokenizer::from_vocab(v, "whole"));
    EXPECT_EQ(whole.encode("<s>abc"), (Ids{5, 4}));
    EXPECT_EQ(whole.encode("abcab"), (Ids{3, 2, 3}));  // no token whole: merges as before

    // A "tekken" GGUF takes ignore_merges, as llama.cpp reads one; its
    // metadata names the pattern again.
    const LlmTokenizer from_gguf = must_load(LlmTokenizer::from_gguf_metadata(whole.gguf_metadata(), "tekken"));
    EXPECT_EQ(from_gguf.pre_tokenizer(), LlmPreTokenizer::Tekken);
    EXPECT_EQ(from_gguf.encode("<s>abc"), (Ids{5, 4}));
}

// tokenizer.json with Tekken's Split (as Mistral Small 3.x's) and
// model.ignore_merges.
TEST(LlmTokenizer, TekkenTokenizerJsonIsRead) {
    json j = tokenizer_json();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    j["model"]["ignore_merges"] = true;
    test::TempDir dir;
    const LlmTokenizer t = must_load(LlmTokenizer::from_tokenizer_json(dir.write("tokenizer.json", j.dump())));
    EXPECT_EQ(t.pre_tokenizer(), LlmPreTokenizer::Tekken);
    EXPECT_EQ(t.pre_tokenize("HelloWorld"), (Pieces{"Hello", "World"}));
    EXPECT_EQ(t.encode("hello"), (Ids{259}));

    j["model"]["ignore_merges"] = "yes";
    auto refused = LlmTokenizer::from_tokenizer_json(dir.write("bad.json", j.dump()));
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("model.ignore_merges is \"yes\", not true or false"), std::string::npos)
        << refused.error().message;
}

// ---- BPE and added tokens on the test's own vocabulary ----

TEST(LlmTokenizer, BpeMergesByRank) {
    const LlmTokenizer t = test_tokenizer();
    EXPECT_EQ(t.size(), 281);
    EXPECT_EQ(t.encode("hello world"), (Ids{259, 264}));
    // (h, e) outranks (Ġ, h): " hello" is Ġ + hello, never Ġh + ello.
    EXPECT_EQ(t.encode(" hello"), (Ids{byte_id(' '), 259}));
    EXPECT_EQ(t.encode("hello\n\nworld"), (Ids{259, 266, byte_id('w'), 261, byte_id('l'), byte_id('d')}));
    EXPECT_EQ(t.encode("user"), (Ids{274}));
    EXPECT_EQ(t.encode("\xE4\xB8\xAD"), (Ids{276}));
    EXPECT_EQ(t.encode("  "), (Ids{265}));
    EXPECT_EQ(t.encode(""), Ids{});
    // Invalid UTF-8 is tokenized as U+FFFD (EF BF BD: no merges here).
    EXPECT_EQ(t.encode("\xFF"), (Ids{byte_id('\xEF'), byte_id('\xBF'), byte_id('\xBD')}));
}

TEST(LlmTokenizer, ChatTemplateKeepsSpecialTokensWhole) {
    const LlmTokenizer t = test_tokenizer();
    Ids expected = {kImStart, 274, byte_id('\n'), 259, kImEnd, byte_id('\n'), kImStart};
    for (char c : std::string("assistant")) expected.push_back(byte_id(c));
    expected.push_back(byte_id('\n'));
    EXPECT_EQ(t.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"), expected);
    EXPECT_EQ(t.encode("<think>hello</think>"),
              (Ids{kThink, 259, byte_id('<'), byte_id('/'), byte_id('t'), byte_id('h'), byte_id('i'), byte_id('n'),
                   byte_id('k'), byte_id('>')}));
    EXPECT_EQ(t.encode("<|endoftext|><|endoftext|>"), (Ids{kEndOfText, kEndOfText}));
    EXPECT_TRUE(t.is_added(kImStart));
    EXPECT_FALSE(t.is_added(259));
    EXPECT_EQ(t.token_id("<|im_end|>"), kImEnd);
    EXPECT_EQ(t.token_id("nope"), -1);
    EXPECT_EQ(t.token_text(259), "hello");
    EXPECT_EQ(t.token_text(100000), "");
}

TEST(LlmTokenizer, AddedTokensMatchLeftmostThenLongest) {
    LlmBpeVocab v;
    v.tokens = {"x", "ab", "abc", "bcd", "c", "d", "a", "b"};
    v.added_ids = {1, 2, 3};
    const LlmTokenizer t = must_load(LlmTokenizer::from_vocab(v, "added"));
    EXPECT_EQ(t.encode("xabcx"), (Ids{0, 2, 0}));
    EXPECT_EQ(t.encode("abcd"), (Ids{2, 5}));
    EXPECT_EQ(t.encode("xbcd"), (Ids{0, 3}));
    EXPECT_EQ(t.encode("ab"), (Ids{1}));
}

TEST(LlmTokenizer, DecodeUndoesTheByteCharacters) {
    const LlmTokenizer t = test_tokenizer();
    for (const std::string text : {"hello world", "<|im_start|>user\nhello<|im_end|>\n", "\xE4\xB8\xAD x \t\r\n",
                                   "caf\xC3\xA9 \xF0\x9F\x98\x80!"}) {
        EXPECT_EQ(t.decode(t.encode(text)), text);
    }
    // Half a character becomes U+FFFD; bad ids are skipped.
    EXPECT_EQ(t.decode({byte_id('\xE4'), 259}), "\xEF\xBF\xBDhello");
    EXPECT_EQ(t.decode({-1, 259, 100000}), "hello");
}

TEST(LlmTokenizer, AllFormsGiveTheSameIds) {
    test::TempDir dir;
    const std::string json_path = dir.write("a/tokenizer.json", tokenizer_json().dump());
    write_vocab_merges(dir, "b/", true);
    write_vocab_merges(dir, "c/tokenizer/", true);
    const std::string gguf_path = write_gguf(dir, "d/vocab.gguf");
    std::vector<std::pair<std::string, LlmTokenizer>> forms;
    forms.emplace_back("tokenizer.json", must_load(LlmTokenizer::from_tokenizer_json(json_path)));
    forms.emplace_back("folder a", must_load(LlmTokenizer::load(dir.file("a"))));
    forms.emplace_back("vocab.json", must_load(LlmTokenizer::load(dir.file("b/vocab.json"))));
    forms.emplace_back("folder b", must_load(LlmTokenizer::load(dir.file("b"))));
    forms.emplace_back("folder c/tokenizer", must_load(LlmTokenizer::load(dir.file("c"))));
    forms.emplace_back("gguf metadata", must_load(LlmTokenizer::from_gguf_metadata(gguf_metadata(), "meta")));
    forms.emplace_back("gguf file", must_load(LlmTokenizer::load(gguf_path)));
    forms.emplace_back("gguf folder", must_load(LlmTokenizer::load(dir.file("d"))));
    auto model = io::ModelFile::open({gguf_path});
    if (model.ok()) {
        forms.emplace_back("ModelFile", must_load(LlmTokenizer::from_gguf_metadata(*model)));
    } else {
        ADD_FAILURE() << model.error().message;
    }
    const LlmTokenizer reference = test_tokenizer();
    for (const std::string text : {"hello world", " hello", "<|im_start|>user\nhello<|im_end|>\n", "<think>x",
                                   "\xE4\xB8\xAD\xE4\xB8\xAD  \n\n world's",
                                   "h\xFF"
                                   "e"}) {
        const Ids ids = reference.encode(text);
        for (const auto& [name, t] : forms) {
            EXPECT_EQ(t.encode(text), ids) << name << ": " << text;
            EXPECT_EQ(t.size(), 281) << name;
        }
    }
}

TEST(LlmTokenizer, VocabJsonWithoutConfigTakesPipeTokensAsAdded) {
    test::TempDir dir;
    write_vocab_merges(dir, "", false);
    const LlmTokenizer t = must_load(LlmTokenizer::load(dir.path()));
    // No added tokens at all: <|...|> tokens are not in Qwen's vocab.json.
    EXPECT_EQ(t.size(), 277);
    EXPECT_EQ(t.token_id("<|im_start|>"), -1);
    // A GPT-2 style vocab.json holding <|endoftext|> makes it an added token.
    const std::vector<uint8_t> bytes = test::read_bytes(dir.file("vocab.json"));
    json vocab = json::parse(std::string(bytes.begin(), bytes.end()));
    vocab["<|endoftext|>"] = 277;
    dir.write("vocab.json", vocab.dump());
    const LlmTokenizer g = must_load(LlmTokenizer::load(dir.file("vocab.json")));
    EXPECT_EQ(g.encode("hello<|endoftext|>"), (Ids{259, 277}));
    EXPECT_TRUE(g.is_added(277));
}

TEST(LlmTokenizer, EncodeIsThreadSafe) {
    const LlmTokenizer t = test_tokenizer();
    const std::vector<std::string> texts = {"hello world", "<|im_start|>user\nhello<|im_end|>", "\xE4\xB8\xAD user"};
    std::vector<Ids> expected;
    for (const auto& s : texts) expected.push_back(t.encode(s));
    std::vector<std::thread> threads;
    std::vector<int> failures(4, 0);
    for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&, k] {
            for (int i = 0; i < 500; ++i) {
                for (size_t j = 0; j < texts.size(); ++j) failures[k] += t.encode(texts[j]) != expected[j];
            }
        });
    }
    for (auto& th : threads) th.join();
    for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(LlmTokenizer, LongInputsStayFast) {
    const LlmTokenizer t = test_tokenizer();
    // One 200k-letter piece: BPE must not be quadratic.
    const std::string letters(200000, 'l');
    EXPECT_EQ(t.encode(letters).size(), 100000u);
    const std::string spaces(200000, ' ');
    EXPECT_EQ(t.encode(spaces).size(), 100000u);
}

// ---- broken files ----

TEST(LlmTokenizer, BrokenTokenizerJsonIsRefused) {
    test::TempDir dir;
    const auto refused = [&](const std::string& text, const std::string& why) {
        const std::string path = dir.write("tokenizer.json", text);
        const Error e = load_error(LlmTokenizer::from_tokenizer_json(path));
        EXPECT_EQ(e.kind, ErrorKind::BadFile) << e.message;
        EXPECT_EQ(e.message.rfind(path + ": ", 0), 0u) << e.message;
        EXPECT_TRUE(contains(e.message, why)) << e.message;
    };
    const std::string good = tokenizer_json().dump();
    refused(good.substr(0, good.size() / 2), "malformed JSON");
    refused("", "malformed JSON");
    refused(std::string(100000, '[') + std::string(100000, ']'), "no \"model\" object");
    refused("{\"model\": 3}", "no \"model\" object");
    json j = tokenizer_json();
    j["model"]["type"] = "Unigram";
    refused(j.dump(), "model.type is \"Unigram\"");
    j = tokenizer_json();
    j["model"]["vocab"]["hello"] = -5;
    refused(j.dump(), "token 'hello' has id -5");
    j = tokenizer_json();
    j["model"]["vocab"]["hello"] = "x";
    refused(j.dump(), "token 'hello' has id");
    j = tokenizer_json();
    j["model"]["vocab"]["hello2"] = 259;
    refused(j.dump(), "id 259 is used by both 'hello' and 'hello2'");
    j = tokenizer_json();
    j["model"]["merges"].push_back("x zz");
    refused(j.dump(), "uses 'zz', which is not in the vocabulary");
    j = tokenizer_json();
    j["model"]["merges"].push_back("h o");
    refused(j.dump(), "uses 'ho', which is not in the vocabulary");
    j = tokenizer_json();
    j["model"]["merges"].push_back("abc");
    refused(j.dump(), "is not two space-separated symbols");
    j = tokenizer_json();
    j["model"]["merges"].push_back(json::array({"a"}));
    refused(j.dump(), "is neither");
    j = tokenizer_json();
    j["model"].erase("merges");
    refused(j.dump(), "no model.merges");
    j = tokenizer_json();
    j["model"].erase("vocab");
    refused(j.dump(), "no model.vocab");
    j = tokenizer_json();
    j["added_tokens"][0]["id"] = 259;
    refused(j.dump(), "the vocabulary gives to 'hello'");
    j = tokenizer_json();
    j["added_tokens"][0].erase("content");
    refused(j.dump(), "needs an integer id and a string content");
    j = tokenizer_json();
    j["added_tokens"] = 7;
    refused(j.dump(), "added_tokens is not an array");
    j = tokenizer_json();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    refused(j.dump(), "neither Qwen2's nor Tekken's pattern");
    j = tokenizer_json();
    j["pre_tokenizer"] = {{"type", "Metaspace"}};
    refused(j.dump(), "pre_tokenizer \"Metaspace\" is not supported");
    j = tokenizer_json();
    j["pre_tokenizer"] = nullptr;
    refused(j.dump(), "no pre_tokenizer");
    j = tokenizer_json();
    j["normalizer"] = {{"type", "Lowercase"}};
    refused(j.dump(), "normalizer");
    j = tokenizer_json();
    j["model"]["end_of_word_suffix"] = "</w>";
    refused(j.dump(), "model.end_of_word_suffix");
    j = tokenizer_json();
    j["model"]["byte_fallback"] = true;
    refused(j.dump(), "byte_fallback");
}

TEST(LlmTokenizer, BrokenVocabMergesAreRefused) {
    test::TempDir dir;
    write_vocab_merges(dir, "", true);
    const std::string vocab = dir.file("vocab.json");
    dir.write("merges.txt", "#version: 0.2\nh e\nh e l\n");
    Error e = load_error(LlmTokenizer::load(vocab));
    EXPECT_TRUE(contains(e.message, "merges.txt: line 3: expected two symbols")) << e.message;
    dir.write("merges.txt", "h q\n");
    e = load_error(LlmTokenizer::load(vocab));
    EXPECT_TRUE(contains(e.message, "uses 'hq', which is not in the vocabulary")) << e.message;
    dir.write("merges.txt", "h e\n");
    dir.write("tokenizer_config.json", "{\"added_tokens_decoder\": {\"x\": {\"content\": \"<a>\"}}}");
    e = load_error(LlmTokenizer::load(vocab));
    EXPECT_TRUE(contains(e.message, "tokenizer_config.json: added_tokens_decoder entry 'x'")) << e.message;
    dir.write("tokenizer_config.json", "{\"added_tokens_decoder\": {\"259\": {\"content\": \"<a>\"}}}");
    e = load_error(LlmTokenizer::load(vocab));
    EXPECT_TRUE(contains(e.message, "the vocabulary gives to 'hello'")) << e.message;
    dir.write("tokenizer_config.json", "{\"added_tokens_decoder\": ");
    e = load_error(LlmTokenizer::load(vocab));
    EXPECT_TRUE(contains(e.message, "tokenizer_config.json: malformed JSON")) << e.message;
    dir.write("vocab.json", "[1, 2]");
    e = load_error(LlmTokenizer::load(vocab));
    EXPECT_TRUE(contains(e.message, "vocab.json: the vocabulary is not a JSON object")) << e.message;
    test::TempDir empty;
    e = load_error(LlmTokenizer::load(empty.path()));
    EXPECT_TRUE(contains(e.message, "no tokenizer.json, tekken.json, vocab.json + merges.txt or .gguf")) << e.message;
    e = load_error(LlmTokenizer::load(empty.file("missing.json")));
    EXPECT_EQ(e.kind, ErrorKind::BadFile);
    EXPECT_TRUE(contains(e.message, "missing.json")) << e.message;
    const std::string junk = empty.write("junk.gguf", "GGUF\x03\x00\x00\x00 truncated");
    e = load_error(LlmTokenizer::load(junk));
    EXPECT_EQ(e.kind, ErrorKind::BadFile);
    EXPECT_EQ(e.message.rfind(junk, 0), 0u) << e.message;
    const std::string text = empty.write("notes.txt", "hello");
    e = load_error(LlmTokenizer::load(text));
    EXPECT_TRUE(contains(e.message, "not a GGUF file")) << e.message;
}

TEST(LlmTokenizer, BrokenGgufMetadataIsRefused) {
    const auto refused = [&](const io::Metadata& m, const std::string& why) {
        const Error e = load_error(LlmTokenizer::from_gguf_metadata(m, "x.gguf"));
        EXPECT_EQ(e.kind, ErrorKind::BadFile) << e.message;
        EXPECT_EQ(e.message.rfind("x.gguf: ", 0), 0u) << e.message;
        EXPECT_TRUE(contains(e.message, why)) << e.message;
    };
    refused({}, "no tokenizer.ggml.model");
    io::Metadata m = gguf_metadata();
    m["tokenizer.ggml.model"] = io::MetaValue::of_string("llama");
    refused(m, "not \"gpt2\"");
    m = gguf_metadata();
    m["tokenizer.ggml.pre"] = io::MetaValue::of_string("llama-bpe");
    refused(m, "tokenizer.ggml.pre is 'llama-bpe', a pre-tokenizer kiln does not know");
    m = gguf_metadata();
    m.erase("tokenizer.ggml.pre");
    refused(m, "tokenizer.ggml.pre is missing");
    m = gguf_metadata();
    m["tokenizer.ggml.token_type"].array.pop_back();
    refused(m, "tokenizer.ggml.token_type is not an array of 281 types");
    m = gguf_metadata();
    m["tokenizer.ggml.token_type"].array[7] = io::MetaValue::of_int(9);
    refused(m, "token_type[7]");
    m = gguf_metadata();
    m["tokenizer.ggml.tokens"].array[3] = io::MetaValue::of_int(3);
    refused(m, "tokens[3] is not a string");
    m = gguf_metadata();
    m["tokenizer.ggml.tokens"].array[259] = io::MetaValue::of_string("he");
    refused(m, "token 'he' appears at ids 256 and 259");
    m = gguf_metadata();
    m["tokenizer.ggml.merges"].array.push_back(io::MetaValue::of_string("zz q"));
    refused(m, "uses 'zz', which is not in the vocabulary");
    m = gguf_metadata();
    m["tokenizer.ggml.merges"].array.push_back(io::MetaValue::of_int(1));
    refused(m, "tokenizer.ggml.merges[21]");
    m = gguf_metadata();
    m.erase("tokenizer.ggml.merges");
    refused(m, "tokenizer.ggml.merges is missing");
    m = gguf_metadata();
    m["tokenizer.ggml.tokens"] = io::MetaValue::of_string("x");
    refused(m, "tokenizer.ggml.tokens is missing or not an array");
    m = gguf_metadata();
    m["tokenizer.ggml.tokens"].array.assign(281, io::MetaValue::of_string(""));
    refused(m, "empty control token");
    // Without token types, <|...|> tokens are the added ones.
    m = gguf_metadata();
    m.erase("tokenizer.ggml.token_type");
    const LlmTokenizer t = must_load(LlmTokenizer::from_gguf_metadata(m, "x.gguf"));
    EXPECT_TRUE(t.is_added(kImStart));
    EXPECT_FALSE(t.is_added(kThink));
}

// ---- real tokenizers, provisioned by scripts/setup.sh ----

std::string repo_root() { return std::string(KILN_FIXTURES_DIR) + "/../.."; }

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// llama.cpp's tests/test-tokenizer-0.cpp read_tests(): inputs separated by
// "\n__ggml_vocab_test__\n", one line of space-separated ids per input
// (stripped; an empty line is no ids). Tokenized as they are: no BOS, no
// added space.
std::vector<std::pair<std::string, Ids>> read_vectors(const std::string& base) {
    std::vector<std::pair<std::string, Ids>> tests;
    const std::string raw = read_text(base + ".inp");
    std::vector<std::string> lines;
    std::istringstream out(read_text(base + ".out"));
    for (std::string line; std::getline(out, line);) lines.push_back(line);
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> inputs;
    size_t pos = 0;
    while (pos < raw.size()) {
        const size_t next = raw.find(sep, pos);
        if (next == std::string::npos) {
            inputs.push_back(raw.substr(pos));
            break;
        }
        inputs.push_back(raw.substr(pos, next - pos));
        pos = next + sep.size();
    }
    EXPECT_EQ(inputs.size(), lines.size()) << base;
    for (size_t i = 0; i < std::min(inputs.size(), lines.size()); ++i) {
        Ids ids;
        std::istringstream words(lines[i]);
        for (long long id; words >> id;) ids.push_back(static_cast<int32_t>(id));
        tests.emplace_back(inputs[i], ids);
    }
    return tests;
}

const std::string kSetupHint = " is missing: run scripts/setup.sh, which provisions the real tokenizers the tests use";

std::string llama_vocab(const std::string& name) { return repo_root() + "/third_party/llama-vocab/" + name; }
std::string qwen3_dir() { return repo_root() + "/third_party/llm-tokenizer-qwen3"; }

void expect_vectors(const LlmTokenizer& t, const std::vector<std::pair<std::string, Ids>>& tests,
                    const std::string& name) {
    for (const auto& [text, ids] : tests) {
        EXPECT_EQ(t.encode(text), ids) << name << ": '" << text << "'";
        EXPECT_EQ(t.decode(ids), text) << name;
    }
}

TEST(LlmTokenizerRealData, Qwen2GgufReproducesLlamaCppVectors) {
    const std::string gguf = llama_vocab("ggml-vocab-qwen2.gguf");
    for (const std::string& f : {gguf, gguf + ".inp", gguf + ".out"}) ASSERT_TRUE(file_exists(f)) << f << kSetupHint;
    const LlmTokenizer t = must_load(LlmTokenizer::load(gguf));
    EXPECT_EQ(t.size(), 151936);
    EXPECT_EQ(t.pre_tokenizer(), LlmPreTokenizer::Qwen2);
    const auto tests = read_vectors(gguf);
    EXPECT_GE(tests.size(), 40u);
    expect_vectors(t, tests, "qwen2 gguf");
}

TEST(LlmTokenizerRealData, Qwen3TokenizerJsonGivesTheSameIds) {
    const std::string gguf = llama_vocab("ggml-vocab-qwen2.gguf");
    const std::string json_path = qwen3_dir() + "/tokenizer.json";
    for (const std::string& f : {gguf + ".inp", gguf + ".out", json_path}) {
        ASSERT_TRUE(file_exists(f)) << f << kSetupHint;
    }
    // Qwen3 shares Qwen2's byte-level BPE (vocabulary and merges); its added
    // tokens past <|im_end|> differ, and none is in the vectors.
    const LlmTokenizer t = must_load(LlmTokenizer::from_tokenizer_json(json_path));
    EXPECT_EQ(t.size(), 151669);
    expect_vectors(t, read_vectors(gguf), "qwen3 tokenizer.json");
    const LlmTokenizer folder = must_load(LlmTokenizer::load(qwen3_dir()));
    EXPECT_EQ(folder.encode("Hello world"), (Ids{9707, 1879}));

    // Both real forms agree on any text without Qwen3's own added tokens
    // (<think> and friends, which Qwen2's vocabulary lacks). Checked once,
    // outside the tests, against transformers.js (@lenml/tokenizers 3.7.2)
    // on 20,000 such strings: the same ids, added tokens included.
    ASSERT_TRUE(file_exists(gguf)) << gguf << kSetupHint;
    const LlmTokenizer qwen2 = must_load(LlmTokenizer::load(gguf));
    const std::vector<std::string> alphabet = {"a",
                                               "Z",
                                               "\xC3\xA9",
                                               "\xE4\xB8\xAD",
                                               "1",
                                               "\xD9\xA3",
                                               " ",
                                               " ",
                                               "\t",
                                               "\n",
                                               "\r",
                                               "\xE3\x80\x80",
                                               "\xC2\xA0",
                                               "'",
                                               "s",
                                               "S",
                                               "l",
                                               "re",
                                               "!",
                                               ".",
                                               "(",
                                               "\xF0\x9F\x98\x80",
                                               "_",
                                               "-",
                                               "\xD1\x8F",
                                               "\xE0\xB8\x81",
                                               "\xE0\xA5\x80",
                                               "\xED\x95\x9C",
                                               "the",
                                               " the",
                                               "ing",
                                               "  ",
                                               "\n\n",
                                               "<|im_start|>",
                                               "<|im_end|>",
                                               "<|endoftext|>",
                                               "\xE2\x80\x94"};
    std::mt19937 rng(5);
    for (int i = 0; i < 2000; ++i) {
        std::string text;
        const int n = static_cast<int>(rng() % 16);
        for (int k = 0; k < n; ++k) text += alphabet[rng() % alphabet.size()];
        const Ids ids = qwen2.encode(text);
        ASSERT_EQ(t.encode(text), ids) << "'" << text << "'";
        ASSERT_EQ(t.decode(ids), text);
    }
}

TEST(LlmTokenizerRealData, ChatTemplateUsesSingleSpecialIds) {
    const std::string gguf = llama_vocab("ggml-vocab-qwen2.gguf");
    const std::string json_path = qwen3_dir() + "/tokenizer.json";
    for (const std::string& f : {gguf, json_path}) ASSERT_TRUE(file_exists(f)) << f << kSetupHint;
    const std::string prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
    // <|im_start|> user \n hello <|im_end|> \n <|im_start|> assistant \n
    const Ids expected = {151644, 872, 198, 14990, 151645, 198, 151644, 77091, 198};
    for (const std::string& path : {gguf, json_path}) {
        const LlmTokenizer t = must_load(LlmTokenizer::load(path));
        EXPECT_EQ(t.token_id("<|im_start|>"), 151644) << path;
        EXPECT_EQ(t.token_id("<|im_end|>"), 151645) << path;
        EXPECT_EQ(t.token_id("<|endoftext|>"), 151643) << path;
        EXPECT_EQ(t.encode(prompt), expected) << path;
        EXPECT_EQ(t.decode(expected), prompt) << path;
    }
    const LlmTokenizer qwen3 = must_load(LlmTokenizer::load(json_path));
    EXPECT_EQ(qwen3.encode("<think>\n\n</think>\n\n"), (Ids{151667, 271, 151668, 271}));
}

}  // namespace
}  // namespace kiln::text
