#include "text/clip_tokenizer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "test_files.h"
#include "text/unicode.h"
#include "text/utf8.h"

namespace kiln::text {
namespace {

// The 256 byte characters of CLIP's bytes_to_unicode, in vocabulary order,
// written out independently of the code under test: printable Latin-1 bytes
// first as themselves, then the others as U+0100 upwards.
std::vector<std::string> byte_chars() {
    std::vector<int> bytes;
    for (int b = '!'; b <= '~'; ++b) bytes.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bytes.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bytes.push_back(b);
    std::vector<int> chars = bytes;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
        if (std::find(bytes.begin(), bytes.end(), b) == bytes.end()) chars.push_back(256 + extra++);
    }
    std::vector<std::string> out;
    for (int c : chars) {
        std::string s;
        if (c < 0x80) {
            s.push_back(static_cast<char>(c));
        } else {
            s.push_back(static_cast<char>(0xC0 | (c >> 6)));
            s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
        }
        out.push_back(s);
    }
    return out;
}

// The merges of tests/fixtures/tokenizer/merges.txt, in rank order.
const std::vector<std::string> kMerges = {"r e",         "re d</w>", "c i", "ci r",     "c l",     "cl e</w>",
                                          "cir cle</w>", "o n</w>",  "t h", "th e</w>", "i t</w>", "' s</w>",
                                          "l e</w>",     "Ã ©</w>",  "w h", "wh i",     "whi t",   "whit e</w>"};

// The CLIP vocabulary layout (bytes, bytes + "</w>", one token per merge,
// specials) for `merges`: single bytes get their real CLIP ids.
std::vector<std::string> clip_layout_tokens(const std::vector<std::string>& merges) {
    std::vector<std::string> tokens = byte_chars();
    for (int i = 0; i < 256; ++i) tokens.push_back(tokens[i] + "</w>");
    for (const std::string& m : merges) {
        const size_t space = m.find(' ');
        tokens.push_back(m.substr(0, space) + m.substr(space + 1));
    }
    tokens.push_back("<|startoftext|>");
    tokens.push_back("<|endoftext|>");
    return tokens;
}

ClipTokenizer tiny(const std::vector<std::string>& merges = kMerges) {
    auto t = ClipTokenizer::from_tokens_and_merges(clip_layout_tokens(merges), merges, "tiny");
    EXPECT_TRUE(t.ok()) << t.error().message;
    return std::move(t.value());
}

ClipTokenizer fixture() {
    auto t = ClipTokenizer::load(KILN_FIXTURES_DIR "/tokenizer");
    EXPECT_TRUE(t.ok()) << t.error().message;
    return std::move(t.value());
}

// Ids of the tiny vocabulary (merge results follow the 512 byte tokens).
constexpr int32_t kA = 320;       // "a</w>", as in the real CLIP vocabulary
constexpr int32_t kComma = 267;   // ",</w>", as in the real CLIP vocabulary
constexpr int32_t kRed = 513;     // "red</w>"
constexpr int32_t kCircle = 518;  // "circle</w>"
constexpr int32_t kOn = 519;      // "on</w>"
constexpr int32_t kThe = 521;     // "the</w>"
constexpr int32_t kIt = 522;      // "it</w>"
constexpr int32_t kApS = 523;     // "'s</w>"
constexpr int32_t kEAcute = 525;  // "Ã©</w>" (é)
constexpr int32_t kWhite = 529;   // "white</w>"

int32_t byte_id(char c) { return static_cast<int32_t>(c - '!'); }  // printable ASCII, no word end
int32_t byte_end_id(char c) { return 256 + byte_id(c); }           // the same with "</w>"

using Ids = std::vector<int32_t>;

void expect_error(const Result<ClipTokenizer>& result, const std::string& fragment1,
                  const std::string& fragment2 = "") {
    ASSERT_FALSE(result.ok()) << "expected an error containing: " << fragment1;
    EXPECT_NE(result.error().message.find(fragment1), std::string::npos) << result.error().message;
    EXPECT_NE(result.error().message.find(fragment2), std::string::npos) << result.error().message;
}

std::string join_lines(const std::vector<std::string>& lines, const std::string& header, const std::string& eol) {
    std::string out = header;
    for (const std::string& l : lines) out += l + eol;
    return out;
}

// vocab.json for clip_layout_tokens(kMerges) with the specials at the real
// CLIP ids 49406/49407.
std::string vocab_json() {
    std::string out = "{";
    auto tokens = clip_layout_tokens(kMerges);
    tokens.resize(tokens.size() - 2);
    for (size_t i = 0; i < tokens.size(); ++i) {
        std::string escaped;
        for (char c : tokens[i]) {
            if (c == '"' || c == '\\') escaped.push_back('\\');
            escaped.push_back(c);
        }
        out += "\"" + escaped + "\":" + std::to_string(i) + ",";
    }
    return out + "\"<|startoftext|>\":49406,\"<|endoftext|>\":49407}";
}

// ---- encoding ----

TEST(ClipTokenizer, SpecialIdsComeFromTheVocabulary) {
    ClipTokenizer t = tiny();
    EXPECT_EQ(t.bos_id(), 512 + static_cast<int32_t>(kMerges.size()));
    EXPECT_EQ(t.eos_id(), t.bos_id() + 1);
    EXPECT_EQ(t.vocab_size(), t.eos_id() + 1);
    EXPECT_EQ(t.comma_id(), kComma);
    EXPECT_EQ(t.token_id("red</w>"), kRed);
    EXPECT_EQ(t.token_id("nope"), -1);
    EXPECT_EQ(t.token_text(kCircle), "circle</w>");
    EXPECT_EQ(t.token_text(-1), "");
    EXPECT_EQ(t.token_text(1 << 20), "");

    ClipTokenizer f = fixture();
    EXPECT_EQ(f.bos_id(), 49406);
    EXPECT_EQ(f.eos_id(), 49407);
    EXPECT_EQ(f.vocab_size(), 49408);
    EXPECT_EQ(f.token_text(40000), "");  // a hole in the id space
}

TEST(ClipTokenizer, EncodesWordsWithMerges) {
    ClipTokenizer t = tiny();
    EXPECT_EQ(t.encode("a red circle"), (Ids{kA, kRed, kCircle}));
    EXPECT_EQ(t.encode("a red circle on the white"), (Ids{kA, kRed, kCircle, kOn, kThe, kWhite}));
    // No merge applies: one id per byte, the last with "</w>".
    EXPECT_EQ(t.encode("xyz"), (Ids{byte_id('x'), byte_id('y'), byte_end_id('z')}));
    // "re" merges but "red" needs "d</w>": "reds" ends in "s</w>".
    EXPECT_EQ(t.encode("reds"), (Ids{t.token_id("re"), byte_id('d'), byte_end_id('s')}));
    EXPECT_TRUE(t.encode("").empty());
    EXPECT_TRUE(t.encode(" \t\n ").empty());
}

TEST(ClipTokenizer, MergeRankDecidesTheSplit) {
    // "cle": c-l (rank 4) merges before l-e</w> (rank 12), then cl-e</w>.
    ClipTokenizer t = tiny();
    EXPECT_EQ(t.encode("cle"), (Ids{t.token_id("cle</w>")}));
    // With l-e</w> first, "c" + "le</w>" has no merge left.
    std::vector<std::string> merges = {"l e</w>", "c l", "cl e</w>"};
    ClipTokenizer u = tiny(merges);
    EXPECT_EQ(u.encode("cle"), (Ids{byte_id('c'), u.token_id("le</w>")}));
    EXPECT_EQ(u.encode("le"), (Ids{u.token_id("le</w>")}));
    // Only the word end can use "l e</w>".
    EXPECT_EQ(u.encode("lele"), (Ids{byte_id('l'), byte_id('e'), u.token_id("le</w>")}));
}

TEST(ClipTokenizer, CleansWhitespaceAndLowerCases) {
    ClipTokenizer t = tiny();
    const Ids expected{kA, kRed, kCircle};
    EXPECT_EQ(t.encode("  A\tRED\n\n Circle  "), expected);
    EXPECT_EQ(t.encode("a\u00a0red\u3000circle"), expected);  // Unicode spaces
    EXPECT_EQ(t.encode("a red\x01 circle\x7f"), expected);    // control characters dropped
    // É lower-cases to é (bytes C3 A9 -> "Ã©</w>").
    EXPECT_EQ(t.encode("É"), (Ids{kEAcute}));
    EXPECT_EQ(t.encode("é"), (Ids{kEAcute}));
    // Fullwidth ASCII becomes ASCII, then lower-case.
    EXPECT_EQ(t.encode("ＲＥＤ"), (Ids{kRed}));
}

TEST(ClipTokenizer, PreTokenisesLikeTheClipRegex) {
    ClipTokenizer t = tiny();
    // Punctuation runs are one piece, separate from letters.
    EXPECT_EQ(t.encode("red,circle!!"), (Ids{kRed, kComma, kCircle, byte_id('!'), byte_end_id('!')}));
    // Digits are one piece each.
    EXPECT_EQ(t.encode("a123"), (Ids{kA, byte_end_id('1'), byte_end_id('2'), byte_end_id('3')}));
    // Contractions split off.
    EXPECT_EQ(t.encode("it's"), (Ids{kIt, kApS}));
    EXPECT_EQ(t.encode("IT'S"), (Ids{kIt, kApS}));
    // ... but only at the start of a match: "!'s" is one punctuation run, then "s".
    EXPECT_EQ(t.encode("!'s"), (Ids{byte_id('!'), byte_end_id('\''), byte_end_id('s')}));
    // Special-token text maps to the special ids.
    EXPECT_EQ(t.encode("<|startoftext|>a<|endoftext|>"), (Ids{t.bos_id(), kA, t.eos_id()}));
    EXPECT_EQ(t.encode("<|ENDOFTEXT|>"), (Ids{t.eos_id()}));  // lower-cased first
    // Non-ASCII letters join the word; emoji are punctuation.
    EXPECT_EQ(t.encode("aé"), (Ids{byte_id('a'), kEAcute}));
    const Ids cat = t.encode("a🐱");
    ASSERT_EQ(cat.size(), 5u);  // "a</w>" + 4 bytes of U+1F431
    EXPECT_EQ(cat[0], kA);
    EXPECT_GE(cat[4], 256);  // last byte carries "</w>"
}

TEST(ClipTokenizer, UnescapesHtmlAndStraightensQuotes) {
    ClipTokenizer t = tiny();
    EXPECT_EQ(t.encode("red &amp; circle"), (Ids{kRed, byte_end_id('&'), kCircle}));
    EXPECT_EQ(t.encode("&amp;amp;"), (Ids{byte_end_id('&')}));  // unescaped twice, as open_clip does
    EXPECT_EQ(t.encode("it&#39;s"), (Ids{kIt, kApS}));
    EXPECT_EQ(t.encode("it&#x27;s"), (Ids{kIt, kApS}));
    EXPECT_EQ(t.encode("it\u2019s"), (Ids{kIt, kApS}));  // ’ -> '
    EXPECT_EQ(t.encode("&lt;"), (Ids{byte_end_id('<')}));
    EXPECT_EQ(t.encode("&nbsp;red"), (Ids{kRed}));                  // U+00A0 is whitespace
    EXPECT_EQ(t.encode("&bogus;"), t.encode("& bogus ;"));          // unknown entities stay as they are
    EXPECT_EQ(t.encode("&ampred"), (Ids{byte_end_id('&'), kRed}));  // "&amp" needs no ';' (HTML5 legacy)
}

TEST(ClipTokenizer, InvalidUtf8BecomesReplacementCharacter) {
    ClipTokenizer t = tiny();
    // U+FFFD is EF BF BD: three byte characters, the last with "</w>".
    const Ids replacement = t.encode("\xEF\xBF\xBD");
    ASSERT_EQ(replacement.size(), 3u);
    EXPECT_EQ(t.encode("\xC3"), replacement);
    EXPECT_EQ(t.encode("\xFF"), replacement);
}

TEST(ClipTokenizer, UnknownSymbolsMapToEndOfText) {
    // A vocabulary missing "z</w>" (a hole at its id).
    std::vector<std::string> tokens = clip_layout_tokens(kMerges);
    tokens[256 + byte_id('z')] = "";
    auto t = ClipTokenizer::from_tokens_and_merges(tokens, kMerges, "holey");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->encode("a z"), (Ids{kA, t->eos_id()}));
}

