// The weight residency manager: blocks load from their params, stay until
// room is needed, go furthest-needed first, never while pinned, and every
// byte is in the ledger.
#include "runtime/weight_store.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ggml-cpu.h"
#include "io/model_file.h"
#include "io/tensor_convert.h"

namespace kiln {
namespace {

struct Fixture {
    io::ModelFile file = io::ModelFile::open({KILN_DEFAULT_MODEL}).value();
    runtime::ModuleWeights weights{file, "cond_stage_model.transformer.text_model.", std::nullopt};
    ggml_tensor* tokens = weights.require("embeddings.token_embedding.weight", {-1, 128});
    ggml_tensor* positions = weights.require("embeddings.position_embedding.weight", {77, 128});
    ggml_tensor* norm = weights.require("final_layer_norm.weight", {128});
    Fixture() { EXPECT_TRUE(weights.load_params(runtime::ParamsLocation::Disk, nullptr).ok()); }
};

TEST(WeightStore, LoadsFromTheParamsAndCountsEveryByte) {
    Fixture f;
    runtime::DeviceLedger ledger(nullptr, 1.0);
    runtime::WeightStore store(ledger, ggml_backend_cpu_buffer_type());
    runtime::WeightBlock* block = store.define_block(f.weights, {f.tokens, f.norm}, 0);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(store.define_block(f.weights, {f.tokens}, 1), nullptr);  // already in a block
    EXPECT_EQ(store.block_of(f.norm), block);
    EXPECT_EQ(store.missing_bytes({block}), block->bytes);
    store.pin({block});
    ASSERT_TRUE(store.load({block}, nullptr).ok());
    store.release({block});
    EXPECT_EQ(ledger.managed(), block->bytes);
    // The compute copy holds the file's values.
    const io::TensorInfo* info = f.weights.info("final_layer_norm.weight");
    auto expected = io::convert_tensor(*info, f.file.data(*info), f.norm->type).value();
    std::vector<uint8_t> got(ggml_nbytes(f.norm));
    ggml_backend_tensor_get(f.norm, got.data(), 0, got.size());
    EXPECT_EQ(got, expected);
    store.evict_all();
    EXPECT_EQ(ledger.managed(), 0u);
    EXPECT_EQ(f.norm->data, nullptr);  // graphs see it unplaced again
}

TEST(WeightStore, EvictsTheBlockNeededFurthestAheadAndNeverAPinnedOne) {
    Fixture f;
    runtime::DeviceLedger ledger(nullptr, 1.0);
    runtime::WeightStore store(ledger, ggml_backend_cpu_buffer_type());
    runtime::WeightBlock* b0 = store.define_block(f.weights, {f.tokens}, 0);
    runtime::WeightBlock* b1 = store.define_block(f.weights, {f.positions}, 1);
    runtime::WeightBlock* b2 = store.define_block(f.weights, {f.norm}, 2);
    for (runtime::WeightBlock* b : {b0, b1}) ASSERT_TRUE(store.load({b}, nullptr).ok());
    const uint64_t limit = b0->bytes + b1->bytes;  // no room for a third
    // About to run segment 2 of 3: segment 0 comes next, segment 1 last.
    const runtime::EvictionHint hint{&f.weights, 2, 3};
    store.pin({b0, b1});
    EXPECT_FALSE(store.make_room(b2->bytes, limit, hint));  // both pinned
    store.release({b0, b1});
    ASSERT_TRUE(store.make_room(b2->bytes, limit, hint));
    EXPECT_TRUE(b0->resident());
    EXPECT_FALSE(b1->resident());
    ASSERT_TRUE(store.load({b2}, nullptr).ok());
    EXPECT_LE(ledger.peak(), limit);
    EXPECT_EQ(store.stats().evictions, 1);
}

}  // namespace
}  // namespace kiln
