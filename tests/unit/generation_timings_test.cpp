// pipeline::GenerationTimings: generate() reports where its time went
// (kiln-bench reads it) without changing what it makes.
#include <gtest/gtest.h>

#include <numeric>

#include "pipeline/generate.h"

namespace kiln::pipeline {
namespace {

TEST(GenerationTimings, EveryStepAndModuleIsTimedAndTheImagesAreUnchanged) {
    ModelPaths paths;
    paths.model = {KILN_DEFAULT_MODEL};
    ModelOptions options;
    options.threads = 1;
    auto model = Model::load(paths, options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    GenerationRequest request;
    request.prompt = "a red circle on a white background";
    request.steps = 3;
    request.batch_count = 2;

    GenerationTimings timings;
    timings.step_s = {99.0};  // left over from an earlier job: replaced, not appended to
    auto timed = generate(**model, request, nullptr, &timings);
    ASSERT_TRUE(timed.ok()) << timed.error().message;
    auto untimed = generate(**model, request);
    ASSERT_TRUE(untimed.ok()) << untimed.error().message;

    ASSERT_EQ(timings.step_s.size(), 6u);  // 3 steps for each of 2 images
    for (double s : timings.step_s) EXPECT_GT(s, 0.0);
    EXPECT_GT(timings.text_encoding_s, 0.0);
    EXPECT_GT(timings.vae_s, 0.0);
    EXPECT_LE(std::accumulate(timings.step_s.begin(), timings.step_s.end(), 0.0), timings.sampling_s);
    ASSERT_EQ(timed->size(), untimed->size());
    for (size_t i = 0; i < timed->size(); ++i) EXPECT_EQ((*timed)[i].image.pixels, (*untimed)[i].image.pixels);
}

}  // namespace
}  // namespace kiln::pipeline
