// Every option name of sd-cli (tests/fixtures/sd_cli_options.txt, copied
// from the pinned stable-diffusion.cpp commit it names) is implemented,
// accepted and ignored, or refused by name: never "unknown option". And
// docs/sd_cli.md lists each with what kiln does, as the parser says.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "args.h"
#include "test_files.h"

namespace kiln::cli {
namespace {

std::vector<std::string> reference_option_names() {
    std::ifstream in(std::string(KILN_FIXTURES_DIR) + "/sd_cli_options.txt");
    std::vector<std::string> names;
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty() && line[0] == '-') names.push_back(line);
    }
    return names;
}

// A value each implemented option takes; the rest take "1".
std::string sample_value(const std::string& name, const std::string& prompt_file) {
    static const std::map<std::string, std::string> values = {
        {"-M", "img_gen"},
        {"--mode", "img_gen"},
        {"--sampling-method", "euler"},
        {"--scheduler", "karras"},
        {"--rng", "cuda"},
        {"--sampler-rng", "cpu"},
        {"--prediction", "eps"},
        {"--type", "f16"},
        {"--lora-apply-mode", "auto"},
        {"--preview", "proj"},
        {"--cache-mode", "easycache"},
        {"--scm-policy", "dynamic"},
        {"--skip-layers", "[7,8,9]"},
        {"--sigmas", "1,0"},
        {"--hires-sigmas", "0.5,0"},
        {"--hires-upscaler", "latent"},
        {"--auto-fit", "on"},
        {"--backend", "cpu"},
        {"--params-backend", "cpu"},
        {"--rpc-servers", "127.0.0.1:50052"},
        {"--metadata-format", "json"},
        {"--model-args", "chroma_use_dit_mask=false"},
        {"--vae-format", "auto"},
        {"--cache-option", "threshold=0.2"},
        {"--scm-mask", "1,0,1"},
        {"-W", "512"},
        {"--width", "512"},
        {"-H", "512"},
        {"--height", "512"},
        {"--vae-tile-size", "32"},
        {"--vae-tile-overlap", "0.5"},
        {"--split-mode", "layer"},
        {"--high-noise-sampling-method", "euler"},
    };
    if (name == "--prompt-file" || name == "--negative-prompt-file") return prompt_file;
    auto it = values.find(name);
    return it == values.end() ? "1" : it->second;
}

TEST(SdCliOptions, EveryReferenceOptionIsImplementedIgnoredOrRefusedByName) {
    const std::vector<std::string> names = reference_option_names();
    ASSERT_EQ(names.size(), 178u) << "tests/fixtures/sd_cli_options.txt lost lines";
    test::TempDir dir;
    const std::string prompt_file = dir.file("prompt.txt");
    std::ofstream(prompt_file) << "a lighthouse\n";

    std::map<SdCliSupport, int> counts;
    for (const std::string& name : names) {
        SCOPED_TRACE(name);
        const SdCliSupportNote s = sd_cli_support(name);
        ++counts[s.support];
        std::vector<std::string> args = {name};
        if (s.takes_value) args.push_back(sample_value(name, prompt_file));
        auto parsed = parse_args(args);
        switch (s.support) {
            case SdCliSupport::Unknown: ADD_FAILURE() << "kiln does not know sd-cli's " << name; break;
            case SdCliSupport::Implemented:
                if (auto* e = std::get_if<UsageError>(&parsed)) ADD_FAILURE() << e->message;
                break;
            case SdCliSupport::Ignored: {
                auto* o = std::get_if<Options>(&parsed);
                ASSERT_NE(o, nullptr) << std::get<UsageError>(parsed).message;
                EXPECT_EQ(o->ignored_sd_cli_options, std::vector<std::string>{name});
                break;
            }
            case SdCliSupport::Refused: {
                auto* e = std::get_if<UsageError>(&parsed);
                ASSERT_NE(e, nullptr);
                EXPECT_EQ(e->message, s.note);
                EXPECT_EQ(e->message.rfind(name + " ", 0), 0u) << e->message;
                EXPECT_NE(e->message.find("kiln"), std::string::npos) << e->message;
                break;
            }
        }
    }
    // Most of sd-cli is kiln's too: a refusal is the exception.
    EXPECT_GT(counts[SdCliSupport::Implemented], 110);
    EXPECT_EQ(counts[SdCliSupport::Unknown], 0);
}

