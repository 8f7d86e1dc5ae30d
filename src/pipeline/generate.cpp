#include "pipeline/generate.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "image/canny.h"
#include "io/file_hashes.h"
#include "pipeline/block_cache.h"
#include "pipeline/clip_decode.h"
#include "pipeline/condition_cache.h"
#include "pipeline/graphs.h"
#include "pipeline/image_to_video.h"
#include "pipeline/latent_resize.h"
#include "pipeline/loras.h"
#include "pipeline/pixel_planes.h"
#include "pipeline/reference_images.h"
#include "pipeline/schedulers.h"
#include "pipeline/size_conditioning.h"
#include "pipeline/spectrum_forecast.h"
#include "pipeline/upscaler.h"
#include "pipeline/vace_context.h"
#include "pipeline/vae_tiling.h"
#include "runtime/graph_session.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::pipeline {
namespace {

// The diffusion network's graph of one sampling run: built at the first
// step and reused by every later one (same shapes; only x, the timestep and,
// for separate CFG passes, the context change), so a step costs no graph
// build and, with nothing else computed in between, no new allocation.
struct DiffusionGraphs {
    // By batch, token count and skipped blocks: the CFG batch, or the two
    // passes apart (one graph, or two when the prompts' contexts differ in
    // length), and skip-layer guidance's pass.
    std::vector<DiffusionGraph> graphs;
    // The ControlNet's graphs, by the same batch and token count.
    std::vector<ControlGraph> control;
    // The CFG batch of two did not fit, or the contexts differ in length:
    // the passes run one at a time.
    bool separate_passes = false;
};

// A sampling run's step cache (pipeline/step_cache_options.h): at most one
// of these, made when the run starts and gone when it ends.
struct StepCaches {
    std::optional<ConditionCache> condition;   // ucache, easycache
    std::optional<BlockCache> blocks;          // dbcache, taylorseer, cache-dit
    models::BlockSplit split;                  // their Fn and Bn
    std::optional<SpectrumForecast> spectrum;  // spectrum
    // A block cache's vectors in RAM's books (the stream's size times what
    // it keeps per pass), counted once the first front stage shows the size.
    runtime::LedgerReservation held;
};

// The diffusion network's input and output channels.
int64_t in_channels(const Model& model) { return model.diffusion().capabilities().in_channels; }
int64_t out_channels(const Model& model) { return model.diffusion().capabilities().out_channels; }
int64_t image_context_width(const Model& model) { return model.diffusion().capabilities().image_context_width; }

// The network's timestep and scalings at `sigma` (SamplingRun::shifted_timestep).
NetworkStep step_at(const Model& model, const SamplingRun& p, float sigma) {
    return network_step(model.prediction(), p.schedule ? *p.schedule : DiscreteSchedule::stable_diffusion(), sigma,
                        p.shifted_timestep);
}

// The ControlNet's residuals for one evaluation of the UNet: `input` is the
// UNet's (batch items of in_channels planes; the ControlNet reads the
// latent's planes), and the rest as run_diffusion_batch takes them.
Result<std::vector<float>> run_control_net(Model& model, const std::vector<float>& input,
                                           const std::vector<float>& timesteps, const SamplingRun& p,
                                           const std::vector<float>& context, int64_t tokens,
                                           const std::vector<float>& y, int64_t batch, DiffusionGraphs& graphs) {
    auto found = std::find_if(graphs.control.begin(), graphs.control.end(), [&](const ControlGraph& g) {
        return g.shape.batch == batch && g.shape.tokens == tokens;
    });
    if (found == graphs.control.end()) {
        models::DiffusionShape shape{p.latent_w, p.latent_h, batch, tokens, p.flash_attention};
        auto built = build_control_graph(model, shape);
        if (!built.ok()) return built.error();
        graphs.control.push_back(std::move(built).value());
        found = graphs.control.end() - 1;
    }
    ControlGraph& g = *found;
    const int64_t in_ch = in_channels(model), latent_values = p.latent_w * p.latent_h * out_channels(model);
    std::vector<float> latents;
    for (int64_t b = 0; b < batch; ++b) {
        const auto item = input.begin() + b * p.latent_w * p.latent_h * in_ch;
        latents.insert(latents.end(), item, item + latent_values);
    }
    g.session->set_input(g.x, latents.data());
    g.session->set_input(g.timesteps, timesteps.data());
    g.session->set_input(g.context, context.data());
    if (g.y) g.session->set_input(g.y, y.data());
    g.session->set_input(g.hint, p.control_hint.data());
    KILN_TRY(g.session->run(model.control_compute(), g.out));
    return runtime::GraphSession::read(g.out);
}

// Runs the diffusion network on `batch` copies of the scaled latent with
// `context` ([width, tokens] per batch item), `y` (the UNet's vector input,
// or the DiT's pooled vector, per batch item; empty when it takes none) and
// `valid` (the DiT's text-token mask per batch item; empty: none) and
// returns its raw output.
Result<std::vector<float>> run_diffusion_batch(
    Model& model, const std::vector<float>& x, float sigma, const SamplingRun& p, const std::vector<float>& context,
    int64_t tokens, const std::vector<float>& y, const std::vector<float>& valid, int64_t batch, DiffusionGraphs& unet,
    const std::vector<int>& skip_blocks = {}, const models::BlockSplit& split = {},
    const std::vector<float>* stream = nullptr, const std::vector<float>* residual = nullptr) {
    const int64_t in_ch = in_channels(model), out_ch = out_channels(model);
    const NetworkStep step = step_at(model, p, sigma);
    const Scalings& s = step.scalings;
    const float t = step.timestep;
    const int64_t plane = p.latent_w * p.latent_h * p.latent_frames;
    const int64_t latent_values = plane * out_ch;
    std::vector<float> input(static_cast<size_t>(plane * in_ch * batch), 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
        float* dst = input.data() + b * plane * in_ch;
        for (int64_t i = 0; i < latent_values; ++i) dst[i] = x[static_cast<size_t>(i)] * s.c_in;
        if (in_ch > out_ch) {
            if (!p.concat.empty()) {
                std::copy(p.concat.begin(), p.concat.end(), dst + latent_values);
            } else if (model.diffusion().capabilities().concat == models::LatentConcat::MaskThenMaskedImage) {
                // No mask: repaint everything (mask 1, masked image 0).
                std::fill(dst + latent_values, dst + latent_values + plane, 1.0f);
            } else if (model.diffusion().capabilities().concat == models::LatentConcat::MaskedImageThenPixelMask) {
                // No mask: masked image 0, mask 1 (sd-cli's).
                std::fill(dst + 2 * latent_values, dst + plane * in_ch, 1.0f);
            }
        }
    }
    std::vector<float> timesteps(static_cast<size_t>(batch), t);
    auto found = std::find_if(unet.graphs.begin(), unet.graphs.end(), [&](const DiffusionGraph& g) {
        return g.shape.batch == batch && g.shape.tokens == tokens && g.shape.skip_blocks == skip_blocks &&
               g.shape.split.stage == split.stage;
    });
    if (found == unet.graphs.end()) {
        models::DiffusionShape shape{p.latent_w,        p.latent_h,  batch,         tokens,
                                     p.flash_attention, p.ref_sizes, !valid.empty()};
        shape.increase_ref_index = p.increase_ref_index;
        shape.frames = p.latent_frames;
        shape.image_context_rows =
            p.image_context.empty() ? 0 : static_cast<int64_t>(p.image_context.size()) / image_context_width(model);
        shape.clean_first_frame = p.clean_first_frame;
        shape.vace_strength = p.vace_strength;
        shape.skip_blocks = skip_blocks;
        shape.split = split;
        if (!p.control_hint.empty()) add_control_residuals(model, shape, p.control_strength);
        auto built = build_diffusion_graph(model, shape);
        if (!built.ok()) return built.error();
        unet.graphs.push_back(std::move(built).value());
        found = unet.graphs.end() - 1;
    }
    DiffusionGraph& g = *found;
    g.session->set_input(g.x, input.data());
    g.session->set_input(g.timesteps, timesteps.data());
    g.session->set_input(g.context, context.data());
    if (g.y) {
        if (static_cast<int64_t>(y.size()) != ggml_nelements(g.y))
            return Error{"the diffusion network's vector input has the wrong size"};
        g.session->set_input(g.y, y.data());
    }
    if (g.guidance) {
        const std::vector<float> guidance(static_cast<size_t>(batch), p.guidance);
        g.session->set_input(g.guidance, guidance.data());
    }
    // Inputs every batch item reads alike: one item's values, repeated.
    auto set_per_item = [&](ggml_tensor* tensor, const std::vector<float>& item, const char* what) -> Status {
        std::vector<float> values;
        values.reserve(item.size() * static_cast<size_t>(batch));
        for (int64_t b = 0; b < batch; ++b) values.insert(values.end(), item.begin(), item.end());
        if (static_cast<int64_t>(values.size()) != ggml_nelements(tensor))
            return Error{std::string("the DiT's ") + what + " has the wrong size"};
        g.session->set_input(tensor, values.data());
        return Status::Ok();
    };
    for (size_t i = 0; i < g.refs.size(); ++i) KILN_TRY(set_per_item(g.refs[i], p.refs[i], "reference latent"));
    if (g.image_context) KILN_TRY(set_per_item(g.image_context, p.image_context, "image context"));
    if (g.vace_context) KILN_TRY(set_per_item(g.vace_context, p.vace_context, "VACE context"));
    for (auto [tensor, values] : {std::pair{g.stream, stream}, std::pair{g.residual, residual}}) {
        if (!tensor) continue;
        if (!values || static_cast<int64_t>(values->size()) != ggml_nelements(tensor))
            return Error{"a block stage's stream input has the wrong size"};
        g.session->set_input(tensor, values->data());
    }
    if (g.mask) {
        const std::vector<float> mask = model.diffusion().text_mask_values(valid, g.shape);
        g.session->set_input(g.mask, mask.data());
    }
    if (!g.control.empty()) {
        auto residuals = run_control_net(model, input, timesteps, p, context, tokens, y, batch, unet);
        if (!residuals.ok()) return residuals.error();
        size_t offset = 0;
        for (ggml_tensor* residual : g.control) {
            const size_t values = static_cast<size_t>(ggml_nelements(residual));
            if (offset + values > residuals->size())
                return Error{"the ControlNet gave fewer residuals than the UNet takes"};
            g.session->set_input(residual, residuals->data() + offset);
            offset += values;
        }
    }
    KILN_TRY(g.session->run(model.diffusion_compute(), g.out));
    return runtime::GraphSession::read(g.out);
}

// One pass through the network (run_diffusion_batch's arguments): whole or,
// with a block-level step cache, in its stages: the front blocks, then the
// rest, or only the back blocks on the middle residual the cache gives.
// `pass` names the pass to the cache (0 the CFG batch, 1 the conditional
// alone, 2 the unconditional alone); the evaluation's first pass decides
// for the others (`decided`, `skipping`).
struct BlockDecision {
    bool decided = false;
    bool skipping = false;
};
Result<std::vector<float>> run_pass(Model& model, const std::vector<float>& x, float sigma, const SamplingRun& p,
                                    const std::vector<float>& context, int64_t tokens, const std::vector<float>& y,
                                    const std::vector<float>& valid, int64_t batch, DiffusionGraphs& graphs,
                                    StepCaches& caches, int pass, int step, BlockDecision& decision) {
    if (!caches.blocks) return run_diffusion_batch(model, x, sigma, p, context, tokens, y, valid, batch, graphs);
    models::BlockSplit split = caches.split;
    split.stage = models::BlockStage::Front;
    auto front = run_diffusion_batch(model, x, sigma, p, context, tokens, y, valid, batch, graphs, {}, split);
    if (!front.ok()) return front.error();
    const auto middle_of_front = front->begin() + static_cast<std::ptrdiff_t>(front->size() / 2);
    const std::vector<float> stream(front->begin(), middle_of_front), front_residual(middle_of_front, front->end());
    if (caches.held.bytes() == 0) {
        // Per pass: the middle residual, the Taylor series' two (forecasting modes); the front residual once.
        const uint64_t kept = p.cache.mode == CacheMode::DbCache ? 1 : 3;
        const uint64_t bytes = stream.size() * sizeof(float) * (kept * (p.cfg_scale != 1.0f ? 2 : 1) + 1);
        auto held = runtime::LedgerReservation::make(model.host_ledger(), bytes, "the step cache's residuals");
        if (!held.ok()) return held.error();
        caches.held = std::move(held).value();
    }
    if (!decision.decided) {
        decision.skipping = caches.blocks->skips_middle(pass, step, front_residual);
        decision.decided = true;
    }
    if (decision.skipping) {
        const std::vector<float> middle = caches.blocks->middle_residual(pass, step);
        if (middle.size() == stream.size()) {
            split.stage = models::BlockStage::Cached;
            return run_diffusion_batch(model, x, sigma, p, context, tokens, y, valid, batch, graphs, {}, split, &stream,
                                       &middle);
        }
    }
    split.stage = models::BlockStage::Rest;
    auto rest = run_diffusion_batch(model, x, sigma, p, context, tokens, y, valid, batch, graphs, {}, split, &stream);
    if (!rest.ok()) return rest.error();
    const size_t prediction =
        static_cast<size_t>(p.latent_w * p.latent_h * p.latent_frames * out_channels(model) * batch);
    if (rest->size() != prediction + stream.size()) return Error{"a block stage's output has the wrong size"};
    caches.blocks->computed(pass, step,
                            std::vector<float>(rest->begin() + static_cast<std::ptrdiff_t>(prediction), rest->end()),
                            front_residual);
    rest->resize(prediction);
    return rest;
}

// One diffusion-network evaluation: the conditional pass and, with CFG, the unconditional
// one, as one batch of two so every weight is read once per step; when the
// batch does not fit (or p.batch_cfg is off), as two passes of one that
// share one plan; when the two contexts differ in length, as two passes of
// their own lengths. A condition-level step cache may reuse every pass's
// residual instead (pipeline/condition_cache.h).
Result<std::vector<float>> run_diffusion(Model& model, const std::vector<float>& x, float sigma, const SamplingRun& p,
                                         const Conditioning& cond, const Conditioning* uncond, int step,
                                         DiffusionGraphs& graph, StepCaches& caches) {
    const int64_t latent_values = p.latent_w * p.latent_h * p.latent_frames * out_channels(model);
    if (static_cast<int64_t>(x.size()) != latent_values) {
        return Error{"latent has the wrong size for the diffusion network"};
    }
    const NetworkStep at = step_at(model, p, sigma);
    // The condition caches compare and reuse on the network's input, x * c_in.
    std::vector<float> network_input;
    bool reusing = false;
    std::vector<float> c_out, u_out;
    if (caches.condition) {
        network_input.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) network_input[i] = x[i] * at.scalings.c_in;
        reusing = caches.condition->reuses(step, sigma, network_input);
        if (reusing) {
            c_out = caches.condition->reused(0, network_input);
            if (uncond) u_out = caches.condition->reused(1, network_input);
            if (c_out.empty() || (uncond && u_out.empty())) c_out.clear(), u_out.clear();
        }
    }
    if (!p.batch_cfg || (uncond && uncond->tokens != cond.tokens)) graph.separate_passes = true;
    BlockDecision decision;
    if (uncond && !graph.separate_passes && c_out.empty()) {
        std::vector<float> context(cond.hidden);
        context.insert(context.end(), uncond->hidden.begin(), uncond->hidden.end());
        std::vector<float> y(cond.y);
        y.insert(y.end(), uncond->y.begin(), uncond->y.end());
        std::vector<float> valid(cond.token_valid);
        valid.insert(valid.end(), uncond->token_valid.begin(), uncond->token_valid.end());
        auto both = run_pass(model, x, sigma, p, context, cond.tokens, y, valid, 2, graph, caches, 0, step, decision);
        if (both.ok()) {
            c_out.assign(both->begin(), both->begin() + latent_values);
            u_out.assign(both->begin() + latent_values, both->end());
        } else if (both.error().kind == ErrorKind::OutOfMemory) {
            KILN_LOG_WARN("the CFG batch of two does not fit (%s); running the two passes one after the other",
                          both.error().message.c_str());
            graph.separate_passes = true;
            // Its inputs and kept activations would hold room the passes need.
            graph.graphs.clear();
            graph.control.clear();
        } else {
            return both.error();
        }
    }
    if (c_out.empty()) {
        auto c = run_pass(model, x, sigma, p, cond.hidden, cond.tokens, cond.y, cond.token_valid, 1, graph, caches, 1,
                          step, decision);
        if (!c.ok()) return c.error();
        c_out = std::move(c).value();
        if (uncond) {
            auto u = run_pass(model, x, sigma, p, uncond->hidden, uncond->tokens, uncond->y, uncond->token_valid, 1,
                              graph, caches, 2, step, decision);
            if (!u.ok()) return u.error();
            u_out = std::move(u).value();
        }
    }
    if (caches.condition && !reusing) {
        caches.condition->computed(0, network_input, c_out);
        if (uncond) caches.condition->computed(1, network_input, u_out);
    }
    std::vector<float> guided(static_cast<size_t>(latent_values));
    for (size_t i = 0; i < guided.size(); ++i) {
        guided[i] = uncond ? u_out[i] + p.cfg_scale * (c_out[i] - u_out[i]) : c_out[i];
    }
    if (p.slg.applies(step, p.sigmas.size())) {
        std::vector<float> skipped = reusing ? caches.condition->reused(3, network_input) : std::vector<float>{};
        if (skipped.empty()) {
            auto ran = run_diffusion_batch(model, x, sigma, p, cond.hidden, cond.tokens, cond.y, cond.token_valid, 1,
                                           graph, p.slg.blocks);
            if (!ran.ok()) return ran.error();
            skipped = std::move(ran).value();
            if (caches.condition) caches.condition->computed(3, network_input, skipped);
        }
        for (size_t i = 0; i < guided.size(); ++i) guided[i] += p.slg.scale * (c_out[i] - skipped[i]);
    }
    return denoised_from_output(at.scalings, x, guided);
}

