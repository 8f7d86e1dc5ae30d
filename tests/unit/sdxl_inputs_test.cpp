// SDXL from every input form kiln accepts must make the same image: the tiny
// SDXL with the tiny VAE as one single-file checkpoint, its GGUF conversion,
// separate parts given with sd-cli's --diffusion-model, --clip_l, --clip_g
// and --vae (bigG both in open_clip and in HF naming), and a diffusers
// StableDiffusionXLPipeline folder made from it with kiln's name map. Every
// file is written here from the committed tiny models. Also: requests SDXL
// cannot run (a size off its stride) fail cleanly in `kiln` and `kiln plan`.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "golden.h"
#include "image/image_io.h"
#include "io/model_file.h"
#include "io/name_map.h"
#include "pixel_difference.h"
#include "test_files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// The tiny models' head sizes (real ones follow width / 64) travel in every file.
const std::vector<std::pair<std::string, std::string>> kMetadata = {{"kiln.clip.heads", "2"},
                                                                    {"kiln.unet.head_channels", "16"}};

constexpr const char* kClipL = "conditioner.embedders.0.transformer.";
constexpr const char* kClipG = "conditioner.embedders.1.model.";
constexpr const char* kUnet = "model.diffusion_model.";
constexpr const char* kVae = "first_stage_model.";

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

test::SafetensorsEntry entry(const io::ModelFile& file, const io::TensorInfo& t, std::string name) {
    return test::copy_entry(file, t, std::move(name));
}

// The tiny SDXL and the tiny SD1's VAE in one ldm-named checkpoint.
std::vector<test::SafetensorsEntry> merged_checkpoint() {
    auto sdxl = io::ModelFile::open({test::golden_path("models/sdxl_tiny.safetensors")});
    auto sd1 = io::ModelFile::open({test::golden_path("models/sd1_tiny.safetensors")});
    EXPECT_TRUE(sdxl.ok() && sd1.ok());
    std::vector<test::SafetensorsEntry> all;
    for (const io::TensorInfo& t : sdxl->tensors()) all.push_back(entry(*sdxl, t, t.name));
    for (const io::TensorInfo& t : sd1->tensors()) {
        if (starts_with(t.name, kVae)) all.push_back(entry(*sd1, t, t.name));
    }
    return all;
}

// Every form of the same model, written once for the suite.
class SdxlInputs : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        const auto all = merged_checkpoint();
        dir_->write("sdxl.safetensors", test::build_safetensors(all, kMetadata));

        // Separate parts, each without its prefix.
        std::map<std::string, std::vector<test::SafetensorsEntry>> parts;
        for (const auto& e : all) {
            for (const char* prefix : {kClipL, kClipG, kUnet, kVae}) {
                if (!starts_with(e.name, prefix)) continue;
                test::SafetensorsEntry bare = e;
                bare.name = e.name.substr(std::strlen(prefix));
                parts[prefix].push_back(std::move(bare));
            }
        }
        dir_->write("parts/clip_l.safetensors", test::build_safetensors(parts[kClipL], kMetadata));
        dir_->write("parts/clip_g.safetensors", test::build_safetensors(parts[kClipG], kMetadata));
        dir_->write("parts/unet.safetensors", test::build_safetensors(parts[kUnet], kMetadata));
        dir_->write("parts/vae.safetensors", test::build_safetensors(parts[kVae], kMetadata));

        // The diffusers folder: two levels, one resnet each, attention on the second.
        const io::NameMap map(io::ModelFamily::SDXL, io::UnetLayout{2, 1, 0b10});
        std::map<std::string, std::vector<test::SafetensorsEntry>> components;
        for (const auto& e : all) {
            std::string folder;
            for (auto& d : test::to_diffusers(e, map, &folder)) components[folder].push_back(std::move(d));
        }
        for (auto& [folder, entries] : components) {
            const char* file_name =
                folder == "unet" || folder == "vae" ? "diffusion_pytorch_model.safetensors" : "model.safetensors";
            dir_->write("diffusers/" + folder + "/" + file_name, test::build_safetensors(entries, kMetadata));
        }
        // bigG as HF's CLIPTextModelWithProjection file, as diffusers'
        // text_encoder_2/model.safetensors is often passed to --clip_g.
        dir_->write("parts/clip_g_hf.safetensors", test::build_safetensors(components["text_encoder_2"], kMetadata));
        for (const char* folder : {"tokenizer", "tokenizer_2"}) {
            for (const char* f : {"vocab.json", "merges.txt"}) {
                fs::create_directories(dir_->file(std::string("diffusers/") + folder));
                fs::copy_file(tokenizer() + "/" + f, dir_->file(std::string("diffusers/") + folder + "/" + f));
            }
        }
        dir_->write("diffusers/model_index.json", std::string(R"({"_class_name": "StableDiffusionXLPipeline",
                        "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
                        "text_encoder": ["transformers", "CLIPTextModel"],
                        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
                        "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
                        "scheduler": ["diffusers", "EulerDiscreteScheduler"]})"));
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static std::string tokenizer() { return std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer"; }
    static std::string file(const std::string& name) { return dir_->file(name); }
    static test::TempDir* dir_;
};
test::TempDir* SdxlInputs::dir_ = nullptr;

