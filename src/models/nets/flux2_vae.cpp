#include "models/nets/flux2_vae.h"

#include "nn/patches.h"

namespace kiln::models {
namespace {

constexpr float kBatchNormEps = 1e-4f;  // BFL's BatchNorm2d(eps=1e-4)
constexpr int kPatch = 2;

// ne [W, H, C, B] -> its 2x2 patches as channels, ne [W/2, H/2, 4C, B]
// (channel c * 4 + pi * 2 + pj, BFL's "(c pi pj)").
ggml_tensor* to_patch_channels(ggml_context* ctx, ggml_tensor* x) {
    const int64_t w = x->ne[0] / kPatch, h = x->ne[1] / kPatch, B = x->ne[3];
    ggml_tensor* tokens = nn::patchify(ctx, x, kPatch, nn::PatchFeatures::ChannelSlowest);  // [4C, w h, B]
    tokens = ggml_reshape_4d(ctx, tokens, tokens->ne[0], w, h, B);
    return ggml_cont(ctx, ggml_permute(ctx, tokens, 2, 0, 1, 3));
}

// The inverse: ne [w, h, 4C, B] -> [2w, 2h, C, B].
ggml_tensor* from_patch_channels(ggml_context* ctx, ggml_tensor* z) {
    const int64_t w = z->ne[0], h = z->ne[1], B = z->ne[3];
    ggml_tensor* tokens = ggml_cont(ctx, ggml_permute(ctx, z, 1, 2, 0, 3));  // [4C, w, h, B]
    tokens = ggml_reshape_3d(ctx, tokens, tokens->ne[0], w * h, B);
    return nn::unpatchify(ctx, tokens, w, h, kPatch, nn::PatchFeatures::ChannelSlowest);
}

// Channels [first, first + count) of ne [W, H, C, B], contiguous.
ggml_tensor* channels(ggml_context* ctx, ggml_tensor* x, int64_t first, int64_t count) {
    return ggml_cont(
        ctx, ggml_view_4d(ctx, x, x->ne[0], x->ne[1], count, x->ne[3], x->nb[1], x->nb[2], x->nb[3], first * x->nb[2]));
}

// A per-channel vector ne [C] as ne [1, 1, C, 1], to broadcast over a latent.
ggml_tensor* per_channel(ggml_context* ctx, ggml_tensor* v) { return ggml_reshape_4d(ctx, v, 1, 1, v->ne[0], 1); }

}  // namespace

Flux2Vae::Flux2Vae() = default;
Flux2Vae::~Flux2Vae() = default;

Result<std::unique_ptr<Flux2Vae>> Flux2Vae::create(io::WeightDeclarer& weights) {
    const std::string where = "FLUX.2 autoencoder under '" + weights.prefix() + "'";
    const io::TensorInfo* mean = weights.info("bn.running_mean");
    if (!mean || mean->shape.size() != 1) {
        return Error::bad_file(where +
                               ": no bn.running_mean, the latent statistics FLUX.2's autoencoder carries "
                               "(a FLUX.1 or SD autoencoder? pass FLUX.2's ae)");
    }
    auto kl = Vae::create(weights);
    if (!kl.ok()) return kl.error().as(ErrorKind::BadFile).in_context(where + ": ");
    const VaeConfig& c = (*kl)->config();
    const int64_t channels = c.latent_channels * kPatch * kPatch;
    if (mean->shape[0] != channels) {
        return Error::bad_file(where + ": bn.running_mean has " + std::to_string(mean->shape[0]) + " values, the " +
                               std::to_string(c.latent_channels) + "-channel latent in 2x2 patches " +
                               std::to_string(channels));
    }
    std::unique_ptr<Flux2Vae> vae(new Flux2Vae());
    vae->kl_ = std::move(kl).value();
    vae->running_mean_ = weights.require_f32("bn.running_mean", {channels});
    vae->running_var_ = weights.require_f32("bn.running_var", {channels});
    vae->format_ = {c.image_channels, channels, c.downscale() * kPatch, c.has_encoder};
    return vae;
}

ggml_tensor* Flux2Vae::bn_std(ggml_context* ctx) const {
    return per_channel(ctx, ggml_sqrt(ctx, ggml_scale_bias(ctx, running_var_, 1.0f, kBatchNormEps)));
}

ggml_tensor* Flux2Vae::normalize(ggml_context* ctx, ggml_tensor* p) const {
    return ggml_div(ctx, ggml_sub(ctx, p, per_channel(ctx, running_mean_)), bn_std(ctx));
}

ggml_tensor* Flux2Vae::denormalize(ggml_context* ctx, ggml_tensor* z) const {
    return ggml_add(ctx, ggml_mul(ctx, z, bn_std(ctx)), per_channel(ctx, running_mean_));
}

ggml_tensor* Flux2Vae::decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const {
    return kl_->build_decoder(ctx, from_patch_channels(ctx, denormalize(ctx, latent)), target);
}

ggml_tensor* Flux2Vae::encode(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target,
                              LatentEncoding encoding) const {
    ggml_tensor* moments = kl_->build_encoder_moments(ctx, image, target);
    const int64_t zc = kl_->config().latent_channels;
    ggml_tensor* mean = normalize(ctx, to_patch_channels(ctx, channels(ctx, moments, 0, zc)));
    if (encoding == LatentEncoding::Mean) return mean;
    // A Gaussian through (p - m) / s: its log variance less log s^2.
    ggml_tensor* log_var = to_patch_channels(ctx, channels(ctx, moments, zc, zc));
    ggml_tensor* log_s2 = per_channel(ctx, ggml_log(ctx, ggml_scale_bias(ctx, running_var_, 1.0f, kBatchNormEps)));
    return ggml_concat(ctx, mean, ggml_sub(ctx, log_var, log_s2), 2);
}

}  // namespace kiln::models