TEST(ClipTokenizer, CachedAndConcurrentEncodingAgree) {
    ClipTokenizer t = tiny();
    const std::string text = "a red circle on the white, it's";
    const Ids first = t.encode(text);
    EXPECT_EQ(t.encode(text), first);
    std::vector<std::thread> threads;
    std::vector<int> same(4, 0);
    for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&, k] {
            bool ok = true;
            for (int i = 0; i < 200; ++i)
                ok = ok && t.encode(text + " " + std::to_string(i % 7)).size() == first.size() + 1;
            same[k] = ok;
        });
    }
    for (auto& th : threads) th.join();
    for (int ok : same) EXPECT_TRUE(ok);
}

// ---- decoding ----

TEST(ClipTokenizer, DecodesTheOpenClipWay) {
    ClipTokenizer t = tiny();
    EXPECT_EQ(t.decode(t.encode("A red circle, it's café!")), "a red circle , it 's café !");
    EXPECT_EQ(t.decode({t.bos_id(), kA, kRed, t.eos_id()}), "<|startoftext|>a red <|endoftext|>");
    EXPECT_EQ(t.decode({}), "");
    EXPECT_EQ(t.decode({-5, kA, 1 << 20}), "a");  // unknown ids are skipped
    // A lone lead byte decodes to U+FFFD.
    EXPECT_EQ(t.decode({t.token_id("Ã</w>")}), "\xEF\xBF\xBD");  // "Ã" is the byte 0xC3
}

