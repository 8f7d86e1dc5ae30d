#include "pipeline/rng.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace kiln::pipeline {
namespace {

struct RngName {
    RngKind kind;
    std::string_view name;
};

constexpr RngName kRngNames[] = {
    {RngKind::Cpu, "cpu"},
    {RngKind::Cuda, "cuda"},
    {RngKind::StdDefault, "std_default"},
};

std::string lower(std::string_view text) {
    std::string out(text);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
}

uint32_t float_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

float bits_float(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

// ---- avx_mathfun.h (ATen/native/cpu), one lane at a time ----------------------------------------------------------
//
// torch's normal_fill_16_AVX2 takes its log and sincos from avx_mathfun.h (Julien Pommier's sse_mathfun ported to
// AVX by G. Garberoglio, itself a rewrite of the Cephes logf/sinf/cosf). Reproducing the values bit for bit needs the
// same operations in the same order, including where GCC (building torch with -mavx2 -mfma and the default
// -ffp-contract=fast) fused a multiply into the following add: those are the std::fma calls below. Every
// multiply-add that stays unfused in torch is written so that no compiler can contract it (the product is a
// function argument, or there is no add). Checked against torch 1.13 on 65536 values per seed set.

float cephes_log(float x) {
    constexpr float kMinNormPos = 1.17549435e-38f;  // 0x00800000
    const float kSqrtHalf = static_cast<float>(0.707106781186547524);
    const float kP[9] = {
        static_cast<float>(7.0376836292E-2), static_cast<float>(-1.1514610310E-1),
        static_cast<float>(1.1676998740E-1), static_cast<float>(-1.2420140846E-1),
        static_cast<float>(1.4249322787E-1), static_cast<float>(-1.6668057665E-1),
        static_cast<float>(2.0000714765E-1), static_cast<float>(-2.4999993993E-1),
        static_cast<float>(3.3333331174E-1),
    };
    const float kQ1 = static_cast<float>(-2.12194440e-4);
    const float kQ2 = static_cast<float>(0.693359375);

    // Callers pass u in (0, 1]; torch's invalid-argument mask (x <= 0 -> NaN) never applies.
    x = std::max(x, kMinNormPos);
    const uint32_t bits = float_bits(x);
    float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 0x7f);
    x = bits_float((bits & ~0x7f800000u) | float_bits(0.5f));  // mantissa in [0.5, 1)
    e = e + 1.0f;
    const bool below = x < kSqrtHalf;
    const float tmp = below ? x : 0.0f;
    x = x - 1.0f;
    e = e - (below ? 1.0f : 0.0f);
    x = x + tmp;

    const float z = x * x;
    float y = kP[0];
    for (int k = 1; k < 9; ++k) y = std::fma(y, x, kP[k]);
    y = y * x;
    y = std::fma(y, z, e * kQ1);
    y = std::fma(-z, 0.5f, y);
    return std::fma(e, kQ2, x + y);
}

void cephes_sincos(float x, float* sin_out, float* cos_out) {
    const float kFourOverPi = static_cast<float>(1.27323954473516);
    const float kMinusDp1 = static_cast<float>(-0.78515625);
    const float kMinusDp2 = static_cast<float>(-2.4187564849853515625e-4);
    const float kMinusDp3 = static_cast<float>(-3.77489497744594108e-8);
    const float kSinP0 = static_cast<float>(-1.9515295891E-4);
    const float kSinP1 = static_cast<float>(8.3321608736E-3);
    const float kSinP2 = static_cast<float>(-1.6666654611E-1);
    const float kCosP0 = static_cast<float>(2.443315711809948E-005);
    const float kCosP1 = static_cast<float>(-1.388731625493765E-003);
    const float kCosP2 = static_cast<float>(4.166664568298827E-002);

    uint32_t sign_sin = float_bits(x) & 0x80000000u;
    x = std::fabs(x);
    // Octant j = (trunc(x * 4/pi) + 1) & ~1, as cvttps + integer ops.
    int32_t j = static_cast<int32_t>(x * kFourOverPi);
    j = (j + 1) & ~1;
    const float y = static_cast<float>(j);
    const uint32_t swap_sign_sin = static_cast<uint32_t>(j & 4) << 29;
    const bool use_cos_poly_for_sin = (j & 2) != 0;  // torch's poly_mask is (j & 2) == 0
    const uint32_t sign_cos = static_cast<uint32_t>(~(j - 2) & 4) << 29;
    sign_sin ^= swap_sign_sin;

    // Extended-precision range reduction x - j * pi/4 in three parts.
    x = std::fma(y, kMinusDp1, x);
    x = std::fma(y, kMinusDp2, x);
    x = std::fma(y, kMinusDp3, x);

    const float z = x * x;
    float c = std::fma(kCosP0, z, kCosP1);
    c = std::fma(c, z, kCosP2);
    c = c * z;
    c = std::fma(c, z, -(z * 0.5f));
    c = c + 1.0f;

    float s = std::fma(kSinP0, z, kSinP1);
    s = std::fma(s, z, kSinP2);
    s = s * z;
    s = std::fma(s, x, x);

    // sincos256_ps selects with masks and adds a zero; the adds are exact, so plain selection is the same.
    const float sin_value = use_cos_poly_for_sin ? c : s;
    const float cos_value = use_cos_poly_for_sin ? s : c;
    *sin_out = bits_float(float_bits(sin_value + 0.0f) ^ sign_sin);
    *cos_out = bits_float(float_bits(cos_value + 0.0f) ^ sign_cos);
}

// ---- Philox 4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") ----------------------------

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

void philox_round(uint32_t counter[4], const uint32_t key[2]) {
    const uint64_t v1 = static_cast<uint64_t>(counter[0]) * kPhiloxM0;
    const uint64_t v2 = static_cast<uint64_t>(counter[2]) * kPhiloxM1;
    const uint32_t c0 = static_cast<uint32_t>(v2 >> 32) ^ counter[1] ^ key[0];
    const uint32_t c1 = static_cast<uint32_t>(v2);
    const uint32_t c2 = static_cast<uint32_t>(v1 >> 32) ^ counter[3] ^ key[1];
    const uint32_t c3 = static_cast<uint32_t>(v1);
    counter[0] = c0;
    counter[1] = c1;
    counter[2] = c2;
    counter[3] = c3;
}

void philox4x32_10(uint32_t counter[4], uint32_t key[2]) {
    for (int round = 0; round < 9; ++round) {
        philox_round(counter, key);
        key[0] += kPhiloxW0;
        key[1] += kPhiloxW1;
    }
    philox_round(counter, key);
}

// rng_philox.py's box_muller: numpy promotes uint32 * float32 to float64, so everything runs in double and only the
// result is rounded to float32. two_pow32_inv (float32 2.3283064e-10) is exactly 2^-32, which makes u exact.
float philox_box_muller(uint32_t x, uint32_t y) {
    const double two_pow32_inv = static_cast<double>(2.3283064e-10f);
    const float two_pow32_inv_2pi = static_cast<float>(2.3283064e-10 * 6.2831855);
    const double u = static_cast<double>(x) * two_pow32_inv + two_pow32_inv / 2;
    // numpy rounds the product before adding; the volatile keeps a compiler from fusing the two into an FMA.
    volatile double v_product = static_cast<double>(y) * static_cast<double>(two_pow32_inv_2pi);
    const double v = v_product + static_cast<double>(two_pow32_inv_2pi / 2);
    const double s = std::sqrt(-2.0 * std::log(u));
    return static_cast<float>(s * std::sin(v));
}

}  // namespace

