// libFuzzer target for the model-config path: what each network reads from a
// model's header (its metadata and its tensors' names, shapes and dtypes)
// when create() configures it and declares its weights.
//
// The input is a recipe of edits to a real layout rather than a file: the
// default model (models/kiln-tiny.gguf: CLIP, UNet, VAE) and the tiny
// fixtures of T5, Flux, Z-Image and the Qwen3 LLM (tests/golden/models/).
// Each run picks one layout, applies a few edits (a metadata key set to a
// value of any kind, a tensor's dimension, rank or dtype changed, a tensor
// dropped or renamed to another block), builds the model from the edited
// header (io::ModelFile::from_header, no bytes behind it) and runs create()
// of every network that the unedited layout holds. Every outcome must be an
// error with a message, or a network whose configuration kiln can build
// graphs from (KILN_FUZZ_CHECK below) and whose declarations either agree
// with the header or are refused by ModuleWeights::load_params(Disk), which
// checks them without reading a byte. Crashes, sanitizer reports (a float to
// integer cast out of range included) and aborts are findings.
//
// Build and run: scripts/fuzz.sh model_config SECONDS
// The layouts are read from KILN_SOURCE_DIR (the source tree; the
// environment variable of that name overrides it).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "ggml.h"
#include "io/dtype.h"
#include "io/model_file.h"
#include "models/nets/clip_text.h"
#include "models/nets/flux_dit.h"
#include "models/nets/llm_encoder.h"
#include "models/nets/t5_encoder.h"
#include "models/nets/unet.h"
#include "models/nets/vae.h"
#include "models/nets/z_image_dit.h"
#include "runtime/module_weights.h"
#include "util/log.h"

namespace {

using kiln::io::MetaValue;
using kiln::io::ModelFile;
using kiln::io::ParsedFile;
using kiln::io::TensorInfo;

enum class Network { Clip, Unet, Vae, T5, Flux, ZImage, Llm };
constexpr Network kNetworks[] = {Network::Clip, Network::Unet,   Network::Vae, Network::T5,
                                 Network::Flux, Network::ZImage, Network::Llm};

struct Layout {
    ParsedFile header;
    // The networks create() accepts on the unedited layout, with their prefixes.
    std::vector<std::pair<Network, std::string>> networks;
};

// The metadata keys networks and families read; an edit sets one of these or
// one the layout already has.
const char* const kKeys[] = {
    "kiln.clip.heads",
    "kiln.unet.heads",
    "kiln.unet.head_channels",
    "kiln.flux.axes_dim",
    "kiln.z_image.axes_dim",
    "kiln.vae.scale_factor",
    "kiln.default.width",
    "kiln.default.height",
    "kiln.default.steps",
    "general.architecture",
    "qwen3.block_count",
    "qwen3.embedding_length",
    "qwen3.attention.head_count",
    "qwen3.attention.head_count_kv",
    "qwen3.attention.key_length",
    "qwen3.rope.freq_base",
    "qwen3.attention.layer_norm_rms_epsilon",
    "qwen3.feed_forward_length",
};

const std::vector<std::string> kPrefixes = {"",
                                            "model.diffusion_model.",
                                            "first_stage_model.",
                                            "cond_stage_model.transformer.",
                                            "cond_stage_model.transformer.text_model.",
                                            "text_encoders.t5xxl.transformer.",
                                            "text_encoders.qwen3_4b.",
                                            "conditioner.embedders.0.transformer.",
                                            "vae.",
                                            "text_encoder."};

// What create() returns, reduced to: error, or the checks of a configured network.
struct Outcome {
    bool ok = false;
    std::string error;
    kiln::runtime::ModuleWeights* weights = nullptr;
};

void check_unet(const kiln::models::UnetConfig& c) {
    KILN_FUZZ_CHECK(c.in_channels > 0 && c.out_channels > 0 && c.model_channels > 0);
    KILN_FUZZ_CHECK(c.context_dim > 0 && c.time_embed_dim > 0 && c.adm_in_channels >= 0);
    KILN_FUZZ_CHECK(!c.level_channels.empty() && c.level_channels.size() < 16);
    for (int64_t ch : c.level_channels) {
        KILN_FUZZ_CHECK(ch > 0);
        const int64_t heads = c.heads_at(ch);
        KILN_FUZZ_CHECK(heads > 0 && ch % heads == 0);
    }
}

void check_vae(const kiln::models::VaeConfig& c) {
    KILN_FUZZ_CHECK(c.image_channels > 0 && c.latent_channels > 0 && c.res_blocks > 0);
    KILN_FUZZ_CHECK(!c.level_channels.empty() && c.level_channels.size() < 16);
    for (int64_t ch : c.level_channels) KILN_FUZZ_CHECK(ch > 0);
}

void check_clip(const kiln::models::ClipTextConfig& c) {
    KILN_FUZZ_CHECK(c.vocab > 0 && c.width > 0 && c.layers > 0 && c.context > 0 && c.intermediate > 0);
    KILN_FUZZ_CHECK(c.heads > 0 && c.width % c.heads == 0 && c.projection >= 0);
}

void check_t5(const kiln::models::T5Config& c) {
    KILN_FUZZ_CHECK(c.vocab > 0 && c.d_model > 0 && c.d_kv > 0 && c.heads > 0 && c.d_ff > 0 && c.layers > 0);
    KILN_FUZZ_CHECK(c.buckets > 0 && c.max_distance > 0);
}

void check_flux(const kiln::models::FluxConfig& c) {
    KILN_FUZZ_CHECK(c.hidden > 0 && c.heads > 0 && c.hidden % c.heads == 0 && c.patch > 0);
    KILN_FUZZ_CHECK(c.in_channels > 0 && c.out_channels > 0 && c.mlp_hidden > 0 && c.context_dim > 0);
    KILN_FUZZ_CHECK(c.double_blocks >= 0 && c.single_blocks >= 0 && c.vec_dim >= 0);
    int64_t axes = 0;
    for (int a : c.axes_dim) {
        KILN_FUZZ_CHECK(a > 0 && a % 2 == 0);
        axes += a;
    }
    KILN_FUZZ_CHECK(axes == c.head_dim());
    KILN_FUZZ_CHECK(std::isfinite(c.theta) && c.theta > 0);
}

void check_z_image(const kiln::models::ZImageConfig& c) {
    KILN_FUZZ_CHECK(c.dim > 0 && c.heads > 0 && c.head_dim > 0 && c.ffn_hidden > 0 && c.cap_dim > 0);
    KILN_FUZZ_CHECK(c.in_channels > 0 && c.out_channels > 0 && c.patch > 0 && c.layers >= 0);
    int64_t axes = 0;
    for (int a : c.axes_dim) {
        KILN_FUZZ_CHECK(a > 0 && a % 2 == 0);
        axes += a;
    }
    KILN_FUZZ_CHECK(axes == c.head_dim);
    KILN_FUZZ_CHECK(std::isfinite(c.theta) && c.theta > 0 && std::isfinite(c.norm_eps) && c.norm_eps > 0);
}

void check_llm(const kiln::models::LlmConfig& c) {
    KILN_FUZZ_CHECK(c.vocab > 0 && c.width > 0 && c.layers > 0 && c.head_dim > 0 && c.ffn > 0);
    KILN_FUZZ_CHECK(c.heads > 0 && c.kv_heads > 0 && c.heads % c.kv_heads == 0);
    KILN_FUZZ_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0);
    KILN_FUZZ_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0);
}

