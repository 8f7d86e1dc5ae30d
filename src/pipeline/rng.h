// Random number streams for initial latents and ancestral noise (`--rng`).
//
// Both generators reproduce a PyTorch generator bit for bit, so that a seed
// gives the same image as in the Python tools people compare against:
//   cpu   torch.randn(n, generator=torch.Generator().manual_seed(seed)), float32
//         (ComfyUI's noise); mt19937 + ATen's Box-Muller paths.
//   cuda  torch.randn(n, device="cuda") as stable-diffusion-webui emulates it on
//         the CPU (modules/rng_philox.py): Philox 4x32-10 + one Box-Muller value
//         per counter.
// A stream keeps its state between randn() calls exactly as the torch
// generator does (mt19937 position and the cached second Box-Muller value for
// cpu; the per-call offset for cuda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace kiln::pipeline {

enum class RngKind { Cpu, Cuda };

// "cpu", "cuda".
std::string_view rng_kind_name(RngKind kind);
// "cpu, cuda": the valid --rng values, for help and error texts.
std::string rng_kind_names();
// Parses an --rng (or --sampler-rng) value (case-insensitive). The error
// names the flag and lists the valid values.
Result<RngKind> parse_rng_kind(std::string_view name, std::string_view flag = "--rng");

class Rng {
  public:
    virtual ~Rng() = default;
    // The next n standard-normal float32 values of this stream.
    virtual std::vector<float> randn(size_t n) = 0;
};

std::unique_ptr<Rng> make_rng(RngKind kind, uint64_t seed);

// torch's CPU generator (CPUGeneratorImpl) and normal_ for float32:
// - the engine is mt19937 seeded with the low 32 bits of the seed;
// - n >= 16 (ATen normal_fill): n uniforms u = (bits & 0xFFFFFF) / 2^24, then
//   every group of 16 is turned into normals pairwise (j, j + 8) by
//   Box-Muller; when n % 16 != 0 the last 16 values are drawn again and
//   transformed once more;
// - n < 16 (at::normal_distribution<double>): one normal per element from two
//   53-bit uniforms, the sine half cached in the generator for the next
//   element (also across calls).
// Math picks which build of normal_fill_16 to reproduce: torch on x86-64
// with AVX2 (every current desktop CPU; the default dispatch) uses the
// vectorised normal_fill_16_AVX2 whose log/sincos are avx_mathfun's Cephes
// polynomials; torch without AVX2 (ATEN_CPU_CAPABILITY=default, other
// architectures) uses libm logf/cosf/sinf.
class TorchCpuRng final : public Rng {
  public:
    enum class Math { Avx2, Portable };

    explicit TorchCpuRng(uint64_t seed, Math math = Math::Avx2);
    std::vector<float> randn(size_t n) override;

  private:
    float uniform_float();
    double uniform_double();
    double normal_double();
    void normal_fill_16(float* data) const;

    std::mt19937 engine_;
    Math math_;
    bool has_cached_normal_ = false;
    double cached_normal_ = 0.0;
};

// stable-diffusion-webui's Philox emulation of torch's CUDA randn: value i of
// a call is Box-Muller(x, y) of philox4x32_10(counter = {offset, 0, i, 0},
// key = {seed_lo, seed_hi}), keeping only the sine half; offset grows by one
// per call.
class PhiloxRng final : public Rng {
  public:
    explicit PhiloxRng(uint64_t seed) : seed_(seed) {}
    std::vector<float> randn(size_t n) override;

  private:
    uint64_t seed_;
    uint32_t offset_ = 0;
};

}  // namespace kiln::pipeline