// The table of docs/sd_cli.md between its markers, as the parser describes
// each option. KILN_UPDATE_DOCS=1 writes it into the file.
TEST(SdCliOptions, DocsListEveryOptionAsTheParserDoes) {
    std::ostringstream table;
    table << "| option | kiln | what it does in kiln |\n|---|---|---|\n";
    for (const std::string& name : reference_option_names()) {
        const SdCliSupportNote s = sd_cli_support(name);
        const char* word = s.support == SdCliSupport::Implemented ? "yes"
                           : s.support == SdCliSupport::Ignored   ? "ignored"
                           : s.support == SdCliSupport::Refused   ? "refused"
                                                                  : "unknown";
        std::string note = s.note;
        for (size_t at = note.find('|'); at != std::string::npos; at = note.find('|', at + 2))
            note.replace(at, 1, "\\|");
        table << "| `" << name << "` | " << word << " | " << note << " |\n";
    }
    const std::string path = std::string(KILN_DOCS_DIR) + "/sd_cli.md";
    std::ifstream in(path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    std::string doc = buffer.str();
    const std::string begin = "<!-- sd-cli options: begin -->\n", end = "<!-- sd-cli options: end -->";
    const size_t b = doc.find(begin), e = doc.find(end);
    ASSERT_NE(b, std::string::npos) << path << " has no " << begin;
    ASSERT_NE(e, std::string::npos) << path << " has no " << end;
    const std::string current = doc.substr(b + begin.size(), e - b - begin.size());
    if (current != table.str() && std::getenv("KILN_UPDATE_DOCS")) {
        doc.replace(b + begin.size(), e - b - begin.size(), table.str());
        std::ofstream(path) << doc;
        return;
    }
    // The first line that differs, not the whole table: it is 180 lines long.
    std::istringstream have(current), want(table.str());
    std::string had, wanted;
    for (int line = 1; std::getline(want, wanted); ++line) {
        if (!std::getline(have, had)) had = "(the table ends)";
        if (had == wanted) continue;
        ADD_FAILURE() << path << " is out of date at table line " << line << ":\n  has:    " << had
                      << "\n  parser: " << wanted << "\nrerun this test with KILN_UPDATE_DOCS=1";
        return;
    }
    EXPECT_FALSE(std::getline(have, had)) << path << " lists more than sd-cli's options: " << had;
}

TEST(SdCliOptions, PromptFilesDropTheirLastLineBreak) {
    test::TempDir dir;
    std::ofstream(dir.file("p.txt")) << "a lighthouse,\nat dusk\r\n\n";
    std::ofstream(dir.file("n.txt")) << "blurry";
    auto parsed = parse_args({"--prompt-file", dir.file("p.txt"), "--negative-prompt-file", dir.file("n.txt")});
    ASSERT_TRUE(std::holds_alternative<Options>(parsed)) << std::get<UsageError>(parsed).message;
    EXPECT_EQ(std::get<Options>(parsed).prompt, "a lighthouse,\nat dusk");
    EXPECT_EQ(std::get<Options>(parsed).negative_prompt, "blurry");

    auto missing = parse_args({"--prompt-file", dir.file("none.txt")});
    ASSERT_TRUE(std::holds_alternative<UsageError>(missing));
    EXPECT_NE(std::get<UsageError>(missing).message.find(dir.file("none.txt")), std::string::npos);
}

TEST(SdCliOptions, ModelArgsSetTheirFlags) {
    auto parsed = parse_args({"--model-args",
                              "chroma_use_dit_mask=false,chroma_use_t5_mask=true,chroma_t5_mask_pad=3,"
                              "diffusion_flash_attn=1,vae_on_cpu=true,enable_mmap=true"});
    ASSERT_TRUE(std::holds_alternative<Options>(parsed)) << std::get<UsageError>(parsed).message;
    const Options& o = std::get<Options>(parsed);
    EXPECT_TRUE(o.chroma_disable_dit_mask);
    EXPECT_TRUE(o.chroma_enable_t5_mask);
    EXPECT_EQ(o.chroma_t5_mask_pad, 3);
    EXPECT_TRUE(o.diffusion_fa);
    EXPECT_EQ(o.modules_on_cpu, "vae");

    for (const auto& [value, expected] : std::vector<std::pair<std::string, std::string>>{
             {"chroma_use_dit_mask=maybe", "chroma_use_dit_mask: expected true or false, got 'maybe'"},
             {"warp_drive=true", "'warp_drive' is no model argument kiln knows"},
             {"chroma_use_dit_mask", "expected key=value, got 'chroma_use_dit_mask'"}}) {
        auto bad = parse_args({"--model-args", value});
        ASSERT_TRUE(std::holds_alternative<UsageError>(bad)) << value;
        EXPECT_EQ(std::get<UsageError>(bad).message, "--model-args: " + expected);
    }
}

TEST(SdCliOptions, IgnoredSwitchesTakeNoValueAndRefusalsNameTheFeature) {
    auto inline_value = parse_args({"--mmap=yes"});
    ASSERT_TRUE(std::holds_alternative<UsageError>(inline_value));
    EXPECT_EQ(std::get<UsageError>(inline_value).message, "--mmap takes no value");

    auto vae_format = parse_args({"--vae-format", "flux"});
    ASSERT_TRUE(std::holds_alternative<UsageError>(vae_format));
    EXPECT_NE(std::get<UsageError>(vae_format).message.find("cannot override it with 'flux'"), std::string::npos);

    auto split = parse_args({"--split-mode", "diffusion=row,te=layer"});
    ASSERT_TRUE(std::holds_alternative<Options>(split)) << std::get<UsageError>(split).message;
    EXPECT_EQ(std::get<Options>(split).split_mode, "diffusion=row,te=layer");
    auto diagonal = parse_args({"--split-mode", "diagonal"});
    ASSERT_TRUE(std::holds_alternative<UsageError>(diagonal));
    EXPECT_EQ(std::get<UsageError>(diagonal).message,
              "--split-mode: unknown mode 'diagonal' (valid values: layer, row)");

    auto sigmas = parse_args({"--hires-sigmas", "[0.85, 0.7,0.42,0]"});
    ASSERT_TRUE(std::holds_alternative<Options>(sigmas));
    EXPECT_EQ(std::get<Options>(sigmas).hires_sigmas, (std::vector<float>{0.85f, 0.7f, 0.42f, 0.0f}));
}

}  // namespace
}  // namespace kiln::cli
