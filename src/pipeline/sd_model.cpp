#include "pipeline/sd_model.h"

#include <filesystem>

#include "io/model_summary.h"
#include "pipeline/job_forecast.h"
#include "runtime/devices.h"
#include "runtime/host_memory.h"
#include "util/format.h"
#include "util/log.h"

namespace fs = std::filesystem;

namespace kiln::pipeline {
namespace {

const io::MetaValue* meta(const io::ModelFile& file, const std::string& key) {
    auto it = file.metadata().find(key);
    return it == file.metadata().end() ? nullptr : &it->second;
}

// The module prefixes of a single-file SD checkpoint, or of a standalone
// module file (no prefix).
struct Located {
    const io::ModelFile* file = nullptr;
    std::string prefix;
};

// Files given later (--diffusion-model, --clip_l, --vae) win over -m, so the
// search runs from the last file back.
Located locate(const std::vector<std::unique_ptr<io::ModelFile>>& files, const std::vector<std::string>& probes) {
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
        const auto& f = *it;
        for (const std::string& probe : probes) {
            for (const io::TensorInfo& t : f->tensors()) {
                if (t.name.size() >= probe.size() &&
                    t.name.compare(t.name.size() - probe.size(), probe.size(), probe) == 0) {
                    return Located{f.get(), t.name.substr(0, t.name.size() - probe.size())};
                }
            }
        }
    }
    return {};
}

Result<std::unique_ptr<ClipTokenizer>> load_tokenizer(const ModelPaths& paths,
                                                      const std::vector<std::unique_ptr<io::ModelFile>>& files) {
    if (!paths.tokenizer.empty()) {
        auto t = ClipTokenizer::load(paths.tokenizer);
        if (!t.ok()) return t.error();
        return std::make_unique<ClipTokenizer>(std::move(t).value());
    }
    for (const auto& f : files) {
        const io::MetaValue* tokens = meta(*f, "tokenizer.ggml.tokens");
        const io::MetaValue* merges = meta(*f, "tokenizer.ggml.merges");
        if (tokens && merges && tokens->kind == io::MetaValue::Kind::Array &&
            merges->kind == io::MetaValue::Kind::Array) {
            std::vector<std::string> token_list, merge_list;
            for (const auto& v : tokens->array) token_list.push_back(v.str);
            for (const auto& v : merges->array) merge_list.push_back(v.str);
            auto t =
                ClipTokenizer::from_tokens_and_merges(std::move(token_list), merge_list, f->sources().front().path);
            if (!t.ok()) return t.error();
            return std::make_unique<ClipTokenizer>(std::move(t).value());
        }
        // A diffusers folder keeps its tokenizer next to the text encoder.
        for (const io::SourceFile& s : f->sources()) {
            if (s.component != "text_encoder") continue;
            const fs::path folder = fs::path(s.path).parent_path().parent_path() / "tokenizer";
            if (fs::is_directory(folder)) {
                auto t = ClipTokenizer::load(folder.string());
                if (!t.ok()) return t.error();
                return std::make_unique<ClipTokenizer>(std::move(t).value());
            }
        }
    }
    return Error{
        "the model carries no tokenizer: pass --tokenizer PATH (a CLIP tokenizer.json, vocab.json with "
        "merges.txt, a diffusers tokenizer/ folder, or open_clip's bpe_simple_vocab_16e6.txt)"};
}

}  // namespace