// `encoding` matters for encoding only.
Result<std::vector<float>> run_vae(Model& model, bool decode, const std::vector<float>& input, int64_t w, int64_t h,
                                   const std::optional<VaeTiling>& tiling,
                                   models::LatentEncoding encoding = models::LatentEncoding::Mean) {
    if (tiling) {
        return decode ? decode_tiled(model, input, w, h, *tiling)
                      : encode_tiled(model, input, w, h, *tiling, nullptr, encoding);
    }
    VaeGraph g = decode ? build_vae_decode_graph(model, w, h, input.data())
                        : build_vae_encode_graph(model, w, h, input.data(), encoding);
    Status status = g.session->run(model.vae_compute(), g.out);
    if (status.ok()) return runtime::GraphSession::read(g.out);
    if (status.error().kind != ErrorKind::OutOfMemory) return status.error();
    KILN_LOG_WARN("VAE %s: %s; retrying with tiling", decode ? "decode" : "encode", status.error().message.c_str());
    return run_vae(model, decode, input, w, h, VaeTiling{}, encoding);
}

// The decoder's planar [W, H, 3] pixels as an 8-bit RGB image: a VAE's
// [-1, 1], or with `unit_range` a tiny autoencoder's [0, 1], clamped.
Result<image::Image> pixels_to_image(const std::vector<float>& pixels, const ValidatedRequest& p, bool unit_range,
                                     const char* decoder) {
    if (!std::all_of(pixels.begin(), pixels.end(), [](float v) { return std::isfinite(v); })) {
        return Error{std::string("the ") + decoder +
                     " produced non-finite values (NaN or Inf): its weights or the latent scale are "
                     "not finite, or it overflowed (an f16 SDXL VAE: use the fp16-fix VAE with --vae)"};
    }
    image::Image img = image::make_image(p.width, p.height, 3);
    const size_t plane = static_cast<size_t>(p.width) * p.height;
    if (pixels.size() != plane * 3) return Error{std::string("the ") + decoder + " gave an image of the wrong size"};
    for (size_t i = 0; i < plane; ++i) {
        for (size_t ch = 0; ch < 3; ++ch) {
            const float x = pixels[ch * plane + i];
            const float v = std::clamp(unit_range ? x : (x + 1.0f) * 0.5f, 0.0f, 1.0f);
            img.pixels[i * 3 + ch] = static_cast<uint8_t>(std::lround(v * 255.0f));
        }
    }
    return img;
}

