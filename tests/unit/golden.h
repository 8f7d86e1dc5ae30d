// Golden fixtures written by training/make_model_fixtures.py (PyTorch
// reference modules): loading them and comparing kiln's numbers with them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "image/image.h"
#include "io/model_file.h"
#include "io/name_map.h"
#include "pipeline/model.h"
#include "runtime/compute.h"
#include "test_files.h"

namespace kiln::test {

// tests/golden/<relative>
std::string golden_path(const std::string& relative);

// The `kiln` command line with the tiny golden SD1 model and the tokenizer
// fixture, then `args`. One thread: ctest runs tests in parallel, and ggml's
// spinning thread pool slows down badly when its threads outnumber the free
// cores.
std::string kiln_with_sd1_tiny(const std::string& args);

// A fixture tensor's values as float (F32 or I32 in the file) and its shape
// (PyTorch order). Fails the current test if missing.
struct FixtureTensor {
    std::vector<float> values;
    std::vector<int64_t> shape;
};
FixtureTensor fixture_tensor(const io::ModelFile& file, const std::string& name);

// A tensor of `file` (F16, BF16, F32 or I64) as a build_safetensors entry named `name`.
SafetensorsEntry copy_entry(const io::ModelFile& file, const io::TensorInfo& t, std::string name);
// The safetensors file at `path` (F16, BF16, F32 or I64 tensors) with the
// tensor `name` in `shape`, its data cut or padded with zeros to fit, and
// `metadata`: a file another release's widths would give, for load errors.
std::vector<uint8_t> with_tensor_shape(const std::string& path, const std::string& name,
                                       const std::vector<int64_t>& shape,
                                       const std::vector<std::pair<std::string, std::string>>& metadata = {});

// An ldm-named entry in diffusers' names: its component folder in *folder and
// the tensors it becomes (q/k/v split, transposes, VAE attention reshaped),
// by io::NameMap `map`; none for names diffusers has no counterpart of.
std::vector<SafetensorsEntry> to_diffusers(const SafetensorsEntry& e, const io::NameMap& map, std::string* folder);
// Wan 2.1's VAE file at `path` (the original names, Qwen-Image's too) in
// diffusers' AutoencoderKLWan / AutoencoderKLQwenImage names, by
// io/name_map.h's table; each tensor must have one.
std::vector<SafetensorsEntry> wan_vae_in_diffusers_names(const std::string& path);

// A PyTorch shape as ggml's ne (innermost first).
std::vector<int64_t> ggml_ne(const std::vector<int64_t>& torch_shape);

// A one-thread CPU compute for golden runs (ctest runs tests in parallel);
// throws if it cannot be made.
std::unique_ptr<runtime::Compute> golden_cpu();

// max |actual - expected| / max(max |expected|, 1e-6): the error relative to
// the reference's scale.
double relative_error(const std::vector<float>& actual, const std::vector<float>& expected);
// A golden job's model options: F32 weights (the references compute with
// the stored weights widened) and one thread (one summation order).
pipeline::ModelOptions golden_model_options();
// A model given as one path (-m: a file or a diffusers folder).
pipeline::ModelPaths model_at(const std::string& path);
// The loaded model's module `name` (a ModuleSpec name), or null.
const pipeline::Module* module_named(const pipeline::Model& model, const std::string& name);
// The largest 8-bit difference between kiln's image and the reference image
// `key` of a golden job ([1, 3, H, W] in [-1, 1], rounded as the PNG is;
// or frame `frame` of a clip's [1, 3, F, H, W]); 255 when the sizes differ.
int difference_from_reference(const image::Image& img, const io::ModelFile& io, const std::string& key = "image",
                              int frame = 0);
// A golden job's input image: the tensor `name`'s [1, C, H, W] 8-bit values.
image::Image fixture_image(const io::ModelFile& io, const std::string& name);

// Text fixtures of tests/golden/sampling: "<name> <count> <values...>" per
// line, '#' comments (training/make_sampling_fixtures.py).
using Records = std::map<std::string, std::vector<double>>;
Records load_sampling_records(const std::string& file);
// The toy denoiser of training/reference/sampling.py the sampler fixtures use:
// D(x, sigma) = x * 0.25 / (0.25 + sigma^2) + 0.1 * tanh(x), in double.
std::vector<float> toy_denoiser(const std::vector<float>& x, float sigma);
// The record called `name`; fails the current test (and returns an empty
// vector) if there is none.
const std::vector<double>& record(const Records& records, const std::string& name);

}  // namespace kiln::test
