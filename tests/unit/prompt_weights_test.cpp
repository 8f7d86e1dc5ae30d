#include "pipeline/prompt_weights.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace kiln::pipeline {
namespace {

using Parsed = std::vector<std::pair<std::string, float>>;
using Ids = std::vector<int32_t>;

// Expected weights are Python's doubles rounded to float, as the API returns.
void expect_parsed(const std::string& text, const Parsed& expected) {
    const Parsed got = parse_prompt_attention(text);
    ASSERT_EQ(got.size(), expected.size()) << text;
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].first, expected[i].first) << text << " [" << i << "]";
        EXPECT_EQ(got[i].second, expected[i].second) << text << " [" << i << "]";
    }
}

// ---- parse_prompt_attention ----

TEST(PromptAttention, A1111DocstringExamples) {
    expect_parsed("normal text", {{"normal text", 1.0f}});
    expect_parsed("an (important) word", {{"an ", 1.0f}, {"important", 1.1f}, {" word", 1.0f}});
    expect_parsed("(unbalanced", {{"unbalanced", 1.1f}});
    expect_parsed("\\(literal\\]", {{"(literal]", 1.0f}});
    expect_parsed("(unnecessary)(parens)", {{"unnecessaryparens", 1.1f}});
    expect_parsed("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
                  {{"a ", 1.0f},
                   {"house", static_cast<float>(1.5730000000000004)},
                   {" ", 1.1f},
                   {"on", 1.0f},
                   {" a ", 1.1f},
                   {"hill", 0.55f},
                   {", sun, ", 1.1f},
                   {"sky", static_cast<float>(1.4641000000000006)},
                   {".", 1.1f}});
}

TEST(PromptAttention, BracketsAndWeights) {
    expect_parsed("((a))", {{"a", static_cast<float>(1.2100000000000002)}});
    expect_parsed("[[a]]", {{"a", static_cast<float>(0.8264462809917354)}});
    expect_parsed("[unbalanced", {{"unbalanced", static_cast<float>(0.9090909090909091)}});
    expect_parsed("(a [b])", {{"a ", 1.1f}, {"b", 1.0f}});
    expect_parsed("(a:1.5)", {{"a", 1.5f}});
    expect_parsed("( a : 0.25 ) b", {{" a ", 0.25f}, {" b", 1.0f}});
    expect_parsed("(a:-1)", {{"a", -1.0f}});
    expect_parsed("(a:+2)b", {{"a", 2.0f}, {"b", 1.0f}});
    // Not a weight: the ':' and the rest are text, the ')' closes the bracket.
    expect_parsed("(a:1e5)", {{"a:1e5", 1.1f}});
    // A weight with nothing open is text; so are unmatched closers and plain colons.
    expect_parsed("word:1.5)", {{"word:1.5)", 1.0f}});
    expect_parsed("a) b]", {{"a) b]", 1.0f}});
    expect_parsed("x:y", {{"x:y", 1.0f}});
    // Malformed numbers: the longest valid prefix, or 1.0 (A1111 would raise).
    expect_parsed("(a:1.2.3)", {{"a", 1.2f}});
    expect_parsed("(a:.)b", {{"ab", 1.0f}});
}

TEST(PromptAttention, Escapes) {
    expect_parsed("a\\\\b", {{"a\\b", 1.0f}});
    expect_parsed("a\\b", {{"ab", 1.0f}});  // a lone backslash is dropped
    expect_parsed("\\(a\\) \\[b\\]", {{"(a) [b]", 1.0f}});
    expect_parsed("(\\(x\\))", {{"(x)", 1.1f}});
    expect_parsed("end\\", {{"end", 1.0f}});
}

TEST(PromptAttention, Break) {
    expect_parsed("a BREAK b", {{"a", 1.0f}, {"BREAK", -1.0f}, {"b", 1.0f}});
    expect_parsed("a  BREAK\n b", {{"a", 1.0f}, {"BREAK", -1.0f}, {"b", 1.0f}});
    expect_parsed("a,BREAK,b", {{"a,", 1.0f}, {"BREAK", -1.0f}, {",b", 1.0f}});
    expect_parsed("BREAK", {{"", 1.0f}, {"BREAK", -1.0f}, {"", 1.0f}});
    // Only an uppercase whole word.
    expect_parsed("aBREAK b", {{"aBREAK b", 1.0f}});
    expect_parsed("BREAK_x", {{"BREAK_x", 1.0f}});
    expect_parsed("a break b", {{"a break b", 1.0f}});
    // Inside brackets the marker's weight is multiplied too (A1111 does the same).
    expect_parsed("(a BREAK b)", {{"a", 1.1f}, {"BREAK", -1.1f}, {"b", 1.1f}});
}