// The model's VAE on the scaled latent.
Result<image::Image> decode_latent_vae(Model& model, const std::vector<float>& latent, const ValidatedRequest& p,
                                       const std::optional<VaeTiling>& tiling) {
    std::vector<float> z(latent);
    for (float& v : z) v = v / model.latent_scale() + model.latent_shift();
    auto decoded = run_vae(model, /*decode=*/true, z, p.latent_w, p.latent_h, tiling);
    if (!decoded.ok()) return decoded.error();
    return pixels_to_image(*decoded, p, /*unit_range=*/false, "VAE decoder");
}

// --taesd's decoder on the scaled latent itself (its latent API is the
// diffusion network's).
Result<image::Image> decode_latent_taesd(Model& model, const std::vector<float>& latent, const ValidatedRequest& p) {
    VaeGraph g = build_taesd_decode_graph(model, p.latent_w, p.latent_h, latent.data());
    KILN_TRY(g.session->run(model.taesd_compute(), g.out));
    return pixels_to_image(runtime::GraphSession::read(g.out), p, /*unit_range=*/true, "tiny autoencoder");
}

// The final image: the VAE's, or with --taesd (not --taesd-preview-only)
// the tiny autoencoder's, as sd-cli decodes it.
Result<image::Image> decode_latent(Model& model, const std::vector<float>& latent, const ValidatedRequest& p,
                                   const std::optional<VaeTiling>& tiling) {
    if (model.taesd_decodes_images()) return decode_latent_taesd(model, latent, p);
    return decode_latent_vae(model, latent, p, tiling);
}

// A video's scaled latent [C, T, h, w] as its frames (pipeline/clip_decode:
// a latent frame at a time, whole or in spatial tiles).
Result<std::vector<image::Image>> decode_clip(Model& model, const std::vector<float>& latent, const ValidatedRequest& p,
                                              const std::optional<VaeTiling>& tiling,
                                              const std::function<void(int)>& decoded) {
    std::vector<float> z = without_reference_frames(latent, p);
    for (float& v : z) v = v / model.latent_scale() + model.latent_shift();
    const int64_t frames = p.latent_frames - (p.vace_reference ? kVaceReferenceFrames : 0);
    auto planes = decode_clip_planes(model, z, p.latent_w, p.latent_h, frames, tiling, decoded);
    if (!planes.ok()) return planes.error();
    std::vector<image::Image> clip;
    const size_t frame_values = static_cast<size_t>(p.width) * p.height * 3;
    for (size_t at = 0; at + frame_values <= planes->size(); at += frame_values) {
        auto img = pixels_to_image(std::vector<float>(planes->begin() + static_cast<std::ptrdiff_t>(at),
                                                      planes->begin() + static_cast<std::ptrdiff_t>(at + frame_values)),
                                   p, /*unit_range=*/false, "VAE decoder");
        if (!img.ok()) return img.error();
        clip.push_back(std::move(img).value());
    }
    return clip;
}

// A video's first latent frame [C, h, w] of its latent [C, T, h, w]: the
// clip's first frame alone (what previews show; a VACE reference's frame is
// not the clip's).
std::vector<float> first_latent_frame(const std::vector<float>& latent, const ValidatedRequest& p) {
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h);
    const size_t channels = latent.size() / (plane * p.latent_frames);
    const size_t first_frame = p.vace_reference ? static_cast<size_t>(kVaceReferenceFrames) : 0;
    std::vector<float> first(plane * channels);
    for (size_t c = 0; c < channels; ++c) {
        std::copy_n(latent.begin() + (c * p.latent_frames + first_frame) * plane, plane, first.begin() + c * plane);
    }
    return first;
}

// One preview of `latent` (scaled) as request.preview.mode says: the
// family's projection at the latent's size, or a decode at the image's size.
// A failure is warned about once per job (`warned`) and skipped.
Result<image::Image> make_preview(Model& model, const std::vector<float>& clip_or_image, const ValidatedRequest& p,
                                  const GenerationRequest& request, bool& warned) {
    // A video's preview is its first frame.
    const std::vector<float> first = p.video ? first_latent_frame(clip_or_image, p) : std::vector<float>{};
    const std::vector<float>& latent = p.video ? first : clip_or_image;
    Result<image::Image> preview = Error{"no latent to preview yet"};
    switch (request.preview.mode) {
        case PreviewMode::Proj:
            preview = project_latent_to_rgb(latent, p.latent_w, p.latent_h, model.latent_format());
            break;
        case PreviewMode::Tae:
            if (model.has_taesd()) {
                preview = decode_latent_taesd(model, latent, p);
                break;
            }
            [[fallthrough]];  // no --taesd: the VAE, as sd-cli falls back to it
        case PreviewMode::Vae: preview = decode_latent_vae(model, latent, p, request.vae_tiling); break;
        case PreviewMode::None: break;
    }
    if (!preview.ok() && !warned) {
        KILN_LOG_WARN("preview: %s; the job goes on without previews that fail", preview.error().message.c_str());
        warned = true;
    }
    return preview;
}

// The image's latent (scaled): the latent distribution's mean and, with
// `sample_rng`, also a sample of it drawn from that generator, mean + std *
// noise (ldm's DiagonalGaussianDistribution.sample, as sd-cli and A1111
// encode an init image) into *sample.
// `pixels` are planar RGB in [-1, 1] at the job's size.
Result<std::vector<float>> encode_planes(Model& model, const std::vector<float>& pixels, const ValidatedRequest& p,
                                         const std::optional<VaeTiling>& tiling, Rng* sample_rng = nullptr,
                                         std::vector<float>* sample = nullptr) {
    auto encoded = run_vae(model, /*decode=*/false, pixels, p.width, p.height, tiling,
                           sample_rng ? models::LatentEncoding::Moments : models::LatentEncoding::Mean);
    if (!encoded.ok()) return encoded.error();
    std::vector<float> latent = std::move(encoded).value();
    if (sample_rng) {
        // Planar [mean channels, log-variance channels]; ldm clamps the log variance to [-30, 20].
        const size_t half = latent.size() / 2;
        const std::vector<float> noise = sample_rng->randn(half);
        sample->resize(half);
        for (size_t i = 0; i < half; ++i) {
            const float std_dev = std::exp(0.5f * std::clamp(latent[half + i], -30.0f, 20.0f));
            (*sample)[i] = (latent[i] + std_dev * noise[i] - model.latent_shift()) * model.latent_scale();
        }
        latent.resize(half);
    }
    for (float& v : latent) v = (v - model.latent_shift()) * model.latent_scale();
    return latent;
}

Result<std::vector<float>> encode_image(Model& model, const image::Image& source, const ValidatedRequest& p,
                                        const std::optional<VaeTiling>& tiling, Rng* sample_rng = nullptr,
                                        std::vector<float>* sample = nullptr) {
    auto planes = rgb_planes(source, p.width, p.height, PixelRange::Signed);
    if (!planes.ok()) return planes.error();
    return encode_planes(model, *planes, p, tiling, sample_rng, sample);
}

