// What a family knows of its LLM that the file may not say: rope theta and
// RMSNorm epsilon, used where the file's metadata has neither (HF safetensors
// carry no config; GGUFs do). 0: the architecture's defaults.
#pragma once

namespace kiln::models {

struct LlmFileDefaults {
    float rope_theta = 0.0f;
    float norm_eps = 0.0f;
};

}  // namespace kiln::models
