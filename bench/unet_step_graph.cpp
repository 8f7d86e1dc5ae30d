#include "unet_step_graph.h"

#include <vector>

namespace kiln::bench {

UnetStepGraph build_unet_step_graph(const pipeline::StableDiffusionModel& model, int width, int height, bool cfg,
                                    bool flash_attention) {
    const int64_t batch = cfg ? 2 : 1;
    const auto& uc = model.unet().config();
    const int64_t tokens = model.text_encoder().config().context;
    const int64_t lw = width / model.vae().config().downscale();
    const int64_t lh = height / model.vae().config().downscale();
    UnetStepGraph out;
    out.session = std::make_unique<runtime::GraphSession>();
    runtime::GraphSession& session = *out.session;
    const std::vector<float> x(static_cast<size_t>(lw * lh * uc.in_channels * batch), 0.0f);
    const std::vector<float> t(static_cast<size_t>(batch), 0.0f);
    const std::vector<float> c(static_cast<size_t>(uc.context_dim * tokens * batch), 0.0f);
    ggml_tensor* xin = session.input(GGML_TYPE_F32, {lw, lh, uc.in_channels, batch}, x.data(), "x");
    ggml_tensor* tin = session.input(GGML_TYPE_F32, {batch}, t.data(), "timesteps");
    ggml_tensor* cin = session.input(GGML_TYPE_F32, {uc.context_dim, tokens, batch}, c.data(), "context");
    ggml_tensor* eps = model.unet().build(session.ctx(), xin, tin, cin, flash_attention);
    out.graph = session.graph(eps);
    return out;
}

}  // namespace kiln::bench