// A grey mask in [0, 1] (1 = repaint) resized to width x height.
Result<std::vector<float>> mask_plane(const image::Image& mask, int width, int height) {
    auto grey = image::convert_channels(mask, 1);
    if (!grey.ok()) return Error{"mask: " + grey.error().message};
    image::Image m = std::move(grey).value();
    if (m.width != width || m.height != height) {
        auto resized = image::resize_image(m, width, height, image::ResizeFilter::Bilinear);
        if (!resized.ok()) return Error{"mask: " + resized.error().message};
        m = std::move(resized).value();
    }
    std::vector<float> plane(m.pixels.size());
    for (size_t i = 0; i < plane.size(); ++i) plane[i] = m.pixels[i] / 255.0f;
    return plane;
}

// The mask at the latent's size, 1 where a latent pixel is repainted: the
// pixel mask rounded to 0 or 1, then the largest value of each block of
// pixels a latent pixel covers, as sd-cli makes its denoise mask (round, then
// NearestMax). The originals also binarise (A1111 rounds its resized mask,
// diffusers thresholds at 0.5), so a mask's soft edge repaints its latent
// pixel or keeps it, never blends the two; a stroke thinner than a block
// still repaints the block.
Result<std::vector<float>> latent_mask_plane(const image::Image& mask, const ValidatedRequest& p, int downscale) {
    auto pixels = mask_plane(mask, p.width, p.height);
    if (!pixels.ok()) return pixels.error();
    std::vector<float> latent(static_cast<size_t>(p.latent_w) * static_cast<size_t>(p.latent_h), 0.0f);
    for (int y = 0; y < p.height; ++y) {
        for (int x = 0; x < p.width; ++x) {
            if ((*pixels)[static_cast<size_t>(y) * static_cast<size_t>(p.width) + static_cast<size_t>(x)] < 0.5f)
                continue;
            const int64_t lx = std::min<int64_t>(x / downscale, p.latent_w - 1);
            const int64_t ly = std::min<int64_t>(y / downscale, p.latent_h - 1);
            latent[static_cast<size_t>(ly * p.latent_w + lx)] = 1.0f;
        }
    }
    return latent;
}

// Flux.1-Fill's planes after the latent (models::LatentConcat::
// MaskedImageThenPixelMask), as BFL's prepare_fill makes them: the latent of
// the init image times (1 - mask), the soft mask as it is (diffusers
// thresholds it at 0.5 first; the two agree on a black-and-white mask), then
// the mask's pixels, each latent pixel's d x d block as d^2 planes. BFL
// encodes a posterior sample drawn from torch's generator, which no other
// program reproduces; kiln takes the mean, as it does for the UNet's masked
// image.
Result<std::vector<float>> fill_concat(Model& model, const image::Image& init, const std::vector<float>& pixel_mask,
                                       const ValidatedRequest& p, const std::optional<VaeTiling>& tiling) {
    auto planes = rgb_planes(init, p.width, p.height, PixelRange::Signed);
    if (!planes.ok()) return planes.error();
    std::vector<float> masked = std::move(planes).value();
    const size_t pixels = pixel_mask.size();
    for (size_t k = 0; k < masked.size(); ++k) masked[k] *= 1.0f - pixel_mask[k % pixels];
    auto concat = encode_planes(model, masked, p, tiling);
    if (!concat.ok()) return concat.error();
    const int64_t d = model.vae().format().downscale;
    for (int64_t py = 0; py < d; ++py) {
        for (int64_t px = 0; px < d; ++px) {
            for (int64_t ly = 0; ly < p.latent_h; ++ly) {
                for (int64_t lx = 0; lx < p.latent_w; ++lx) {
                    concat->push_back(pixel_mask[static_cast<size_t>((ly * d + py) * p.width + lx * d + px)]);
                }
            }
        }
    }
    return concat;
}

// Fills run.concat (an inpainting network's extra planes: capabilities().concat)
// or run.keep_weight / keep_latent (any other network: latent masking,
// keeping `init_latent`, the init image's latent the job starts from: a
// sample of its distribution, as sd-cli, A1111 and diffusers keep).
Status prepare_inpainting(Model& model, const image::Image& init, const image::Image& mask,
                          const std::vector<float>& init_latent, const ValidatedRequest& p,
                          const std::optional<VaeTiling>& tiling, SamplingRun& run) {
    auto latent_mask = latent_mask_plane(mask, p, model.vae().format().downscale);
    if (!latent_mask.ok()) return latent_mask.error();
    const size_t plane = static_cast<size_t>(p.latent_w) * p.latent_h;
    auto pixel_mask = mask_plane(mask, p.width, p.height);
    if (!pixel_mask.ok()) return pixel_mask.error();
    switch (model.diffusion().capabilities().concat) {
        case models::LatentConcat::FirstFrameCondition:
            return Error::invalid_request("--mask: " + model.family_label() + " takes frames, not a mask");
        case models::LatentConcat::None:
            run.keep_weight.resize(init_latent.size());
            for (size_t k = 0; k < init_latent.size(); ++k) run.keep_weight[k] = 1.0f - (*latent_mask)[k % plane];
            run.keep_latent = init_latent;
            return Status::Ok();
        case models::LatentConcat::MaskedImageThenPixelMask: {
            auto concat = fill_concat(model, init, *pixel_mask, p, tiling);
            if (!concat.ok()) return concat.error();
            run.concat = std::move(concat).value();
            return Status::Ok();
        }
        case models::LatentConcat::MaskThenMaskedImage: break;
    }
    // The masked image: the init image with the repainted area set to 0 (grey
    // in [-1, 1]) where the mask is at least half on, as diffusers prepares it.
    auto rgb = image::convert_channels(init, 3);
    if (!rgb.ok()) return rgb.error();
    image::Image masked = std::move(rgb).value();
    if (masked.width != p.width || masked.height != p.height) {
        auto resized = image::resize_image(masked, p.width, p.height);
        if (!resized.ok()) return resized.error();
        masked = std::move(resized).value();
    }
    for (size_t i = 0; i < pixel_mask->size(); ++i) {
        if ((*pixel_mask)[i] >= 0.5f) {
            for (int ch = 0; ch < 3; ++ch) masked.pixels[i * 3 + static_cast<size_t>(ch)] = 128;
        }
    }
    auto masked_latent = encode_image(model, masked, p, tiling);
    if (!masked_latent.ok()) return masked_latent.error();
    run.concat = *latent_mask;
    run.concat.insert(run.concat.end(), masked_latent->begin(), masked_latent->end());
    return Status::Ok();
}

// Each prompt conditions its pass with its own chunks, as sd-cli and
// A1111's default do (no padding with empty chunks). When one side's chunk
// count divides the other's, its chunks are repeated to the same length, as
// ComfyUI does: attention over k copies of the same keys and values gives
// the same result, and the CFG batch of two stays possible. Otherwise the
// two passes run apart (run_diffusion).
void match_context_lengths(Conditioning& cond, Conditioning& uncond) {
    Conditioning& shorter = cond.tokens < uncond.tokens ? cond : uncond;
    const Conditioning& longer = cond.tokens < uncond.tokens ? uncond : cond;
    if (shorter.tokens == longer.tokens || shorter.tokens == 0 || longer.tokens % shorter.tokens != 0) return;
    const std::vector<float> once = shorter.hidden;
    for (int64_t copies = longer.tokens / shorter.tokens; copies > 1; --copies) {
        shorter.hidden.insert(shorter.hidden.end(), once.begin(), once.end());
    }
    shorter.tokens = longer.tokens;
}

// The diffusion network's vector input: SDXL's pooled text and size
// embedding (sd-cli's micro-conditioning: original size = target size =
// the image's, no crop), or Flux's pooled CLIP-L output itself.
void condition_on_size(const Model& model, Conditioning& cond, std::optional<Conditioning>& uncond, int width,
                       int height) {
    if (model.family().conditioning.size_embedding) {
        SizeConditioning size;
        size.original_height = size.target_height = height;
        size.original_width = size.target_width = width;
        const int dim =
            static_cast<int>(model.diffusion().capabilities().vector_width - static_cast<int64_t>(cond.pooled.size())) /
            6;
        cond.y = sdxl_conditioning_vector(cond.pooled, size, dim);
        if (uncond) uncond->y = sdxl_conditioning_vector(uncond->pooled, size, dim);
    } else if (model.diffusion().capabilities().vector_width > 0) {
        cond.y = cond.pooled;
        if (uncond) uncond->y = uncond->pooled;
    }
}

// The starting point of image-to-image from `x0` (scaled latent): noise at
// the first sigma, x0 + sigma * noise, or on a flow model (1 - sigma) x0 +
// sigma * noise. `noise` is replaced by the result.
void noise_to_first_sigma(std::vector<float>& noise, const std::vector<float>* x0, float sigma, bool flow) {
    const float keep = flow ? 1.0f - sigma : 1.0f;
    for (size_t k = 0; k < noise.size(); ++k) noise[k] = noise[k] * sigma + (x0 ? keep * (*x0)[k] : 0.0f);
}

