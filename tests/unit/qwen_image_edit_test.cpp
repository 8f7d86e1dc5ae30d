// A whole Qwen-Image-Edit job (2509's prompt, diffusers' QwenImageEditPlusPipeline)
// on the tiny parts of training/make_qwen_image_edit_fixtures.py against the
// PyTorch references run end to end: the -r image resized for the vision
// tower (Lanczos to about 384 x 384 pixels' area, bicubic to multiples of
// 28), its rows in the prompt after "Picture 1: " with multimodal RoPE, the
// edit system turn dropped, the negative prompt with the image too, the
// reference latent beside the image's tokens, and Edit-2511's zero_cond_t.
// The tower from --llm_vision or inside the --llm file (ComfyUI's layout);
// the requests an edit model cannot serve, each one clear error. And the
// first Edit release's own pipeline (QwenImageEditPipeline).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "golden.h"
#include "image/image_io.h"
#include "models/nets/llm_encoder.h"
#include "models/nets/qwen_image_dit.h"
#include "models/registry.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/prompt_images.h"
#include "test_files.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr const char* kPrompt = "make the cat blue";
constexpr int kWidth = 64, kHeight = 48;

std::string edit_part(const std::string& name) { return golden_path("pipeline/qwen_image_edit_tiny/" + name); }
std::string image_part(const std::string& name) { return golden_path("pipeline/qwen_image_tiny/" + name); }

ModelPaths parts() {
    ModelPaths paths;
    paths.diffusion_model = image_part("qwen_image_dit.safetensors");
    paths.vae = image_part("qwen_image_vae.safetensors");
    paths.llm = edit_part("qwen_2.5_vl.safetensors");
    paths.llm_vision = edit_part("qwen_2.5_vl_vision.safetensors");
    paths.tokenizer = "llm=" + edit_part("tokenizer");
    return paths;
}

image::Image ref_image() {
    auto ref = image::read_image(edit_part("ref.png"));
    if (!ref.ok()) throw std::runtime_error(ref.error().message);
    return std::move(ref).value();
}

GenerationRequest edit_job() {
    GenerationRequest r;
    r.prompt = kPrompt;
    r.width = kWidth;
    r.height = kHeight;
    r.seed = 11;
    r.steps = 3;
    r.rng = RngKind::Cuda;
    r.ref_images = {ref_image()};
    return r;
}

std::unique_ptr<Model> load(const ModelPaths& paths, ModelOptions options = test::golden_model_options()) {
    auto model = Model::load(paths, options);
    if (!model.ok()) throw std::runtime_error(model.error().message);
    return std::move(model).value();
}

class QwenImageEdit : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        model_ = load(parts()).release();
        auto io = io::ModelFile::open({edit_part("qwen_image_edit_tiny_job.safetensors")});
        ASSERT_TRUE(io.ok()) << io.error().message;
        io_ = new io::ModelFile(std::move(io).value());
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
    }
    static Model* model_;
    static io::ModelFile* io_;
};
Model* QwenImageEdit::model_ = nullptr;
io::ModelFile* QwenImageEdit::io_ = nullptr;

// diffusers' calculate_dimensions and HF's smart_resize, against the
// references' numbers (training/make_qwen25_vl_vision_fixtures.py's table).
TEST(QwenImageEditSizes, VisionSizesAreTheReferences) {
    const io::ModelFile table = *io::ModelFile::open({golden_path("models/qwen25_vl_vision_tiny_io.safetensors")});
    const auto rows = fixture_tensor(table, "smart_resize");  // (height, width, min, max, out_h, out_w)
    ASSERT_EQ(rows.shape.size(), 2u);
    for (int64_t r = 0; r < rows.shape[0]; ++r) {
        const float* v = rows.values.data() + r * 6;
        auto got = smart_resize(static_cast<int>(v[0]), static_cast<int>(v[1]), 28, static_cast<int64_t>(v[2]),
                                static_cast<int64_t>(v[3]));
        ASSERT_TRUE(got.ok()) << got.error().message;
        EXPECT_EQ(got->height, static_cast<int>(v[4])) << "row " << r;
        EXPECT_EQ(got->width, static_cast<int>(v[5])) << "row " << r;
    }
    // The fixture job's image, and ratios whose sizes the edit fixtures printed.
    struct Case {
        int w, h, area_w, area_h, tower_w, tower_h;
    } cases[] = {{64, 48, 448, 320, 448, 308},    {100, 100, 384, 384, 392, 392}, {1600, 900, 512, 288, 504, 280},
                 {900, 1600, 288, 512, 280, 504}, {300, 200, 480, 320, 476, 308}, {210, 90, 576, 256, 588, 252}};
    for (const Case& c : cases) {
        auto s = vision_sizes(c.w, c.h, 384 * 384, 28);
        ASSERT_TRUE(s.ok());
        EXPECT_EQ(s->area.width, c.area_w) << c.w << "x" << c.h;
        EXPECT_EQ(s->area.height, c.area_h) << c.w << "x" << c.h;
        EXPECT_EQ(s->tower.width, c.tower_w) << c.w << "x" << c.h;
        EXPECT_EQ(s->tower.height, c.tower_h) << c.w << "x" << c.h;
    }
    EXPECT_FALSE(smart_resize(16, 4000, 28, 3136, 12845056).ok());  // sides 250 times apart
}

