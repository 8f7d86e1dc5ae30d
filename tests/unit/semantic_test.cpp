// Meaning, not just numbers: the default model (models/kiln-tiny.gguf,
// trained by training/train_tiny.py on drawn shapes) must draw what the
// prompt asks for, as judged by a pixel-statistics classifier.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "image/image_io.h"
#include "pipeline/generate.h"
#include "shape_classifier.h"

namespace kiln {
namespace {

// The judge first: on the training set's own drawings it must be right.
TEST(ShapeClassifier, RecognisesTheTrainingDrawings) {
    int checked = 0;
    for (const auto& entry : std::filesystem::directory_iterator(std::string(KILN_FIXTURES_DIR) + "/shapes")) {
        const std::string stem = entry.path().stem().string();  // colour_shape_background
        const auto a = stem.find('_'), b = stem.rfind('_');
        auto img = image::read_image(entry.path().string());
        ASSERT_TRUE(img.ok()) << img.error().message;
        const test::ShapeGuess g = test::classify_shape_image(*img);
        EXPECT_EQ(g.colour, stem.substr(0, a)) << stem;
        EXPECT_EQ(g.shape, stem.substr(a + 1, b - a - 1))
            << stem << " fill " << g.fill << " solidity " << g.solidity << " corners " << g.corners;
        EXPECT_EQ(g.background, stem.substr(b + 1)) << stem;
        ++checked;
    }
    EXPECT_GE(checked, 8);
}

TEST(DefaultModel, DrawsWhatThePromptAsks) {
    pipeline::ModelPaths paths;
    paths.model = {KILN_DEFAULT_MODEL};
    pipeline::ModelOptions options;
    options.threads = 1;
    auto model = pipeline::Model::load(paths, options);
    ASSERT_TRUE(model.ok()) << model.error().message;

    const char* shapes[] = {"circle", "square", "triangle", "star"};
    const char* colours[] = {"red", "green", "blue", "yellow", "purple", "orange"};
    const char* backgrounds[] = {"white", "black", "gray"};
    int agree = 0, total = 0;
    for (int i = 0; i < 12; ++i) {
        const std::string shape = shapes[i % 4], colour = colours[i % 6], background = backgrounds[(i / 4) % 3];
        pipeline::GenerationRequest request;
        request.prompt = "a " + colour + " " + shape + " on a " + background + " background";
        request.seed = 1000 + i;
        request.batch_count = 2;
        auto images = pipeline::generate(**model, request);
        ASSERT_TRUE(images.ok()) << images.error().message;
        for (const auto& g : *images) {
            const test::ShapeGuess guess = test::classify_shape_image(g.image);
            const bool ok = guess.shape == shape && guess.colour == colour && guess.background == background;
            agree += ok;
            ++total;
            std::printf("  %-45s seed %lld -> %s %s on %s (fill %.2f, solidity %.2f, corners %.2f)%s\n",
                        request.prompt.c_str(), static_cast<long long>(g.info.seed), guess.colour.c_str(),
                        guess.shape.c_str(), guess.background.c_str(), guess.fill, guess.solidity, guess.corners,
                        ok ? "" : "   <-- disagrees");
        }
    }
    const double rate = static_cast<double>(agree) / total;
    std::printf("semantic agreement: %d/%d = %.1f%%\n", agree, total, 100.0 * rate);
    EXPECT_GE(rate, 0.9);
}

}  // namespace
}  // namespace kiln
