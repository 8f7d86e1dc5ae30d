#include "pipeline/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "image/image.h"
#include "io/diffusers_names.h"
#include "models/nets/registry.h"
#include "models/registry.h"
#include "pipeline/request_limits.h"
#include "pipeline/samplers.h"
#include "pipeline/schedulers.h"
#include "runtime/device_books.h"
#include "runtime/devices.h"
#include "runtime/host_memory.h"
#include "util/files.h"
#include "util/format.h"
#include "util/kiln_cache.h"
#include "util/log.h"

namespace fs = std::filesystem;

namespace kiln::pipeline {
namespace {

const io::MetaValue* meta(const io::ModelFile& file, const std::string& key) {
    auto it = file.metadata().find(key);
    return it == file.metadata().end() ? nullptr : &it->second;
}

// A vision tower: Qwen-Image-Edit's (te.vision) or CLIP vision (Wan 2.1
// image-to-video's); either is the model's one vision module.
bool is_vision_tower(models::NetworkKind kind) {
    return kind == models::NetworkKind::QwenVision || kind == models::NetworkKind::ClipVision;
}

// A model file and the flag that named it ("" for -m).
struct GivenFile {
    std::string path;
    std::string flag;
};

// The prefix of the first tensor in `file` that is one of `prefixes` (any,
// when empty) followed by one of the network's marker names.
std::optional<std::string> find_prefix(const io::ModelFile& file, models::NetworkKind network,
                                       const std::vector<std::string>& prefixes) {
    for (const std::string& probe : models::network_entry(network).probes) {
        for (const io::TensorInfo& t : file.tensors()) {
            if (t.name.size() < probe.size() ||
                t.name.compare(t.name.size() - probe.size(), probe.size(), probe) != 0) {
                continue;
            }
            std::string prefix = t.name.substr(0, t.name.size() - probe.size());
            if (prefixes.empty() || std::find(prefixes.begin(), prefixes.end(), prefix) != prefixes.end()) {
                return prefix;
            }
        }
    }
    return std::nullopt;
}

// kiln's cache folder for tokenizer NAME (filled by `kiln pull --tokenizer
// NAME`): the last place every tokenizer search looks, after the model's own
// files. Empty without a cache root (no KILN_CACHE, no HOME).
std::vector<fs::path> cached_tokenizer_folders(std::initializer_list<const char*> names) {
    std::vector<fs::path> out;
    for (const char* name : names) {
        if (auto folder = tokenizer_cache_folder(name)) out.emplace_back(*folder);
    }
    return out;
}

Result<std::unique_ptr<text::ClipTokenizer>> load_tokenizer(const std::string& flag_path,
                                                            const std::vector<std::unique_ptr<io::ModelFile>>& files) {
    if (!flag_path.empty()) {
        auto t = text::ClipTokenizer::load(flag_path);
        if (!t.ok()) return t.error();
        return std::make_unique<text::ClipTokenizer>(std::move(t).value());
    }
    for (const auto& f : files) {
        const io::MetaValue* tokens = meta(*f, "tokenizer.ggml.tokens");
        const io::MetaValue* merges = meta(*f, "tokenizer.ggml.merges");
        if (tokens && merges && tokens->kind == io::MetaValue::Kind::Array &&
            merges->kind == io::MetaValue::Kind::Array) {
            std::vector<std::string> token_list, merge_list;
            for (const auto& v : tokens->array) token_list.push_back(v.str);
            for (const auto& v : merges->array) merge_list.push_back(v.str);
            auto t = text::ClipTokenizer::from_tokens_and_merges(std::move(token_list), merge_list,
                                                                 f->sources().front().path);
            if (!t.ok()) return t.error();
            return std::make_unique<text::ClipTokenizer>(std::move(t).value());
        }
        // A diffusers folder keeps its tokenizer next to the text encoder.
        for (const io::SourceFile& s : f->sources()) {
            if (s.component != "text_encoder") continue;
            const fs::path folder = fs::path(s.path).parent_path().parent_path() / "tokenizer";
            if (path_status(folder.string()).kind == PathKind::Folder) {  // never throws (symlink loops)
                auto t = text::ClipTokenizer::load(folder.string());
                if (!t.ok()) return t.error();
                return std::make_unique<text::ClipTokenizer>(std::move(t).value());
            }
        }
    }
    // CLIP-L's and CLIP-G's tokenizers are the same BPE (the pad token is
    // the conditioner's business), so either cached one serves every CLIP.
    std::string looked;
    for (const fs::path& folder : cached_tokenizer_folders({"clip-l", "clip-g"})) {
        if (path_status(folder.string()).kind == PathKind::Folder) {
            auto t = text::ClipTokenizer::load(folder.string());
            if (!t.ok()) return t.error();
            return std::make_unique<text::ClipTokenizer>(std::move(t).value());
        }
        looked += (looked.empty() ? "" : ", ") + folder.string();
    }
    return Error{"the model carries no tokenizer" + (looked.empty() ? "" : " (looked in: " + looked + ")") +
                 ": pass --tokenizer PATH (a CLIP tokenizer.json, vocab.json with merges.txt, a diffusers "
                 "tokenizer/ folder, or open_clip's bpe_simple_vocab_16e6.txt), or fetch it once with "
                 "'kiln pull --tokenizer clip-l'"};
}

Result<std::unique_ptr<text::T5Tokenizer>> load_t5_tokenizer_at(const std::string& path) {
    auto t = text::T5Tokenizer::load(path);
    if (!t.ok()) return t.error();
    return std::make_unique<text::T5Tokenizer>(std::move(t).value());
}

// T5's tokenizer: --tokenizer t5xxl=PATH; the T5 file's own (GGUF
// tokenizer.ggml.*, as -M convert writes it); a diffusers folder's
// tokenizer_N/ beside text_encoder_N/ (tokenizer/ beside text_encoder/:
// Wan's umT5); spiece.model, tokenizer_2/ or t5_tokenizer/ beside the T5
// file; kiln pull's cache (`cache_name`: "t5xxl", or "umt5" for umT5's 256k
// vocabulary). The error says where kiln looked.
Result<std::unique_ptr<text::T5Tokenizer>> load_t5_tokenizer(const std::string& flag_path, const io::ModelFile& t5_file,
                                                             const std::string& t5_prefix,
                                                             const std::string& cache_name) {
    if (!flag_path.empty()) return load_t5_tokenizer_at(flag_path);
    if (meta(t5_file, "tokenizer.ggml.model")) {
        auto t = text::T5Tokenizer::from_gguf_metadata(t5_file);
        if (!t.ok()) return t.error();
        return std::make_unique<text::T5Tokenizer>(std::move(t).value());
    }
    std::vector<fs::path> candidates;
    for (const io::SourceFile& s : t5_file.sources()) {
        const fs::path dir = fs::path(s.path).parent_path();
        // A diffusers folder's text_encoder_N/ holding the T5 (Flux's: 2,
        // SD3's: 3) has tokenizer_N/ beside it.
        if (s.component.rfind("text_encoder", 0) == 0 && t5_prefix.rfind(s.component + "/", 0) == 0)
            candidates.push_back(dir.parent_path() / ("tokenizer" + s.component.substr(12)));
        // Such a text_encoder[_N]/ given alone (--t5xxl FOLDER/text_encoder).
        const std::string folder = dir.filename().string();
        if (s.component.empty() && folder.rfind("text_encoder", 0) == 0)
            candidates.push_back(dir.parent_path() / ("tokenizer" + folder.substr(12)));
        for (const char* name : {"spiece.model", "tokenizer_2", "t5_tokenizer"}) candidates.push_back(dir / name);
    }
    for (const fs::path& folder : cached_tokenizer_folders({cache_name.c_str()})) candidates.push_back(folder);
    std::string looked;
    for (const fs::path& c : candidates) {
        const PathKind kind = path_status(c.string()).kind;
        if (kind == PathKind::File || kind == PathKind::Folder) return load_t5_tokenizer_at(c.string());
        looked += (looked.empty() ? "" : ", ") + c.string();
    }
    return Error::bad_file(t5_file.sources().front().path +
                           ": the T5 text encoder needs its tokenizer and the file carries none (looked in: " + looked +
                           "); pass --tokenizer t5xxl=PATH (spiece.model, a T5 tokenizer.json or its folder), fetch it "
                           "once with 'kiln pull --tokenizer " +
                           cache_name + "', or convert the T5 once with -M convert --tokenizer t5xxl=PATH to carry it");
}

// A number from the metadata, checked against [min, max]; the error names
// the file and the key.
Result<std::optional<double>> meta_number(const io::ModelFile& file, const std::string& key, double min, double max) {
    const io::MetaValue* v = meta(file, key);
    if (!v) return std::optional<double>();
    const double fallback = std::nan("");
    const double d = file.metadata_number(key, fallback);
    const std::string where = file.sources().front().path + ": metadata " + key;
    if (std::isnan(d)) return Error::bad_file(where + " is not a number: '" + v->to_string() + "'");
    if (!(d >= min && d <= max)) {
        return Error::bad_file(where + " is " + v->to_string() + ", expected " + "[" +
                               format_number(static_cast<float>(min)) + ", " + format_number(static_cast<float>(max)) +
                               "]");
    }
    return std::optional<double>(d);
}

}  // namespace

Result<TokenizerPaths> parse_tokenizer_flag(const std::string& value) {
    TokenizerPaths out;
    const auto eq = value.find('=');
    const std::string head = eq == std::string::npos ? "" : value.substr(0, eq);
    if (head != "t5xxl" && head != "llm" && head != "clip_l" && head != "clip") {
        out.clip = value;
        return out;
    }
    size_t start = 0;
    while (start <= value.size()) {
        const size_t comma = value.find(',', start);
        const std::string item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const auto sep = item.find('=');
        const std::string name = item.substr(0, sep);
        if (sep == std::string::npos || sep + 1 == item.size()) {
            return Error::invalid_request("--tokenizer: '" + item + "' is not ENCODER=PATH");
        }
        if (name == "t5xxl") {
            out.t5 = item.substr(sep + 1);
        } else if (name == "llm") {
            out.llm = item.substr(sep + 1);
        } else if (name == "clip_l" || name == "clip") {
            out.clip = item.substr(sep + 1);
        } else {
            return Error::invalid_request("--tokenizer: unknown encoder '" + name + "' (valid: t5xxl, llm, clip_l)");
        }
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

SeamsScope::SeamsScope(Model& model, nn::Seams seams) : model_(model), before_(model.seams_) { model_.seams_ = seams; }

SeamsScope::~SeamsScope() { model_.seams_ = before_; }

Model::~Model() {
    // The books outlive this model (other models share them): give back
    // everything it holds there.
    for (auto& [ledger, bytes] : lora_reservations_) ledger->release(bytes);
    for (auto& module : modules_) module->executor.reset();
    for (auto& [name, store] : stores_) {
        for (auto& module : modules_) store->drop_module(module->weights());
    }
    for (auto& [module, reservation] : reserved_params_) reservation.first->release(reservation.second);
    stores_.clear();
}

std::string Model::control_net_name() const { return fs::path(control_->file->sources().front().path).stem().string(); }

int Model::size_stride() const { return vae().format().downscale * diffusion().capabilities().size_stride; }

std::unique_ptr<NoiseSchedule> Model::noise_schedule(int width, int height, int steps,
                                                     std::optional<float> flow_shift) const {
    if (prediction_ != Prediction::Flow)
        return std::make_unique<DiscreteSchedule>(DiscreteSchedule::stable_diffusion());
    const models::Schedule& s = family_->schedule;
    if (flow_shift) return std::make_unique<FlowSchedule>(s.flow_shift_factor ? std::log(*flow_shift) : *flow_shift);
    const int64_t patch = static_cast<int64_t>(size_stride());
    const int64_t image_tokens = (width / patch) * (height / patch);
    if (s.step_shift) return std::make_unique<FlowSchedule>(FlowSchedule::empirical_mu(image_tokens, steps));
    if (!s.resolution_shift) return std::make_unique<FlowSchedule>(s.flow_mu);
    return std::make_unique<FlowSchedule>(FlowSchedule::resolution_mu(image_tokens));
}

Result<std::unique_ptr<Model>> Model::load(const ModelPaths& paths, const ModelOptions& options) {
    std::unique_ptr<Model> m(new Model());
    m->lora_dir_ = options.lora_dir;
    m->lora_apply_mode_ = options.lora_apply_mode;
    m->converts_weights_ = options.weight_type.has_value() || !options.tensor_type_rules.empty();
    KILN_TRY(m->load_networks(paths, options));
    if (!paths.taesd.empty()) KILN_TRY(m->load_taesd(paths.taesd, options));
    KILN_TRY(m->read_metadata(options));

    auto tokenizer_paths = parse_tokenizer_flag(paths.tokenizer);
    if (!tokenizer_paths.ok()) return tokenizer_paths.error();
    bool has_clip = false;
    for (const TextEncoder& te : m->text_encoders_) {
        has_clip = has_clip || te.use->layout == models::PromptLayout::ClipChunks;
        if (te.use->layout != models::PromptLayout::FixedLength || m->t5_tokenizer_) continue;
        const Module* t5_module = nullptr;
        for (const auto& module : m->modules_) {
            if (module->network.get() == te.network) t5_module = module.get();
        }
        const std::string cache_name = te.network->label() == "umT5" ? "umt5" : "t5xxl";
        auto t5_tokenizer = load_t5_tokenizer(tokenizer_paths->t5, *t5_module->file, t5_module->prefix, cache_name);
        if (!t5_tokenizer.ok()) return t5_tokenizer.error().as(ErrorKind::BadFile);
        m->t5_tokenizer_ = std::move(t5_tokenizer).value();
        KILN_TRY(m->check_tokenizer_fits(te));
    }
    for (const TextEncoder& te : m->text_encoders_) {
        if (te.use->layout == models::PromptLayout::ChatTemplate)
            KILN_TRY(m->load_llm_tokenizer(tokenizer_paths->llm, te));
    }
    if (has_clip) {
        KILN_TRY(m->load_clip_tokenizer(tokenizer_paths->clip, paths.embeddings));
    } else if (!paths.embeddings.empty()) {
        return Error::invalid_request("--embd-dir: textual-inversion embeddings need a CLIP text encoder, which " +
                                      m->family_label_ + " does not have");
    }

    KILN_TRY(m->place_modules(options));
    std::string counts;
    for (const auto& module : m->modules_) {
        counts += (counts.empty() ? "" : ", ") + module->spec.name + " " + std::to_string(module->weights().count());
    }
    KILN_LOG_VERBOSE("loaded %s (%s): tensors of %s", m->name_.c_str(), m->family_label_.c_str(), counts.c_str());
    m->report_tensor_type_rules(options.tensor_type_rules);
    return m;
}

// What each of --tensor-type-rules' rules took: a rule that matched nothing
// is most likely a misspelt pattern, so it is a warning.
void Model::report_tensor_type_rules(const io::TensorTypeRules& rules) const {
    for (size_t rule = 0; rule < rules.size(); ++rule) {
        size_t total = 0;
        std::string where;
        for (const auto& module : modules_) {
            const size_t n = module->weights().rule_matches()[rule];
            if (n == 0) continue;
            total += n;
            where += (where.empty() ? "" : ", ") + module->spec.name + " " + std::to_string(n);
        }
        if (total == 0) {
            KILN_LOG_WARN(
                "--tensor-type-rules: '%s' matches no tensor of %s (rules see names such as "
                "model.diffusion_model.NAME, first_stage_model.NAME, text_encoders.MODULE.NAME and "
                "MODULE.NAME; kiln info --tensors lists a file's)",
                rules.text(rule).c_str(), family_label_.c_str());
        } else {
            KILN_LOG_VERBOSE("--tensor-type-rules: '%s' matches tensors of %s", rules.text(rule).c_str(),
                             where.c_str());
        }
    }
}

// --taesd's decoder: a module of its own in the "vae" role, after the
// family's modules (placement puts it with the VAE; the memory report
// names it vae.taesd). Its latent must be the model's.
Status Model::load_taesd(const std::string& path, const ModelOptions& options) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) return file.error().as(ErrorKind::BadFile);
    files_.push_back(std::make_unique<io::ModelFile>(std::move(file).value()));
    auto module = std::make_unique<Module>();
    module->spec = {"taesd", models::ModuleRole::Vae, models::NetworkKind::Taesd, {}, "--taesd", {}};
    module->file = files_.back().get();
    module->prefix = "";
    if (Status s = create_network(*module, {}, options); !s.ok())
        return s.error().as(ErrorKind::BadFile).in_context(path + " (--taesd): ");
    const models::Taesd& net = static_cast<const models::Taesd&>(*module->network);
    const int64_t channels = net.config().latent_channels;
    if (channels != latent_channels()) {
        return Error::bad_file(path + " (--taesd): a tiny autoencoder for " + std::to_string(channels) +
                               "-channel latents, but " + family_label_ + "'s latent has " +
                               std::to_string(latent_channels()) + " channels (TAESD and TAESDXL take 4, TAEF1 16)");
    }
    if (net.config().upscale() != vae().format().downscale) {
        return Error::bad_file(path + " (--taesd): it upscales " + std::to_string(net.config().upscale()) +
                               "x, the model's VAE " + std::to_string(vae().format().downscale) + "x");
    }
    taesd_ = module.get();
    taesd_preview_only_ = options.taesd_preview_only;
    modules_.push_back(std::move(module));
    return Status::Ok();
}

// CLIP's tokenizer, checked against every CLIP's vocabulary, and the
// textual-inversion embeddings of every CLIP (SDXL's two take their own rows
// of each file).
Status Model::load_clip_tokenizer(const std::string& flag_path, const std::string& embeddings_dir) {
    auto tokenizer = load_tokenizer(flag_path, files_);
    if (!tokenizer.ok()) return tokenizer.error().as(ErrorKind::BadFile);
    tokenizer_ = std::move(tokenizer).value();
    std::vector<EmbeddingTarget> targets;
    for (const TextEncoder& te : text_encoders_) {
        if (te.use->layout != models::PromptLayout::ClipChunks) continue;
        const int64_t vocab = te.network->vocab();
        KILN_TRY(check_tokenizer_fits(te));
        // An embedding's ids follow the tokenizer's vocabulary in every encoder's table.
        if (!embeddings_dir.empty() && tokenizer_->vocab_size() != vocab) {
            return Error::bad_file("textual-inversion embeddings need the tokenizer's vocabulary (" +
                                   std::to_string(tokenizer_->vocab_size()) + " tokens) to match the " +
                                   te.use->module + " text encoder's (" + std::to_string(vocab) + ")");
        }
        targets.push_back({te.use->module, te.width()});
    }
    if (!embeddings_dir.empty()) {
        auto tables = load_embeddings(embeddings_dir, targets, *tokenizer_);
        if (!tables.ok()) return tables.error().as(ErrorKind::BadFile);
        size_t next = 0;
        for (TextEncoder& te : text_encoders_) {
            if (te.use->layout != models::PromptLayout::ClipChunks) continue;
            te.embeddings = std::move((*tables)[next++]);
            te.embeddings.eos_id = tokenizer_->eos_id();
        }
        KILN_LOG_VERBOSE("textual inversion: %zu embeddings for %zu text encoder(s)", tokenizer_->embeddings().size(),
                         targets.size());
    }
    return Status::Ok();
}

// The LLM's tokenizer: --tokenizer llm=PATH (a GGUF, vocab-only or not, a
// tokenizer.json, vocab.json with merges.txt, or their folder); the LLM
// file's own (a llama.cpp GGUF carries it); a diffusers folder's
// tokenizer/; tokenizer.json, tekken.json (Mistral's repositories), vocab.json
// or tokenizer/ beside the LLM file.
// The error says where kiln looked. Its vocabulary must fit the encoder's
// embedding table.
Status Model::load_llm_tokenizer(const std::string& flag_path, const TextEncoder& encoder) {
    const Module* module = nullptr;
    for (const auto& m : modules_) {
        if (m->network.get() == encoder.network) module = m.get();
    }
    const io::ModelFile& file = *module->file;
    auto take = [&](Result<text::LlmTokenizer> t) -> Status {
        if (!t.ok()) return t.error().as(ErrorKind::BadFile);
        llm_tokenizer_ = std::make_unique<text::LlmTokenizer>(std::move(t).value());
        return Status::Ok();
    };
    if (!flag_path.empty()) {
        KILN_TRY(take(text::LlmTokenizer::load(flag_path)));
    } else if (meta(file, "tokenizer.ggml.model")) {
        KILN_TRY(take(text::LlmTokenizer::from_gguf_metadata(file)));
    } else {
        std::vector<fs::path> candidates;
        for (const io::SourceFile& s : file.sources()) {
            const fs::path dir = fs::path(s.path).parent_path();
            if (s.component == "text_encoder") candidates.push_back(dir.parent_path() / "tokenizer");
            for (const char* name : {"tokenizer.json", "tekken.json", "vocab.json", "tokenizer"})
                candidates.push_back(dir / name);
        }
        const std::string arch = encoder.network->label();
        for (const fs::path& folder : cached_tokenizer_folders({arch.c_str()})) candidates.push_back(folder);
        std::string looked;
        for (const fs::path& c : candidates) {
            const PathKind kind = path_status(c.string()).kind;
            if (kind == PathKind::File || kind == PathKind::Folder) {
                KILN_TRY(take(text::LlmTokenizer::load(c.string())));
                break;
            }
            looked += (looked.empty() ? "" : ", ") + c.string();
        }
        if (!llm_tokenizer_) {
            return Error::bad_file(file.sources().front().path + ": the " + encoder.network->label() +
                                   " text encoder needs its tokenizer and the file carries none (looked in: " + looked +
                                   "); pass --tokenizer llm=PATH (a GGUF of the same model, even a vocab-only one, "
                                   "its tokenizer.json, or vocab.json with merges.txt), or fetch it once with "
                                   "'kiln pull --tokenizer " +
                                   arch + "'");
        }
    }
    if (encoder.use->max_length > 0 && llm_tokenizer_->token_id(encoder.use->pad_text) < 0) {
        return Error::bad_file("the " + encoder.use->module + " tokenizer has no " + encoder.use->pad_text +
                               " token to pad " + family_label_ + "'s prompts with (is it " + encoder.network->label() +
                               "'s tokenizer?)");
    }
    for (const std::string& token : encoder.use->template_tokens) {
        const int32_t id = llm_tokenizer_->token_id(token);
        if (id < 0 || !llm_tokenizer_->is_added(id)) {
            return Error::bad_file("the " + encoder.use->module + " tokenizer has no " + token + " token, which " +
                                   family_label_ + "'s prompt template is written in (is it " +
                                   encoder.network->label() + "'s tokenizer?)");
        }
    }
    return check_tokenizer_fits(encoder);
}

const text::Tokenizer& Model::tokenizer_of(const TextEncoder& encoder) const {
    switch (encoder.use->layout) {
        case models::PromptLayout::FixedLength: return *t5_tokenizer_;
        case models::PromptLayout::ChatTemplate: return *llm_tokenizer_;
        case models::PromptLayout::ClipChunks: break;
    }
    return *tokenizer_;
}

Status Model::check_tokenizer_fits(const TextEncoder& encoder) const {
    const text::Tokenizer& tokenizer = tokenizer_of(encoder);
    if (tokenizer.vocab_size() > encoder.network->vocab()) {
        return Error::bad_file("the " + std::string(tokenizer.name()) + " tokenizer has " +
                               std::to_string(tokenizer.vocab_size()) + " tokens but the " + encoder.use->module +
                               " text encoder only " + std::to_string(encoder.network->vocab()));
    }
    return Status::Ok();
}

Status Model::load_networks(const ModelPaths& paths, const ModelOptions& options) {
    std::vector<GivenFile> given;
    for (const std::string& p : paths.model) given.push_back({p, ""});
    const std::pair<const std::string*, const char*> flagged[] = {
        {&paths.diffusion_model, "--diffusion-model"},
        {&paths.high_noise_diffusion_model, "--high-noise-diffusion-model"},
        {&paths.clip_l, "--clip_l"},
        {&paths.clip_g, "--clip_g"},
        {&paths.t5xxl, "--t5xxl"},
        {&paths.llm, "--llm"},
        {&paths.llm_vision, "--llm_vision"},
        {&paths.clip_vision, "--clip_vision"},
        {&paths.vae, "--vae"}};
    for (const auto& [path, flag] : flagged) {
        if (!path->empty()) given.push_back({*path, flag});
    }
    if (given.empty()) return Error::invalid_request("no model given: pass -m MODEL");
    models::FileSet set;
    for (const GivenFile& g : given) {
        auto file = io::ModelFile::open({g.path});
        if (!file.ok()) return file.error().as(ErrorKind::BadFile);
        files_.push_back(std::make_unique<io::ModelFile>(std::move(file).value()));
        set.files.push_back(files_.back().get());
    }
    name_ = fs::path(given.front().path).stem().string();
    // A split file's parts are one model of several files: no one hash either.
    if (paths.model.size() <= 1 && files_.front()->sources().size() == 1 &&
        path_status(given.front().path).kind == PathKind::File) {
        model_file_ = given.front().path;
    }
    const std::string where = given.size() == 1 ? given.front().path : "the given model files";

    const models::Detection detection = models::detect_family(set);
    if (!detection.family) {
        return Error::bad_file(where + ": not a model family kiln runs (found: " + detection.label + "; runs: " + [] {
            std::string names;
            for (const models::Family* f : models::families()) {
                names += (names.empty() ? "" : ", ") + f->name;
            }
            return names;
        }() + ")");
    }
    family_ = detection.family;
    family_label_ = detection.label;
    // A module's own file in HF or diffusers naming takes the ldm names. A
    // diffusers VAE's names pass for an unprefixed ldm one's (both start
    // "encoder.", "decoder."), so its blocks tell.
    for (size_t i = 0; i < given.size(); ++i) {
        for (const models::ModuleSpec& spec : family_->modules) {
            if (given[i].flag != spec.flag || !spec.diffusers_component) continue;
            const bool diffusers_vae =
                spec.diffusers_component == io::ModelComponent::Vae && io::is_diffusers_vae(files_[i]->tensors());
            if (!diffusers_vae && find_prefix(*files_[i], spec.network, spec.prefixes)) continue;
            files_[i]->rename_as_diffusers_component(family_->diffusers_family, *spec.diffusers_component);
        }
    }

    // Each module comes from the file its flag named, else from the first
    // file (last to first) that holds it and was not given for another
    // module: a full checkpoint passed as --vae gives only its VAE.
    for (const models::ModuleSpec& spec : family_->modules) {
        auto module = std::make_unique<Module>();
        module->spec = spec;
        for (size_t i = 0; i < given.size() && !module->file; ++i) {
            if (given[i].flag != spec.flag) continue;
            if (given[i].flag.empty()) break;
            auto prefix = find_prefix(*files_[i], spec.network, {});
            if (!prefix) {
                models::FileSet alone;
                alone.files = {files_[i].get()};
                return Error::bad_file(given[i].path + " (" + spec.flag + "): no " + spec.name +
                                       " in it (found: " + models::detect_family(alone).label + ")");
            }
            module->file = files_[i].get();
            module->prefix = *prefix;
        }
        // The high-noise expert comes from its own flag alone: the main
        // network's file holds a DiT of the same kind.
        for (size_t i = given.size(); i-- > 0 && !module->file && !spec.high_noise;) {
            if (!given[i].flag.empty() && given[i].flag != spec.flag && given[i].flag != spec.also_in_flag) continue;
            if (auto prefix = find_prefix(*files_[i], spec.network, spec.prefixes)) {
                module->file = files_[i].get();
                module->prefix = *prefix;
            }
        }
        if (!module->file && spec.optional) {
            // A text encoder's absence changes every image; a vision tower's
            // only edit jobs, which say so (pipeline/request.cpp).
            if (spec.role == models::ModuleRole::TextEncoder && !is_vision_tower(spec.network)) {
                KILN_LOG_WARN("%s: no %s given (%s); it runs without it, zeros in place of its text states",
                              family_label_.c_str(), spec.name.c_str(), spec.flag.c_str());
            }
            continue;
        }
        if (!module->file) {
            return Error::bad_file(where + ": no " + spec.name + " found (family " + family_label_ + "); pass " +
                                   spec.flag);
        }
        if (spec.network == models::NetworkKind::ControlNet || spec.network == models::NetworkKind::Taesd) {
            return Error{"internal: a family lists " + spec.name + ", which comes from " + spec.flag + " only"};
        }
        // Only the layers the family reads are declared (Z-Image's
        // hidden_states[-2] never needs the LLM's last layer's weights).
        models::NetworkOptions network_options;
        network_options.zero_cond_t = options.zero_cond_t;
        for (const models::TextEncoderUse& use : family_->conditioning.encoders) {
            if (use.module == spec.name) network_options.hf_named_openclip = use.hf_named_openclip;
            if (use.module != spec.name || use.layout != models::PromptLayout::ChatTemplate) continue;
            network_options.unused_last_layers = use.default_layer - 1;
            network_options.llm_defaults = use.llm_defaults;
            for (int k : use.hidden_states) network_options.first_layers = std::max(network_options.first_layers, k);
        }
        if (Status s = create_network(*module, network_options, options); !s.ok())
            return s.error().as(ErrorKind::BadFile).in_context(module->file->sources().front().path + ": ");
        if (spec.role == models::ModuleRole::Diffusion) (spec.high_noise ? high_noise_ : diffusion_) = module.get();
        if (spec.role == models::ModuleRole::Vae) vae_ = module.get();
        if (is_vision_tower(spec.network)) vision_ = module.get();
        modules_.push_back(std::move(module));
    }
    for (const models::TextEncoderUse& use : family_->conditioning.encoders) {
        const auto module = std::find_if(modules_.begin(), modules_.end(),
                                         [&](const auto& m) { return m->spec.name == use.module; });
        if (module == modules_.end()) {
            absent_text_encoders_.push_back(&use);
            continue;
        }
        text_encoders_.push_back({&use, (*module)->network->as_text_encoder(), nullptr, (*module)->params.get()});
    }
    KILN_TRY(check_conditioning());
    KILN_TRY(check_high_noise_expert());
    KILN_TRY(check_image_context());
    if (!paths.control_net.empty()) KILN_TRY(load_control_net(paths.control_net, options));
    // A file given for one module that also holds others: say which were not taken from it.
    for (size_t i = 0; i < given.size(); ++i) {
        if (given[i].flag.empty()) continue;
        const auto own = std::find_if(family_->modules.begin(), family_->modules.end(),
                                      [&](const models::ModuleSpec& spec) { return spec.flag == given[i].flag; });
        if (own == family_->modules.end()) {
            KILN_LOG_WARN("%s (%s): %s takes no such part; the file is not used", given[i].path.c_str(),
                          given[i].flag.c_str(), family_label_.c_str());
            continue;
        }
        for (const models::ModuleSpec& spec : family_->modules) {
            // The file's own network is no other module's part (a DiT given
            // as one Wan 2.2 expert is the other expert's kind).
            if (spec.network == own->network) continue;
            if (spec.flag != given[i].flag && spec.also_in_flag != given[i].flag &&
                find_prefix(*files_[i], spec.network, spec.prefixes)) {
                KILN_LOG_WARN("%s (%s): its %s is not used", given[i].path.c_str(), given[i].flag.c_str(),
                              spec.name.c_str());
            }
        }
    }
    return Status::Ok();
}

// --control-net: a ControlNet for this model's UNet, a module of its own.
// It must have been trained for the UNet's family: the same context width
// (SD1 768, SD2 1024, SDXL 2048), channels and label_emb vector.
Status Model::load_control_net(const std::string& path, const ModelOptions& options) {
    auto opened = io::ModelFile::open({path});
    if (!opened.ok()) return opened.error().as(ErrorKind::BadFile).in_context("--control-net: ");
    const std::string where = "--control-net " + path + ": ";
    if (io::is_diffusers_controlnet(opened->tensors())) {  // diffusers' ControlNetModel names
        if (Status s = opened->rename_as_diffusers_controlnet(); !s.ok())
            return s.error().as(ErrorKind::BadFile).in_context(where);
    }
    files_.push_back(std::make_unique<io::ModelFile>(std::move(opened).value()));
    const io::ModelFile& file = *files_.back();
    if (!diffusion().capabilities().control_residuals) {
        return Error::invalid_request(where + "ControlNets are for UNet models (SD1.x, SD2.x, SDXL); " + family_label_ +
                                      " has none");
    }
    auto prefix = models::ControlNet::find_prefix(file);
    if (!prefix) {
        models::FileSet alone;
        alone.files = {&file};
        return Error::bad_file(
            where + "not a ControlNet (no input_hint_block; found: " + models::detect_family(alone).label + ")");
    }
    auto module = std::make_unique<Module>();
    module->spec = {
        "controlnet", models::ModuleRole::Control, models::NetworkKind::ControlNet, {}, "--control-net", {}};
    module->file = &file;
    module->prefix = *prefix;
    if (Status s = create_network(*module, {}, options); !s.ok())
        return s.error().as(ErrorKind::BadFile).in_context(where);
    const auto& net = static_cast<const models::ControlNet&>(*module->network);
    if (Status s = diffusion().check_control_net(net, family_label_); !s.ok()) return s.error().in_context(where);
    control_ = module.get();
    modules_.push_back(std::move(module));
    return Status::Ok();
}

namespace {

// The spellings --tensor-type-rules sees a module's tensor names under
// besides the file's: sd-cli's (the prefix its loader gives the module's
// file) and kiln's own (the module's name, as kiln plan lists it), so that
// "model.diffusion_model.", "first_stage_model." and "^vae\." each pick a
// module whatever prefix the file had.
std::vector<std::string> rule_spellings(const models::ModuleSpec& spec) {
    std::vector<std::string> prefixes;
    switch (spec.role) {
        case models::ModuleRole::Diffusion:
            prefixes.push_back(spec.high_noise ? "model.high_noise_diffusion_model." : "model.diffusion_model.");
            break;
        case models::ModuleRole::Vae: prefixes.push_back("first_stage_model."); break;
        case models::ModuleRole::TextEncoder: prefixes.push_back("text_encoders." + spec.name + "."); break;
        case models::ModuleRole::Control: prefixes.push_back("control_model."); break;
    }
    prefixes.push_back(spec.name + ".");
    return prefixes;
}

}  // namespace

Status Model::create_network(Module& module, const models::NetworkOptions& options,
                             const ModelOptions& model_options) const {
    io::WeightTypeRequest types{model_options.weight_type, model_options.tensor_type_rules,
                                rule_spellings(module.spec)};
    module.params = std::make_unique<runtime::ModuleWeights>(*module.file, module.prefix, std::move(types));
    auto net = models::network_entry(module.spec.network).create(*module.params, options);
    if (!net.ok()) return net.error();
    module.network = std::move(net).value();
    return module.params->declaration_status();
}

Status Model::check_conditioning() const {
    models::ConditioningShape shape;
    shape.family = family_->name;
    shape.family_label = family_label_;
    shape.size_embedding = family_->conditioning.size_embedding;
    shape.latent_channels = vae().format().latent_channels;
    shape.vae_downscale = vae().format().downscale;
    shape.vae_temporal_downscale = vae().format().temporal_downscale;
    for (const TextEncoder& te : text_encoders_) {
        shape.encoders.push_back({te.use->module, te.network->label(), te.width(), te.network->pooled_width(),
                                  te.use->context, te.use->pooled, te.use->token_group});
    }
    return diffusion().check_conditioning(shape);
}

std::string Model::high_noise_expert_name() const {
    return fs::path(high_noise_->file->sources().front().path).stem().string();
}

Status Model::check_high_noise_expert() const {
    if (!high_noise_) return Status::Ok();
    const models::DiffusionCapabilities& main = diffusion_->network->as_diffusion()->capabilities();
    const models::DiffusionCapabilities& expert = high_noise_->network->as_diffusion()->capabilities();
    auto shape = [](const models::DiffusionCapabilities& c) {
        return std::to_string(c.hidden_width) + " wide, " + std::to_string(c.in_channels) + " latent channels in, " +
               std::to_string(c.out_channels) + " out, a context " + std::to_string(c.context_width) + " wide";
    };
    if (high_noise_->spec.network != diffusion_->spec.network || shape(main) != shape(expert)) {
        return Error::bad_file(high_noise_->file->sources().front().path +
                               " (--high-noise-diffusion-model): the high-noise expert is a " + expert.label + " " +
                               shape(expert) + "; the --diffusion-model's " + main.label + " is " + shape(main) +
                               " (the two experts of one release, such as Wan 2.2 A14B's, are alike)");
    }
    return Status::Ok();
}

// Wan 2.1's I2V and FLF2V DiTs read CLIP vision's rows of the first frame:
// the tower given must make rows of the width img_emb takes. A job without
// it is refused when it asks (pipeline/request.cpp), not the model.
Status Model::check_image_context() const {
    const int64_t width = diffusion_->network->as_diffusion()->capabilities().image_context_width;
    if (!vision_ || vision_->spec.network != models::NetworkKind::ClipVision) return Status::Ok();
    if (width == 0) {
        KILN_LOG_WARN(
            "%s (--clip_vision): this %s DiT reads no image context (only Wan 2.1's I2V and FLF2V do); "
            "the file is not used",
            vision_->file->sources().front().path.c_str(), family_label_.c_str());
        return Status::Ok();
    }
    const int64_t rows = vision_->network->as_vision_encoder()->out_width();
    if (rows != width) {
        return Error::bad_file(vision_->file->sources().front().path + " (--clip_vision): its rows are " +
                               std::to_string(rows) + " wide but the DiT's img_emb takes " + std::to_string(width) +
                               " (Wan 2.1 image-to-video reads CLIP-vision-H, clip_vision_h.safetensors)");
    }
    return Status::Ok();
}

const models::LatentFormat& Model::latent_format() const {
    for (const models::LatentFormat& other : family_->other_latents) {
        if (vae_ && other.channels == latent_channels()) return other;
    }
    return family_->latent;
}

Status Model::read_metadata(const ModelOptions& options) {
    const io::ModelFile& main = *files_.front();
    defaults_ = family_->defaults;
    latent_scale_ = latent_format().scale;
    auto scale = meta_number(main, "kiln.vae.scale_factor", 1e-6, 1e6);
    if (!scale.ok()) return scale.error();
    if (*scale) latent_scale_ = static_cast<float>(**scale);

    prediction_ = family_->schedule.prediction;
    const std::string prediction = main.metadata_string("kiln.prediction", "");
    if (prediction == "v") prediction_ = Prediction::V;
    if (prediction == "eps") prediction_ = Prediction::Eps;
    if (!prediction.empty() && prediction != "v" && prediction != "eps") {
        return Error::bad_file(main.sources().front().path + ": metadata kiln.prediction is '" + prediction +
                               "', expected eps or v");
    }
    // Some v-prediction checkpoints say so with an empty "v_pred" tensor.
    for (const auto& f : files_) {
        if (f->find("v_pred")) prediction_ = Prediction::V;
    }
    if (options.prediction) prediction_ = *options.prediction;

    ModelDefaults& d = defaults_;
    const int stride = size_stride();
    for (auto [key, value] : {std::pair<const char*, int*>{"kiln.default.width", &d.width},
                              std::pair<const char*, int*>{"kiln.default.height", &d.height}}) {
        auto v = meta_number(main, key, stride, image::kMaxDimension);
        if (!v.ok()) return v.error();
        if (!*v) continue;
        if (std::fmod(**v, stride) != 0) {
            return Error::bad_file(main.sources().front().path + ": metadata " + key + " is " +
                                   format_number(static_cast<float>(**v)) +
                                   ", not a multiple of the model's size stride " + std::to_string(stride));
        }
        *value = static_cast<int>(**v);
    }
    auto steps = meta_number(main, "kiln.default.steps", 1, kMaxSteps);
    if (!steps.ok()) return steps.error();
    if (*steps) d.steps = static_cast<int>(**steps);
    auto cfg = meta_number(main, "kiln.default.cfg_scale", 0, kMaxCfgScale);
    if (!cfg.ok()) return cfg.error();
    if (*cfg) d.cfg_scale = static_cast<float>(**cfg);
    d.sampler = main.metadata_string("kiln.default.sampler", d.sampler);
    if (auto s = parse_sampler(d.sampler); !s.ok()) {
        return s.error()
            .as(ErrorKind::BadFile)
            .in_context(main.sources().front().path + ": metadata kiln.default.sampler: ");
    }
    d.scheduler = main.metadata_string("kiln.default.scheduler", d.scheduler);
    if (auto s = parse_scheduler(d.scheduler); !s.ok()) {
        return s.error()
            .as(ErrorKind::BadFile)
            .in_context(main.sources().front().path + ": metadata kiln.default.scheduler: ");
    }
    return Status::Ok();
}

}  // namespace kiln::pipeline