// The schedule's last `strength` share as sd-cli and A1111 cut it (sd-cli's
// generate_image, A1111's setup_img2img_steps and sample_img2img): with
// t_enc = int(steps * strength), at most steps - 1, the sigmas from index
// steps - t_enc - 1 on, so t_enc + 1 steps run (at least one, at most all).
void keep_last_share(std::vector<float>& sigmas, int steps, float strength) {
    const int t_enc = std::min(steps - 1, static_cast<int>(static_cast<float>(steps) * strength));
    sigmas.erase(sigmas.begin(), sigmas.begin() + (steps - t_enc - 1));
}

}  // namespace

Result<std::vector<float>> sample_latent(Model& model, const SamplingRun& run, std::vector<float> x,
                                         const Conditioning& cond, const Conditioning* uncond, Rng& rng,
                                         const ProgressFn& progress, bool* passes_apart,
                                         StepCacheReport* cache_report) {
    const size_t extra = static_cast<size_t>(run.latent_w * run.latent_h * run.latent_frames *
                                             (in_channels(model) - out_channels(model)));
    if (!run.concat.empty() && run.concat.size() != extra) return Error{"inpainting inputs have the wrong size"};
    if (run.keep_weight.size() != run.keep_latent.size() ||
        (!run.keep_weight.empty() && run.keep_weight.size() != x.size())) {
        return Error{"latent mask has the wrong size"};
    }
    // Latent masking (sd.cpp, A1111): the kept region follows the init image.
    // Written as (1 - w) * v + w * keep, so a weight of 1 keeps the init
    // latent exactly, whatever v was (v + w * (keep - v) rounds).
    auto keep_region = [&run](std::vector<float>& v) {
        for (size_t k = 0; k < v.size(); ++k) {
            const float w = run.keep_weight[k];
            v[k] = (1.0f - w) * v[k] + w * run.keep_latent[k];
        }
    };
    DiffusionGraphs graph;
    const NoiseSchedule& schedule = run.schedule ? *run.schedule : DiscreteSchedule::stable_diffusion();
    const int steps = static_cast<int>(run.sigmas.size()) - 1;
    StepCaches caches;
    switch (run.cache.mode) {
        case CacheMode::UCache:
        case CacheMode::EasyCache: caches.condition.emplace(run.cache, run.sigmas, schedule); break;
        case CacheMode::DbCache:
        case CacheMode::TaylorSeer:
        case CacheMode::CacheDit:
            caches.blocks.emplace(run.cache, run.cache_step_offset);
            caches.split.front = run.cache.front_blocks;
            caches.split.back = run.cache.back_blocks;
            break;
        case CacheMode::Spectrum: caches.spectrum.emplace(run.cache, steps); break;
        case CacheMode::None: break;
    }
    int evaluations = 0;
    // What an interrupt ends with (A1111's last_latent): the last step's
    // denoised estimate, or the starting latent before the first.
    std::vector<float> last_estimate = x;
    int steps_done = 0;
    DenoiseFn denoise = [&](const std::vector<float>& xt, float sigma, int step) -> Result<std::vector<float>> {
        if (model.cancel_requested()) return Error::cancelled("cancelled");
        if (model.cut_short()) {
            steps_done = step;
            return Error::cancelled("interrupted");
        }
        ++evaluations;
        Result<std::vector<float>> denoised = Error{"no evaluation"};
        if (caches.spectrum && caches.spectrum->forecasts_next()) {
            denoised = caches.spectrum->forecast();
        } else {
            denoised = run_diffusion(model, xt, sigma, run, cond, run.cfg_scale != 1.0f ? uncond : nullptr, step, graph,
                                     caches);
            if (denoised.ok() && caches.spectrum) caches.spectrum->record(*denoised);
        }
        if (denoised.ok() && !run.keep_weight.empty()) keep_region(*denoised);
        if (denoised.ok() && run.on_denoised) run.on_denoised(xt, sigma, *denoised);
        if (denoised.ok()) last_estimate = *denoised;
        return denoised;
    };
    runtime::Executor& unet = model.diffusion_compute();
    const runtime::ExecutorStats before = unet.stats();
    const int builds_before = unet.plans().builds(), hits_before = unet.plans().hits();
    auto result = sample(run.sampler, denoise, std::move(x), run.sigmas, rng, run.eta, progress, schedule);
    if (!result.ok() && model.cut_short() && !model.cancel_requested()) {
        KILN_LOG_INFO("%s at step %d of %d: the image is that step's denoised estimate",
                      model.interrupt_requested() ? "interrupted" : "skipped", steps_done, steps);
        result = std::move(last_estimate);
    }
    if (run.cache.enabled()) {
        StepCacheReport report{run.cache.mode, 0, evaluations};
        if (caches.condition) report.skipped = caches.condition->reused_count();
        if (caches.blocks) report.skipped = caches.blocks->skipped_count();
        if (caches.spectrum) report.skipped = caches.spectrum->forecast_count();
        KILN_LOG_VERBOSE("step cache %s: skipped %d of %d evaluations", describe_step_cache(run.cache).c_str(),
                         report.skipped, report.evaluations);
        if (cache_report) *cache_report = report;
    }
    // ... and the sampled latent too (A1111 blends it once more after
    // sampling): a sampler's last step lands on the denoised latent only up to
    // rounding.
    if (result.ok() && !run.keep_weight.empty()) keep_region(*result);
    if (passes_apart) *passes_apart = uncond && run.cfg_scale != 1.0f && graph.separate_passes;
    const runtime::ExecutorStats& after = unet.stats();
    KILN_LOG_VERBOSE("diffusion graph: built once, allocated %d time(s) for %d evaluation(s)",
                     after.allocations - before.allocations, after.runs - before.runs);
    KILN_LOG_VERBOSE("diffusion plans: %d built, %d reused; %d segmented run(s), %d segment(s) in the last",
                     unet.plans().builds() - builds_before, unet.plans().hits() - hits_before,
                     after.segmented_runs - before.segmented_runs, after.last_segments);
    if (const auto devices = unet.split_devices(); devices.size() > 1) {
        for (const runtime::Executor* device : devices) {
            const auto [first, end] = device->segment_range();
            if (first == end) continue;
            KILN_LOG_VERBOSE(
                "diffusion layer split: %s ran segments %d-%d in %d group(s), receiving %s a run in %.1f ms; "
                "%d weight block(s) started uploading while the device before it computed",
                device->store().ledger().device_name().c_str(), first, end - 1, device->stats().last_segments,
                human_bytes(device->stats().crossing_bytes).c_str(), device->stats().crossing_seconds * 1000.0,
                device->stats().handoff_prefetches);
        }
    }
    return result;
}

namespace {

// Sampling with Wan 2.2 A14B's experts (pipeline/experts.h): the high-noise
// expert's first `high_steps` steps with its sampler, guidance and eta, then
// the main network's from the sigma where it stopped, on the same noise
// generator; progress counts the schedule's steps across both. Without
// expert steps, one run.
Result<std::vector<float>> sample_with_experts(Model& model, const SamplingRun& run, const ValidatedRequest& p,
                                               int high_steps, std::vector<float> x, const Conditioning& cond,
                                               const Conditioning* uncond, Rng& rng, const ProgressFn& progress,
                                               bool* passes_apart, StepCacheReport* cache_report) {
    if (high_steps <= 0) {
        return sample_latent(model, run, std::move(x), cond, uncond, rng, progress, passes_apart, cache_report);
    }
    const int total = static_cast<int>(run.sigmas.size()) - 1;
    const auto counted_from = [&](int first) -> ProgressFn {
        if (!progress) return nullptr;
        return [&progress, first, total](int step, int) { progress(first + step, total); };
    };
    SamplingRun high = run;
    high.sigmas.assign(run.sigmas.begin(), run.sigmas.begin() + high_steps + 1);
    high.sampler = p.high_noise_sampler;
    high.cfg_scale = p.high_noise_cfg;
    high.eta = p.high_noise_eta.value_or(default_eta(p.high_noise_sampler));
    StepCacheReport high_report;
    bool high_apart = false;
    {
        HighNoiseExpertScope expert(model);
        auto sampled =
            sample_latent(model, high, std::move(x), cond, uncond, rng, counted_from(0), &high_apart, &high_report);
        if (!sampled.ok()) return sampled;
        x = std::move(sampled).value();
    }
    KILN_LOG_VERBOSE("high-noise expert: steps 1-%d of %d; the main network takes over at sigma %g", high_steps, total,
                     static_cast<double>(run.sigmas[static_cast<size_t>(high_steps)]));
    if (passes_apart) *passes_apart = high_apart;
    if (cache_report) *cache_report = high_report;
    if (high_steps == total || model.cut_short()) return x;
    SamplingRun low = run;
    low.sigmas.assign(run.sigmas.begin() + high_steps, run.sigmas.end());
    low.cache_step_offset = run.cache_step_offset + high_steps;
    StepCacheReport low_report;
    bool low_apart = false;
    auto sampled =
        sample_latent(model, low, std::move(x), cond, uncond, rng, counted_from(high_steps), &low_apart, &low_report);
    if (passes_apart) *passes_apart = *passes_apart || low_apart;
    if (cache_report) {
        cache_report->mode = low_report.mode;
        cache_report->skipped += low_report.skipped;
        cache_report->evaluations += low_report.evaluations;
    }
    return sampled;
}

}  // namespace