// ---- loaders ----

TEST(ClipTokenizerLoad, FixtureMatchesTheLayoutBuiltHere) {
    // tests/fixtures/tokenizer holds vocab.json + merges.txt for kMerges.
    ClipTokenizer f = fixture();
    ClipTokenizer t = tiny();
    for (int32_t id = 0; id < 512 + static_cast<int32_t>(kMerges.size()); ++id) {
        EXPECT_EQ(f.token_text(id), t.token_text(id)) << id;
    }
    for (const char* text : {"a red circle", "it's the white circle, on a red cle", "café ÉÉ 123 !!"}) {
        Ids a = f.encode(text), b = t.encode(text);
        EXPECT_EQ(a, b) << text;
    }
}

TEST(ClipTokenizerLoad, VocabJsonAndMergesTxt) {
    test::TempDir dir;
    const std::string vocab = dir.write("vocab.json", vocab_json());
    // A #version header, CRLF line ends, a blank line at the end.
    const std::string merges = dir.write("merges.txt", join_lines(kMerges, "#version: 0.2\r\n", "\r\n") + "\r\n");
    auto t = ClipTokenizer::from_vocab_merges(vocab, merges);
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->bos_id(), 49406);
    EXPECT_EQ(t->eos_id(), 49407);
    EXPECT_EQ(t->encode("a red circle"), (Ids{kA, kRed, kCircle}));

    // load() on the vocab.json path finds merges.txt next to it; on the folder too.
    for (const std::string& path : {vocab, dir.path()}) {
        auto u = ClipTokenizer::load(path);
        ASSERT_TRUE(u.ok()) << path << ": " << u.error().message;
        EXPECT_EQ(u->encode("the white circle"), (Ids{kThe, kWhite, kCircle}));
    }
}