TEST(PromptAttention, EmptyAndUnicode) {
    expect_parsed("", {{"", 1.0f}});
    expect_parsed("()", {{"", 1.0f}});
    expect_parsed("(café:1.2) 猫", {{"café", 1.2f}, {" 猫", 1.0f}});
}

// ---- tokenize_with_weights ----

// tests/fixtures/tokenizer: the CLIP byte layout ("a</w>" = 320, ",</w>" =
// 267 as in the real vocabulary), a few merges, BOS 49406, EOS 49407.
text::ClipTokenizer fixture() {
    auto t = text::ClipTokenizer::load(KILN_FIXTURES_DIR "/tokenizer");
    EXPECT_TRUE(t.ok()) << t.error().message;
    return std::move(t.value());
}

constexpr int32_t kBos = 49406;
constexpr int32_t kEos = 49407;
constexpr int32_t kA = 320;
constexpr int32_t kComma = 267;
constexpr int32_t kRed = 513;
constexpr int32_t kCircle = 518;

// BOS + content + EOS + pad up to 77.
Ids chunk(const Ids& content, int32_t pad = kEos) {
    Ids out{kBos};
    out.insert(out.end(), content.begin(), content.end());
    out.push_back(kEos);
    out.resize(77, pad);
    return out;
}

std::vector<float> chunk_weights(const std::vector<float>& content) {
    std::vector<float> out{1.0f};
    out.insert(out.end(), content.begin(), content.end());
    out.resize(77, 1.0f);
    return out;
}

std::string repeat(const std::string& word, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += word + " ";
    return out;
}

TEST(TokenChunks, OneChunkPaddedWithEndOfText) {
    text::ClipTokenizer t = fixture();
    TokenChunks c = tokenize_with_weights(t, "a red circle");
    ASSERT_EQ(c.tokens.size(), 1u);
    EXPECT_EQ(c.tokens[0], chunk({kA, kRed, kCircle}));
    EXPECT_EQ(c.weights[0], chunk_weights({1.0f, 1.0f, 1.0f}));
}

TEST(TokenChunks, WeightsFollowTheirTokens) {
    text::ClipTokenizer t = fixture();
    TokenChunks c = tokenize_with_weights(t, "a (red:1.5) [circle]");
    ASSERT_EQ(c.tokens.size(), 1u);
    EXPECT_EQ(c.tokens[0], chunk({kA, kRed, kCircle}));
    EXPECT_EQ(c.weights[0], chunk_weights({1.0f, 1.5f, static_cast<float>(1 / 1.1)}));
    // Emphasis off: brackets are text.
    ChunkOptions plain;
    plain.parse_weights = false;
    TokenChunks p = tokenize_with_weights(t, "(red)", plain);
    EXPECT_EQ(p.tokens[0], chunk({t.token_id("(</w>"), kRed, t.token_id(")</w>")}));
}

TEST(TokenChunks, OpenClipPadsWithZero) {
    text::ClipTokenizer t = fixture();
    ChunkOptions sd2;
    sd2.pad_id = 0;
    TokenChunks c = tokenize_with_weights(t, "a red", sd2);
    ASSERT_EQ(c.tokens.size(), 1u);
    EXPECT_EQ(c.tokens[0], chunk({kA, kRed}, 0));
}

TEST(TokenChunks, EmptyPromptIsOneChunk) {
    text::ClipTokenizer t = fixture();
    TokenChunks c = tokenize_with_weights(t, "");
    ASSERT_EQ(c.tokens.size(), 1u);
    EXPECT_EQ(c.tokens[0], chunk({}));
    EXPECT_EQ(c.weights[0], chunk_weights({}));
}

