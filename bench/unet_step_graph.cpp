#include "unet_step_graph.h"

#include "pipeline/conditioner.h"
#include "pipeline/graphs.h"

namespace kiln::bench {

UnetStepGraph build_unet_step_graph(const pipeline::Model& model, int width, int height, bool cfg, bool flash_attention,
                                    const std::string* prompt, int64_t latent_frames) {
    const int64_t lw = width / model.vae().format().downscale;
    const int64_t lh = height / model.vae().format().downscale;
    models::DiffusionShape shape{lw, lh,   cfg ? 2 : 1, pipeline::context_length(model, prompt), flash_attention,
                                 {}, false};
    shape.frames = latent_frames;
    auto g = pipeline::build_diffusion_graph(model, shape);
    UnetStepGraph out;
    if (!g.ok()) return out;
    out.graph = g->session->graph(g->out);
    out.session = std::move(g->session);
    return out;
}

}  // namespace kiln::bench