TEST(ClipTokenizerLoad, TokenizerJsonWithStringOrPairMerges) {
    test::TempDir dir;
    std::string merges_strings = "[";
    std::string merges_pairs = "[";
    for (size_t i = 0; i < kMerges.size(); ++i) {
        const std::string& m = kMerges[i];
        const size_t space = m.find(' ');
        const std::string sep = i ? "," : "";
        merges_strings += sep + "\"" + m + "\"";
        merges_pairs += sep + "[\"" + m.substr(0, space) + "\",\"" + m.substr(space + 1) + "\"]";
    }
    merges_strings += "]";
    merges_pairs += "]";
    const std::string added =
        R"("added_tokens":[{"id":49406,"content":"<|startoftext|>","special":true},)"
        R"({"id":49407,"content":"<|endoftext|>","special":true},{"id":49408,"content":"<extra>","special":false}])";
    for (const std::string& merges : {merges_strings, merges_pairs}) {
        const std::string json = "{\"version\":\"1.0\"," + added +
                                 ",\"model\":{\"type\":\"BPE\",\"vocab\":" + vocab_json() + ",\"merges\":" + merges +
                                 "}}";
        const std::string path = dir.write("tokenizer.json", json);
        auto t = ClipTokenizer::from_tokenizer_json(path);
        ASSERT_TRUE(t.ok()) << t.error().message;
        EXPECT_EQ(t->encode("a red circle"), (Ids{kA, kRed, kCircle}));
        EXPECT_EQ(t->bos_id(), 49406);
        EXPECT_EQ(t->token_id("<extra>"), 49408);  // added tokens join the vocabulary
        EXPECT_EQ(t->vocab_size(), 49409);

        auto via_load = ClipTokenizer::load(path);
        ASSERT_TRUE(via_load.ok()) << via_load.error().message;
        EXPECT_EQ(via_load->encode("it's"), (Ids{kIt, kApS}));
    }
    // A folder with only tokenizer.json.
    auto folder = ClipTokenizer::load(dir.path());
    ASSERT_TRUE(folder.ok()) << folder.error().message;
    EXPECT_EQ(folder->encode("red"), (Ids{kRed}));
}