TEST_F(QwenImageEdit, VisionRowsAreTheReferences) {
    ASSERT_TRUE(model_->has_vision());
    auto rows = encode_prompt_image(*model_, ref_image(), 384 * 384);
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    EXPECT_EQ(rows->grid_cols, 16);  // 448 / 28
    EXPECT_EQ(rows->grid_rows, 11);  // 308 / 28
    const auto want = fixture_tensor(*io_, "vl.rows");
    const double error = relative_error(rows->rows, want.values);
    EXPECT_LT(error, 1e-4);
    std::printf("vision rows of the resized -r image: relative error %.2e\n", error);
}

TEST_F(QwenImageEdit, PromptHasTheImageAndDropsTheEditSystemTurn) {
    auto image = encode_prompt_image(*model_, ref_image(), 384 * 384);
    ASSERT_TRUE(image.ok());
    const TextEncoder& llm = model_->text_encoders().front();
    const LlmImagePrompt p = llm_image_prompt(model_->llm_tokenizer(), *llm.use, kPrompt, {*image});
    const auto tokens = fixture_tensor(*io_, "llm.tokens");
    EXPECT_EQ(std::vector<float>(p.ids.begin(), p.ids.end()), tokens.values);
    EXPECT_EQ(p.dropped, static_cast<int64_t>(fixture_tensor(*io_, "llm.dropped").values.at(0)));
    ASSERT_EQ(p.grids.size(), 1u);
    const std::vector<int32_t> positions =
        models::llm_multimodal_positions(static_cast<int64_t>(p.ids.size()), p.grids);
    const auto want = fixture_tensor(*io_, "llm.positions");  // [3, n]
    EXPECT_EQ(std::vector<float>(positions.begin(), positions.begin() + static_cast<int64_t>(want.values.size())),
              want.values);

    for (const auto& [prompt, key] :
         {std::pair{std::string(kPrompt), "llm.hidden"}, std::pair{std::string(""), "llm.uncond_hidden"}}) {
        auto c = encode_prompt(*model_, prompt, 0, {}, {*image});
        ASSERT_TRUE(c.ok()) << c.error().message;
        const auto hidden = fixture_tensor(*io_, key);
        EXPECT_EQ(c->tokens, hidden.shape[1]) << key;
        EXPECT_LT(relative_error(c->hidden, hidden.values), 1e-3) << key;
    }
}

TEST_F(QwenImageEdit, EditJobMatchesTheReferenceJob) {
    auto images = generate(*model_, edit_job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    ASSERT_EQ(images->size(), 1u);
    // As stored, the DiT's products take BF16 activations and the LLM's F16
    // (the text-to-image job's tolerance, tests/unit/qwen_image_pipeline_test.cpp).
    EXPECT_LE(difference_from_reference(images->front().image, *io_), 4);
}

// Edit-2511: a DiT file with ComfyUI's empty __index_timestep_zero__, and
// the flag for files without it.
TEST_F(QwenImageEdit, ZeroCondTimestepFromTheMarkerOrTheFlag) {
    test::TempDir dir;
    const io::ModelFile dit = *io::ModelFile::open({image_part("qwen_image_dit.safetensors")});
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : dit.tensors()) entries.push_back(test::copy_entry(dit, t, t.name));
    entries.push_back({"__index_timestep_zero__", "F32", {0}, {}});
    std::vector<std::pair<std::string, std::string>> metadata;
    for (const auto& [key, value] : dit.metadata()) metadata.push_back({key, value.to_string()});
    ModelPaths marked = parts();
    marked.diffusion_model = dir.write("qwen_image_edit_2511.safetensors", test::build_safetensors(entries, metadata));
    auto from_marker = load(marked);
    ModelOptions flagged = test::golden_model_options();
    flagged.zero_cond_t = true;
    auto from_flag = load(parts(), flagged);
    for (Model* m : {from_marker.get(), from_flag.get()}) {
        const auto& net = dynamic_cast<const models::QwenImageDit&>(m->diffusion());
        EXPECT_TRUE(net.config().zero_cond_t);
        auto images = generate(*m, edit_job());
        ASSERT_TRUE(images.ok()) << images.error().message;
        EXPECT_LE(difference_from_reference(images->front().image, *io_, "image_zero_cond_t"), 4);
    }
    EXPECT_FALSE(dynamic_cast<const models::QwenImageDit&>(model_->diffusion()).config().zero_cond_t);
}