// create() of `Net` over the tensors under `prefix`; on success the
// configuration is checked, and the network with its weights kept alive in
// `holder` so its weights can be checked after.
template <class Net, class Check, class... Args>
Outcome finish(const ModelFile& file, const std::string& prefix, std::optional<ggml_type> weight_type, Check check,
               std::shared_ptr<void>& holder, Args... args) {
    Outcome out;
    auto weights = std::make_shared<kiln::runtime::ModuleWeights>(file, prefix, weight_type);
    auto created = Net::create(*weights, args...);
    if (!created.ok()) {
        out.error = created.error().message;
        return out;
    }
    std::shared_ptr<Net> net(std::move(created).value());
    check(net->config());
    out.ok = true;
    out.weights = weights.get();
    holder =
        std::make_shared<std::pair<std::shared_ptr<kiln::runtime::ModuleWeights>, std::shared_ptr<Net>>>(weights, net);
    return out;
}

Outcome create(Network network, const ModelFile& file, const std::string& prefix, std::optional<ggml_type> weight_type,
               int llm_unused_layers, std::shared_ptr<void>& holder) {
    using namespace kiln::models;
    switch (network) {
        case Network::Clip: return finish<ClipTextEncoder>(file, prefix, weight_type, check_clip, holder);
        case Network::Unet: return finish<Unet>(file, prefix, weight_type, check_unet, holder);
        case Network::Vae: return finish<Vae>(file, prefix, weight_type, check_vae, holder);
        case Network::T5: return finish<T5Encoder>(file, prefix, weight_type, check_t5, holder);
        case Network::Flux: return finish<FluxDit>(file, prefix, weight_type, check_flux, holder);
        case Network::ZImage: return finish<ZImageDit>(file, prefix, weight_type, check_z_image, holder);
        case Network::Llm: return finish<LlmEncoder>(file, prefix, weight_type, check_llm, holder, llm_unused_layers);
    }
    return {};
}

std::vector<Layout>& layouts() {
    static std::vector<Layout> all;
    return all;
}