TEST(ClipTokenizerLoad, DiffusersModelFolder) {
    test::TempDir dir;
    dir.write("model_index.json", "{}");
    dir.write("tokenizer/vocab.json", vocab_json());
    dir.write("tokenizer/merges.txt", join_lines(kMerges, "#version: 0.2\n", "\n"));
    auto t = ClipTokenizer::load(dir.path());
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->encode("a red circle"), (Ids{kA, kRed, kCircle}));
}

// A vocab.json that is not a file (a FIFO: reading it would block) is
// named for what it is, not reported as missing.
TEST(ClipTokenizerLoad, AVocabJsonThatIsNotAFileIsNamed) {
    test::TempDir dir;
    ASSERT_EQ(::mkfifo(dir.file("vocab.json").c_str(), 0644), 0);
    dir.write("merges.txt", join_lines(kMerges, "#version: 0.2\n", "\n"));
    auto t = ClipTokenizer::load(dir.path());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find(dir.file("vocab.json") + ": not a regular file (a FIFO)"), std::string::npos)
        << t.error().message;
}

TEST(ClipTokenizerLoad, GgufStyleTokensAndMerges) {
    auto t = ClipTokenizer::from_tokens_and_merges(clip_layout_tokens(kMerges), kMerges, "model.gguf");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->encode("a white circle"), (Ids{kA, kWhite, kCircle}));
}

TEST(ClipTokenizerLoad, OpenClipMergesOnly) {
    const std::string text = join_lines(kMerges, "#version: 0.2\n", "\n");
    auto t = ClipTokenizer::from_clip_merges(text, "bpe_simple_vocab_16e6.txt");
    ASSERT_TRUE(t.ok()) << t.error().message;
    // The vocabulary built from merges is the CLIP layout: same ids as the list form.
    ClipTokenizer ref = tiny();
    EXPECT_EQ(t->vocab_size(), ref.vocab_size());
    EXPECT_EQ(t->bos_id(), ref.bos_id());
    EXPECT_EQ(t->eos_id(), ref.eos_id());
    EXPECT_EQ(t->encode("it's a red circle"), ref.encode("it's a red circle"));

    test::TempDir dir;
    auto loaded = ClipTokenizer::load(dir.write("bpe_simple_vocab_16e6.txt", text));
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    EXPECT_EQ(loaded->encode("white"), (Ids{kWhite}));
}

