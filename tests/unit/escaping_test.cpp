// Text that comes from files reaches the terminal escaped: no raw control
// bytes (a tensor name holding ESC [ 2 J would clear the screen).
#include <gtest/gtest.h>

#include "test_files.h"
#include "text/clip_tokenizer.h"
#include "util/format.h"

namespace kiln {
namespace {

bool has_control_bytes(const std::string& s) {
    for (unsigned char c : s) {
        if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
    }
    return false;
}

TEST(Escaping, ControlBytesAndInvalidUtf8BecomeHexEscapes) {
    EXPECT_EQ(escaped("plain text"), "plain text");
    EXPECT_EQ(escaped("a\x1b[2Jb"), "a\\x1b[2Jb");
    EXPECT_EQ(escaped("line\nnext\t"), "line\\x0anext\\x09");
    EXPECT_EQ(escaped("caf\xc3\xa9 \xe7\x8c\xab"), "caf\xc3\xa9 \xe7\x8c\xab");  // valid UTF-8 kept
    EXPECT_EQ(escaped("\xff\xc3"), "\\xff\\xc3");                                // invalid bytes escaped
    EXPECT_EQ(escaped("\xc2\x9b"), "\\xc2\\x9b");                                // C1 CSI escaped
    EXPECT_EQ(escaped("a\xe2\x80\xaetxt.exe"), "a\\xe2\\x80\\xaetxt.exe");            // U+202E, right-to-left override
    EXPECT_EQ(escaped("\xe2\x81\xa6x\xe2\x81\xa9"), "\\xe2\\x81\\xa6x\\xe2\\x81\\xa9");    // isolates
    EXPECT_EQ(escaped("back\\slash"), "back\\x5cslash");
    EXPECT_EQ(escaped(std::string("nul\0byte", 8)), "nul\\x00byte");
}

TEST(Escaping, InfoTensorsPrintsNamesAndMetadataEscaped) {
    test::TempDir dir;
    const std::string model = dir.write(
        "m.safetensors", test::build_safetensors({{"evil\\u001b[2J\\u0007name", "F32", {1}, test::f32_bytes(1)}},
                                                 {{"note\\u001b]0;title\\u0007", "x\\u001b[31my"}}));
    auto r = test::run_command(std::string(KILN_BIN) + " info --tensors " + model);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(has_control_bytes(r.out)) << r.out;
    EXPECT_NE(r.out.find("evil\\x1b[2J\\x07name"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("note\\x1b]0;title\\x07 = x\\x1b[31my"), std::string::npos) << r.out;
}

TEST(Escaping, TokenizerErrorsQuoteFileTextEscaped) {
    test::TempDir dir;
    const std::string vocab = dir.write("vocab.json", std::string("{\"bad\\u001b[2Jtoken\": -5}"));
    const std::string merges = dir.write("merges.txt", std::string("#version: 0.2\n"));
    auto t = text::ClipTokenizer::from_vocab_merges(vocab, merges);
    ASSERT_FALSE(t.ok());
    EXPECT_FALSE(has_control_bytes(t.error().message)) << t.error().message;
    EXPECT_NE(t.error().message.find("bad\\x1b[2Jtoken"), std::string::npos) << t.error().message;

    const std::string bad_merges = dir.write("merges2.txt", std::string("#version: 0.2\nonly\x1b[2J\n"));
    const std::string ok_vocab = dir.write("vocab2.json", std::string("{\"a\": 0}"));
    t = text::ClipTokenizer::from_vocab_merges(ok_vocab, bad_merges);
    ASSERT_FALSE(t.ok());
    EXPECT_FALSE(has_control_bytes(t.error().message)) << t.error().message;
}

}  // namespace
}  // namespace kiln