// ComfyUI's qwen_2.5_vl_7b.safetensors holds the text model (model.*) and
// the tower (visual.*) in one file: --llm alone gives both, the same rows.
TEST_F(QwenImageEdit, TowerInsideTheLlmFile) {
    test::TempDir dir;
    std::vector<test::SafetensorsEntry> entries;
    std::vector<std::pair<std::string, std::string>> metadata;
    for (const char* name : {"qwen_2.5_vl.safetensors", "qwen_2.5_vl_vision.safetensors"}) {
        const io::ModelFile f = *io::ModelFile::open({edit_part(name)});
        for (const io::TensorInfo& t : f.tensors()) entries.push_back(test::copy_entry(f, t, t.name));
        for (const auto& [key, value] : f.metadata()) metadata.push_back({key, value.to_string()});
    }
    ModelPaths together = parts();
    together.llm = dir.write("qwen_2.5_vl_7b.safetensors", test::build_safetensors(entries, metadata));
    together.llm_vision.clear();
    auto model = load(together);
    ASSERT_TRUE(model->has_vision());
    auto a = encode_prompt_image(*model, ref_image(), 384 * 384);
    auto b = encode_prompt_image(*model_, ref_image(), 384 * 384);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->rows, b->rows);
}

TEST_F(QwenImageEdit, RequestsItCannotServeAreOneClearError) {
    auto expect_refused = [](Model& model, const GenerationRequest& r, const std::vector<std::string>& says) {
        auto images = generate(model, r);
        ASSERT_FALSE(images.ok());
        for (const std::string& s : says)
            EXPECT_NE(images.error().message.find(s), std::string::npos) << images.error().message;
    };
    // Four images: 2509 takes up to three.
    GenerationRequest four = edit_job();
    four.ref_images.assign(4, ref_image());
    expect_refused(*model_, four, {"at most 3 reference images", "got 4"});

    // No vision tower given: an edit job says what to pass; text to image still runs.
    ModelPaths no_tower = parts();
    no_tower.llm_vision.clear();
    auto blind = load(no_tower);
    EXPECT_FALSE(blind->has_vision());
    expect_refused(*blind, edit_job(), {"vision tower", "--llm_vision"});

    // A tower whose rows are not the LLM's width (tests/golden/models' tiny tower: 24 wide).
    ModelPaths other = parts();
    other.llm_vision = golden_path("models/qwen25_vl_vision_tiny.safetensors");
    auto mismatched = load(other);
    expect_refused(*mismatched, edit_job(), {"24 wide", "48 wide"});

    // A tokenizer without the vision tokens (Qwen-Image's tiny one).
    ModelPaths no_tokens = parts();
    no_tokens.tokenizer = "llm=" + image_part("tokenizer");
    auto plain_tokenizer = load(no_tokens);
    expect_refused(*plain_tokenizer, edit_job(), {"<|vision_start|>"});

    // The model serves the next job.
    auto images = generate(*model_, edit_job());
    EXPECT_TRUE(images.ok());
}

// sd-cli's docs/qwen_image_edit.md command line with the tiny parts (local
// paths, the fixture job's size, steps and seed): the reference job's image.
// Without the tower: one error line, exit 1 or 2, no output file.
TEST(QwenImageEditCli, SdCliCommandLine) {
    test::TempDir dir;
    const std::string line = std::string(KILN_BIN) + " --diffusion-model " + image_part("qwen_image_dit.safetensors") +
                             " --vae " + image_part("qwen_image_vae.safetensors") + " --llm " +
                             edit_part("qwen_2.5_vl.safetensors") + " --tokenizer llm=" + edit_part("tokenizer") +
                             " --cfg-scale 2.5 --sampling-method euler -v --offload-to-cpu --diffusion-fa "
                             "--flow-shift 3 -r " +
                             edit_part("ref.png") + " -p 'make the cat blue' -W 64 -H 48 --steps 3 -s 11 -t 1 ";
    const std::string out = dir.file("edit.png");
    auto ok = test::run_command(line + "--llm_vision " + edit_part("qwen_2.5_vl_vision.safetensors") + " -o " + out);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    auto img = image::read_image(out);
    ASSERT_TRUE(img.ok()) << img.error().message;
    const io::ModelFile io = *io::ModelFile::open({edit_part("qwen_image_edit_tiny_job.safetensors")});
    EXPECT_LE(difference_from_reference(*img, io), 4);

    const std::string bad = dir.file("bad.png");
    auto refused = test::run_command(line + "-o " + bad);
    EXPECT_TRUE(refused.exit_code == 1 || refused.exit_code == 2) << refused.exit_code;
    EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
    EXPECT_NE(refused.err.find("--llm_vision"), std::string::npos) << refused.err;
    EXPECT_FALSE(std::filesystem::exists(bad));
}

