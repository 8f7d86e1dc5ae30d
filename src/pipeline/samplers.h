// Samplers (`--sampling-method`): integrate from pure noise at sigmas[0] down
// to sigmas.back() = 0, calling the denoiser D(x, sigma) (the x0 estimate,
// k-diffusion's convention) once or twice per step.
//
//   euler          Euler on dx/dsigma = (x - D) / sigma        (k-diffusion sample_euler, no churn)
//   euler_a        Euler to sigma_down, then noise * sigma_up    (sample_euler_ancestral)
//   heun           Heun's 2nd-order method, Euler on the last step (sample_heun, no churn)
//   dpm2           DPM-Solver-2 midpoint in log sigma             (sample_dpm_2, no churn)
//   dpm++2s_a      DPM-Solver++(2S) + ancestral noise             (sample_dpmpp_2s_ancestral)
//   dpm++2m        DPM-Solver++(2M)                               (sample_dpmpp_2m)
//   dpm++2mv2      2M with the step-size-symmetric correction of
//                  stable-diffusion-webui discussion #8457 (sd.cpp's dpm++2mv2)
//   ipndm          improved PNDM, 4th-order Adams-Bashforth on d  (Zhang & Chen 2023; zju-pi diff-solvers, sd.cpp)
//   lcm            x = D, then fresh noise at the next sigma      (ComfyUI sample_lcm, sd.cpp)
//   ddim_trailing  DDIM (Song et al. 2020) on the "trailing" timesteps of Lin et al. 2023 (diffusers
//                  DDIMScheduler, timestep_spacing="trailing", set_alpha_to_one=False)
//   tcd            Trajectory Consistency Distillation's strategic stochastic sampling (Zheng et al. 2024,
//                  Algorithm 4; diffusers TCDScheduler, 50 original steps)
//
// On a flow model (a FlowSchedule: x = (1 - sigma) x0 + sigma noise) euler,
// heun, dpm2, dpm++2m, dpm++2mv2 and ipndm run unchanged (their ODE in sigma
// is the flow's); euler_a is ComfyUI's sample_euler_ancestral_RF and lcm
// mixes its noise in as the flow does; dpm++2s_a, ddim_trailing and tcd are
// not defined for flow models and are an invalid request.
//
// Each follows the reference named beside it; stable-diffusion.cpp's
// sample_k_diffusion implements the same methods. Where the two differ, kiln
// follows the reference: dpm++2s_a evaluates the midpoint at sigma(s) as
// k-diffusion does (sd.cpp passes sigmas[i + 1]), and ddim_trailing rounds
// timesteps half-to-even like numpy (sd.cpp's roundf differs when T / steps
// ends in .5, e.g. 16 steps).
//
// ddim_trailing and tcd take only the step count from `sigmas` (their
// timesteps are fixed by the method) and work in the DDPM's variance-preserving
// space: the input x (noise * sigmas[0]) is divided by the sigma of their first
// timestep, the denoiser is called with x_vp * sqrt(1 + sigma_t^2) at
// sigma_t = sqrt((1 - a_t) / a_t), and the result is the DDPM sample at
// t = 0, as in diffusers and sd.cpp.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/denoiser.h"
#include "pipeline/rng.h"
#include "util/result.h"

namespace kiln::pipeline {

enum class SamplerKind { Euler, EulerA, Heun, Dpm2, DpmPp2SA, DpmPp2M, DpmPp2Mv2, Ipndm, Lcm, DdimTrailing, Tcd };

// The canonical (sd.cpp) name: "euler", "euler_a", ..., "dpm++2mv2", "ddim_trailing", "tcd".
std::string_view sampler_name(SamplerKind kind);
// The canonical names, comma-separated, for help and error texts.
std::string sampler_names();
// Parses a --sampling-method value (case-insensitive): sd.cpp's names, plus
// k-diffusion/ComfyUI spellings (euler_ancestral, dpm_2, dpmpp_2m,
// dpmpp_2s_ancestral, dpmpp_2m_v2, ddim). The error lists the valid names.
Result<SamplerKind> parse_sampler(std::string_view name);

// The samplers defined for flow models, comma-separated.
std::string flow_sampler_names();

// The eta that reproduces stable-diffusion.cpp's default behaviour: 1 for the
// ancestral samplers (euler_a, dpm++2s_a: full ancestral noise), 0 for
// ddim_trailing and tcd (sd.cpp's --eta default), 0 for the rest (unused).
float default_eta(SamplerKind kind);

// D(x, sigma): the denoised (x0) estimate for x at noise level sigma, same
// size as x. `step` is the 0-based sampler step the call belongs to (a
// second-order step calls it twice with the same step). An error stops the
// sampler and is passed up unchanged (e.g. a cancelled job).
using DenoiseFn = std::function<Result<std::vector<float>>(const std::vector<float>& x, float sigma, int step)>;
// Called after each completed step with (steps done, total steps).
using ProgressFn = std::function<void(int step, int total)>;

// Runs `kind` over the schedule `sigmas` (n + 1 values, descending, the last 0;
// every one but the last > 0) starting from x = noise * sigmas[0], and returns
// the final x. Noise for stochastic steps comes from `rng`, rng.randn(x.size())
// per draw, drawn when the reference draws it (euler_a and dpm++2s_a: every
// step whose next sigma is > 0, whatever eta; lcm: same; ddim_trailing: every
// step when eta > 0; tcd: every step but the last when eta > 0).
// eta: euler_a and dpm++2s_a scale sigma_up by it (k-diffusion get_ancestral_step);
// ddim_trailing's sigma_t(eta); tcd's gamma. Other samplers ignore it.
// `schedule` says whether the model is a flow model (see above) and gives
// ddim_trailing and tcd their alphas_cumprod (they need a DiscreteSchedule).
// Errors: fewer than 2 sigmas, a non-finite or misplaced zero sigma, a
// denoiser result of the wrong size, or the denoiser's own error.
Result<std::vector<float>> sample(SamplerKind kind, const DenoiseFn& denoise, std::vector<float> x,
                                  const std::vector<float>& sigmas, Rng& rng, float eta = 1.0f,
                                  const ProgressFn& progress = nullptr,
                                  const NoiseSchedule& schedule = DiscreteSchedule::stable_diffusion());

}  // namespace kiln::pipeline