std::string a1111_sampler_name(const std::string& sampler) {
    static const std::pair<const char*, const char*> kNames[] = {
        {"euler", "Euler"},
        {"euler_a", "Euler a"},
        {"heun", "Heun"},
        {"dpm2", "DPM2"},
        {"dpm++2s_a", "DPM++ 2S a"},
        {"dpm++2m", "DPM++ 2M"},
        {"dpm++2mv2", "DPM++ 2M v2"},
        {"ipndm", "iPNDM"},
        {"lcm", "LCM"},
        {"ddim_trailing", "DDIM"},
        {"tcd", "TCD"},
    };
    for (const auto& [kiln_name, a1111] : kNames) {
        if (sampler == kiln_name) return a1111;
    }
    return sampler;
}

namespace {

// The hires fix's second pass for one image (A1111's "Hires. fix", sd-cli's
// --hires): the first pass's `latent` (scaled) is upscaled to the hires
// size, in latent space or, with a model upscaler, as a decoded image that
// is upscaled, resized to the hires size and encoded again (a sample of its
// latent distribution, drawn from `rng`, as for an init image); then the
// last `denoising_strength` of a fresh schedule of hires steps runs on it,
// with noise from `rng` (the image's generator, continued; the sampler's
// from `sampler_rng`, the same one unless --sampler-rng). Strength 0 runs
// no step: the result is the upscaled first pass itself. `started` is
// called with the second pass's step count before it runs.
Result<image::Image> hires_pass(Model& model, const GenerationRequest& request, const ValidatedRequest& p,
                                const std::vector<float>& latent, const SamplingRun& first, Conditioning cond,
                                std::optional<Conditioning> uncond, Upscaler* upscaler, Rng& rng, Rng& sampler_rng,
                                const ProgressFn& progress, const std::function<void(int)>& started) {
    const ValidatedHires& h = *p.hires;
    // --hires-sigmas is the schedule as it runs: every value of it is a step.
    const float strength = h.sigmas.empty() ? request.hires->denoising_strength : 1.0f;
    ValidatedRequest at = p;
    at.width = h.width;
    at.height = h.height;
    at.latent_w = h.latent_w;
    at.latent_h = h.latent_h;
    at.steps = h.steps;
    std::vector<float> start;
    if (h.upscaler == HiresUpscaler::Latent) {
        start =
            resize_latent(latent, out_channels(model), p.latent_w, p.latent_h, h.latent_w, h.latent_h, h.latent_mode);
        if (strength == 0.0f) return decode_latent(model, start, at, request.vae_tiling);
    } else {
        auto decoded = decode_latent(model, latent, p, request.vae_tiling);
        if (!decoded.ok()) return decoded.error();
        Result<image::Image> big = std::move(decoded).value();
        if (h.upscaler == HiresUpscaler::Model) {
            // The model as many times as it takes to reach the hires size, then
            // Lanczos to that size exactly (A1111's way with an upscaler model).
            const int repeats = repeats_to_reach(upscaler->scale(), big->width, big->height, h.width, h.height);
            big = upscaler->upscale(*big, request.hires->upscale_tile, repeats);
            if (!big.ok()) return big.error().in_context("hires upscale: ");
        }
        if (big->width != h.width || big->height != h.height) {
            big = image::resize_image(*big, h.width, h.height, image::ResizeFilter::Lanczos3);
            if (!big.ok()) return big.error();
        }
        if (strength == 0.0f) return big;
        std::vector<float> sampled;
        auto encoded = encode_image(model, *big, at, request.vae_tiling, &rng, &sampled);
        if (!encoded.ok()) return encoded.error();
        start = std::move(sampled);
    }
    const std::unique_ptr<NoiseSchedule> schedule =
        model.noise_schedule(h.width, h.height, h.steps, request.flow_shift);
    auto sigmas = h.sigmas.empty() ? get_sigmas(p.scheduler, h.steps, *schedule) : Result<std::vector<float>>(h.sigmas);
    if (!sigmas.ok()) return sigmas.error();
    if (h.sigmas.empty()) keep_last_share(*sigmas, h.steps, strength);
    SamplingRun run = first;
    run.cache = {};  // the second pass computes every step
    run.latent_w = h.latent_w;
    run.latent_h = h.latent_h;
    run.sigmas = *sigmas;
    run.schedule = schedule.get();
    // The first pass's inpainting inputs have its size; an inpainting UNet
    // then repaints everything, as in text-to-image.
    run.concat.clear();
    run.keep_weight.clear();
    run.keep_latent.clear();
    condition_on_size(model, cond, uncond, h.width, h.height);
    std::vector<float> x = rng.randn(start.size());
    noise_to_first_sigma(x, &start, run.sigmas.front(), schedule->flow());
    started(static_cast<int>(run.sigmas.size()) - 1);
    auto sampled = sample_latent(model, run, std::move(x), cond, uncond ? &*uncond : nullptr, sampler_rng, progress);
    if (!sampled.ok()) return sampled.error();
    if (!std::all_of(sampled->begin(), sampled->end(), [](float v) { return std::isfinite(v); })) {
        return Error{"the hires pass produced non-finite values (NaN or Inf)"};
    }
    return decode_latent(model, *sampled, at, request.vae_tiling);
}

// A1111's keys for a hires fix: "Denoising strength", then "Hires upscale"
// (with a scale) or "Hires resize" (with a size), "Hires steps" (when given),
// "Hires upscaler".
// --hires-sigmas runs all of its schedule: strength 1, its steps.
void add_hires_info(const HiresFix& request, const ValidatedHires& h, image::GenerationInfo& info) {
    const bool sigmas = !h.sigmas.empty();
    info.extra.emplace_back("Denoising strength", sigmas ? "1" : format_number(request.denoising_strength));
    if (request.width == 0 && request.height == 0) {
        info.extra.emplace_back("Hires upscale", format_number(request.scale));
    } else {
        info.extra.emplace_back("Hires resize", std::to_string(h.width) + "x" + std::to_string(h.height));
    }
    if (request.steps > 0 || sigmas) info.extra.emplace_back("Hires steps", std::to_string(h.steps));
    info.extra.emplace_back("Hires upscaler", h.label);
}

}  // namespace

