// Random number streams for initial latents and ancestral noise (`--rng`).
//
// Both generators reproduce a PyTorch generator bit for bit, so that a seed
// gives the same image as in the Python tools people compare against:
//   cpu   torch.randn(n, generator=torch.Generator().manual_seed(seed)), float32
//         (ComfyUI's noise); mt19937 + ATen's Box-Muller paths.
//   cuda  torch.randn(n, device="cuda") as stable-diffusion-webui emulates it on
//         the CPU (modules/rng_philox.py): Philox 4x32-10 + one Box-Muller value
//         per counter.
//   std_default  sd-cli's STDDefaultRNG (--rng std_default): C++'s
//         std::default_random_engine and std::normal_distribution<float> as
//         GCC's libstdc++ computes them, so a seed gives sd-cli's image on
//         Linux on every platform kiln builds for.
// A stream keeps its state between randn() calls exactly as the torch
// generator does (mt19937 position and the cached second Box-Muller value for
// cpu; the per-call offset for cuda); std_default keeps its engine's state
// but, as sd-cli makes a new distribution for every call, not the polar
// method's second value.
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

enum class RngKind { Cpu, Cuda, StdDefault };

// "cpu", "cuda", "std_default".
std::string_view rng_kind_name(RngKind kind);
// "cpu, cuda, std_default": the valid --rng values, for help and error texts.
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

// sd-cli's STDDefaultRNG, written out from libstdc++ (GCC 12's <random>):
// - std::default_random_engine is minstd_rand0, x = 16807 x mod (2^31 - 1),
//   seeded with the seed's low 32 bits (x = 1 when that is 0 mod 2^31 - 1);
// - generate_canonical<float, 24> takes one draw: float(x - 1) / 2^31 in
//   float (its divisor 2^31 - 2 rounds to 2^31), 1 becoming nextafter(1, 0);
// - normal_distribution<float> is Marsaglia's polar method: x and y =
//   2u - 1 (in double, then float) until 0 < x^2 + y^2 <= 1 (float), then
//   y * sqrt(-2 log(r2) / r2) and, from the next call of the same
//   distribution, x times the same. sd-cli makes a new distribution for
//   each randn() call, so a call of odd length drops its last x.
// Written out rather than taken from <random>, whose engines and
// distributions differ between standard libraries (libc++, MSVC).
class StdDefaultRng final : public Rng {
  public:
    explicit StdDefaultRng(uint64_t seed);
    std::vector<float> randn(size_t n) override;

  private:
    float canonical();

    uint64_t state_;
};

}  // namespace kiln::pipeline