TEST(TokenChunks, BreakStartsANewChunk) {
    text::ClipTokenizer t = fixture();
    TokenChunks c = tokenize_with_weights(t, "a BREAK red circle");
    ASSERT_EQ(c.tokens.size(), 2u);
    EXPECT_EQ(c.tokens[0], chunk({kA}));
    EXPECT_EQ(c.tokens[1], chunk({kRed, kCircle}));
    // A BREAK at the end adds nothing; BREAK alone is one empty chunk; two BREAKs make an empty chunk between.
    EXPECT_EQ(tokenize_with_weights(t, "a BREAK").tokens.size(), 1u);
    EXPECT_EQ(tokenize_with_weights(t, "BREAK").tokens, std::vector<Ids>{chunk({})});
    TokenChunks two = tokenize_with_weights(t, "a BREAK BREAK red");
    ASSERT_EQ(two.tokens.size(), 3u);
    EXPECT_EQ(two.tokens[1], chunk({}));
    // Brackets around BREAK that do not multiply back to exactly -1 (in double) make it text.
    TokenChunks text = tokenize_with_weights(t, "[[[(((BREAK)))]]]");
    ASSERT_EQ(text.tokens.size(), 1u);
    EXPECT_EQ(text.tokens[0][4], t.token_id("k</w>"));  // b re a k</w>
    EXPECT_EQ(text.weights[0][1], -1.0f);
    // From already-parsed fragments.
    TokenChunks f = tokenize_fragments(t, {{"a", 1.0f}, {"BREAK", -1.0f}, {"red", 2.0f}});
    ASSERT_EQ(f.tokens.size(), 2u);
    EXPECT_EQ(f.weights[1], chunk_weights({2.0f}));
}

TEST(TokenChunks, LongPromptsContinueInMoreChunks) {
    text::ClipTokenizer t = fixture();
    EXPECT_EQ(tokenize_with_weights(t, repeat("a", 75)).tokens.size(), 1u);
    TokenChunks c = tokenize_with_weights(t, repeat("a", 80));
    ASSERT_EQ(c.tokens.size(), 2u);
    EXPECT_EQ(c.tokens[0], chunk(Ids(75, kA)));
    EXPECT_EQ(c.tokens[1], chunk(Ids(5, kA)));
    EXPECT_EQ(tokenize_with_weights(t, repeat("a", 160)).tokens.size(), 3u);
}

// A weight no float can hold (a thousand nested parentheses, an explicit
// 1e30) is refused up front, naming the fragment, not found as non-finite
// values after the job.
TEST(TokenChunks, WeightsBeyondTheLimitAreRefusedNamingTheFragment) {
    const std::string nested = std::string(1000, '(') + "cat" + std::string(1000, ')');
    Status s = check_prompt_size("a " + nested, "--prompt");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("--prompt: 'cat' has the weight inf"), std::string::npos) << s.error().message;
    s = check_prompt_size("a (dog:10000000) b", "--negative-prompt");  // A1111's weights are digits and a dot
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("--negative-prompt: 'dog' has the weight 10000000"), std::string::npos)
        << s.error().message;
    EXPECT_TRUE(check_prompt_size("a ((cat:3)) (dog:-2) [[b]]", "--prompt").ok());
}

// A BREAK storm or a huge prompt is bounded by the parse: check_prompt_size
// refuses it up front (naming the limit), and chunking never goes past
// kMaxPromptChunks whoever calls it.
TEST(TokenChunks, PromptSizeIsBoundedByChunkCount) {
    std::string storm = "a";
    for (int i = 0; i < 5000; ++i) storm += " BREAK a";
    Status s = check_prompt_size(storm, "--prompt");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message,
              "--prompt: 5000 BREAKs make at least 5001 chunks; at most 64 chunks (of 75 tokens) are allowed");
    EXPECT_TRUE(check_prompt_size(repeat("a BREAK", 63), "--prompt").ok());
    EXPECT_FALSE(check_prompt_size(repeat("a BREAK", 64) + "a", "--prompt").ok());
    s = check_prompt_size(std::string(kMaxPromptBytes + 1, 'a'), "--negative-prompt");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message, "--negative-prompt: 65537 bytes, more than the limit of 65536");

    text::ClipTokenizer t = fixture();
    EXPECT_EQ(tokenize_with_weights(t, storm).tokens.size(), static_cast<size_t>(kMaxPromptChunks));
    EXPECT_EQ(tokenize_with_weights(t, repeat("a", 75 * 100)).tokens.size(), static_cast<size_t>(kMaxPromptChunks));
}

