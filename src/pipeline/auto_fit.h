// Auto-fit's second step (docs/architecture.md, "The memory system"), run after a model is
// loaded: placement's guess (pipeline/placement.h) put every module's
// weights on the GPU with the largest budget where they fit by their size;
// this checks the guess against the measured plan of a job (the default
// size, or ModelOptions::job_width/job_height/job_hires) and keeps weights
// in RAM instead, VAE first and the diffusion network last, until the job
// fits. It runs apart from the loader so that loading a model never
// validates requests or forecasts jobs.
#pragma once

#include "pipeline/model.h"
#include "util/result.h"

namespace kiln::pipeline {

// Does nothing unless model.auto_fit() and a GPU computes; logs the final
// placement either way (info when auto-fit chose it, verbose otherwise).
Status auto_fit(Model& model, const ModelOptions& options);

// Model::load, then auto_fit(), then with --eager-load every module's
// weights: what a front-end calls to get a model ready for jobs.
Result<std::unique_ptr<Model>> load_model(const ModelPaths& paths, const ModelOptions& options);

}  // namespace kiln::pipeline