TEST(ClipTokenizerLoad, OpenClipMergesAreCutAtTheClipVocabularySize) {
    // 49152 - 256 - 2 = 48894 merges are used, as open_clip does, which puts
    // the specials at the real ids 49406 and 49407.
    const std::vector<std::string> chars = byte_chars();
    std::string text = "#version: 0.2\n";
    int count = 0;
    for (size_t a = 0; a < 256 && count < 48900; ++a) {
        for (size_t b = 0; b < 256 && count < 48900; ++b, ++count) text += chars[a] + " " + chars[b] + "\n";
    }
    auto t = ClipTokenizer::from_clip_merges(text, "big.txt");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->bos_id(), 49406);
    EXPECT_EQ(t->eos_id(), 49407);
    EXPECT_EQ(t->vocab_size(), 49408);
    // Merge 48893 = 190 * 256 + 253 is the last one used.
    EXPECT_EQ(t->token_text(512 + 48893), chars[190] + chars[253]);
    EXPECT_EQ(t->token_id(chars[190] + chars[254]), -1);
}

// ---- loader errors ----

TEST(ClipTokenizerLoad, MissingFilesAreErrors) {
    test::TempDir dir;
    expect_error(ClipTokenizer::load(dir.file("nope.json")), "nope.json", "no such file");
    expect_error(ClipTokenizer::from_tokenizer_json(dir.file("tokenizer.json")), "tokenizer.json", "no such file");
    // vocab.json without merges.txt.
    const std::string vocab = dir.write("vocab.json", vocab_json());
    expect_error(ClipTokenizer::load(vocab), "merges.txt", "no such file");
    // An empty folder.
    test::TempDir empty;
    expect_error(ClipTokenizer::load(empty.path()), empty.path(), "no tokenizer.json or vocab.json + merges.txt");
    // Something else.
    expect_error(ClipTokenizer::load(dir.write("model.bin", "x")), "model.bin", "not a tokenizer file");
}

TEST(ClipTokenizerLoad, MalformedJsonIsAnError) {
    test::TempDir dir;
    const std::string merges = dir.write("merges.txt", join_lines(kMerges, "#version: 0.2\n", "\n"));
    expect_error(ClipTokenizer::from_vocab_merges(dir.write("vocab.json", "{\"a\": 1,"), merges), "vocab.json",
                 "malformed JSON");
    expect_error(ClipTokenizer::from_vocab_merges(dir.write("vocab.json", "[1, 2]"), merges), "vocab.json",
                 "not a JSON object");
    expect_error(ClipTokenizer::from_vocab_merges(dir.write("vocab.json", R"({"a": "x"})"), merges), "token 'a'",
                 "not an integer");
    expect_error(ClipTokenizer::from_vocab_merges(dir.write("vocab.json", R"({"a": -3})"), merges), "token 'a'",
                 "not an integer");
    expect_error(ClipTokenizer::from_tokenizer_json(dir.write("tokenizer.json", "{}")), "tokenizer.json",
                 "no \"model\" object");
    expect_error(ClipTokenizer::from_tokenizer_json(
                     dir.write("tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {}}})")),
                 "tokenizer.json", "expected \"BPE\"");
    expect_error(ClipTokenizer::from_tokenizer_json(
                     dir.write("tokenizer.json", "{\"model\": {\"vocab\": " + vocab_json() + ", \"merges\": [3]}}")),
                 "tokenizer.json", "merge 0 3");
    expect_error(ClipTokenizer::from_tokenizer_json(dir.write("tokenizer.json", "{\"model\": {\"vocab\": {}}}")),
                 "tokenizer.json", "no model.merges");
}