TEST(TokenChunks, ACommaNearTheEndMovesTheRestToTheNextChunk) {
    text::ClipTokenizer t = fixture();
    // 70 a, a comma, 10 a: the chunk is full after 4 more; the 4 move on.
    const std::string prompt = repeat("a", 70) + ", " + repeat("a", 10);
    Ids first(70, kA);
    first.push_back(kComma);
    TokenChunks c = tokenize_with_weights(t, prompt);
    ASSERT_EQ(c.tokens.size(), 2u);
    EXPECT_EQ(c.tokens[0], chunk(first));
    EXPECT_EQ(c.tokens[1], chunk(Ids(10, kA)));

    // Back-tracking off: the chunk is cut at 75.
    ChunkOptions off;
    off.comma_backtrack = 0;
    TokenChunks d = tokenize_with_weights(t, prompt, off);
    ASSERT_EQ(d.tokens.size(), 2u);
    Ids full = first;
    full.insert(full.end(), 4, kA);
    EXPECT_EQ(d.tokens[0], chunk(full));
    EXPECT_EQ(d.tokens[1], chunk(Ids(6, kA)));

    // A comma more than 20 tokens back is ignored.
    const std::string far = repeat("a", 50) + ", " + repeat("a", 30);
    TokenChunks e = tokenize_with_weights(t, far);
    ASSERT_EQ(e.tokens.size(), 2u);
    EXPECT_EQ(e.tokens[1], chunk(Ids(6, kA)));
}

TEST(TokenChunks, EmbeddingsStayInOneChunk) {
    text::ClipTokenizer t = fixture();
    const int32_t first = t.add_embedding_token("style", 3).value();
    TokenChunks c = tokenize_with_weights(t, repeat("a", 74) + "(style)");
    ASSERT_EQ(c.tokens.size(), 2u);
    EXPECT_EQ(c.tokens[0], chunk(Ids(74, kA)));
    EXPECT_EQ(c.tokens[1], chunk({first, first + 1, first + 2}));
    EXPECT_EQ(c.weights[1], chunk_weights({1.1f, 1.1f, 1.1f}));

    // An embedding longer than a chunk is split.
    ChunkOptions small;
    small.chunk_length = 4;
    const int32_t big = t.add_embedding_token("huge", 6).value();
    TokenChunks s = tokenize_with_weights(t, "a huge", small);
    ASSERT_EQ(s.tokens.size(), 2u);
    EXPECT_EQ(s.tokens[0], (Ids{kBos, kA, big, big + 1, big + 2, kEos}));
    EXPECT_EQ(s.tokens[1], (Ids{kBos, big + 3, big + 4, big + 5, kEos, kEos}));
}

// ---- apply_token_weights ----

TEST(TokenWeights, ScaleRowsAndKeepTheMean) {
    std::vector<float> hidden = {1, 2, 3, 4, 5, 6};  // 2 tokens x 3
    const float weights[] = {1.0f, 2.0f};
    apply_token_weights(hidden.data(), 2, 3, weights);
    // Weighted: 1 2 3 8 10 12 (mean 6); scaled by 3.5 / 6.
    const double s = 3.5 / 6.0;
    const std::vector<double> expected = {1 * s, 2 * s, 3 * s, 8 * s, 10 * s, 12 * s};
    for (size_t i = 0; i < hidden.size(); ++i) EXPECT_NEAR(hidden[i], expected[i], 1e-6) << i;
    EXPECT_NEAR(std::accumulate(hidden.begin(), hidden.end(), 0.0) / 6.0, 3.5, 1e-6);
}

TEST(TokenWeights, UnitWeightsChangeNothing) {
    std::vector<float> hidden = {0.5f, -1.25f, 3.0f, 2.0f};
    const std::vector<float> before = hidden;
    const float weights[] = {1.0f, 1.0f};
    apply_token_weights(hidden.data(), 2, 2, weights);
    EXPECT_EQ(hidden, before);
}

TEST(TokenWeights, ZeroWeightedMeanSkipsTheRescale) {
    std::vector<float> hidden = {1.0f, -3.0f};  // 2 tokens x 1
    const float weights[] = {3.0f, 1.0f};       // weighted sum 0
    apply_token_weights(hidden.data(), 2, 1, weights);
    EXPECT_EQ(hidden, (std::vector<float>{3.0f, -3.0f}));
    apply_token_weights(hidden.data(), 0, 1, weights);  // nothing to do
}

}  // namespace
}  // namespace kiln::pipeline