std::string_view rng_kind_name(RngKind kind) {
    for (const RngName& entry : kRngNames) {
        if (entry.kind == kind) return entry.name;
    }
    return "?";
}

std::string rng_kind_names() {
    std::string names;
    for (const RngName& entry : kRngNames) {
        if (!names.empty()) names += ", ";
        names += entry.name;
    }
    return names;
}

Result<RngKind> parse_rng_kind(std::string_view name, std::string_view flag) {
    const std::string wanted = lower(name);
    for (const RngName& entry : kRngNames) {
        if (entry.name == wanted) return entry.kind;
    }
    return Error{std::string(flag) + ": unknown RNG '" + std::string(name) + "' (valid: " + rng_kind_names() + ")"};
}

std::unique_ptr<Rng> make_rng(RngKind kind, uint64_t seed) {
    switch (kind) {
        case RngKind::Cpu: return std::make_unique<TorchCpuRng>(seed);
        case RngKind::Cuda: return std::make_unique<PhiloxRng>(seed);
        case RngKind::StdDefault: return std::make_unique<StdDefaultRng>(seed);
    }
    return nullptr;
}

// ---- TorchCpuRng ---------------------------------------------------------------------------------------------------

// at::mt19937(seed) keeps only the low 32 bits (init_with_uint32); its stream is the standard MT19937 one.
TorchCpuRng::TorchCpuRng(uint64_t seed, Math math)
    : engine_(static_cast<std::mt19937::result_type>(seed & 0xffffffffu)), math_(math) {}

// at::uniform_real_distribution<float>(0, 1): the low 24 bits of one 32-bit draw, times 2^-24 (exact).
float TorchCpuRng::uniform_float() {
    const uint32_t bits = static_cast<uint32_t>(engine_()) & 0xFFFFFFu;
    return static_cast<float>(bits) * (1.0f / 16777216.0f);
}

