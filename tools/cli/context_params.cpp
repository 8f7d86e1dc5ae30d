#include "context_params.h"

namespace kiln::cli {

kiln_context_params context_params_of(const Options& options) {
    auto optional = [](const std::string& s) { return s.empty() ? nullptr : s.c_str(); };
    kiln_context_params cp;
    kiln_context_params_init(&cp);
    cp.diffusion_model_path = optional(options.diffusion_model);
    cp.high_noise_diffusion_model_path = optional(options.high_noise_diffusion_model);
    cp.vae_path = optional(options.vae);
    cp.clip_l_path = optional(options.clip_l);
    cp.clip_g_path = optional(options.clip_g);
    cp.t5xxl_path = optional(options.t5xxl);
    cp.llm_path = optional(options.llm);
    cp.llm_vision_path = optional(options.llm_vision);
    cp.clip_vision_path = optional(options.clip_vision);
    cp.qwen_image_zero_cond_t = options.qwen_image_zero_cond_t ? 1 : 0;
    cp.tokenizer_path = optional(options.tokenizer);
    cp.embeddings_dir = optional(options.embeddings_dir);
    cp.control_net_path = optional(options.control_net);
    cp.lora_model_dir = optional(options.lora_model_dir);
    cp.lora_apply_mode = optional(options.lora_apply_mode);
    cp.taesd_path = optional(options.taesd);
    cp.taesd_preview_only = options.taesd_preview_only ? 1 : 0;
    cp.weight_type = optional(options.weight_type);
    cp.tensor_type_rules = optional(options.tensor_type_rules);
    cp.prediction = optional(options.prediction);
    cp.n_threads = options.threads;
    cp.rpc_servers = optional(options.rpc_servers);
    cp.backend = optional(options.backend);
    cp.params_backend = optional(options.params_backend);
    cp.split_mode = optional(options.split_mode);
    cp.offload_to_cpu = options.offload_to_cpu ? 1 : 0;
    cp.modules_on_cpu = optional(options.modules_on_cpu);
    cp.disable_auto_fit = options.auto_fit ? 0 : 1;
    cp.max_vram = optional(options.max_vram);
    cp.disable_prefetch = options.disable_prefetch ? 1 : 0;
    cp.disable_segmented_compute = options.disable_segmented_compute ? 1 : 0;
    cp.eager_load = options.eager_load ? 1 : 0;
    return cp;
}

}  // namespace kiln::cli
