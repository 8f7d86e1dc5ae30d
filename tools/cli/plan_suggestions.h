// When `kiln plan` finds that a job does not fit, or fits only by reading
// weights from disk at every step, what would change that. Each candidate (a
// quantization, VAE tiling, a module on the CPU) is planned again as its own
// command line would be, and only those whose plan fits are suggested.
#pragma once

#include <functional>
#include <string>

#include "args.h"

namespace kiln::cli {

// kiln_plan's verdict (1 fits, 2 fits by streaming from disk, 0 does not) for
// the job planned with other options; a negative value when it cannot say
// (the plan failed).
using PlanVerdict = std::function<int(const Options&)>;

// The "suggestions:" block for a plan whose verdict was `verdict` (empty when
// it fits): every candidate that fits, with the flag to add, or a line
// saying that none of those tried does. `uses_gpu`: some module computes
// on a device other than the CPU (the CPU-placement candidates apply).
std::string plan_suggestions(const Options& options, int verdict, bool uses_gpu, const PlanVerdict& plan);

}  // namespace kiln::cli
