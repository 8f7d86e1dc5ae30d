#include "text/t5_tokenizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/gguf_writer.h"
#include "io/model_file.h"
#include "test_files.h"

namespace kiln::text {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kMeta = "\xE2\x96\x81";  // "▁"

// The expected ids below were also checked once, outside the tests, against
// sentencepiece 0.1.97 (Debian's python3-sentencepiece) on the spiece.model
// files these helpers write (with and without the charsmap, and with byte
// fallback) and on 30 random unigram models with user-defined, unused and
// tied pieces: the same ids for all 12,000 prompts tried.

// ---- the test's own unigram model ----
//
// 0 <pad>, 1 </s> (control), 2 <unk>, 3 "▁" -2.0, 4..29 the letters a..z at
// -5.0 each, then multi-letter pieces whose scores give Viterbi real
// choices, one user-defined piece and a capital A for the charsmap tests.
// T5's layout: pad 0, eos 1, unk 2.
struct TestPiece {
    std::string text;
    float score;
    PieceType type;
};

int32_t letter(char c) { return 4 + (c - 'a'); }

std::vector<TestPiece> test_pieces() {
    std::vector<TestPiece> p = {{"<pad>", 0.0f, PieceType::Control},
                                {"</s>", 0.0f, PieceType::Control},
                                {"<unk>", 0.0f, PieceType::Unknown},
                                {kMeta, -2.0f, PieceType::Normal}};
    for (char c = 'a'; c <= 'z'; ++c) p.push_back({std::string(1, c), -5.0f, PieceType::Normal});
    const std::vector<std::pair<std::string, float>> multi = {
        {kMeta + "the", -2.5f},     // 30
        {kMeta + "cat", -7.0f},     // 31
        {kMeta + "c", -3.2f},       // 32
        {"at", -3.0f},              // 33
        {kMeta + "t", -3.3f},       // 34
        {"he", -3.1f},              // 35
        {kMeta + "a", -3.0f},       // 36
        {kMeta + "red", -4.5f},     // 37
        {kMeta + "r", -3.4f},       // 38
        {"ed", -3.2f},              // 39
        {"re", -3.0f},              // 40
        {kMeta + "circle", -9.0f},  // 41
        {kMeta + "cir", -4.2f},     // 42
        {"cle", -4.0f},             // 43
        {",", -4.0f},               // 44
        {".", -4.0f},               // 45
        {"A", -5.0f},               // 46
        {"fi", -3.5f},              // 47
        {kMeta + "dog", -4.0f},     // 48
    };
    for (const auto& [text, score] : multi) p.push_back({text, score, PieceType::Normal});
    p.push_back({"<sep>", 0.0f, PieceType::UserDefined});  // 49
    const std::vector<std::pair<std::string, float>> more = {
        {kMeta + "ca", -3.5f},   // 50
        {"ha", -3.6f},           // 51
        {"hat", -3.9f},          // 52
        {kMeta + "hat", -6.0f},  // 53
        {kMeta + "h", -3.3f},    // 54
    };
    for (const auto& [text, score] : more) p.push_back({text, score, PieceType::Normal});
    return p;
}

// The pieces with 256 byte pieces after <unk> (ids 3..258): byte fallback.
std::vector<TestPiece> byte_fallback_pieces() {
    std::vector<TestPiece> p = {
        {"<pad>", 0.0f, PieceType::Control}, {"</s>", 0.0f, PieceType::Control}, {"<unk>", 0.0f, PieceType::Unknown}};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        p.push_back({name, 0.0f, PieceType::Byte});
    }
    p.push_back({kMeta, -2.0f, PieceType::Normal});        // 259
    p.push_back({"a", -3.0f, PieceType::Normal});          // 260
    p.push_back({kMeta + "a", -2.0f, PieceType::Normal});  // 261
    return p;
}

// ---- a tiny precompiled charsmap ----
//
// A Darts-clone double array built the simplest way: every trie node gets
// its own block of 256 units at base = 256 * k; its children sit at base ^
// byte = base + byte and its leaf (the value unit) at base itself. A node's
// unit holds its label, has_leaf (bit 8) and offset = position ^ base (bits
// 10..30); a value unit is the replacement's offset | 1 << 31.
std::string build_charsmap(const std::vector<std::pair<std::string, std::string>>& rules) {
    struct Node {
        std::map<uint8_t, size_t> children;
        int64_t value = -1;
    };
    std::vector<Node> nodes(1);
    std::string strings;
    for (const auto& [key, replacement] : rules) {
        size_t n = 0;
        for (char ch : key) {
            const uint8_t c = static_cast<uint8_t>(ch);
            auto it = nodes[n].children.find(c);
            if (it == nodes[n].children.end()) {
                nodes.emplace_back();
                it = nodes[n].children.emplace(c, nodes.size() - 1).first;
            }
            n = it->second;
        }
        nodes[n].value = static_cast<int64_t>(strings.size());
        strings += replacement;
        strings.push_back('\0');
    }
    std::vector<uint32_t> units(256 * (nodes.size() + 1), 0);
    // Node i's block starts at 256 * (i + 1); the root's own unit is 0.
    std::vector<size_t> position(nodes.size(), 0);
    for (size_t i = 0; i < nodes.size(); ++i) {
        const size_t base = 256 * (i + 1);
        const uint32_t label = i == 0 ? 0 : units[position[i]] & 0xFF;
        units[position[i]] =
            label | static_cast<uint32_t>(position[i] ^ base) << 10 | (nodes[i].value >= 0 ? 1u << 8 : 0u);
        if (nodes[i].value >= 0) units[base] = static_cast<uint32_t>(nodes[i].value) | 1u << 31;
        for (const auto& [c, child] : nodes[i].children) {
            position[child] = base + c;
            units[base + c] = c;  // the label; the rest is filled in when the child is visited
        }
    }
    std::string blob;
    const uint32_t trie_bytes = static_cast<uint32_t>(units.size() * 4);
    for (int k = 0; k < 4; ++k) blob.push_back(static_cast<char>(trie_bytes >> (8 * k)));
    for (uint32_t u : units) {
        for (int k = 0; k < 4; ++k) blob.push_back(static_cast<char>(u >> (8 * k)));
    }
    return blob + strings;
}