// ---------------------------------------------------------------------------
// The first Edit release (diffusers' QwenImageEditPipeline), against
// training/make_qwen_image_edit_first_fixtures.py: one image, no
// "Picture 1: ", the vision image at about 1024 x 1024 pixels.

// The DiT under `name` (a link to the tiny DiT): the name is what tells the
// releases apart.
models::Detection detect_as(const test::TempDir& dir, const std::string& name) {
    const std::string link = dir.file(name);
    std::filesystem::create_symlink(image_part("qwen_image_dit.safetensors"), link);
    const io::ModelFile file = *io::ModelFile::open({link});
    models::FileSet set;
    set.files = {&file};
    return models::detect_family(set);
}

TEST(QwenImageEditFirstRelease, TheFileNameTellsTheReleases) {
    test::TempDir dir;
    for (const char* first : {"qwen_image_edit_fp8_e4m3fn.safetensors", "Qwen-Image-Edit-bf16.safetensors"})
        EXPECT_EQ(detect_as(dir, first).label, "Qwen-Image-Edit") << first;
    for (const char* later : {"qwen_image_edit_2509_fp8_e4m3fn.safetensors", "Qwen-Image-Edit-2511-bf16.safetensors",
                              "qwen_image_edit_plus.safetensors", "qwen_image_bf16.safetensors"})
        EXPECT_EQ(detect_as(dir, later).label, "Qwen-Image") << later;
}

class QwenImageEditFirst : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir;
        ModelPaths paths = parts();
        paths.diffusion_model = dir_->file("qwen_image_edit_bf16.safetensors");
        std::filesystem::create_symlink(image_part("qwen_image_dit.safetensors"), paths.diffusion_model);
        model_ = load(paths).release();
        io_ = new io::ModelFile(*io::ModelFile::open({edit_part("qwen_image_edit_first_job.safetensors")}));
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
        delete dir_;
    }
    static test::TempDir* dir_;
    static Model* model_;
    static io::ModelFile* io_;
};
test::TempDir* QwenImageEditFirst::dir_ = nullptr;
Model* QwenImageEditFirst::model_ = nullptr;
io::ModelFile* QwenImageEditFirst::io_ = nullptr;

TEST_F(QwenImageEditFirst, PromptHasTheImageAtTheVaesSizeWithoutPictureOne) {
    ASSERT_EQ(model_->family_label(), "Qwen-Image-Edit");
    const TextEncoder& llm = model_->text_encoders().front();
    auto image = encode_prompt_image(*model_, ref_image(), llm.use->vision_area);
    ASSERT_TRUE(image.ok()) << image.error().message;
    // 64 x 48 -> 1184 x 896 (calculate_dimensions at 1024 x 1024) -> 1176 x 896 (smart_resize).
    EXPECT_EQ(image->grid_cols, 42);
    EXPECT_EQ(image->grid_rows, 32);
    EXPECT_LT(relative_error(image->rows, fixture_tensor(*io_, "vl.rows").values), 1e-4);

    const LlmImagePrompt p = llm_image_prompt(model_->llm_tokenizer(), *llm.use, kPrompt, {*image});
    EXPECT_EQ(std::vector<float>(p.ids.begin(), p.ids.end()), fixture_tensor(*io_, "llm.tokens").values);
    EXPECT_EQ(p.dropped, static_cast<int64_t>(fixture_tensor(*io_, "llm.dropped").values.at(0)));
    ASSERT_EQ(p.grids.size(), 1u);
    const std::vector<int32_t> positions =
        models::llm_multimodal_positions(static_cast<int64_t>(p.ids.size()), p.grids);
    const auto want = fixture_tensor(*io_, "llm.positions");  // [3, n]; kiln's has ggml's fourth axis after
    EXPECT_EQ(std::vector<float>(positions.begin(), positions.begin() + static_cast<int64_t>(want.values.size())),
              want.values);
}

TEST_F(QwenImageEditFirst, EditJobMatchesTheReferenceJob) {
    auto images = generate(*model_, edit_job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io_), 4);
    // A second image has no place in the first release's prompt.
    GenerationRequest two = edit_job();
    two.ref_images.assign(2, ref_image());
    auto refused = generate(*model_, two);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("at most 1 reference image"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace kiln::pipeline
