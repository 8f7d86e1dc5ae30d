#include "pipeline/clip_decode.h"

#include <array>

#include "pipeline/graphs.h"
#include "pipeline/model.h"
#include "runtime/graph_session.h"
#include "util/log.h"

namespace kiln::pipeline {
namespace {

// The chunk loop over a w x h latent (planar [C, T, h, w]): planar [F * 3, H, W].
// `decoded` hears each chunk's frames.
Result<std::vector<float>> decode_chunks(Model& model, const std::vector<float>& latent, int64_t w, int64_t h,
                                         int64_t frames, const std::function<void(int64_t)>& decoded) {
    const int64_t channels = model.vae().format().latent_channels;
    const size_t plane = static_cast<size_t>(w * h);
    if (latent.size() != plane * static_cast<size_t>(channels * frames))
        return Error{"the video latent has the wrong size"};
    std::vector<float> out;
    std::vector<std::vector<float>> history;
    std::vector<std::array<int64_t, 4>> history_shapes;
    std::vector<float> frame(plane * static_cast<size_t>(channels));
    for (int64_t t = 0; t < frames; ++t) {
        if (model.cancel_requested()) return Error::cancelled("cancelled");
        for (int64_t c = 0; c < channels; ++c) {
            const float* src = latent.data() + static_cast<size_t>(c * frames + t) * plane;
            std::copy_n(src, plane, frame.data() + static_cast<size_t>(c) * plane);
        }
        auto g = build_clip_chunk_graph(model, w, h, history_shapes);
        if (!g.ok()) return g.error();
        g->session->set_input(g->input, frame.data());
        // Each piece is freed once the session holds its copy: RAM holds the
        // history (3.5 GiB at 832x480) once, not twice.
        for (size_t i = 0; i < history.size(); ++i) {
            g->session->set_input(g->history[i], history[i].data());
            std::vector<float>().swap(history[i]);
        }
        KILN_TRY(g->session->run(model.vae_compute(), g->out));
        const std::vector<float> values = runtime::GraphSession::read(g->out);
        out.insert(out.end(), values.begin(), values.end());
        history.clear();
        history_shapes.clear();
        for (const ggml_tensor* k : g->chunk.history) {
            history.push_back(runtime::GraphSession::read(k));
            history_shapes.push_back({k->ne[0], k->ne[1], k->ne[2], k->ne[3]});
        }
        decoded(t);
    }
    return out;
}

}  // namespace

Result<std::vector<float>> decode_clip_planes(Model& model, const std::vector<float>& latent, int64_t w, int64_t h,
                                              int64_t frames, const std::optional<VaeTiling>& tiling,
                                              const std::function<void(int)>& decoded, TilingStats* stats) {
    const models::AutoencoderFormat& vc = model.vae().format();
    const int64_t out_frames = 1 + vc.temporal_downscale * (frames - 1);
    auto frames_after = [&](int64_t t) { return static_cast<int>(1 + vc.temporal_downscale * t); };
    if (!tiling) {
        auto whole = decode_chunks(model, latent, w, h, frames, [&](int64_t t) { decoded(frames_after(t)); });
        if (whole.ok() || whole.error().kind != ErrorKind::OutOfMemory) {
            if (whole.ok() && stats) *stats = TilingStats{1, 1};
            return whole;
        }
        KILN_LOG_WARN("VAE decode of the clip: %s; retrying in tiles", whole.error().message.c_str());
        return decode_clip_planes(model, latent, w, h, frames, VaeTiling{}, decoded, stats);
    }
    KILN_TRY(validate_tiling(*tiling));
    // The clip as one map of C T planes in, F 3 planes out, so the tiles and
    // their blend are vae_tiling's.
    TiledMap map;
    map.grid_w = w;
    map.grid_h = h;
    map.in_channels = vc.latent_channels * frames;
    map.out_channels = 3 * out_frames;
    map.in_scale = 1;
    map.out_scale = vc.downscale;
    const int64_t tiles = tiles_across_seams(model, map, *tiling);
    int64_t tile = 0;
    TileFn fn = [&](const std::vector<float>& z, int64_t tw, int64_t th) -> Result<std::vector<float>> {
        auto done = decode_chunks(model, z, tw, th, frames, [&](int64_t t) {
            decoded(static_cast<int>((tile * out_frames + frames_after(t)) / tiles));
        });
        ++tile;
        return done;
    };
    return run_tiled_across_seams(model, latent, map, *tiling, fn, stats);
}

}  // namespace kiln::pipeline