void add_layout(const std::string& path) {
    auto file = ModelFile::open({path});
    if (!file.ok()) {
        std::fprintf(stderr, "fuzz_model_config: %s\n", file.error().message.c_str());
        std::abort();
    }
    Layout layout;
    layout.header.format = file->sources().front().format;
    layout.header.tensors = file->tensors();
    layout.header.metadata = file->metadata();
    for (Network network : kNetworks) {
        for (const std::string& prefix : kPrefixes) {
            std::shared_ptr<void> holder;
            if (create(network, *file, prefix, std::nullopt, 0, holder).ok) {
                layout.networks.emplace_back(network, prefix);
                break;
            }
        }
    }
    if (layout.networks.empty()) {
        std::fprintf(stderr, "fuzz_model_config: no network found in %s\n", path.c_str());
        std::abort();
    }
    layouts().push_back(std::move(layout));
}

// A new size for a dimension now `current` (which an earlier edit may have
// made huge: the arithmetic saturates rather than overflow).
int64_t interesting_dim(FuzzedDataProvider& in, int64_t current) {
    const auto times = [current](int64_t k) {
        int64_t out = 0;
        return __builtin_mul_overflow(current, k, &out) ? current : out;
    };
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0: return 0;
        case 1: return 1;
        case 2: return current == INT64_MAX ? current : current + 1;
        case 3: return current == INT64_MIN ? current : current - 1;
        case 4: return times(2);
        case 5: return current / 2;
        case 6: return times(3);
        case 7: return int64_t(1) << in.ConsumeIntegralInRange<int>(8, 62);
        case 8: return -in.ConsumeIntegralInRange<int64_t>(1, 1 << 20);
        default: return in.ConsumeIntegralInRange<int64_t>(0, 1 << 16);
    }
}

MetaValue interesting_value(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0: return MetaValue::of_int(in.ConsumeIntegral<int64_t>());
        case 1: return MetaValue::of_int(in.ConsumeIntegralInRange<int64_t>(-4, 4100));
        case 2: return MetaValue::of_uint(in.ConsumeIntegral<uint64_t>());
        case 3: return MetaValue::of_float(in.ConsumeFloatingPoint<double>());
        case 4: {
            const double special[] = {std::nan(""), INFINITY, -INFINITY, 1e30, -1e30, 0.5, 2.5, -0.0, 1e-30};
            return MetaValue::of_float(special[in.ConsumeIntegralInRange<size_t>(0, 8)]);
        }
        case 5: return MetaValue::of_bool(in.ConsumeBool());
        case 6: {
            std::vector<MetaValue> items;
            const size_t n = in.ConsumeIntegralInRange<size_t>(0, 5);
            for (size_t i = 0; i < n; ++i)
                items.push_back(MetaValue::of_int(in.ConsumeIntegralInRange<int64_t>(-2, 200)));
            return MetaValue::of_array(std::move(items), /*GGUF_TYPE_INT32=*/5);
        }
        case 7: {
            // Numbers as text, the way safetensors metadata holds them ("8,12,12").
            std::string text;
            const size_t n = in.ConsumeIntegralInRange<size_t>(1, 4);
            for (size_t i = 0; i < n; ++i) {
                if (i) text += ',';
                text += std::to_string(in.ConsumeIntegralInRange<int64_t>(-3, 200));
            }
            return MetaValue::of_string(text);
        }
        default: return MetaValue::of_string(in.ConsumeRandomLengthString(32));
    }
}