std::string kiln(const std::string& args) { return std::string(KILN_BIN) + " " + args + " -t 1"; }

// Generates with the model flags `model_args`; the image, empty when it failed.
image::Image generate(const std::string& model_args, const std::string& out) {
    auto r =
        test::run_command(kiln(model_args + " -p \"a red circle\" -n blurry -W 64 -H 64 --steps 3 -s 3 -o " + out));
    EXPECT_EQ(r.exit_code, 0) << model_args << "\n" << r.err;
    auto image = image::read_image(out);
    if (!image.ok()) return {};
    EXPECT_EQ(image->width, 64);
    return *image;
}

TEST_F(SdxlInputs, EveryFormMakesTheSameImage) {
    const std::string tok = " --tokenizer " + tokenizer();
    const image::Image single = generate("-m " + file("sdxl.safetensors") + tok, file("single.png"));
    ASSERT_FALSE(single.pixels.empty());

    auto info = test::run_command(kiln("info " + file("sdxl.safetensors")));
    EXPECT_NE(info.out.find("SDXL"), std::string::npos) << info.out;

    auto convert =
        test::run_command(kiln("-M convert -m " + file("sdxl.safetensors") + tok + " -o " + file("sdxl.gguf")));
    ASSERT_EQ(convert.exit_code, 0) << convert.err;

    const std::string parts = " --diffusion-model " + file("parts/unet.safetensors") + " --clip_l " +
                              file("parts/clip_l.safetensors") + " --vae " + file("parts/vae.safetensors");
    const struct {
        std::string name, args;
    } forms[] = {
        {"gguf", "-m " + file("sdxl.gguf") + tok},
        {"parts", parts + " --clip_g " + file("parts/clip_g.safetensors") + tok},
        {"parts, HF-named bigG", parts + " --clip_g " + file("parts/clip_g_hf.safetensors") + tok},
        // The folder's own tokenizer/ is used.
        {"diffusers", "-m " + file("diffusers")},
    };
    int n = 0;
    for (const auto& form : forms) {
        SCOPED_TRACE(form.name);
        const image::Image image = generate(form.args, file("form" + std::to_string(n++) + ".png"));
        ASSERT_EQ(image.pixels.size(), single.pixels.size());
        const test::PixelDifference d = test::pixel_difference(image, single);
        EXPECT_EQ(d.max, 0) << "the image differs from the single file's (mean " << d.mean << ")";
    }
}

TEST_F(SdxlInputs, EveryFormIsSdxlWithAllItsModules) {
    const std::string tok = " --tokenizer " + tokenizer();
    for (const std::string& args :
         {"-m " + file("sdxl.safetensors") + tok, "-m " + file("diffusers"),
          " --diffusion-model " + file("parts/unet.safetensors") + " --clip_l " + file("parts/clip_l.safetensors") +
              " --clip_g " + file("parts/clip_g_hf.safetensors") + " --vae " + file("parts/vae.safetensors") + tok}) {
        SCOPED_TRACE(args);
        auto plan = test::run_command(kiln("plan " + args + " -W 64 -H 64"));
        EXPECT_EQ(plan.exit_code, 0) << plan.err;
        for (const char* module : {"te.clip_l", "te.clip_g", "diffusion", "vae"}) {
            EXPECT_NE(plan.out.find(module), std::string::npos) << module << "\n" << plan.out;
        }
    }
}

// A size the model cannot make (the tiny SDXL's stride is 4: a VAE of two
// levels, a UNet of two): exit 2, a message naming the stride, no file.
TEST_F(SdxlInputs, SizeOffTheStrideIsAUsageError) {
    const std::string model = "-m " + file("sdxl.safetensors") + " --tokenizer " + tokenizer();
    auto info = test::run_command(kiln("plan " + model));
    ASSERT_EQ(info.exit_code, 0) << info.err;
    for (const std::string& size : {"-W 66 -H 64", "-W 64 -H 70", "-W 1001 -H 1001"}) {
        SCOPED_TRACE(size);
        const std::string out = file("bad.png");
        auto r = test::run_command(kiln(model + " -p x --steps 1 " + size + " -o " + out));
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_NE(r.err.find("must be multiples of 4 for this model (SDXL)"), std::string::npos) << r.err;
        EXPECT_FALSE(std::ifstream(out).good()) << "an image was written";
        auto plan = test::run_command(kiln("plan " + model + " " + size));
        EXPECT_EQ(plan.exit_code, 2) << plan.out << plan.err;
        EXPECT_NE(plan.err.find("must be multiples of 4 for this model (SDXL)"), std::string::npos) << plan.err;
    }
}

}  // namespace
}  // namespace kiln
