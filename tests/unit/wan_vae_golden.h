// The golden suite of a Wan VAE (Wan 2.1's wan_vae_test.cpp, Wan 2.2's
// wan22_vae_test.cpp): a tiny VAE file and its reference inputs and outputs,
// graphs run on the fixture's inputs (whole, or a clip in chunks through the
// causal history) and compared with them.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_graph.h"
#include "golden.h"
#include "models/nets/wan_vae.h"
#include "runtime/graph_session.h"
#include "runtime/module_weights.h"
#include "test_files.h"

namespace kiln::test {

constexpr double kTolerance = 1e-4;

inline io::ModelFile open_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

struct DeclaredVae {
    std::unique_ptr<runtime::ModuleWeights> weights;
    std::unique_ptr<models::WanVae> vae;
    const models::WanVae* operator->() const { return vae.get(); }
};

// `weights` and `io`: files under tests/golden/.
class WanVaeGoldenSuite : public ::testing::Test {
  protected:
    WanVaeGoldenSuite(const std::string& weights_file, const std::string& io_file)
        : weights(open_file(golden_path(weights_file))), io(open_file(golden_path(io_file))) {}

    io::ModelFile weights;
    io::ModelFile io;
    std::unique_ptr<runtime::Compute> compute = golden_cpu();

    DeclaredVae vae() {
        DeclaredVae d;
        d.weights = std::make_unique<runtime::ModuleWeights>(weights, "", GGML_TYPE_F32);
        auto v = models::WanVae::create(*d.weights);
        if (!v.ok()) throw std::runtime_error(v.error().message);
        d.vae = std::move(v).value();
        // The CausalConv3d weights are 5-D in the file; ModuleWeights folds them for ggml.
        const Status loaded = d.weights->load(compute->weights_backend());
        if (!loaded.ok()) throw std::runtime_error(loaded.error().message);
        return d;
    }

    // Runs `build` on the fixture's `input`; returns its output. With
    // `blocks`, also compares each cut-marked block with the fixture's
    // block.<name>.
    std::vector<float> run(const std::string& input,
                           const std::function<ggml_tensor*(ggml_context*, ggml_tensor*)>& build,
                           const std::vector<std::string>& blocks = {}) {
        runtime::GraphSession session;
        const auto v = fixture_tensor(io, input);
        ggml_tensor* in = session.input(GGML_TYPE_F32, ggml_ne(v.shape), v.values.data());
        ggml_tensor* out = build(session.ctx(), in);
        EXPECT_NE(out, nullptr);
        if (!out) return {};
        EXPECT_TRUE(session.run(*compute, out, !blocks.empty()).ok());
        for (const std::string& name : blocks) {
            const ggml_tensor* cut = session.find("cut:" + name);
            EXPECT_NE(cut, nullptr) << name;
            if (!cut) continue;
            EXPECT_LT(relative_error(runtime::GraphSession::read(cut), fixture_tensor(io, "block." + name).values),
                      kTolerance)
                << name;
        }
        return runtime::GraphSession::read(out);
    }

    // The fixture's `input` ([T, C, h, w]) cut along T into chunks of
    // `sizes` frames, each chunk a graph of its own (`chunk_of`) taking the
    // history the previous one left; the chunks' outputs one after the other.
    using ChunkOf = std::function<models::ClipChunk(ggml_context*, ggml_tensor*, const std::vector<ggml_tensor*>&)>;
    std::vector<float> run_in_chunks(const std::string& input, const std::vector<int64_t>& sizes,
                                     const ChunkOf& chunk_of) {
        const auto z = fixture_tensor(io, input);
        const int64_t C = z.shape[1], h = z.shape[2], w = z.shape[3];
        std::vector<float> out;
        std::vector<std::vector<float>> history;
        std::vector<std::array<int64_t, 4>> history_ne;
        int64_t first = 0;
        for (int64_t count : sizes) {
            runtime::GraphSession session;
            ggml_tensor* in = session.input(GGML_TYPE_F32, {w, h, C, count},
                                            z.values.data() + static_cast<size_t>(first * C * h * w));
            std::vector<ggml_tensor*> history_in;
            for (size_t i = 0; i < history.size(); ++i) {
                const auto& ne = history_ne[i];
                history_in.push_back(session.input(GGML_TYPE_F32, {ne[0], ne[1], ne[2], ne[3]}, history[i].data()));
            }
            const models::ClipChunk chunk = chunk_of(session.ctx(), in, history_in);
            if (!chunk.frames) {
                ADD_FAILURE() << "the chunk of " << count << " frames after " << first << " was refused";
                return {};
            }
            for (ggml_tensor* t : chunk.history) session.add_output(t);
            EXPECT_TRUE(session.run(*compute, chunk.frames).ok());
            const std::vector<float> values = runtime::GraphSession::read(chunk.frames);
            out.insert(out.end(), values.begin(), values.end());
            history.clear();
            history_ne.clear();
            for (const ggml_tensor* t : chunk.history) {
                history.push_back(runtime::GraphSession::read(t));
                history_ne.push_back({t->ne[0], t->ne[1], t->ne[2], t->ne[3]});
            }
            first += count;
        }
        return out;
    }

    // The fixture's clip.z decoded in chunks of `sizes` latent frames.
    std::vector<float> decode_in_chunks(const models::WanVae& vae, const std::vector<int64_t>& sizes) {
        bool starts = true;
        return run_in_chunks("clip.z", sizes, [&](ggml_context* ctx, ggml_tensor* latent, const auto& history) {
            models::ClipChunk chunk = vae.decode_chunk(ctx, latent, history, nn::ComputeTarget::Cpu);
            const int64_t count = latent->ne[3];
            if (chunk.frames) EXPECT_EQ(chunk.frames->ne[3], starts ? 1 + 4 * (count - 1) : 4 * count);
            starts = false;
            return chunk;
        });
    }
};

}  // namespace kiln::test