// One edit of the header. A tensor edit that no parser could return (a
// negative dimension, a byte size that overflows or does not fill a
// quantization block) is undone: parsers refuse those; an empty shape (a
// scalar, which safetensors allows) is kept (fuzz_gguf and
// fuzz_safetensors check it), so they never reach create().
void edit(FuzzedDataProvider& in, ParsedFile& header) {
    std::vector<TensorInfo>& tensors = header.tensors;
    const int kind = in.ConsumeIntegralInRange<int>(0, 6);
    if (kind == 0 || tensors.empty()) {
        const size_t existing = header.metadata.size();
        const size_t pick = in.ConsumeIntegralInRange<size_t>(0, std::size(kKeys) + existing - 1);
        std::string key;
        if (pick < std::size(kKeys)) {
            key = kKeys[pick];
        } else {
            auto it = header.metadata.begin();
            std::advance(it, pick - std::size(kKeys));
            key = it->first;
        }
        if (in.ConsumeBool() && in.ConsumeBool()) {
            header.metadata.erase(key);
        } else {
            header.metadata[key] = interesting_value(in);
        }
        return;
    }
    TensorInfo& t = tensors[in.ConsumeIntegralInRange<size_t>(0, tensors.size() - 1)];
    const TensorInfo before = t;
    switch (kind) {
        case 1:
        case 2:
            if (!t.shape.empty()) {
                int64_t& d = t.shape[in.ConsumeIntegralInRange<size_t>(0, t.shape.size() - 1)];
                d = interesting_dim(in, d);
            }
            break;
        case 3:
            if (in.ConsumeBool() && !t.shape.empty()) {
                t.shape.pop_back();
            } else if (t.shape.size() < 4) {
                t.shape.push_back(in.ConsumeIntegralInRange<int64_t>(0, 4));
            }
            break;
        case 4: {
            const kiln::io::DType types[] = {kiln::io::DType::F32,
                                             kiln::io::DType::F16,
                                             kiln::io::DType::BF16,
                                             kiln::io::DType::F64,
                                             kiln::io::DType::I8,
                                             kiln::io::DType::I16,
                                             kiln::io::DType::I32,
                                             kiln::io::DType::I64,
                                             kiln::io::DType::U8,
                                             kiln::io::DType::BOOL,
                                             kiln::io::DType::F8_E4M3,
                                             kiln::io::DType::F8_E5M2,
                                             static_cast<kiln::io::DType>(GGML_TYPE_Q8_0),
                                             static_cast<kiln::io::DType>(GGML_TYPE_Q4_K)};
            t.dtype = types[in.ConsumeIntegralInRange<size_t>(0, std::size(types) - 1)];
            break;
        }
        case 5: tensors.erase(tensors.begin() + (&t - tensors.data())); return;
        default: {
            // Another block or layer: a digit of the name changed (a copy, so
            // the original stays), e.g. one layer more than the others.
            TensorInfo copy = t;
            std::vector<size_t> digits;
            for (size_t i = 0; i < copy.name.size(); ++i) {
                if (copy.name[i] >= '0' && copy.name[i] <= '9') digits.push_back(i);
            }
            if (digits.empty()) return;
            copy.name[digits[in.ConsumeIntegralInRange<size_t>(0, digits.size() - 1)]] =
                static_cast<char>('0' + in.ConsumeIntegralInRange<int>(0, 9));
            for (const TensorInfo& other : tensors) {
                if (other.name == copy.name) return;
            }
            tensors.push_back(std::move(copy));
            return;
        }
    }
    // A parser never returns a tensor whose byte size does not exist.
    int64_t elements = 1;
    for (int64_t d : t.shape) {
        if (d < 0 || __builtin_mul_overflow(elements, d, &elements)) elements = -1;
        if (elements < 0) break;
    }
    const auto bytes = elements >= 0 ? kiln::io::dtype_byte_size(t.dtype, elements) : std::nullopt;
    if (!bytes) {
        t = before;
        return;
    }
    t.nbytes = *bytes;
}

void silent_log(ggml_log_level, const char*, void*) {}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    ggml_log_set(silent_log, nullptr);
    kiln::log_set_level(kiln::LogLevel::Error);
    setenv("GGML_NO_BACKTRACE", "1", 0);  // GGML_ABORT must not try to attach gdb
    const char* env = std::getenv("KILN_SOURCE_DIR");
    const std::string root = env ? env : KILN_SOURCE_DIR;
    add_layout(root + "/models/kiln-tiny.gguf");
    for (const char* name : {"t5_tiny.safetensors", "flux_tiny.safetensors", "chroma_tiny.safetensors",
                             "z_image_tiny.safetensors", "qwen3_tiny.gguf", "sdxl_tiny.safetensors"}) {
        add_layout(root + "/tests/golden/models/" + name);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const Layout& layout = layouts()[in.ConsumeIntegralInRange<size_t>(0, layouts().size() - 1)];
    ParsedFile header = layout.header;
    const int edits = in.ConsumeIntegralInRange<int>(1, 6);
    for (int i = 0; i < edits; ++i) edit(in, header);

    // --type: none, or one of the types a user may ask for.
    const std::optional<ggml_type> weight_types[] = {std::nullopt, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_Q8_0,
                                                     GGML_TYPE_Q4_K};
    const auto weight_type = weight_types[in.ConsumeIntegralInRange<size_t>(0, std::size(weight_types) - 1)];
    const int llm_unused_layers = in.ConsumeIntegralInRange<int>(-1, 4);

    auto file = ModelFile::from_header(std::move(header), "fuzz.gguf");
    if (!file.ok()) return 0;  // a renamed tensor met its twin
    for (const auto& [network, prefix] : layout.networks) {
        std::shared_ptr<void> holder;
        const Outcome out = create(network, *file, prefix, weight_type, llm_unused_layers, holder);
        if (!out.ok) {
            KILN_FUZZ_CHECK(!out.error.empty());
            continue;
        }
        // The declarations against the header: agreement, or an error naming a tensor.
        const kiln::Status checked =
            out.weights->load_params(kiln::runtime::ParamsLocation::Disk, /*compute_backend=*/nullptr);
        KILN_FUZZ_CHECK(checked.ok() || !checked.error().message.empty());
    }
    return 0;
}