TEST(ClipTokenizerLoad, BadMergesAreErrors) {
    test::TempDir dir;
    const std::string vocab = dir.write("vocab.json", vocab_json());
    expect_error(ClipTokenizer::from_vocab_merges(vocab, dir.write("merges.txt", "#version: 0.2\nr e\nr e d\n")),
                 "merges.txt", "line 3: expected two symbols");
    // Symbols the vocabulary does not have.
    expect_error(ClipTokenizer::from_vocab_merges(vocab, dir.write("merges.txt", "r e\nq u\n")), "merge 1 'q u'",
                 "'qu', which is not in the vocabulary");
    expect_error(ClipTokenizer::from_tokens_and_merges(clip_layout_tokens(kMerges), {"r e", "xx y"}, "m.gguf"),
                 "m.gguf: merge 1 'xx y'", "'xx'");
    expect_error(ClipTokenizer::from_tokens_and_merges(clip_layout_tokens(kMerges), {"r e", "rey"}, "m.gguf"),
                 "m.gguf: merge 1 'rey'", "two space-separated symbols");
}

TEST(ClipTokenizerLoad, BadVocabulariesAreErrors) {
    std::vector<std::string> no_specials = clip_layout_tokens(kMerges);
    no_specials.resize(no_specials.size() - 2);
    expect_error(ClipTokenizer::from_tokens_and_merges(no_specials, kMerges, "m.gguf"), "m.gguf",
                 "no <|startoftext|> token");
    no_specials.push_back("<|startoftext|>");
    expect_error(ClipTokenizer::from_tokens_and_merges(no_specials, kMerges, "m.gguf"), "m.gguf",
                 "no <|endoftext|> token");

    std::vector<std::string> duplicate = clip_layout_tokens(kMerges);
    duplicate.push_back("red</w>");
    expect_error(ClipTokenizer::from_tokens_and_merges(duplicate, kMerges, "m.gguf"), "m.gguf: token 'red</w>'",
                 "ids 513 and");

    test::TempDir dir;
    const std::string merges = dir.write("merges.txt", "");
    expect_error(ClipTokenizer::from_vocab_merges(
                     dir.write("vocab.json", R"({"a": 1, "b": 1, "<|startoftext|>": 2, "<|endoftext|>": 3})"), merges),
                 "vocab.json", "id 1 is used by both 'a' and 'b'");
}

// ---- textual inversion ----

TEST(ClipTokenizerEmbeddings, WordsMapToIdsPastTheVocabulary) {
    ClipTokenizer t = fixture();
    auto style = t.add_embedding_token("myStyle", 3);
    ASSERT_TRUE(style.ok()) << style.error().message;
    EXPECT_EQ(style.value(), 49408);
    auto other = t.add_embedding_token("bad-hands", 2);
    ASSERT_TRUE(other.ok()) << other.error().message;
    EXPECT_EQ(other.value(), 49411);
    ASSERT_EQ(t.embeddings().size(), 2u);
    EXPECT_EQ(t.embeddings()[1].name, "bad-hands");

    EXPECT_EQ(t.encode("a myStyle red"), (Ids{kA, 49408, 49409, 49410, kRed}));
    EXPECT_EQ(t.encode("myStyle, bad-hands"), (Ids{49408, 49409, 49410, kComma, 49411, 49412}));
    EXPECT_EQ(t.encode("(myStyle)").size(), 5u);
    EXPECT_EQ(t.encode("RED myStyle").front(), kRed);  // the rest is still lower-cased

    // Case-sensitive and whole words only.
    for (const char* text : {"mystyle", "MYSTYLE", "myStyles", "xmyStyle", "myStyle_v2", "my-myStyle", "myStyle2"}) {
        const Ids ids = t.encode(text);
        EXPECT_TRUE(std::none_of(ids.begin(), ids.end(), [](int32_t id) { return id >= 49408; })) << text;
    }

    EXPECT_EQ(t.embedding_for_id(49410)->name, "myStyle");
    EXPECT_EQ(t.embedding_for_id(49411)->name, "bad-hands");
    EXPECT_EQ(t.embedding_for_id(49413), nullptr);
    EXPECT_EQ(t.embedding_for_id(kRed), nullptr);
    EXPECT_EQ(t.decode(t.encode("a myStyle red")), "a myStyle red");
}

