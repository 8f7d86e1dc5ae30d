// Limits of a request (pipeline/request.h validates against them) and of a
// model file's defaults (pipeline/model.cpp reads "kiln.default.*" within
// them).
#pragma once

#include <cstddef>

namespace kiln::pipeline {

constexpr int kMaxSteps = 10000;
constexpr float kMaxCfgScale = 100.0f;
constexpr int kMaxBatchCount = 1000;
constexpr float kMaxFlowShift = 20.0f;
constexpr float kMaxSigma = 1000.0f;  // --sigmas (SD's largest is 14.6, EDM models' 80)
constexpr int kMaxT5MaskPad = 512;    // --chroma-t5-mask-pad: Chroma's T5 sequence
constexpr int kMaxSkipLayer = 1000;   // --skip-layers (flux1-dev has 57 blocks)
constexpr size_t kMaxReferenceImages = 8;
constexpr float kMaxHiresScale = 8.0f;
constexpr float kMaxControlStrength = 10.0f;
constexpr int kMaxPreviewInterval = kMaxSteps;
// --video-frames: Wan's clips are 81 frames; 1025 is 257 latent frames.
constexpr int kMaxVideoFrames = 1025;
constexpr float kMaxVaceStrength = 10.0f;  // --vace-strength (sd-server's vace_strength range)

}  // namespace kiln::pipeline