Result<std::vector<GeneratedImage>> generate(Model& model, const GenerationRequest& request,
                                             const StepCallback& on_step, GenerationTimings* timings,
                                             const PreviewCallback& on_preview, const PhaseCallback& on_phase,
                                             const DecodeCallback& on_decode) {
    auto planned = validate_request(model, request);
    if (!planned.ok()) return planned.error();
    auto images_held = reserve_request_images(model, request);
    if (!images_held.ok()) return images_held.error();
    model.clear_cancel();
    const ValidatedRequest& p = *planned;
    const SeamsScope seams(model, request.seams);
    if (request.guidance && !model.diffusion().capabilities().guidance) {
        KILN_LOG_WARN("--guidance does nothing for %s: its DiT has no guidance embedding (use --cfg-scale)",
                      model.family_label().c_str());
    }
    if (request.flow_shift && model.prediction() != Prediction::Flow) {
        KILN_LOG_WARN("--flow-shift does nothing for %s: not a flow model", model.family_label().c_str());
    }
    const T5Options& t5 = request.t5_options;
    if ((!t5.dit_mask || t5.t5_mask || t5.pad_tokens >= 0) && !model.masks_text_padding()) {
        KILN_LOG_WARN("the --chroma-* options do nothing for %s: it does not mask T5's padding (Chroma does)",
                      model.family_label().c_str());
    }
    GenerationTimings unused;
    GenerationTimings& times = timings ? *timings : unused;
    times = GenerationTimings{};
    using Clock = std::chrono::steady_clock;
    const auto seconds_since = [](Clock::time_point start) {
        return std::chrono::duration<double>(Clock::now() - start).count();
    };

    // <lora:NAME:W> tags choose the adapters and leave the prompt; the
    // image's parameters keep them, as A1111's do.
    auto tagged = extract_lora_tags(request.prompt);
    if (!tagged.ok()) return tagged.error();
    KILN_TRY(apply_loras(model, tagged->loras));

    // The unconditional pass runs when either expert's guidance needs it.
    const bool use_cfg = p.cfg != 1.0f || (p.high_noise_steps > 0 && p.high_noise_cfg != 1.0f);
    // The hires fix's model upscaler, loaded once for the batch and before
    // anything runs: a file or a RAM budget it does not fit fails fast.
    std::unique_ptr<Upscaler> hires_upscaler;
    runtime::LedgerReservation upscaler_held;
    if (p.hires && p.hires->upscaler == HiresUpscaler::Model) {
        // On the VAE's thread count (the CPU's computes use the job's -t).
        auto loaded = Upscaler::load(p.hires->model_path, model.vae_compute().compute().threads());
        if (!loaded.ok()) return loaded.error().in_context("--hires-upscaler: ");
        hires_upscaler = std::move(loaded).value();
        hires_upscaler->set_cancel_check([&model] { return model.cancel_requested(); });
        // In RAM's books while the batch holds it: its weights and its largest tile's buffers.
        auto memory = hires_upscaler->memory(
            p.width, p.height, request.hires->upscale_tile,
            repeats_to_reach(hires_upscaler->scale(), p.width, p.height, p.hires->width, p.hires->height));
        if (!memory.ok()) return memory.error();
        auto held = runtime::LedgerReservation::make(model.host_ledger(), memory->total(),
                                                     "the hires upscaler " + hires_upscaler->name());
        if (!held.ok()) return held.error();
        upscaler_held = std::move(held).value();
    }
    const Clock::time_point encoding_start = Clock::now();
    if (on_phase) on_phase(JobPhase::Encode, 0);
    // An edit model's -r images also enter its prompt, the negative's too
    // (diffusers' QwenImageEditPlusPipeline), through its vision tower: once.
    std::vector<PromptImage> prompt_images;
    if (model.has_vision()) {
        for (const TextEncoder& te : model.text_encoders()) {
            if (te.use->vision_module.empty()) continue;
            for (size_t i = 0; i < request.ref_images.size(); ++i) {
                auto encoded = encode_prompt_image(model, request.ref_images[i], te.use->vision_area);
                if (!encoded.ok()) return encoded.error().in_context("reference image " + std::to_string(i + 1) + ": ");
                KILN_LOG_VERBOSE("reference image %zu: %lldx%lld tokens in the prompt", i + 1,
                                 static_cast<long long>(encoded->grid_cols),
                                 static_cast<long long>(encoded->grid_rows));
                prompt_images.push_back(std::move(encoded).value());
            }
        }
    }
    auto cond = encode_prompt(model, tagged->prompt, request.clip_skip, request.t5_options, prompt_images);
    if (!cond.ok()) return cond.error();
    std::optional<Conditioning> uncond;
    if (use_cfg) {
        const models::Conditioning& recipe = model.family().conditioning;
        if (recipe.zero_empty_negative && request.negative_prompt.empty()) {
            uncond = *cond;
            std::fill(uncond->hidden.begin(), uncond->hidden.end(), 0.0f);
            std::fill(uncond->pooled.begin(), uncond->pooled.end(), 0.0f);
        } else {
            auto encoded =
                encode_prompt(model, request.negative_prompt, request.clip_skip, request.t5_options, prompt_images);
            if (!encoded.ok()) return encoded.error();
            uncond = std::move(encoded).value();
        }
        // CLIP's chunks repeat to a common length for a UNet's
        // cross-attention; a DiT's contexts of different lengths run as two
        // passes (run_diffusion).
        if (!model.diffusion().capabilities().joint_attention) match_context_lengths(*cond, *uncond);
    }
    condition_on_size(model, *cond, uncond, p.width, p.height);
    times.text_encoding_s = seconds_since(encoding_start);

    const std::unique_ptr<NoiseSchedule> schedule =
        model.noise_schedule(p.width, p.height, p.steps, request.flow_shift);
    std::vector<float> sigmas = request.sigmas;  // --sigmas, or the scheduler's
    if (sigmas.empty()) {
        auto scheduled = get_sigmas(p.scheduler, p.steps, *schedule);
        if (!scheduled.ok()) return scheduled.error();
        sigmas = std::move(scheduled).value();
    }
    std::optional<std::vector<float>> init_latent;
    if (request.init_image && !p.init_image_in_clip()) {
        if (!model.vae().format().has_encoder)
            return Error{"this model's VAE has no encoder: image-to-image needs one"};
        // A sample of the init image's latent distribution, drawn from the
        // job's generator at the first image's seed before anything else
        // (sd-cli's order; each image's noise then starts at its own seed).
        // An inpainting job keeps this sample where the mask keeps the image.
        std::unique_ptr<Rng> encode_rng = make_rng(request.rng, static_cast<uint64_t>(request.seed));
        std::vector<float> sampled;
        ValidatedRequest at = p;
        at.width = request.init_image->width;
        at.height = request.init_image->height;
        auto encoded = encode_image(model, *request.init_image, at, request.vae_tiling, encode_rng.get(), &sampled);
        if (!encoded.ok()) return encoded.error();
        if (at.width != p.width || at.height != p.height) {
            // init_latent_resize (A1111's resize_mode 3): the sample is resized,
            // as A1111 resizes its encoding (a sample too).
            const int64_t down = model.vae().format().downscale;
            sampled = resize_latent(sampled, model.latent_channels(), at.width / down, at.height / down, p.latent_w,
                                    p.latent_h, LatentResize::Bilinear);
        }
        init_latent = std::move(sampled);
        // Run only the last `strength` of the schedule.
        keep_last_share(sigmas, p.steps, request.strength);
    }

    SamplingRun run;
    if (request.mask) {
        if (!init_latent) return Error{"--mask needs an init image (-i)"};
        auto prepared =
            prepare_inpainting(model, *request.init_image, *request.mask, *init_latent, p, request.vae_tiling, run);
        if (!prepared.ok()) return prepared.error();
    }
    if (p.first_frame) {
        const image::Image* last = request.end_image ? &*request.end_image : nullptr;
        auto condition = first_frame_condition(model, *request.init_image, last, p);
        if (!condition.ok()) return condition.error();
        run.concat = std::move(condition).value();
        if (takes_image_context(model)) {
            auto rows = image_context(model, *request.init_image, last);
            if (!rows.ok()) return rows.error();
            run.image_context = std::move(rows).value();
        }
    }
    if (p.first_latent) KILN_TRY(keep_first_latent(model, *request.init_image, p, run));
    if (p.vace) {
        auto context =
            vace_context(model, request.control_frames, request.init_image ? &*request.init_image : nullptr, p);
        if (!context.ok()) return context.error();
        run.vace_context = std::move(context).value();
        run.vace_strength = request.vace_strength;
    }
    run.latent_w = p.latent_w;
    run.latent_h = p.latent_h;
    run.latent_frames = p.latent_frames;
    run.cfg_scale = p.cfg;
    run.sampler = p.sampler;
    run.sigmas = sigmas;
    run.eta = request.eta.value_or(default_eta(p.sampler));
    // The request's validation refused skip-layer guidance for a network without a skip list.
    if (request.slg.scale != 0.0f) run.slg = request.slg;
    if (request.timestep_shift > 0) {
        if (model.family().schedule.shifted_timestep) {
            run.shifted_timestep = request.timestep_shift;
        } else {
            KILN_LOG_WARN("--timestep-shift does nothing for %s: it is for NitroFusion's SDXL models",
                          model.family_label().c_str());
        }
    }
    run.flash_attention = request.flash_attention;
    run.batch_cfg = request.batch_cfg;
    run.cache = request.cache;
    run.cache_step_offset = p.steps - (static_cast<int>(sigmas.size()) - 1);
    run.schedule = schedule.get();
    run.guidance = p.guidance;
    if (request.control_image) {
        // sd-cli's control image: RGB in [0, 1] at 8x the latent's size (the
        // output's size with SD's VAE; the ControlNet's hint block
        // downsamples by 8 whatever the VAE does).
        const int64_t f = models::ControlNetConfig::kHintDownscale;
        const int hint_w = static_cast<int>(p.latent_w * f), hint_h = static_cast<int>(p.latent_h * f);
        image::Image control = *request.control_image;
        if (request.control_canny) {  // as sd-cli: the edges of the image at the size it is used at
            auto rgb = image::convert_channels(control, 3);
            if (rgb.ok()) rgb = image::resize_image(*rgb, hint_w, hint_h);
            if (!rgb.ok()) return rgb.error().in_context("--control-image: ");
            control = image::canny_edges(*rgb);
        }
        auto hint = rgb_planes(control, hint_w, hint_h, PixelRange::Unit);
        if (!hint.ok()) return hint.error().in_context("--control-image: ");
        run.control_hint = std::move(hint).value();
        run.control_strength = request.control_strength;
    } else if (model.has_control_net()) {
        KILN_LOG_WARN("--control-net without --control-image: the ControlNet is not used");
    }
    if (request.control_canny && !request.control_image) {
        KILN_LOG_WARN("--canny without --control-image: there is no image to find edges in");
    }
    // Kontext's reference images: each encoded (the latent distribution's
    // mean), as sd-cli does, at about the output's area
    // (pipeline/reference_images.h) or, without auto-resize, at its own size.
    run.increase_ref_index = request.increase_ref_index;
    for (const image::Image& given : request.ref_images) {
        ValidatedRequest at = p;
        const int stride = model.size_stride();
        image::Image ref = given;
        if (request.auto_resize_ref_images) {
            const ReferenceSize size = auto_reference_size(given.width, given.height, p.width, p.height, stride);
            ref = nearest_resized(given, size.width, size.height);
        }
        at.width = ref.width / stride * stride;
        at.height = ref.height / stride * stride;
        KILN_LOG_VERBOSE("reference image %dx%d: encoded at %dx%d", given.width, given.height, at.width, at.height);
        auto encoded = encode_image(model, ref, at, request.vae_tiling);
        if (!encoded.ok()) return encoded.error().in_context("reference image: ");
        run.refs.push_back(std::move(encoded).value());
        run.ref_sizes.push_back(
            {at.width / model.vae().format().downscale, at.height / model.vae().format().downscale});
    }
    const bool flow = schedule->flow();
    bool preview_failed = false;  // warned once per job
    // A1111's "Model hash" and "Lora hashes" (io/file_hashes.h), worked out
    // with the first image, not before: a job cancelled or failed while
    // sampling reads no file for them. A file that cannot be hashed only
    // leaves its hash out.
    std::optional<std::pair<std::string, std::string>> file_hashes;
    const auto hashes_of_files = [&]() -> const std::pair<std::string, std::string>& {
        if (!file_hashes) {
            file_hashes.emplace();
            if (!model.model_file().empty()) {
                auto hash = io::model_short_hash(model.model_file());
                if (hash.ok()) {
                    file_hashes->first = *hash;
                } else {
                    KILN_LOG_WARN("no model hash for the images' parameters: %s", hash.error().message.c_str());
                }
            }
            file_hashes->second = lora_hashes_text(model.lora_dir(), tagged->loras);
        }
        return *file_hashes;
    };
    const size_t latent_size = static_cast<size_t>(p.latent_w) * p.latent_h * p.latent_frames * out_channels(model);
    // The high-noise expert's steps of the schedule as it runs (image-to-image cuts its front).
    const int high_noise_steps = std::max(0, p.high_noise_steps - run.cache_step_offset);
    std::vector<GeneratedImage> results;
    for (int i = 0; i < request.batch_count; ++i) {
        const int64_t seed = request.seed + i;
        std::unique_ptr<Rng> rng = make_rng(request.rng, static_cast<uint64_t>(seed));
        // --sampler-rng: the sampler's noise from a stream of its own, seeded alike (sd-cli's).
        std::unique_ptr<Rng> own_sampler_rng;
        if (request.sampler_rng && *request.sampler_rng != request.rng) {
            own_sampler_rng = make_rng(*request.sampler_rng, static_cast<uint64_t>(seed));
        }
        Rng& sampler_rng = own_sampler_rng ? *own_sampler_rng : *rng;
        std::vector<float> x = rng->randn(latent_size);
        noise_to_first_sigma(x, init_latent ? &*init_latent : nullptr, sigmas.front(), flow);
        if (run.clean_first_frame) {  // TI2V: the first latent frame starts as the image's
            for (size_t k = 0; k < x.size(); ++k) {
                if (run.keep_weight[k] == 1.0f) x[k] = run.keep_latent[k];
            }
        }
        // The latent the next preview shows: the last denoiser call's
        // estimate, or its noisy input as the network saw it (sd-cli's
        // noised_input, x * c_in).
        const bool previewing = on_preview && request.preview.mode != PreviewMode::None;
        std::vector<float> shown;
        run.on_denoised = nullptr;
        if (previewing) {
            run.on_denoised = [&](const std::vector<float>& xt, float sigma, const std::vector<float>& denoised) {
                if (!request.preview.noisy) {
                    shown = denoised;
                    return;
                }
                const float c_in = get_scalings(model.prediction(), sigma).c_in;
                shown.resize(xt.size());
                for (size_t k = 0; k < xt.size(); ++k) shown[k] = xt[k] * c_in;
            };
        }
        Clock::time_point step_start;
        ProgressFn progress = [&](int step, int total) {
            times.step_s.push_back(seconds_since(step_start));
            if (on_step) on_step(i, step, total);
            if (previewing && step % request.preview.interval == 0) {
                auto preview = make_preview(model, shown, p, request, preview_failed);
                if (preview.ok()) on_preview(i, step, *preview);
            }
            step_start = Clock::now();  // the callbacks' time is no step's
        };
        // Step 0: sampling of this image starts now (front-ends time from here).
        if (on_step) on_step(i, 0, static_cast<int>(sigmas.size()) - 1);
        const Clock::time_point sampling_start = Clock::now();
        step_start = sampling_start;
        bool passes_apart = false;
        StepCacheReport cache_report;
        auto latent =
            sample_with_experts(model, run, p, high_noise_steps, std::move(x), *cond, uncond ? &*uncond : nullptr,
                                sampler_rng, progress, &passes_apart, &cache_report);
        times.cfg_passes_apart = times.cfg_passes_apart || passes_apart;
        if (!latent.ok()) return latent.error();
        // NaN or Inf in weights, embeddings or the latent scale would give a
        // flat image with no word: say which module made them.
        if (!std::all_of(latent->begin(), latent->end(), [](float v) { return std::isfinite(v); })) {
            return Error{"the " + std::string(model.diffusion().capabilities().label) +
                         " produced non-finite values (NaN or Inf): check the model's weights and the "
                         "prompt's embeddings"};
        }
        times.sampling_s += seconds_since(sampling_start);
        const Clock::time_point finish_start = Clock::now();
        // Interrupted or skipped, the image ends here: no hires pass (and,
        // interrupted, no later image of the batch), as A1111.
        const bool interrupted = model.cut_short();
        if (on_phase) on_phase(p.hires && !interrupted ? JobPhase::Hires : JobPhase::Decode, i);
        GeneratedImage g;
        if (p.video) {
            auto clip = decode_clip(model, *latent, p, request.vae_tiling, [&](int done) {
                if (on_decode) on_decode(i, done, p.frames);
            });
            if (!clip.ok()) return clip.error();
            g.frames = std::move(clip).value();
            g.image = g.frames.front();
        } else {
            auto img = p.hires && !interrupted ? hires_pass(model, request, p, *latent, run, *cond, uncond,
                                                            hires_upscaler.get(), *rng, sampler_rng, progress,
                                                            [&](int total) {
                                                                if (on_step) on_step(i, 0, total);
                                                                step_start = Clock::now();
                                                            })
                                               : decode_latent(model, *latent, p, request.vae_tiling);
            if (!img.ok()) return img.error();
            g.image = std::move(img).value();
        }
        (p.hires ? times.hires_s : times.vae_s) += seconds_since(finish_start);

        image::GenerationInfo& info = g.info;
        info.prompt = request.prompt;
        info.negative_prompt = request.negative_prompt;
        info.steps = p.steps;
        info.sampler = a1111_sampler_name(std::string(sampler_name(p.sampler)));
        info.scheduler = std::string(scheduler_name(p.scheduler));
        info.cfg_scale = p.cfg;
        info.seed = seed;
        info.width = p.width;
        info.height = p.height;
        info.model = model.name();
        if (p.video) info.extra.emplace_back("Frames", std::to_string(p.frames));
        // A1111's "Tiling: True" for both seams; one seam by its axis.
        if (request.seams.any()) {
            info.extra.emplace_back("Tiling", request.seams.x && request.seams.y ? "True"
                                              : request.seams.x                  ? "x"
                                                                                 : "y");
        }
        if (p.vace) info.extra.emplace_back("VACE strength", format_number(request.vace_strength));
        if (high_noise_steps > 0) {
            info.extra.emplace_back("High noise model", model.high_noise_expert_name());
            info.extra.emplace_back("High noise steps", std::to_string(high_noise_steps));
            info.extra.emplace_back("High noise sampler",
                                    a1111_sampler_name(std::string(sampler_name(p.high_noise_sampler))));
            info.extra.emplace_back("High noise CFG scale", format_number(p.high_noise_cfg));
        }
        if (request.file_hashes && !hashes_of_files().first.empty()) {
            info.extra.emplace_back("Model hash", hashes_of_files().first);
        }
        if (request.init_image && !p.init_image_in_clip()) {
            info.extra.emplace_back("Denoising strength", format_number(request.strength));
        }
        if (request.eta) info.extra.emplace_back("Eta", format_number(*request.eta));
        if (p.hires) add_hires_info(*request.hires, *p.hires, info);
        if (request.mask) info.extra.emplace_back("Mask", "yes");
        if (!run.control_hint.empty()) {
            info.extra.emplace_back("ControlNet", model.control_net_name());
            info.extra.emplace_back("ControlNet weight", format_number(request.control_strength));
            if (request.control_canny) info.extra.emplace_back("ControlNet preprocessor", "canny");
        }
        if (request.clip_skip > 1) info.extra.emplace_back("Clip skip", std::to_string(request.clip_skip));
        if (run.cache.enabled()) {
            info.extra.emplace_back("Cache", std::string(cache_mode_name(run.cache.mode)) + ", skipped " +
                                                 std::to_string(cache_report.skipped) + "/" +
                                                 std::to_string(cache_report.evaluations));
            times.cache.mode = cache_report.mode;
            times.cache.skipped += cache_report.skipped;
            times.cache.evaluations += cache_report.evaluations;
        }
        if (p.guidance > 0.0f) info.extra.emplace_back("Guidance", format_number(p.guidance));
        if (flow) {
            const auto* fs = static_cast<const FlowSchedule*>(schedule.get());
            info.extra.emplace_back("Shift", format_number(fs->mu()));
        }
        // After the other extras: A1111's Lora extension adds it when it
        // applies the networks, just before sampling.
        if (request.file_hashes && !hashes_of_files().second.empty()) {
            info.extra.emplace_back("Lora hashes", hashes_of_files().second);
        }
        info.extra.emplace_back("RNG", std::string(rng_kind_name(request.rng)));
        info.extra.emplace_back("Version", std::string("kiln ") + KILN_VERSION);
        results.push_back(std::move(g));
        model.take_skip();                       // a skip was this image's alone
        if (model.interrupt_requested()) break;  // during this image's hires pass too
    }
    return results;
}

}  // namespace kiln::pipeline