// at::uniform_real_distribution<double>(0, 1): random64() = (first draw << 32) | second draw, low 53 bits, * 2^-53.
double TorchCpuRng::uniform_double() {
    const uint64_t hi = static_cast<uint32_t>(engine_());
    const uint64_t lo = static_cast<uint32_t>(engine_());
    const uint64_t bits = ((hi << 32) | lo) & ((uint64_t{1} << 53) - 1);
    return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

// at::normal_distribution<double>: Box-Muller on two doubles, r from u2 and the angle from u1; the sine half is
// cached in the generator and returned by the next call. (Current torch writes log1p(-u2), older releases
// log(1 - u2); rounded to float32, both give every fixture value exactly.)
double TorchCpuRng::normal_double() {
    if (has_cached_normal_) {
        has_cached_normal_ = false;
        return cached_normal_;
    }
    const double u1 = uniform_double();
    const double u2 = uniform_double();
    const double r = std::sqrt(-2.0 * std::log1p(-u2));
    const double theta = 2.0 * 3.14159265358979323846 * u1;
    cached_normal_ = r * std::sin(theta);
    has_cached_normal_ = true;
    return r * std::cos(theta);
}

// ATen normal_fill_16 / normal_fill_16_AVX2 with mean 0 and std 1 (the final fmadd(n, 1, 0) is exact): values
// j and j + 8 of a group of 16 uniforms become r cos(theta) and r sin(theta), r = sqrt(-2 log(1 - u_j)) and
// theta = 2 pi u_{j+8}.
void TorchCpuRng::normal_fill_16(float* data) const {
    for (int j = 0; j < 8; ++j) {
        const float u1 = 1.0f - data[j];  // [0, 1) -> (0, 1] for the log
        const float u2 = data[j + 8];
        if (math_ == Math::Avx2) {
            const float radius = std::sqrt(-2.0f * cephes_log(u1));
            // _mm256_set1_ps(2.0f * c10::pi<double>): 2 pi rounded to float once, then a float product.
            const float theta = static_cast<float>(2.0 * 3.14159265358979323846) * u2;
            float sin_theta;
            float cos_theta;
            cephes_sincos(theta, &sin_theta, &cos_theta);
            data[j] = radius * cos_theta;
            data[j + 8] = radius * sin_theta;
        } else {
            const float radius = std::sqrt(-2.0f * std::log(u1));
            // `2.0f * c10::pi<double> * u2` is a double product rounded to float.
            const float theta = static_cast<float>(2.0 * 3.14159265358979323846 * static_cast<double>(u2));
            data[j] = radius * std::cos(theta);
            data[j + 8] = radius * std::sin(theta);
        }
    }
}

std::vector<float> TorchCpuRng::randn(size_t n) {
    std::vector<float> out(n);
    if (n < 16) {
        for (float& value : out) value = static_cast<float>(normal_double());
        return out;
    }
    for (float& value : out) value = uniform_float();
    for (size_t i = 0; i + 16 <= n; i += 16) normal_fill_16(out.data() + i);
    if (n % 16 != 0) {
        // ATen redraws the last 16 values and transforms them as one more group.
        float* tail = out.data() + n - 16;
        for (size_t i = 0; i < 16; ++i) tail[i] = uniform_float();
        normal_fill_16(tail);
    }
    return out;
}

// ---- PhiloxRng -----------------------------------------------------------------------------------------------------

std::vector<float> PhiloxRng::randn(size_t n) {
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) {
        // Counter {offset, 0, i, 0}: rng_philox.py keeps i in counter[2] (up to 2^32 values per call).
        uint32_t counter[4] = {offset_, 0u, static_cast<uint32_t>(i), 0u};
        uint32_t key[2] = {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
        philox4x32_10(counter, key);
        out[i] = philox_box_muller(counter[0], counter[1]);
    }
    ++offset_;
    return out;
}

// ---- StdDefaultRng -------------------------------------------------------------------------------------------------

namespace {
constexpr uint64_t kMinstdModulus = 2147483647;  // 2^31 - 1
}

StdDefaultRng::StdDefaultRng(uint64_t seed) : state_((seed & 0xffffffffu) % kMinstdModulus) {
    if (state_ == 0) state_ = 1;
}

float StdDefaultRng::canonical() {
    state_ = state_ * 16807 % kMinstdModulus;
    const float u = static_cast<float>(state_ - 1) / 2147483648.0f;
    return u >= 1.0f ? std::nextafter(1.0f, 0.0f) : u;
}

std::vector<float> StdDefaultRng::randn(size_t n) {
    std::vector<float> out(n);
    bool saved_available = false;  // a new distribution per call, as sd-cli makes one
    float saved = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        if (saved_available) {
            saved_available = false;
            out[i] = saved;
            continue;
        }
        float x, y, r2;
        do {
            x = static_cast<float>(static_cast<double>(2.0f * canonical()) - 1.0);
            y = static_cast<float>(static_cast<double>(2.0f * canonical()) - 1.0);
            // Rounded apart, as libstdc++ compiled without FMA rounds them.
            volatile float xx = x * x;
            volatile float yy = y * y;
            r2 = xx + yy;
        } while (r2 > 1.0f || r2 == 0.0f);
        const float mult = std::sqrt(-2.0f * std::log(r2) / r2);
        // "* stddev + mean" with 1 and 0: only a -0 becomes +0.
        saved = x * mult + 0.0f;
        saved_available = true;
        out[i] = y * mult + 0.0f;
    }
    return out;
}

}  // namespace kiln::pipeline