Result<std::unique_ptr<StableDiffusionModel>> StableDiffusionModel::load(const ModelPaths& paths,
                                                                         const ModelOptions& options) {
    std::unique_ptr<StableDiffusionModel> m(new StableDiffusionModel());
    std::vector<std::string> groups;
    for (const std::string& p : paths.model) groups.push_back(p);
    for (const std::string* p : {&paths.diffusion_model, &paths.clip_l, &paths.vae}) {
        if (!p->empty()) groups.push_back(*p);
    }
    if (groups.empty()) return Error{"no model given: pass -m MODEL"};
    for (const std::string& path : groups) {
        auto file = io::ModelFile::open({path});
        if (!file.ok()) return file.error();
        m->files_.push_back(std::make_unique<io::ModelFile>(std::move(file).value()));
    }
    const io::ModelFile& main = *m->files_.front();
    m->name_ = fs::path(groups.front()).stem().string();
    const io::ModelSummary summary = io::summarize_model(main);
    m->family_ = summary.family;

    const Located unet_at = locate(m->files_, {"input_blocks.0.0.weight"});
    const Located clip_at =
        locate(m->files_, {"text_model.embeddings.token_embedding.weight", "token_embedding.weight"});
    const Located vae_at = locate(m->files_, {"decoder.conv_in.weight"});

    const std::string where = groups.size() == 1 ? groups.front() : "the given model files";
    if (!unet_at.file) {
        return Error{where + ": no SD1/SD2 UNet found (family: " + summary.family + "); pass --diffusion-model"};
    }
    if (!clip_at.file) return Error{where + ": no CLIP text encoder found; pass --clip_l"};
    if (!vae_at.file) return Error{where + ": no VAE found; pass --vae"};

    auto unet = models::Unet::create(*unet_at.file, unet_at.prefix, options.weight_type);
    if (!unet.ok()) return Error{unet_at.file->sources().front().path + ": " + unet.error().message};
    auto clip = models::ClipTextEncoder::create(*clip_at.file, clip_at.prefix, options.weight_type);
    if (!clip.ok()) return Error{clip_at.file->sources().front().path + ": " + clip.error().message};
    auto vae = models::Vae::create(*vae_at.file, vae_at.prefix, options.weight_type);
    if (!vae.ok()) return Error{vae_at.file->sources().front().path + ": " + vae.error().message};
    if ((*clip)->config().width != (*unet)->config().context_dim) {
        return Error{"the text encoder's width " + std::to_string((*clip)->config().width) +
                     " does not match the UNet's context width " + std::to_string((*unet)->config().context_dim)};
    }
    if ((*vae)->config().latent_channels != (*unet)->config().out_channels) {
        return Error{"the VAE's latent channels do not match the UNet's output channels"};
    }
    m->unet_ = std::move(unet).value();
    m->clip_ = std::move(clip).value();
    m->vae_ = std::move(vae).value();

    const bool open_clip = m->clip_->config().naming == models::ClipTextConfig::Naming::OpenClip;
    m->default_clip_skip_ = open_clip ? 2 : 1;
    m->pad_token_ = open_clip ? 0 : -1;
    m->latent_scale_ = static_cast<float>(main.metadata_number("kiln.vae.scale_factor", 0.18215));
    const std::string prediction = main.metadata_string("kiln.prediction", "eps");
    m->prediction_ = options.prediction.value_or(prediction == "v" ? Prediction::V : Prediction::Eps);
    ModelDefaults& d = m->defaults_;
    d.width = static_cast<int>(main.metadata_number("kiln.default.width", d.width));
    d.height = static_cast<int>(main.metadata_number("kiln.default.height", d.height));
    d.steps = static_cast<int>(main.metadata_number("kiln.default.steps", d.steps));
    d.cfg_scale = static_cast<float>(main.metadata_number("kiln.default.cfg_scale", d.cfg_scale));
    d.sampler = main.metadata_string("kiln.default.sampler", d.sampler);
    d.scheduler = main.metadata_string("kiln.default.scheduler", d.scheduler);

    auto tokenizer = load_tokenizer(paths, m->files_);
    if (!tokenizer.ok()) return tokenizer.error();
    m->tokenizer_ = std::move(tokenizer).value();
    if (m->tokenizer_->vocab_size() > m->clip_->config().vocab) {
        return Error{"the tokenizer has " + std::to_string(m->tokenizer_->vocab_size()) +
                     " tokens but the text encoder only " + std::to_string(m->clip_->config().vocab)};
    }

    if (!paths.embeddings.empty()) {
        if (m->tokenizer_->vocab_size() != m->clip_->config().vocab) {
            return Error{"textual-inversion embeddings need the tokenizer's vocabulary (" +
                         std::to_string(m->tokenizer_->vocab_size()) + " tokens) to match the text encoder's (" +
                         std::to_string(m->clip_->config().vocab) + ")"};
        }
        auto table = load_embeddings(paths.embeddings, m->clip_->config().width, *m->tokenizer_);
        if (!table.ok()) return table.error();
        m->embeddings_ = std::move(table).value();
        KILN_LOG_VERBOSE("textual inversion: %zu embeddings, %zu vectors", m->tokenizer_->embeddings().size(),
                         m->embeddings_.rows());
    }

    KILN_TRY(m->place_modules(options));
    KILN_LOG_VERBOSE("loaded %s (%s): text encoder %zu tensors, UNet %zu, VAE %zu", m->name_.c_str(),
                     m->family_.c_str(), m->clip_->weights().count(), m->unet_->weights().count(),
                     m->vae_->weights().count());
    return m;
}

}  // namespace kiln::pipeline