TEST(ClipTokenizerEmbeddings, LongestNameWins) {
    ClipTokenizer t = tiny();
    const int32_t short_id = t.add_embedding_token("style", 1).value();
    const int32_t long_id = t.add_embedding_token("style v2", 1).value();
    EXPECT_EQ(t.encode("style v2"), (Ids{long_id}));
    EXPECT_EQ(t.encode("style a"), (Ids{short_id, kA}));
}

TEST(ClipTokenizerEmbeddings, BadRegistrationsAreErrors) {
    ClipTokenizer t = tiny();
    ASSERT_TRUE(t.add_embedding_token("x", 1).ok());
    auto dup = t.add_embedding_token("x", 2);
    ASSERT_FALSE(dup.ok());
    EXPECT_NE(dup.error().message.find("already registered"), std::string::npos);
    EXPECT_FALSE(t.add_embedding_token("", 1).ok());
    EXPECT_FALSE(t.add_embedding_token(" y", 1).ok());
    EXPECT_FALSE(t.add_embedding_token("y", 0).ok());
    EXPECT_EQ(t.embeddings().size(), 1u);
}

// ---- character classes ----

TEST(ClipCharClass, MatchesUnicodeCategories) {
    EXPECT_EQ(char_class('a'), CharClass::Letter);
    EXPECT_EQ(char_class('7'), CharClass::Number);
    EXPECT_EQ(char_class(' '), CharClass::Space);
    EXPECT_EQ(char_class('!'), CharClass::Other);
    EXPECT_EQ(char_class(0xE9), CharClass::Letter);    // é
    EXPECT_EQ(char_class(0x732B), CharClass::Letter);  // 猫
    EXPECT_EQ(char_class(0x3B1), CharClass::Letter);   // α
    EXPECT_EQ(char_class(0xB2), CharClass::Number);    // ²
    EXPECT_EQ(char_class(0xBD), CharClass::Number);    // ½
    EXPECT_EQ(char_class(0x663), CharClass::Number);   // Arabic-Indic 3
    EXPECT_EQ(char_class(0x2163), CharClass::Number);  // Roman numeral four
    EXPECT_EQ(char_class(0xA0), CharClass::Space);     // no-break space
    EXPECT_EQ(char_class(0x3000), CharClass::Space);   // ideographic space
    EXPECT_EQ(char_class(0x301), CharClass::Other);    // combining acute
    EXPECT_EQ(char_class(0x94D), CharClass::Other);    // Devanagari virama
    EXPECT_EQ(char_class(0x2014), CharClass::Other);   // em dash
    EXPECT_EQ(char_class(0x1F431), CharClass::Other);  // cat face emoji
    EXPECT_EQ(char_class(0x20AC), CharClass::Other);   // euro sign
}

TEST(ClipUtf8, DecodesLikePythonReplace) {
    EXPECT_EQ(utf8_to_u32("a\xC3\xA9"), (std::u32string{'a', 0xE9}));
    EXPECT_EQ(utf8_to_u32("\xF0\x9F\x90\xB1"), (std::u32string{0x1F431}));
    // Maximal invalid subparts: a truncated 3-byte sequence is one U+FFFD.
    EXPECT_EQ(utf8_to_u32("\xE2\x82x"), (std::u32string{0xFFFD, 'x'}));
    EXPECT_EQ(utf8_to_u32("\xC0\xAF"), (std::u32string{0xFFFD, 0xFFFD}));              // overlong
    EXPECT_EQ(utf8_to_u32("\xED\xA0\x80"), (std::u32string{0xFFFD, 0xFFFD, 0xFFFD}));  // surrogate
    EXPECT_EQ(u32_to_utf8(U"a\u00e9\U0001F431"), "a\xC3\xA9\xF0\x9F\x90\xB1");
}

}  // namespace
}  // namespace kiln::text
