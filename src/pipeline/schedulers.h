// Sigma schedules (`--scheduler`): which noise levels the sampler visits.
//
// Every schedule turns n sampling steps into n + 1 descending sigmas, the
// last one 0, from the model's sigma table (a DDPM's, or a flow model's
// shifted one: denoiser.h):
//   discrete     k-diffusion DiscreteSchedule.get_sigmas: t evenly spaced from
//                T-1 down to 0, sigma = t_to_sigma(t) (sd.cpp's default)
//   karras       Karras et al. 2022, eq. (5), rho = 7, between the table's
//                sigma_min and sigma_max (k-diffusion get_sigmas_karras)
//   exponential  evenly spaced in log sigma (k-diffusion get_sigmas_exponential)
//   ays          Align Your Steps (Sabour et al. 2024), NVIDIA's 10-step SD 1.5
//                levels stretched to n steps by log-linear interpolation
//                (the project's howto loglinear_interp, as ComfyUI and sd.cpp)
//   sgm_uniform  t evenly spaced from T-1 to 0 over n + 1 points, the last
//                dropped (ComfyUI normal_scheduler(sgm=True), sd.cpp)
//   simple       every (T/n)-th table entry from the top (ComfyUI
//                simple_scheduler, sd.cpp)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pipeline/denoiser.h"
#include "util/result.h"

namespace kiln::pipeline {

enum class SchedulerKind { Discrete, Karras, Exponential, Ays, SgmUniform, Simple };

std::string_view scheduler_name(SchedulerKind kind);
// "discrete, karras, ...": the valid --scheduler values.
std::string scheduler_names();
// Parses a --scheduler value (case-insensitive); the error lists the valid values.
Result<SchedulerKind> parse_scheduler(std::string_view name);

// n + 1 sigmas for `steps` = n >= 1 sampling steps, descending, ending in 0.
// Errors: steps < 1.
// Errors: steps < 1; ays on a flow schedule (its levels are SD's).
Result<std::vector<float>> get_sigmas(SchedulerKind kind, int steps, const NoiseSchedule& schedule);

}  // namespace kiln::pipeline
