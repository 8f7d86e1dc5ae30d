// kiln_interrupt, A1111's interrupt: sampling stops at the next step and the
// job ends with the image of the last step's denoised estimate. The image
// must be exactly what a VAE preview of that step shows (the same latent
// through the same decoder), the batch's later images are not made, and a
// hires fix is not run after an interrupted first pass.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "golden.h"
#include "kiln.h"

namespace kiln {
namespace {

struct Interrupting {
    kiln_context* ctx = nullptr;
    int at_step = 0;
    bool skip = false;  // kiln_skip rather than kiln_interrupt
    std::vector<uint8_t> preview;  // the VAE preview of at_step
    int previews = 0;
};

void interrupt_at(int image, int step, const kiln_image* preview, void* user_data) {
    auto* self = static_cast<Interrupting*>(user_data);
    ++self->previews;
    if (image != 0 || step != self->at_step) return;
    self->preview.assign(preview->data, preview->data + size_t(preview->width) * preview->height * preview->channels);
    if (self->skip) {
        kiln_skip(self->ctx);
    } else {
        kiln_interrupt(self->ctx);
    }
}

struct Context {
    kiln_context* ctx = nullptr;
    Context() {
        kiln_context_params cp;
        kiln_context_params_init(&cp);
        const std::string model = test::golden_path("models/sd1_tiny.safetensors");
        const std::string tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
        cp.model_path = model.c_str();
        cp.tokenizer_path = tokenizer.c_str();
        cp.n_threads = 1;
        char* error = nullptr;
        EXPECT_EQ(kiln_context_create(&cp, &ctx, &error), KILN_OK) << (error ? error : "");
        kiln_free_string(error);
    }
    ~Context() { kiln_context_free(ctx); }
};

// The job's previews interrupt it at `step` of its first image.
void interrupt_at_step(Interrupting& seen, kiln_generation_params& gp, kiln_context* ctx, int step) {
    seen.ctx = ctx;
    seen.at_step = step;
    gp.preview = &interrupt_at;
    gp.preview_user_data = &seen;
}

kiln_generation_params long_job() {
    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = "a red circle";
    gp.width = 32;
    gp.height = 32;
    gp.steps = 12;
    gp.seed = 5;
    gp.batch_count = 3;
    gp.preview_mode = KILN_PREVIEW_VAE;
    gp.preview_interval = 1;
    return gp;
}

TEST(Interrupt, EndsWithTheLastStepsEstimateAndNoLaterImage) {
    Context c;
    ASSERT_NE(c.ctx, nullptr);
    Interrupting seen;
    kiln_generation_params gp = long_job();
    interrupt_at_step(seen, gp, c.ctx, 4);
    kiln_image* images = nullptr;
    int n = 0;
    char* error = nullptr;
    ASSERT_EQ(kiln_generate(c.ctx, &gp, &images, &n, &error), KILN_OK) << (error ? error : "");
    ASSERT_EQ(n, 1) << "the batch's later images were made";
    EXPECT_EQ(seen.previews, 4) << "sampling went on after the interrupt";
    ASSERT_EQ(images[0].width, 32u);
    const std::vector<uint8_t> got(images[0].data, images[0].data + 32 * 32 * 3);
    EXPECT_EQ(got, seen.preview);
    EXPECT_NE(std::string(images[0].parameters).find("Seed: 5"), std::string::npos);
    kiln_images_free(images, n);

    // The next job on the context is not interrupted.
    gp.preview = nullptr;
    gp.batch_count = 2;
    gp.steps = 3;
    ASSERT_EQ(kiln_generate(c.ctx, &gp, &images, &n, &error), KILN_OK) << (error ? error : "");
    EXPECT_EQ(n, 2);
    kiln_images_free(images, n);
}

TEST(Interrupt, AnInterruptedFirstPassGetsNoHiresPass) {
    Context c;
    ASSERT_NE(c.ctx, nullptr);
    Interrupting seen;
    kiln_generation_params gp = long_job();
    gp.batch_count = 1;
    gp.hires = 1;
    gp.hires_scale = 2.0f;
    interrupt_at_step(seen, gp, c.ctx, 2);
    kiln_image* images = nullptr;
    int n = 0;
    char* error = nullptr;
    ASSERT_EQ(kiln_generate(c.ctx, &gp, &images, &n, &error), KILN_OK) << (error ? error : "");
    ASSERT_EQ(n, 1);
    EXPECT_EQ(images[0].width, 32u) << "the hires pass ran after the interrupt";
    kiln_images_free(images, n);
}

// kiln_skip (A1111's skip) ends the current image the same way, and the
// batch goes on: its later images are those of a run without the skip.
TEST(Interrupt, SkipEndsTheCurrentImageAndTheBatchGoesOn) {
    Context c;
    ASSERT_NE(c.ctx, nullptr);
    kiln_generation_params gp = long_job();
    gp.steps = 6;
    kiln_image* plain = nullptr;
    int n_plain = 0;
    char* error = nullptr;
    ASSERT_EQ(kiln_generate(c.ctx, &gp, &plain, &n_plain, &error), KILN_OK) << (error ? error : "");
    ASSERT_EQ(n_plain, 3);

    Interrupting seen;
    seen.skip = true;
    interrupt_at_step(seen, gp, c.ctx, 2);
    kiln_image* images = nullptr;
    int n = 0;
    ASSERT_EQ(kiln_generate(c.ctx, &gp, &images, &n, &error), KILN_OK) << (error ? error : "");
    ASSERT_EQ(n, 3);
    EXPECT_EQ(seen.previews, 2 + 6 + 6) << "image 1 sampled on after the skip, or the others stopped";
    EXPECT_EQ(std::vector<uint8_t>(images[0].data, images[0].data + 32 * 32 * 3), seen.preview);
    const auto pixels = [](const kiln_image& i) { return std::vector<uint8_t>(i.data, i.data + 32 * 32 * 3); };
    EXPECT_NE(pixels(images[0]), pixels(plain[0]));
    EXPECT_EQ(pixels(images[1]), pixels(plain[1]));
    EXPECT_EQ(pixels(images[2]), pixels(plain[2]));
    kiln_images_free(images, n);
    kiln_images_free(plain, n_plain);
}

TEST(Interrupt, CancelWinsOverIt) {
    Context c;
    ASSERT_NE(c.ctx, nullptr);
    kiln_generation_params gp = long_job();
    struct Both {
        kiln_context* ctx;
    } both{c.ctx};
    gp.preview = [](int, int step, const kiln_image*, void* user_data) {
        if (step != 2) return;
        kiln_interrupt(static_cast<Both*>(user_data)->ctx);
        kiln_cancel(static_cast<Both*>(user_data)->ctx);
    };
    gp.preview_user_data = &both;
    kiln_image* images = nullptr;
    int n = 0;
    char* error = nullptr;
    EXPECT_EQ(kiln_generate(c.ctx, &gp, &images, &n, &error), KILN_ERROR_CANCELLED);
    EXPECT_EQ(n, 0);
    kiln_free_string(error);
}

}  // namespace
}  // namespace kiln