namespace kiln::pipeline {

Status StableDiffusionModel::place_modules(const ModelOptions& options) {
    const ggml_backend_buffer_type_t cpu = ggml_backend_cpu_buffer_type();
    module_bytes_ = {{"diffusion", unet_->weights().allocation_size(cpu)},
                     {"te", clip_->weights().allocation_size(cpu)},
                     {"vae", vae_->weights().allocation_size(cpu)}};
    auto placement = pipeline::place_modules(options.placement, module_bytes_, runtime::list_devices(),
                                             runtime::host_available_bytes());
    if (!placement.ok()) return placement.error();
    placement_ = std::move(placement).value();
    const bool auto_fit =
        options.placement.auto_fit && options.placement.backend.empty() && options.placement.params_backend.empty();

    auto device_of = [](const std::string& name) -> Result<ggml_backend_dev_t> {
        if (name == "CPU") return static_cast<ggml_backend_dev_t>(nullptr);
        auto dev = runtime::find_device(name);
        if (!dev.ok()) return Error{"--backend: " + dev.error().message};
        return *dev;
    };
    auto ledger_for = [&](const std::string& name, ggml_backend_dev_t dev) -> runtime::DeviceLedger& {
        auto& ledger = ledgers_[name];
        if (!ledger) ledger = std::make_unique<runtime::DeviceLedger>(dev, options.placement.budgets.for_device(name));
        return *ledger;
    };
    // What each module needs to load its weights once placement is final.
    struct Module {
        const char* name;
        std::unique_ptr<runtime::Executor>* executor;
        runtime::ModuleWeights* weights;
        ModulePlacement* placement = nullptr;
        ggml_backend_t backend = nullptr;
        ggml_backend_buffer_type_t params_buft = nullptr;
        runtime::DeviceLedger* params_ledger = nullptr;  // weights kept on a device are counted there
        uint64_t reserved = 0;
    };
    std::vector<Module> modules = {{"diffusion", &diffusion_executor_, &unet_->weights()},
                                   {"te", &te_executor_, &clip_->weights()},
                                   {"vae", &vae_executor_, &vae_->weights()}};
    // Records a module's params location (and the bytes it keeps on a device).
    auto place_params = [&](Module& m, runtime::ParamsLocation where) -> Status {
        if (m.params_ledger) m.params_ledger->release(m.reserved);
        m.params_ledger = nullptr;
        m.params_buft = nullptr;
        m.reserved = 0;
        const bool on_cpu = m.placement->compute_device == "CPU";
        if (on_cpu && where == runtime::ParamsLocation::Host) where = runtime::ParamsLocation::ComputeDevice;
        m.placement->params = where;
        m.weights->set_params_location(where);
        if (where == runtime::ParamsLocation::ComputeDevice && !on_cpu) {
            m.params_buft = (*m.executor)->compute().buffer_type();
            m.params_ledger = &(*m.executor)->store().ledger();
        } else if (where == runtime::ParamsLocation::OtherDevice) {
            auto other = device_of(m.placement->params_device);
            if (!other.ok()) return Error{"--params-backend: " + other.error().message};
            m.params_buft = ggml_backend_dev_buffer_type(*other);
            m.params_ledger = &ledger_for(m.placement->params_device, *other);
        }
        if (!m.params_ledger) return Status::Ok();
        const uint64_t need = m.weights->allocation_size(m.params_buft);
        const uint64_t limit = m.params_ledger->limit();
        if (m.params_ledger->managed() + need > limit) {
            return Error{std::string("out of memory: the ") + m.name + " weights need " + human_bytes(need) + " on " +
                         m.params_ledger->device_name() + ", the budget leaves " +
                         human_bytes(limit > m.params_ledger->managed() ? limit - m.params_ledger->managed() : 0) +
                         " (keep them in RAM with --params-backend " + m.name + "=cpu, or on disk)"};
        }
        m.params_ledger->add(need);
        m.reserved = need;
        return Status::Ok();
    };
    for (Module& m : modules) {
        m.placement =
            &*std::find_if(placement_.begin(), placement_.end(), [&](const auto& x) { return x.module == m.name; });
        auto dev = device_of(m.placement->compute_device);
        if (!dev.ok()) return dev.error();
        auto compute = runtime::Compute::create(*dev, options.threads);
        if (!compute.ok()) return compute.error();
        m.backend = (*compute)->weights_backend();
        m.weights->set_computes_on_cpu(*dev == nullptr);
        runtime::DeviceLedger& ledger = ledger_for(m.placement->compute_device, *dev);
        auto& store = stores_[m.placement->compute_device];
        if (!store) store = std::make_unique<runtime::WeightStore>(ledger, (*compute)->buffer_type());
        *m.executor = std::make_unique<runtime::Executor>(m.name, std::move(compute).value(), *m.weights, *store,
                                                          options.executor);
        KILN_TRY(place_params(m, m.placement->params));
    }

    // Auto-fit checks its guess against the job's measured plan and moves
    // weights off the GPU (VAE first, the UNet last) until the job fits.
    if (auto_fit && placement_.front().compute_device != "CPU") {
        const int width = options.job_width > 0 ? options.job_width : defaults_.width;
        const int height = options.job_height > 0 ? options.job_height : defaults_.height;
        for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
            auto forecast = forecast_job(*this, width, height, /*cfg=*/true, /*flash_attention=*/false);
            if (!forecast.ok() || forecast->fits) break;
            if (it->placement->params != runtime::ParamsLocation::ComputeDevice) continue;
            KILN_LOG_VERBOSE("auto-fit: a %dx%d job does not fit; %s weights move to RAM", width, height, it->name);
            KILN_TRY(place_params(*it, runtime::ParamsLocation::Host));
        }
    }
    const std::string text = describe_placement(placement_, module_bytes_);
    if (auto_fit && placement_.front().compute_device != "CPU") {
        KILN_LOG_INFO("auto-fit:\n%s", text.substr(0, text.size() - 1).c_str());
    } else {
        KILN_LOG_VERBOSE("placement:\n%s", text.substr(0, text.size() - 1).c_str());
    }

    if (options.plan_only) return Status::Ok();
    for (Module& m : modules) {
        auto loader = [weights = m.weights, backend = m.backend, buft = m.params_buft,
                       name = std::string(m.name)]() -> Status {
            KILN_TRY(weights->load_params(weights->params_location(), backend, buft));
            KILN_LOG_VERBOSE("%s: weights loaded (%s)", name.c_str(),
                             runtime::params_location_name(weights->params_location()));
            return Status::Ok();
        };
        if (options.eager_load) {
            KILN_TRY(loader());
        } else {
            (*m.executor)->set_loader(loader);
        }
    }
    return Status::Ok();
}

void StableDiffusionModel::release_caches() {
    for (auto* e : {diffusion_executor_.get(), te_executor_.get(), vae_executor_.get()}) e->release_workspace();
    for (auto& [name, store] : stores_) store->evict_all();
}

}  // namespace kiln::pipeline