// Fullwidth Ａ -> A, ＡＢ -> ab (a longer rule over the same prefix), tab
// and newline -> space, the ﬁ ligature -> fi, U+0001 removed, the
// ideographic space -> space.
std::string test_charsmap() {
    return build_charsmap({{"\xEF\xBC\xA1", "A"},
                           {"\xEF\xBC\xA1\xEF\xBC\xA2", "ab"},
                           {"\t", " "},
                           {"\n", " "},
                           {"\xEF\xAC\x81", "fi"},
                           {"\x01", ""},
                           {"\xE3\x80\x80", " "}});
}

// ---- writers of the two file forms ----

void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7F) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, uint32_t field, int wire) { put_varint(out, uint64_t{field} << 3 | wire); }
void put_len(std::string& out, uint32_t field, const std::string& bytes) {
    put_tag(out, field, 2);
    put_varint(out, bytes.size());
    out += bytes;
}
void put_varint_field(std::string& out, uint32_t field, int64_t v) {
    put_tag(out, field, 0);
    put_varint(out, static_cast<uint64_t>(v));  // negative int32: ten bytes, as protobuf writes them
}
void put_float_field(std::string& out, uint32_t field, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    put_tag(out, field, 5);
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>(bits >> (8 * k)));
}

std::string spm_piece(const TestPiece& p) {
    std::string m;
    put_len(m, 1, p.text);
    put_float_field(m, 2, p.score);
    if (p.type != PieceType::Normal) put_varint_field(m, 3, static_cast<int64_t>(p.type));  // NORMAL is the default
    return m;
}

struct SpmOptions {
    std::string charsmap;
    int model_type = 1;
    bool byte_fallback = false;
};

// A ModelProto as sentencepiece writes T5's: pieces, trainer_spec (with
// fields kiln skips: input, character_coverage, bos_id = -1 as a ten-byte
// varint), normalizer_spec, and an extension field (fixed64) at the end.
std::string spm_model(const std::vector<TestPiece>& pieces, const SpmOptions& o = {}) {
    std::string model;
    for (const TestPiece& p : pieces) put_len(model, 1, spm_piece(p));
    std::string trainer;
    put_len(trainer, 1, "corpus.txt");
    put_varint_field(trainer, 3, o.model_type);
    put_varint_field(trainer, 4, static_cast<int64_t>(pieces.size()));
    put_float_field(trainer, 10, 0.9995f);
    if (o.byte_fallback) put_varint_field(trainer, 35, 1);
    put_varint_field(trainer, 40, 2);
    put_varint_field(trainer, 41, -1);
    put_varint_field(trainer, 42, 1);
    put_varint_field(trainer, 43, 0);
    put_len(model, 2, trainer);
    std::string normalizer;
    put_len(normalizer, 1, o.charsmap.empty() ? "identity" : "nmt_nfkc");
    if (!o.charsmap.empty()) put_len(normalizer, 2, o.charsmap);
    put_varint_field(normalizer, 3, 1);
    put_varint_field(normalizer, 4, 1);
    put_varint_field(normalizer, 5, 1);
    put_len(model, 3, normalizer);
    put_tag(model, 201, 1);
    model += std::string(8, '\x07');
    return model;
}

std::string base64(const std::string& bytes) {
    static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < bytes.size(); i += 3) {
        const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16 | static_cast<uint8_t>(bytes[i + 1]) << 8 |
                           static_cast<uint8_t>(bytes[i + 2]);
        for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
    }
    if (i + 1 == bytes.size()) {
        const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
        out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], '=', '='};
    } else if (i + 2 == bytes.size()) {
        const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16 | static_cast<uint8_t>(bytes[i + 1]) << 8;
        out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
    }
    return out;
}

// HF's tokenizer.json for T5, in the shape transformers writes it.
json hf_tokenizer_json(const std::vector<TestPiece>& pieces, const std::string& charsmap = "",
                       bool byte_fallback = false) {
    json added = json::array();
    json vocab = json::array();
    int32_t unk = -1;
    for (size_t i = 0; i < pieces.size(); ++i) {
        const TestPiece& p = pieces[i];
        vocab.push_back({p.text, p.score});
        if (p.type == PieceType::Unknown) unk = static_cast<int32_t>(i);
        if (p.type == PieceType::Control || p.type == PieceType::Unknown || p.type == PieceType::UserDefined) {
            added.push_back({{"id", i},
                             {"content", p.text},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", false},
                             {"special", p.type != PieceType::UserDefined}});
        }
    }
    json precompiled = {{"type", "Precompiled"}, {"precompiled_charsmap", nullptr}};
    if (!charsmap.empty()) precompiled["precompiled_charsmap"] = base64(charsmap);
    return {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers", {precompiled, {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}}}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "WhitespaceSplit"}},
            {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}}}}}},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single",
           {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}}}},
        {"decoder", {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}}},
        {"model", {{"type", "Unigram"}, {"unk_id", unk}, {"vocab", vocab}, {"byte_fallback", byte_fallback}}},
    };
}

