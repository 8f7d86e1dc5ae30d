// A test suite whose tests share one model, loaded once from `Parts()` with
// the golden tests' options (one thread, F32): each test fails at once if
// the load did.
#pragma once

#include <gtest/gtest.h>

#include "golden.h"
#include "pipeline/model.h"

namespace kiln::test {

template <pipeline::ModelPaths (*Parts)()>
class SharedModelSuite : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto loaded = pipeline::Model::load(Parts(), golden_model_options());
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
    }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
    }
    void SetUp() override { ASSERT_NE(model_, nullptr); }
    static inline pipeline::Model* model_ = nullptr;
};

}  // namespace kiln::test