namespace kiln::pipeline {

Status Model::place_modules(const ModelOptions& options) {
    const ggml_backend_buffer_type_t cpu = ggml_backend_cpu_buffer_type();
    module_bytes_ = {{"diffusion", 0}, {"te", 0}, {"vae", 0}};
    if (control_) module_bytes_["control"] = 0;
    // A vision tower serves edit jobs only: its weights stay in RAM (or the
    // mapped file) and stream to its role's device when one runs, so they
    // take no part in placing the role's (below).
    for (const auto& module : modules_) {
        if (module.get() != vision_) module_bytes_[module->role()] += module->weights().allocation_size(cpu);
    }
    auto placement = pipeline::place_modules(options.placement, module_bytes_, runtime::list_devices(),
                                             runtime::host_available_bytes());
    if (!placement.ok()) return placement.error();
    placement_ = std::move(placement).value();
    budgets_ = options.placement.budgets;
    auto_fit_ =
        options.placement.auto_fit && options.placement.backend.empty() && options.placement.params_backend.empty();

    // In placement's priority order: diffusion, ControlNet, text encoders, VAE.
    for (models::ModuleRole role : {models::ModuleRole::Diffusion, models::ModuleRole::Control,
                                    models::ModuleRole::TextEncoder, models::ModuleRole::Vae}) {
        for (auto& module : modules_) {
            if (module->spec.role == role) by_priority_.push_back(module.get());
        }
    }
    for (Module* m : by_priority_) {
        // A module's executor is named by its role ("te"), or role and
        // network when a role has several ("te.clip_g").
        // The vision tower and the high-noise expert are named apart
        // ("te.vision", "diffusion.high_noise"); the main networks keep their role's name.
        const auto named_apart = [&](const Module* x) { return x == vision_ || x == high_noise_; };
        const auto same_role = std::count_if(modules_.begin(), modules_.end(), [&](const auto& other) {
            return other->spec.role == m->spec.role && !named_apart(other.get());
        });
        m->executor_name =
            same_role > 1 || named_apart(m) ? std::string(m->role()) + "." + m->spec.name : std::string(m->role());
        m->placement =
            &*std::find_if(placement_.begin(), placement_.end(), [&](const auto& x) { return x.module == m->role(); });
        if (m == vision_) {  // its role's device, its own record: params in RAM
            vision_placement_ = *m->placement;
            vision_placement_.params = runtime::ParamsLocation::Host;
            vision_placement_.split_devices.clear();
            m->placement = &vision_placement_;
        }
        auto dev = device_of(m->placement->compute_device);
        if (!dev.ok()) return dev.error();
        auto compute = runtime::Compute::create(*dev, options.threads);
        if (!compute.ok()) return compute.error();
        m->backend = (*compute)->weights_backend();
        m->target = *dev == nullptr ? nn::ComputeTarget::Cpu : nn::ComputeTarget::Device;
        ledger_for(m->placement->compute_device, *dev);
        auto& store = stores_[m->placement->compute_device];
        if (!store) {
            store = runtime::shared_store(m->placement->compute_device, *dev,
                                          budgets_.for_device(m->placement->compute_device), (*compute)->buffer_type());
        }
        runtime::ExecutorOptions executor_options = options.executor;
        executor_options.cancel = &cancel_;
        m->executor = std::make_unique<runtime::Executor>(m->executor_name, std::move(compute).value(), m->weights(),
                                                          *store, executor_options);
        KILN_TRY(add_split_devices(*m, options.threads));
        KILN_TRY(place_params(*m, m->placement->params));
    }
    for (TextEncoder& te : text_encoders_) {
        for (const auto& module : modules_) {
            if (module->network.get() == te.network) te.executor = module->executor.get();
        }
    }

    // RAM's books, whether or not a module computes on the CPU: a job's
    // decoded images are counted there (pipeline/request.h).
    host_ledger_ =
        ledgers_.count("CPU") ? ledgers_["CPU"] : runtime::shared_ledger("CPU", nullptr, budgets_.for_device("CPU"));

    if (options.plan_only) return Status::Ok();
    // Weights load when a graph first needs them (or load_weights()), from
    // where the params are then: auto-fit may still move them.
    for (Module* m : by_priority_) {
        m->executor->set_loader([m]() -> Status {
            runtime::ModuleWeights& weights = m->weights();
            KILN_TRY(weights.load_params(weights.params_location(), m->backend, m->params_buft));
            KILN_LOG_VERBOSE("%s: weights loaded (%s)", m->executor_name.c_str(),
                             runtime::params_location_name(weights.params_location()));
            return Status::Ok();
        });
    }
    return Status::Ok();
}

Status Model::add_split_devices(Module& m, int threads) {
    const ModulePlacement& p = *m.placement;
    if (p.split_devices.empty()) return Status::Ok();
    std::vector<ggml_backend_dev_t> devices;
    for (const std::string& name : p.split_devices) {
        auto dev = device_of(name);
        if (!dev.ok()) return dev.error();
        auto compute = runtime::Compute::create(*dev, threads);
        if (!compute.ok()) return compute.error();
        ledger_for(name, *dev);
        auto& store = stores_[name];
        if (!store) store = runtime::shared_store(name, *dev, budgets_.for_device(name), (*compute)->buffer_type());
        m.executor->add_split_device(std::move(compute).value(), *store);
        devices.push_back(*dev);
    }
    if (p.row_split_asked) {
        // ggml offers row split through a backend's split buffer type (CUDA's);
        // kiln's executor does not place weights in one yet.
        std::string offered;
        for (ggml_backend_dev_t dev : devices) {
            ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
            if (reg && ggml_backend_reg_get_proc_address(reg, "ggml_backend_split_buffer_type")) {
                offered = ggml_backend_reg_name(reg);
            }
        }
        KILN_LOG_WARN("--split-mode row: %s; %s runs as a layer split",
                      offered.empty() ? "none of the listed devices offers a split buffer type (ggml has one for CUDA)"
                                      : (offered + "'s split buffers are not used by kiln yet").c_str(),
                      m.executor_name.c_str());
    }
    return Status::Ok();
}

Result<ggml_backend_dev_t> Model::device_of(const std::string& name) const {
    if (name == "CPU") return static_cast<ggml_backend_dev_t>(nullptr);
    auto dev = runtime::find_device(name);
    if (!dev.ok()) return Error{"--backend: " + dev.error().message};
    return *dev;
}

runtime::DeviceLedger& Model::ledger_for(const std::string& name, ggml_backend_dev_t dev) {
    auto& ledger = ledgers_[name];
    if (!ledger) ledger = runtime::shared_ledger(name, dev, budgets_.for_device(name));
    return *ledger;
}

Status Model::place_params(Module& m, runtime::ParamsLocation where) {
    if (auto r = reserved_params_.find(m.executor_name); r != reserved_params_.end()) {
        r->second.first->release(r->second.second);
        reserved_params_.erase(r);
    }
    runtime::DeviceLedger* params_ledger = nullptr;
    m.params_buft = nullptr;
    const bool on_cpu = m.placement->compute_device == "CPU";
    if (on_cpu && where == runtime::ParamsLocation::Host) where = runtime::ParamsLocation::ComputeDevice;
    m.placement->params = where;
    m.weights().set_params_location(where);
    if (where == runtime::ParamsLocation::ComputeDevice && !on_cpu) {
        m.params_buft = m.executor->compute().buffer_type();
        params_ledger = &m.executor->store().ledger();
    } else if (where == runtime::ParamsLocation::OtherDevice) {
        auto other = device_of(m.placement->params_device);
        if (!other.ok()) return Error{"--params-backend: " + other.error().message};
        m.params_buft = ggml_backend_dev_buffer_type(*other);
        params_ledger = &ledger_for(m.placement->params_device, *other);
    }
    if (!params_ledger) return Status::Ok();
    const uint64_t need = m.weights().allocation_size(m.params_buft);
    const uint64_t limit = params_ledger->limit();
    if (params_ledger->managed() + need > limit) {
        return Error::out_of_memory(
            "out of memory: the " + m.executor_name + " weights need " + human_bytes(need) + " on " +
            params_ledger->device_name() + ", the budget leaves " +
            human_bytes(limit > params_ledger->managed() ? limit - params_ledger->managed() : 0) +
            " (keep them in RAM with --params-backend " + m.role() + "=cpu, or on disk)");
    }
    params_ledger->add(need);
    reserved_params_[m.executor_name] = {params_ledger, need};
    return Status::Ok();
}

Status Model::keep_params_in_ram(Module& module) { return place_params(module, runtime::ParamsLocation::Host); }

Status Model::load_weights() {
    for (Module* m : by_priority_) KILN_TRY(m->executor->load_weights());
    return Status::Ok();
}

void Model::release_caches() {
    for (auto& module : modules_) module->executor->release_workspace();
    for (auto& [name, store] : stores_) store->evict_all();
}

void Model::forget_weight_copies() {
    release_caches();
    encoded_constants_.clear();
    for (auto& [name, store] : stores_) {
        for (auto& module : modules_) store->drop_module(module->weights());
    }
}

}  // namespace kiln::pipeline