UnigramVocab unigram_vocab(const std::vector<TestPiece>& pieces, const std::string& charsmap = "") {
    UnigramVocab v;
    for (const TestPiece& p : pieces) v.pieces.push_back({p.text, p.score, p.type});
    v.eos_id = 1;
    v.pad_id = 0;
    v.precompiled_charsmap = charsmap;
    return v;
}

T5Tokenizer must_load(Result<T5Tokenizer> t) {
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) std::abort();
    return std::move(t).value();
}

T5Tokenizer from_spiece(const test::TempDir& dir, const std::vector<TestPiece>& pieces, const SpmOptions& o = {}) {
    return must_load(T5Tokenizer::from_spiece_model(dir.write("spiece.model", spm_model(pieces, o))));
}

T5Tokenizer from_json(const test::TempDir& dir, const std::vector<TestPiece>& pieces, const std::string& charsmap = "",
                      bool byte_fallback = false) {
    return must_load(T5Tokenizer::from_tokenizer_json(
        dir.write("tokenizer.json", hf_tokenizer_json(pieces, charsmap, byte_fallback).dump(2))));
}

Error load_error(Result<T5Tokenizer> t) {
    EXPECT_FALSE(t.ok());
    if (t.ok()) return Error{};
    EXPECT_EQ(t.error().kind, ErrorKind::BadFile) << t.error().message;
    return t.error();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::vector<std::string> kPrompts = {
    "the cat",
    "a red circle.",
    "the hat",
    "  the   cat  ",
    "the\tcat\nsat",
    "the 猫 cat",
    "猫犬 dog",
    "Hi",
    "the<sep>cat",
    "a</s>",
    "",
    "   ",
    "\xEF\xBC\xA1 cat, \xEF\xBC\xA1\xEF\xBC\xA2 \xEF\xBC\xA1\xEF\xBC\xA3",
    "\x01the\n\n cat\x01",
    "\xEF\xAC\x81re",
    "\xE3\x80\x80the",
    "\xFFthe \xC3",
    "zzz a red red red circle, the cat, the hat, the dog.",
    std::string("nul\0byte", 8),
};

// ---- tests ----

// Expected ids worked out by hand from the scores above (the best total
// score wins; "▁" is id 3, letters 4 + (c - 'a')):
//   "the cat" -> "▁the▁cat": "▁the" -2.5 beats "▁t"+"he" -6.4; for "▁cat"
//     "▁c"+"at" = -3.2 - 3.0 = -6.2 beats "▁cat" -7.0, "▁ca"+"t" -8.5 and
//     "▁"+"c"+"at" -10.0 -> [30, 32, 33] (a greedy longest match would
//     take "▁cat").
//   "a red circle." -> "▁a" -3.0 (vs "▁"+"a" -7.0); "▁red" -4.5 (vs
//     "▁r"+"ed" -6.6); "▁cir"+"cle" = -8.2 beats "▁circle" -9.0; "." ->
//     [36, 37, 42, 43, 45].
//   "the hat" -> "▁hat": "▁"+"hat" = -2.0 - 3.9 = -5.9 beats "▁hat" -6.0,
//     "▁h"+"at" -6.3 and "▁"+"ha"+"t" -10.6 -> [30, 3, 52].
TEST(T5Tokenizer, ViterbiPicksTheBestTotalScore) {
    test::TempDir dir;
    const T5Tokenizer t = from_spiece(dir, test_pieces());
    EXPECT_EQ(t.encode("the cat"), (Ids{30, 32, 33}));
    EXPECT_EQ(t.encode("a red circle."), (Ids{36, 37, 42, 43, 45}));
    EXPECT_EQ(t.encode("the hat"), (Ids{30, 3, 52}));
    EXPECT_EQ(t.encode("the dog"), (Ids{30, 48}));
    EXPECT_EQ(t.size(), 55);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_EQ(t.pad_id(), 0);
    EXPECT_EQ(t.unk_id(), 2);
    EXPECT_EQ(t.piece_id(kMeta + "cir"), 42);
    EXPECT_EQ(t.piece_text(52), "hat");
    EXPECT_EQ(t.piece_id("nope"), -1);
    EXPECT_EQ(t.piece_text(-1), "");
    EXPECT_EQ(t.piece_text(55), "");
}

// A character no piece starts with is <unk> (id 2); a run of them is one
// <unk>, as sentencepiece merges them. "</s>" typed in the text is not EOS:
// '<' and '/' are one unknown run, 's' a letter, '>' unknown.
TEST(T5Tokenizer, UnknownCharactersBecomeOneUnkPerRun) {
    test::TempDir dir;
    const T5Tokenizer t = from_spiece(dir, test_pieces());
    // "▁the▁猫▁cat": "▁" (3) before the unknown 猫.
    EXPECT_EQ(t.encode("the 猫 cat"), (Ids{30, 3, 2, 32, 33}));
    EXPECT_EQ(t.encode("猫犬 dog"), (Ids{3, 2, 48}));
    EXPECT_EQ(t.encode("Hi"), (Ids{3, 2, letter('i')}));
    EXPECT_EQ(t.encode("a</s>"), (Ids{36, 2, letter('s'), 2}));
    // An invalid byte becomes U+FFFD (unknown); "the" after it has no "▁":
    // "t"+"he" -8.1.
    EXPECT_EQ(t.encode("\xFFthe"), (Ids{3, 2, letter('t'), 35}));
    EXPECT_EQ(t.normalize("\xFFthe"), kMeta + "\xEF\xBF\xBDthe");
}

// Without a charsmap only ' ' is whitespace: trimmed, runs collapsed, each
// one "▁", and "▁" in front. A tab stays a character (unknown here).
TEST(T5Tokenizer, WhitespaceIsTrimmedCollapsedAndEscaped) {
    test::TempDir dir;
    const T5Tokenizer t = from_spiece(dir, test_pieces());
    EXPECT_EQ(t.normalize("  the   cat  "), kMeta + "the" + kMeta + "cat");
    EXPECT_EQ(t.encode("  the   cat  "), t.encode("the cat"));
    EXPECT_EQ(t.normalize(""), "");
    EXPECT_EQ(t.normalize("    "), "");
    EXPECT_TRUE(t.encode("   ").empty());
    EXPECT_TRUE(t.encode("").empty());
    // "▁the\tcat": the tab is unknown, then "c"+"at" -8.0.
    EXPECT_EQ(t.encode("the\tcat"), (Ids{30, 2, letter('c'), 33}));

    // add_dummy_prefix and remove_extra_whitespaces off (GGUF keys).
    UnigramVocab v = unigram_vocab(test_pieces());
    v.add_dummy_prefix = false;
    v.remove_extra_whitespaces = false;
    const T5Tokenizer raw = must_load(T5Tokenizer::from_vocab(v, "raw"));
    EXPECT_EQ(raw.normalize(" the  cat "), kMeta + "the" + kMeta + kMeta + "cat" + kMeta);
    EXPECT_EQ(raw.encode("the cat"), (Ids{letter('t'), 35, 32, 33}));
}

// User-defined pieces score length * max(FLT_MIN, max normal score) - 0.1,
// about -0.1 here, so they always win; unused pieces are never produced.
TEST(T5Tokenizer, UserDefinedPiecesWinAndUnusedOnesNeverAppear) {
    test::TempDir dir;
    std::vector<TestPiece> pieces = test_pieces();
    EXPECT_EQ(from_spiece(dir, pieces).encode("the<sep>cat"), (Ids{30, 49, letter('c'), 33}));
    pieces.push_back({"zz", -0.5f, PieceType::Unused});  // 55: would win if it were used
    const T5Tokenizer t = from_spiece(dir, pieces);
    EXPECT_EQ(t.encode("zz"), (Ids{3, letter('z'), letter('z')}));
    EXPECT_EQ(t.piece_id("zz"), 55);
}

TEST(T5Tokenizer, EncodePaddedAppendsEosTruncatesAndPads) {
    test::TempDir dir;
    const T5Tokenizer t = from_spiece(dir, test_pieces());
    PaddedTokens p = t.encode_padded("the cat", 8, true);
    EXPECT_EQ(p.ids, (Ids{30, 32, 33, 1, 0, 0, 0, 0}));
    EXPECT_EQ(p.mask, (Ids{1, 1, 1, 1, 0, 0, 0, 0}));
    p = t.encode_padded("the cat", 8, false);
    EXPECT_EQ(p.ids, (Ids{30, 32, 33, 1}));
    EXPECT_EQ(p.mask, (Ids{1, 1, 1, 1}));
    p = t.encode_padded("the cat", 4, true);  // exactly full
    EXPECT_EQ(p.ids, (Ids{30, 32, 33, 1}));
    EXPECT_EQ(p.mask, (Ids{1, 1, 1, 1}));
    p = t.encode_padded("the cat", 2, true);  // cut, EOS kept last
    EXPECT_EQ(p.ids, (Ids{30, 1}));
    EXPECT_EQ(p.mask, (Ids{1, 1}));
    p = t.encode_padded("the cat", 1, true);
    EXPECT_EQ(p.ids, (Ids{1}));
    p = t.encode_padded("", 3, true);
    EXPECT_EQ(p.ids, (Ids{1, 0, 0}));
    EXPECT_EQ(p.mask, (Ids{1, 0, 0}));
    p = t.encode_padded("the cat", 0, true);  // no limit
    EXPECT_EQ(p.ids, (Ids{30, 32, 33, 1}));
    // Flux dev's length: 512 ids, as many mask ones as real tokens.
    p = t.encode_padded("a red circle.", 512, true);
    ASSERT_EQ(p.ids.size(), 512u);
    ASSERT_EQ(p.mask.size(), 512u);
    EXPECT_EQ(std::count(p.mask.begin(), p.mask.end(), 1), 6);
    EXPECT_EQ(p.ids[5], 1);
    EXPECT_EQ(p.ids[511], 0);
}

TEST(T5Tokenizer, DecodeUndoesTheMetaSpaces) {
    test::TempDir dir;
    const T5Tokenizer t = from_spiece(dir, test_pieces());
    EXPECT_EQ(t.decode(t.encode("a red circle.")), "a red circle.");
    EXPECT_EQ(t.decode(t.encode_padded("the cat", 8, true).ids), "the cat");
    EXPECT_EQ(t.decode(t.encode("the 猫 cat")), "the  \xE2\x81\x87  cat");
    EXPECT_EQ(t.decode({-5, 1000, 30}), "the");
}

// The same model as tokenizer.json, spiece.model and GGUF metadata gives the
// same ids for every prompt, with and without a charsmap.
TEST(T5Tokenizer, AllThreeFormsAgreeTokenForToken) {
    for (const std::string& charsmap : {std::string(), test_charsmap()}) {
        test::TempDir dir;
        SpmOptions o;
        o.charsmap = charsmap;
        const T5Tokenizer spm = from_spiece(dir, test_pieces(), o);
        const T5Tokenizer hf = from_json(dir, test_pieces(), charsmap);
        const T5Tokenizer gguf = must_load(T5Tokenizer::from_gguf_metadata(spm.gguf_metadata(), "meta"));
        EXPECT_EQ(hf.size(), spm.size());
        EXPECT_EQ(hf.eos_id(), 1);
        EXPECT_EQ(hf.pad_id(), 0);
        EXPECT_EQ(hf.unk_id(), 2);
        EXPECT_EQ(gguf.eos_id(), 1);
        EXPECT_EQ(gguf.pad_id(), 0);
        for (size_t i = 0; i < test_pieces().size(); ++i) {
            EXPECT_EQ(hf.vocab().pieces[i].type, spm.vocab().pieces[i].type) << i;
            EXPECT_EQ(gguf.vocab().pieces[i].type, spm.vocab().pieces[i].type) << i;
        }
        for (const std::string& prompt : kPrompts) {
            const Ids ids = spm.encode(prompt);
            EXPECT_EQ(hf.encode(prompt), ids) << prompt;
            EXPECT_EQ(gguf.encode(prompt), ids) << prompt;
            EXPECT_EQ(hf.normalize(prompt), spm.normalize(prompt)) << prompt;
        }
    }
}

// The charsmap rules: the longest rule at each byte wins, replacements that
// hold spaces join the whitespace handling, an empty one drops a character.
TEST(T5Tokenizer, PrecompiledCharsmapNormalises) {
    test::TempDir dir;
    SpmOptions o;
    o.charsmap = test_charsmap();
    const T5Tokenizer t = from_spiece(dir, test_pieces(), o);
    // Tabs and newlines are spaces now: "the\tcat" is "the cat".
    EXPECT_EQ(t.encode("the\tcat"), (Ids{30, 32, 33}));
    // Ａ -> A (46); ＡＢ -> "ab" by the longer rule: "▁a"+"b" -8.0; ＡＣ:
    // only Ａ has a rule, Ｃ is copied and unknown.
    EXPECT_EQ(t.encode("\xEF\xBC\xA1 cat"), (Ids{3, 46, 32, 33}));
    EXPECT_EQ(t.encode("\xEF\xBC\xA1\xEF\xBC\xA2"), (Ids{36, letter('b')}));
    EXPECT_EQ(t.encode("\xEF\xBC\xA1\xEF\xBC\xA3"), (Ids{3, 46, 2}));
    // U+0001 vanishes, newline runs collapse with the following space.
    EXPECT_EQ(t.normalize("\x01the\n\n cat\x01"), kMeta + "the" + kMeta + "cat");
    // ﬁ -> "fi" (47): "▁"+"fi" -5.5.
    EXPECT_EQ(t.encode("\xEF\xAC\x81"), (Ids{3, 47}));
    // A leading ideographic space is a leading space, so it is trimmed.
    EXPECT_EQ(t.encode("\xE3\x80\x80the"), (Ids{30}));
    // Only control characters: nothing left, not even the "▁".
    EXPECT_EQ(t.normalize("\x01\x01"), "");
    // A NUL byte matches no rule (keys hold none) and is copied.
    EXPECT_EQ(t.normalize(std::string("a\0b", 3)), kMeta + std::string("a\0b", 3));
}

// UMT5-style byte fallback: an unknown character becomes its UTF-8 bytes
// (<0xXX> pieces, ids 3 + byte), never merged; decode puts them back.
TEST(T5Tokenizer, ByteFallbackSpellsUnknownCharactersAsBytes) {
    test::TempDir dir;
    SpmOptions o;
    o.byte_fallback = true;
    const T5Tokenizer spm = from_spiece(dir, byte_fallback_pieces(), o);
    const T5Tokenizer hf = from_json(dir, byte_fallback_pieces(), "", true);
    const Ids expected = {261, 3 + 0xE7, 3 + 0x8C, 3 + 0xAB, 3 + 0xE7, 3 + 0x8C, 3 + 0xAB};  // "▁a" 猫 猫
    EXPECT_EQ(spm.encode("a猫猫"), expected);
    EXPECT_EQ(hf.encode("a猫猫"), expected);
    EXPECT_EQ(spm.decode(expected), "a猫猫");
    EXPECT_EQ(spm.decode({3 + 0xE7, 261}), "\xEF\xBF\xBD a");  // a cut character
    // The byte pieces are ordinary pieces of the vocabulary without fallback.
    EXPECT_EQ(from_json(dir, byte_fallback_pieces(), "", false).encode("a猫"), (Ids{261, 2}));
}

// gguf_metadata() written into a real GGUF by -M convert's writer reads
// back into the same tokenizer.
TEST(T5Tokenizer, GgufMetadataSurvivesAGgufFile) {
    test::TempDir dir;
    SpmOptions o;
    o.charsmap = test_charsmap();
    const T5Tokenizer spm = from_spiece(dir, test_pieces(), o);
    const std::string in =
        dir.write("in.safetensors", test::build_safetensors({{"w", "F32", {2}, test::f32_bytes(2)}}));
    auto model = io::ModelFile::open({in});
    ASSERT_TRUE(model.ok()) << model.error().message;
    io::GgufWriteOptions options;
    options.extra_metadata = spm.gguf_metadata();
    const std::string out = dir.file("t5.gguf");
    auto status = io::write_gguf(*model, out, options);
    ASSERT_TRUE(status.ok()) << status.error().message;
    auto gguf = io::ModelFile::open({out});
    ASSERT_TRUE(gguf.ok()) << gguf.error().message;
    EXPECT_EQ(gguf->metadata().at("tokenizer.ggml.model").str, "t5");
    const T5Tokenizer back = must_load(T5Tokenizer::from_gguf_metadata(*gguf));
    EXPECT_EQ(back.vocab().precompiled_charsmap, test_charsmap());
    for (const std::string& prompt : kPrompts) EXPECT_EQ(back.encode(prompt), spm.encode(prompt)) << prompt;
}

// llama.cpp's T5 GGUFs without token types: the unknown id names the
// unknown piece, EOS and padding become control pieces; a signed-byte
// charsmap reads the same.
TEST(T5Tokenizer, GgufMetadataWithoutTokenTypes) {
    test::TempDir dir;
    SpmOptions o;
    o.charsmap = test_charsmap();
    const T5Tokenizer spm = from_spiece(dir, test_pieces(), o);
    io::Metadata m = spm.gguf_metadata();
    m.erase("tokenizer.ggml.token_type");
    for (io::MetaValue& b : m["tokenizer.ggml.precompiled_charsmap"].array)
        b = io::MetaValue::of_int(static_cast<int8_t>(b.u));
    const T5Tokenizer t = must_load(T5Tokenizer::from_gguf_metadata(m, "meta"));
    EXPECT_EQ(t.vocab().pieces[1].type, PieceType::Control);
    EXPECT_EQ(t.vocab().pieces[2].type, PieceType::Unknown);
    // <sep> is an ordinary piece now; everything else agrees.
    for (const std::string& prompt : {"the cat", "a red circle.", "\xEF\xBC\xA1\xEF\xBC\xA2", "the\tcat"}) {
        EXPECT_EQ(t.encode(prompt), spm.encode(prompt)) << prompt;
    }
}

TEST(T5Tokenizer, LoadFindsTheFileInAFolder) {
    test::TempDir dir;
    dir.write("flux/tokenizer/tokenizer.json", hf_tokenizer_json(test_pieces()).dump());  // not reached
    dir.write("flux/tokenizer_2/spiece.model", spm_model(test_pieces()));
    auto t = T5Tokenizer::load(dir.file("flux"));
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->encode("the cat"), (Ids{30, 32, 33}));
    const std::string json_path = dir.write("t5/tokenizer.json", hf_tokenizer_json(test_pieces()).dump());
    EXPECT_TRUE(T5Tokenizer::load(dir.file("t5")).ok());
    EXPECT_TRUE(T5Tokenizer::load(json_path).ok());
    dir.write("empty/readme.txt", "nothing");
    const Error e = load_error(T5Tokenizer::load(dir.file("empty")));
    EXPECT_TRUE(contains(e.message, dir.file("empty"))) << e.message;
    EXPECT_TRUE(contains(e.message, "no spiece.model or tokenizer.json")) << e.message;
}

