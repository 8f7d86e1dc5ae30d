// Which of a loaded model's weights an adapter file's layer name means, for
// every naming convention adapter files use:
//   kohya              lora_unet_<ldm or diffusers path>, lora_te_/lora_te1_/lora_te2_<HF CLIP path>,
//                      lora_unet_<BFL path> (Flux), lora_transformer_<diffusers path> (Flux, Z-Image)
//   diffusers / PEFT   unet.<path>, text_encoder.<path>, text_encoder_2.<path>, transformer.<path>,
//                      base_model.model.<path>
//   the model's own    <prefix><path> as in the checkpoint, ComfyUI's diffusion_model.<path>
// with '.' and '_' treated alike (kohya writes paths with '_'). A name in a
// split convention (diffusers' to_q, to_k, to_v, OpenCLIP's q/k/v of a
// fused in_proj) means a range of rows of the fused weight; the other way
// round, a fused layer's name (BFL's qkv, linear1) on a network whose file
// splits it means each split weight, with its rows of the layer's change.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "pipeline/model.h"

namespace kiln::pipeline {

struct LoraTarget {
    Module* module = nullptr;
    ggml_tensor* weight = nullptr;  // the module's declared weight
    std::string name;               // its full name, for messages
    int64_t first_row = 0;          // the rows of it the layer changes
    int64_t rows = 0;
    int64_t columns = 0;  // per row: in, or in * kh * kw for a convolution
    ggml_tensor* bias = nullptr;  // the layer's declared bias (the same rows), if it has one
    // The adapter layer's rows that change this target: [layer_first_row,
    // layer_first_row + rows) of a layer of layer_rows rows (0: the layer's
    // rows are the target's), after its two halves are swapped when
    // swap_halves (pipeline/lora_file.h, adapter_rows).
    int64_t layer_first_row = 0;
    int64_t layer_rows = 0;
    bool swap_halves = false;
};

class LoraTargets {
  public:
    // Indexes every matrix and convolution weight of every module but Wan
    // 2.2 A14B's high-noise expert, or (high_noise_expert) of the expert alone.
    LoraTargets(Model& model, bool high_noise_expert);
    // The weights a file's layer name means: one, each part a file splits
    // it into, or none.
    std::vector<const LoraTarget*> find(const std::string& layer_key) const;
    size_t size() const { return targets_.size(); }

  private:
    void add(const std::string& key, const std::vector<size_t>& targets);
    std::vector<LoraTarget> targets_;
    std::unordered_map<std::string, std::vector<size_t>> by_key_;  // normalized key -> targets; empty: ambiguous
};

}  // namespace kiln::pipeline