// ---- hostile and wrong files: each a BadFile error naming the file ----

TEST(T5Tokenizer, MissingFileIsAnErrorNamingIt) {
    test::TempDir dir;
    const std::string path = dir.file("nope/spiece.model");
    Error e = load_error(T5Tokenizer::from_spiece_model(path));
    EXPECT_TRUE(contains(e.message, path)) << e.message;
    e = load_error(T5Tokenizer::from_tokenizer_json(dir.file("nope.json")));
    EXPECT_TRUE(contains(e.message, dir.file("nope.json"))) << e.message;
    e = load_error(T5Tokenizer::load(path));
    EXPECT_TRUE(contains(e.message, path)) << e.message;
}

TEST(T5Tokenizer, BpeTokenizerJsonIsRefused) {
    test::TempDir dir;
    const json clip = {
        {"model",
         {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", {"a b"}}, {"unk_token", "<|endoftext|>"}}}};
    const std::string path = dir.write("clip.json", clip.dump());
    const Error e = load_error(T5Tokenizer::from_tokenizer_json(path));
    EXPECT_TRUE(contains(e.message, path)) << e.message;
    EXPECT_TRUE(contains(e.message, "'BPE'")) << e.message;
    EXPECT_TRUE(contains(e.message, "Unigram")) << e.message;
}

TEST(T5Tokenizer, BrokenTokenizerJsonIsRefused) {
    test::TempDir dir;
    const auto refused = [&](const json& j, const std::string& why) {
        const std::string path = dir.write("t.json", j.dump());
        const Error e = load_error(T5Tokenizer::from_tokenizer_json(path));
        EXPECT_TRUE(contains(e.message, path)) << e.message;
        EXPECT_TRUE(contains(e.message, why)) << e.message;
    };
    json j = hf_tokenizer_json(test_pieces());
    j["model"]["vocab"] = json::array();
    refused(j, "model.vocab is empty");
    j = hf_tokenizer_json(test_pieces());
    j["model"]["unk_id"] = nullptr;
    refused(j, "model.unk_id is null");
    j = hf_tokenizer_json(test_pieces());
    j["model"]["vocab"] = json::array({json::array({"<unk>", 0.0})});
    j["model"]["unk_id"] = 0;
    j["added_tokens"] = json::array();
    refused(j, "no normal pieces");
    j = hf_tokenizer_json(test_pieces());
    j["model"]["vocab"][7] = "x";
    refused(j, "model.vocab[7]");
    j = hf_tokenizer_json(test_pieces());
    j["model"]["unk_id"] = 999;
    refused(j, "model.unk_id is 999");
    j = hf_tokenizer_json(test_pieces());
    j["model"]["vocab"][5][0] = "a";  // "b" renamed: a duplicate
    refused(j, "also piece 4");
    j = hf_tokenizer_json(test_pieces());
    j["normalizer"] = {{"type", "Lowercase"}};
    refused(j, "'Lowercase'");
    j = hf_tokenizer_json(test_pieces());
    j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "not base64!";
    refused(j, "base64");
    j = hf_tokenizer_json(test_pieces(), test_charsmap());
    std::string short_map = test_charsmap().substr(0, 100);
    j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = base64(short_map);
    refused(j, "precompiled charsmap");
    j = hf_tokenizer_json(test_pieces());
    j["pre_tokenizer"] = nullptr;
    refused(j, "Metaspace");
    j = hf_tokenizer_json(test_pieces());
    j["added_tokens"][0]["content"] = "<bad>";
    refused(j, "added token '<bad>'");
    j = hf_tokenizer_json(test_pieces());
    j.erase("model");
    refused(j, "no model");
    refused(json::array({1, 2}), "not a tokenizer.json");
    // Deep nesting (a hostile file): refused without recursing once per level.
    std::string deep = hf_tokenizer_json(test_pieces()).dump();
    const std::string normalizer = "\"normalizer\":";
    const size_t at = deep.find(normalizer) + normalizer.size();
    std::string nested;
    for (int k = 0; k < 100000; ++k) nested += "{\"type\":\"Sequence\",\"normalizers\":[";
    nested += "null";
    for (int k = 0; k < 100000; ++k) nested += "]}";
    const size_t end = deep.find(",\"pre_tokenizer\"");
    std::string text = deep.substr(0, at) + nested + deep.substr(end);
    std::string p = dir.write("deep.json", text);
    EXPECT_TRUE(contains(load_error(T5Tokenizer::from_tokenizer_json(p)).message, "nested deeper than 8"));
    text = deep;
    const std::string vocab = "\"vocab\":[";
    text.insert(text.find(vocab) + vocab.size(), std::string(100000, '[') + std::string(100000, ']') + ",");
    p = dir.write("deep.json", text);
    EXPECT_TRUE(contains(load_error(T5Tokenizer::from_tokenizer_json(p)).message, "model.vocab[0] is [<array>]"));
    const std::string path = dir.write("bad.json", "{\"model\": ");
    EXPECT_TRUE(contains(load_error(T5Tokenizer::from_tokenizer_json(path)).message, "malformed JSON"));
}

TEST(T5Tokenizer, WrongSentencepieceModelsAreRefused) {
    test::TempDir dir;
    const auto refused = [&](const std::string& bytes, const std::string& why) {
        const std::string path = dir.write("spiece.model", bytes);
        const Error e = load_error(T5Tokenizer::from_spiece_model(path));
        EXPECT_TRUE(contains(e.message, path)) << e.message;
        EXPECT_TRUE(contains(e.message, why)) << e.message;
    };
    SpmOptions bpe;
    bpe.model_type = 2;
    refused(spm_model(test_pieces(), bpe), "(BPE), not UNIGRAM");
    refused("", "empty file");
    refused(spm_model({}), "no pieces");
    std::vector<TestPiece> no_unk = test_pieces();
    no_unk[2].type = PieceType::Control;
    refused(spm_model(no_unk), "no unknown piece");
    std::vector<TestPiece> two_unk = test_pieces();
    two_unk[0].type = PieceType::Unknown;
    refused(spm_model(two_unk), "both unknown");
    std::vector<TestPiece> dup = test_pieces();
    dup[30].text = "a";
    refused(spm_model(dup), "piece 30 'a' is also piece 4");
    std::vector<TestPiece> empty_piece = test_pieces();
    empty_piece[9].text = "";
    refused(spm_model(empty_piece), "piece 9 is empty");
    std::vector<TestPiece> bad_type = test_pieces();
    std::string bytes;
    for (const TestPiece& p : bad_type) {
        std::string m;
        put_len(m, 1, p.text);
        put_float_field(m, 2, p.score);
        put_varint_field(m, 3, &p == &bad_type[7] ? 9 : static_cast<int64_t>(p.type));
        put_len(bytes, 1, m);
    }
    refused(bytes, "piece 7 'd' has type 9");
    std::vector<TestPiece> nan_score = test_pieces();
    nan_score[12].score = std::nanf("");
    refused(spm_model(nan_score), "not a finite number");
    SpmOptions fallback;
    fallback.byte_fallback = true;
    refused(spm_model(test_pieces(), fallback), "no byte pieces");
    std::vector<TestPiece> few_bytes = byte_fallback_pieces();
    few_bytes.erase(few_bytes.begin() + 10);
    refused(spm_model(few_bytes, fallback), "all 256 byte pieces");
    refused(spm_model(byte_fallback_pieces()), "byte pieces although");
    // A hostile charsmap: its trie says it is longer than the blob, or a
    // rule points outside the replacement strings.
    SpmOptions map;
    map.charsmap = std::string("\xFF\xFF\x00\x00", 4) + std::string(64, '\0');
    refused(spm_model(test_pieces(), map), "precompiled charsmap");
    map.charsmap = test_charsmap();
    map.charsmap.resize(map.charsmap.size() - 8);  // cut into the 15 bytes of replacement strings
    refused(spm_model(test_pieces(), map), "a rule points to byte");
}

// Truncated files, wrong wire types, runaway lengths: clean errors.
TEST(T5Tokenizer, MalformedProtobufIsACleanError) {
    const std::string good = spm_model(test_pieces());
    const auto refused = [&](const std::string& bytes, const std::string& why) {
        auto t =
            T5Tokenizer::from_spiece_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "m.model");
        ASSERT_FALSE(t.ok());
        EXPECT_EQ(t.error().kind, ErrorKind::BadFile);
        EXPECT_EQ(t.error().message.rfind("m.model: ", 0), 0u) << t.error().message;
        EXPECT_TRUE(contains(t.error().message, why)) << t.error().message;
    };
    refused(good.substr(0, good.size() - 1), "truncated fixed64");
    refused(good.substr(0, 5), "runs past the end");
    // A piece whose score comes as a varint.
    std::string m, piece;
    put_len(piece, 1, "a");
    put_varint_field(piece, 2, 3);
    put_len(m, 1, piece);
    refused(m, "score (field 2) has wire type varint, expected fixed32");
    // The pieces field as a varint.
    std::string v;
    put_varint_field(v, 1, 5);
    refused(v, "pieces (field 1) has wire type varint");
    // A group, a field number 0, an endless varint.
    std::string g;
    put_tag(g, 7, 3);
    refused(g, "wire type 3");
    refused(std::string("\x00\x01", 2), "field number 0");
    refused(std::string("\x28") + std::string(11, '\xFF'), "varint longer than 64 bits");
    refused(std::string("\x28\xFF"), "truncated varint");
    // Every cut of a valid file either loads or fails cleanly.
    for (size_t n = 1; n < good.size(); ++n) {
        auto t = T5Tokenizer::from_spiece_bytes(reinterpret_cast<const uint8_t*>(good.data()), n, "cut");
        if (!t.ok()) EXPECT_EQ(t.error().message.rfind("cut: ", 0), 0u) << t.error().message;
    }
}

// Random byte changes to a valid spiece.model (with a charsmap): whatever
// loads encodes any text to ids of its own vocabulary.
TEST(T5Tokenizer, MutatedModelsNeverCrash) {
    SpmOptions o;
    o.charsmap = test_charsmap();
    const std::string good = spm_model(test_pieces(), o);
    std::mt19937 rng(1234);
    int loaded = 0;
    for (int round = 0; round < 1500; ++round) {
        std::string bytes = good;
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < edits; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
        auto t = T5Tokenizer::from_spiece_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "fuzz");
        if (!t.ok()) {
            EXPECT_FALSE(t.error().message.empty());
            continue;
        }
        ++loaded;
        for (const std::string& prompt : kPrompts) {
            for (int32_t id : t->encode(prompt)) ASSERT_TRUE(id >= 0 && id < t->size());
        }
        (void)t->decode(t->encode_padded("the cat \xEF\xBC\xA1", 16, true).ids);
    }
    EXPECT_GT(loaded, 0);
}

TEST(T5Tokenizer, BrokenGgufMetadataIsRefused) {
    test::TempDir dir;
    const T5Tokenizer spm = from_spiece(dir, test_pieces());
    const auto refused = [&](const io::Metadata& m, const std::string& why) {
        const Error e = load_error(T5Tokenizer::from_gguf_metadata(m, "x.gguf"));
        EXPECT_EQ(e.message.rfind("x.gguf: ", 0), 0u) << e.message;
        EXPECT_TRUE(contains(e.message, why)) << e.message;
    };
    io::Metadata m = spm.gguf_metadata();
    m["tokenizer.ggml.model"] = io::MetaValue::of_string("gpt2");
    refused(m, "not \"t5\"");
    refused({}, "no tokenizer.ggml.model");
    m = spm.gguf_metadata();
    m["tokenizer.ggml.scores"].array.pop_back();
    refused(m, "tokenizer.ggml.scores");
    m = spm.gguf_metadata();
    m["tokenizer.ggml.token_type"].array[4] = io::MetaValue::of_int(17);
    refused(m, "token_type[4]");
    m = spm.gguf_metadata();
    m["tokenizer.ggml.unknown_token_id"] = io::MetaValue::of_uint(5000);
    refused(m, "unknown_token_id");
    m = spm.gguf_metadata();
    m["tokenizer.ggml.unknown_token_id"] = io::MetaValue::of_uint(1);
    refused(m, "typed control");
    m = spm.gguf_metadata();
    m["tokenizer.ggml.tokens"].array[3] = io::MetaValue::of_int(3);
    refused(m, "tokens[3] is not a string");
    m = spm.gguf_metadata();
    m["tokenizer.ggml.add_space_prefix"] = io::MetaValue::of_string("yes");
    refused(m, "add_space_prefix is not a boolean");
    m = spm.gguf_metadata();
    io::MetaValue map;
    map.kind = io::MetaValue::Kind::Array;
    map.array = {io::MetaValue::of_uint(300)};
    m["tokenizer.ggml.precompiled_charsmap"] = map;
    refused(m, "not a byte");
}

}  // namespace
}  // namespace kiln::text
