#include "model_registry.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

namespace fs = std::filesystem;

namespace kiln::server {
namespace {

constexpr int kMaxFolderDepth = 4;

bool is_model_file(const fs::path& path) {
    std::string ext = path.extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ext != ".safetensors" && ext != ".gguf" && ext != ".ckpt" && ext != ".pt" && ext != ".pth" && ext != ".sft") {
        return false;
    }
    // Split files are one model, named by their first part ("-00001-of-00003").
    const std::string stem = path.stem().string();
    const auto of = stem.rfind("-of-");
    if (of != std::string::npos && of >= 6 && stem[of - 6] == '-') return stem.compare(of - 5, 5, "00001") == 0;
    return true;
}

// The folders ComfyUI and A1111 keep a model's parts and add-ons in, by
// their names (lower case): what is in them is no model to run on its own.
// Their own model folders (checkpoints/, diffusion_models/, unet/,
// Stable-diffusion/) are searched like any other.
bool is_parts_folder(const std::string& name) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const char* const kParts[] = {"vae",         "vae_approx",   "text_encoders", "clip",     "clip_vision",
                                         "loras",       "lora",         "lycoris",       "embeddings", "upscale_models",
                                         "esrgan",      "realesrgan",   "controlnet",    "hypernetworks",
                                         "style_models", "photomaker",  "gligen",        "taesd"};
    for (const char* part : kParts) {
        if (lower == part) return true;
    }
    return false;
}

// The kind of part a ComfyUI or A1111 folder holds, by its name: "vae",
// "text_encoder", or "" for a folder of another kind.
std::string part_kind_of_folder(const std::string& name) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "vae") return "vae";
    if (lower == "text_encoders" || lower == "text_encoder" || lower == "clip") return "text_encoder";
    return "";
}

// `path` lies inside `root` (both canonical), component by component.
bool inside(const fs::path& root, const fs::path& path) {
    auto r = root.begin();
    auto p = path.begin();
    for (; r != root.end(); ++r, ++p) {
        if (p == path.end() || *r != *p) return false;
    }
    return true;
}

// A listing reads the family of every file, on a request's thread: a
// safetensors header of 100 MB (a million tensors) took seconds and kept
// most of a GB resident. Real checkpoints have headers of a few hundred KB;
// a file past this bound gets no family (so it is never the default) and
// can still be asked for by name, when its load says what it is.
constexpr uint64_t kMaxListedHeaderBytes = 16ull << 20;

// The JSON header length a .safetensors file declares (its first 8 bytes,
// little-endian), or nullopt for another format or a file too short.
std::optional<uint64_t> safetensors_header_length(const std::string& path) {
    std::string ext = fs::path(path).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ext != ".safetensors" && ext != ".sft") return std::nullopt;
    std::ifstream in(path, std::ios::binary);
    unsigned char bytes[8];
    if (!in.read(reinterpret_cast<char*>(bytes), sizeof bytes)) return std::nullopt;
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[i];
    return length;
}

std::string family_of(const std::string& path) {
    if (auto header = safetensors_header_length(path); header && *header > kMaxListedHeaderBytes) {
        std::fprintf(stderr, "kiln serve: %s: a %llu-byte header, over the listing's %llu; not read for its family\n",
                     path.c_str(), static_cast<unsigned long long>(*header),
                     static_cast<unsigned long long>(kMaxListedHeaderBytes));
        return "";
    }
    char* text = nullptr;
    char* error = nullptr;
    std::string family;
    if (kiln_model_describe(path.c_str(), 0, &text, &error) == KILN_OK && text) {
        const std::string report = text;
        const auto at = report.find("family: ");
        if (at != std::string::npos) {
            const auto end = report.find('\n', at);
            family = report.substr(at + 8, end == std::string::npos ? std::string::npos : end - at - 8);
        }
    }
    kiln_free_string(text);
    kiln_free_string(error);
    return family;
}

// Whether `kiln info`'s family label names a family kiln generates with.
// What it recognises but cannot run has labels of its own
// (src/models/registry.cpp: a text encoder or UNet alone "(...)", a VAE,
// "unknown" for a LoRA or anything else), and "" is a file it could not read.
bool runnable_family(const std::string& family) {
    return !family.empty() && family != "unknown" && family != "VAE" &&
           family.find('(') == std::string::npos;
}

// A1111 titles carry a hash ("model.safetensors [6ce0161689]"); the name is before it.
std::string without_hash(const std::string& name) {
    if (name.size() > 3 && name.back() == ']') {
        const auto open = name.rfind(" [");
        if (open != std::string::npos) return name.substr(0, open);
    }
    return name;
}

[[noreturn]] void bad_model(const std::string& field, const std::string& name, const std::string& problem) {
    throw RequestError{400, field, field + ": '" + name + "' " + problem};
}

}  // namespace

ModelRegistry::ModelRegistry(const ServerOptions& options) : options_(options) {}

ModelRegistry::~ModelRegistry() {
    for (Loaded& l : loaded_) kiln_context_free(l.ctx);
}

std::vector<ModelEntry> ModelRegistry::list() {
    std::vector<ModelEntry> entries;
    if (options_.model_dir.empty()) {
        entries.push_back({fs::path(options_.model).filename().string(), options_.model, ""});
    } else {
        std::error_code ec;
        const fs::path root = fs::canonical(options_.model_dir, ec);
        if (ec) return entries;
        std::vector<std::pair<std::string, std::string>> links_out;  // link, target
        // Symlinked folders are followed (kept inside the folder's real path below; the depth bound ends loops).
        fs::recursive_directory_iterator it(
            root, fs::directory_options::skip_permission_denied | fs::directory_options::follow_directory_symlink, ec);
        for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            const fs::path& path = it->path();
            if (path.filename().string().front() == '.') {
                if (it->is_directory(ec)) it.disable_recursion_pending();
                continue;
            }
            // A symlink counts only when it points inside the folder.
            std::error_code link_ec;
            const fs::path target = fs::canonical(path, link_ec);
            if (link_ec || !inside(root, target)) {
                if (!link_ec && it->is_symlink(link_ec)) links_out.emplace_back(path.string(), target.string());
                if (it->is_directory(ec)) it.disable_recursion_pending();
                continue;
            }
            const std::string name = path.lexically_relative(root).generic_string();
            if (fs::is_directory(target, link_ec) && is_parts_folder(path.filename().string())) {
                it.disable_recursion_pending();
                continue;
            }
            if (fs::is_directory(target, link_ec)) {
                if (fs::exists(target / "model_index.json", link_ec)) {
                    entries.push_back({name, target.string(), ""});
                    it.disable_recursion_pending();
                } else if (it.depth() + 1 >= kMaxFolderDepth) {
                    it.disable_recursion_pending();
                }
            } else if (is_model_file(path)) {
                entries.push_back({name, target.string(), ""});
            }
        }
        // Said once per link: the folder is listed again at every request.
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& [link, target] : links_out) {
            if (!warned_links_.insert(link).second) continue;
            std::fprintf(stderr, "kiln serve: %s: a symlink out of the model folder (to %s); not offered\n",
                         link.c_str(), target.c_str());
        }
    }
    std::sort(entries.begin(), entries.end(), [](const ModelEntry& a, const ModelEntry& b) { return a.name < b.name; });
    bool described = false;
    for (ModelEntry& e : entries) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto cached = family_cache_.find(e.path);
        if (cached == family_cache_.end()) {
            cached = family_cache_.emplace(e.path, family_of(e.path)).first;
            described = true;
        }
        e.family = cached->second;
    }
    // Only what runs: a VAE, a LoRA or a text encoder alone is no model (a
    // file kiln could not read, family "", stays: its load says what is wrong).
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [](const ModelEntry& e) { return !e.family.empty() && !runnable_family(e.family); }),
                  entries.end());
    // Describing a model parses its header: give the memory back to the
    // system, not to this thread's malloc arena.
    if (described) malloc_trim(0);
    return entries;
}

std::string in_request_terms(const std::string& message) {
    std::string out = message;
    for (const char* part : {"clip_l", "clip_g", "t5xxl", "llm", "vae"}) {
        const std::string flag = std::string("pass --") + part;
        const std::string field = std::string("name one of the model folder's parts in the request's \"") + part +
                                  "\" field (GET /kiln/v1/models lists them)";
        size_t at = 0;
        while ((at = out.find(flag, at)) != std::string::npos) {
            // Only the whole flag: "pass --clip_l" is not "pass --clip_lx".
            const size_t end = at + flag.size();
            if (end < out.size() && (std::isalnum(static_cast<unsigned char>(out[end])) || out[end] == '_')) {
                at = end;
                continue;
            }
            out.replace(at, flag.size(), field);
            at += field.size();
        }
    }
    return out;
}

std::string ModelParts::describe() const {
    std::string out;
    for (const auto& [key, path] : {std::pair<const char*, const std::string*>{"vae", &vae}, {"clip_l", &clip_l},
                                    {"clip_g", &clip_g}, {"t5xxl", &t5xxl}, {"llm", &llm}}) {
        if (!path->empty()) out += (out.empty() ? " with " : ", ") + std::string(key) + "=" + *path;
    }
    return out;
}

void ModelParts::apply(kiln_context_params& params) const {
    if (!vae.empty()) params.vae_path = vae.c_str();
    if (!clip_l.empty()) params.clip_l_path = clip_l.c_str();
    if (!clip_g.empty()) params.clip_g_path = clip_g.c_str();
    if (!t5xxl.empty()) params.t5xxl_path = t5xxl.c_str();
    if (!llm.empty()) params.llm_path = llm.c_str();
}

std::vector<PartEntry> ModelRegistry::parts() {
    std::vector<PartEntry> parts;
    if (options_.model_dir.empty()) return parts;
    std::error_code ec;
    const fs::path root = fs::canonical(options_.model_dir, ec);
    if (ec) return parts;
    for (fs::directory_iterator top(root, ec); !ec && top != fs::directory_iterator(); top.increment(ec)) {
        const std::string kind = part_kind_of_folder(top->path().filename().string());
        std::error_code kind_ec;
        if (kind.empty() || !top->is_directory(kind_ec)) continue;
        fs::recursive_directory_iterator it(top->path(),
                                            fs::directory_options::skip_permission_denied |
                                                fs::directory_options::follow_directory_symlink,
                                            kind_ec);
        for (; !kind_ec && it != fs::recursive_directory_iterator(); it.increment(kind_ec)) {
            std::error_code file_ec;
            const fs::path target = fs::canonical(it->path(), file_ec);
            // Inside the folder's real path only; the depth bound ends symlink loops.
            if (file_ec || !inside(root, target) || it->path().filename().string().front() == '.' ||
                it.depth() >= kMaxFolderDepth) {
                if (it->is_directory(file_ec)) it.disable_recursion_pending();
                continue;
            }
            if (!fs::is_directory(target, file_ec) && is_model_file(it->path())) {
                parts.push_back({it->path().lexically_relative(root).generic_string(), target.string(), kind});
            }
        }
    }
    std::sort(parts.begin(), parts.end(), [](const PartEntry& a, const PartEntry& b) { return a.name < b.name; });
    return parts;
}

PartEntry ModelRegistry::resolve_part(const std::string& name, const std::string& field) {
    const std::vector<PartEntry> listed = parts();
    for (const PartEntry& p : listed) {
        if (p.name == name) return p;
    }
    // "ae.safetensors" for "vae/ae.safetensors": the name within its kind's folder.
    for (const PartEntry& p : listed) {
        const auto slash = p.name.find('/');
        if (slash != std::string::npos && p.name.compare(slash + 1, std::string::npos, name) == 0) return p;
    }
    std::string known;
    for (const PartEntry& p : listed) known += (known.empty() ? "" : ", ") + p.name;
    if (known.empty()) {
        bad_model(field, name,
                  options_.model_dir.empty()
                      ? "cannot be chosen: this server serves one model (-m); its parts come from its own flags"
                      : "is not a part of this server: its model folder has no vae/, text_encoders/ or clip/ files");
    }
    bad_model(field, name, "is not a part of this server (GET /kiln/v1/models lists them: " + known + ")");
}

ModelEntry ModelRegistry::resolve(const std::string& requested, const std::string& field) {
    std::string name = without_hash(requested);
    if (name.empty()) name = default_model();
    if (name.empty()) {
        throw RequestError{400, field,
                           field + ": none given, and no model of this server can be the default (GET /v1/models "
                                   "lists them with their families)"};
    }
    if (name.find('\0') != std::string::npos || name.find('\\') != std::string::npos) {
        bad_model(field, name, "is not a model name");
    }
    const fs::path relative(name);
    if (relative.is_absolute()) bad_model(field, name, "is an absolute path; name a model inside the model folder");
    for (const fs::path& part : relative) {
        if (part == "..") bad_model(field, name, "leaves the model folder ('..')");
    }
    if (!options_.model_dir.empty()) {
        std::error_code ec;
        const fs::path root = fs::canonical(options_.model_dir, ec);
        const fs::path target = fs::weakly_canonical(root / relative, ec);
        if (ec || !inside(root, target)) bad_model(field, name, "leaves the model folder");
    }
    const std::vector<ModelEntry> models = list();
    for (const ModelEntry& m : models) {
        if (m.name == name) return m;
    }
    // A1111 clients may send the name without its extension (model_name).
    for (const ModelEntry& m : models) {
        if (fs::path(m.name).replace_extension().generic_string() == name) return m;
    }
    std::string known;
    for (const ModelEntry& m : models) known += (known.empty() ? "" : ", ") + m.name;
    bad_model(field, name, "is not a model of this server (GET /v1/models lists them: " + known + ")");
}

std::string ModelRegistry::default_model() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!default_model_.empty()) return default_model_;
    }
    // -m's model is the one the user chose; its load says what is wrong with it.
    if (options_.model_dir.empty()) return fs::path(options_.model).filename().string();
    // The first listed that kiln can run: not a LoRA, a VAE alone or a broken file.
    for (const ModelEntry& m : list()) {
        if (runnable_family(m.family)) return m.name;
    }
    return "";
}

void ModelRegistry::set_default_model(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    default_model_ = name;
}

std::vector<std::string> ModelRegistry::loaded() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> names;
    for (const Loaded& l : loaded_) names.push_back(l.name);
    return names;
}

std::vector<DeviceMemory> ModelRegistry::memory() {
    // Under the lock no context can be freed: eviction takes it out of
    // loaded_ first.
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<DeviceMemory> memory;
    for (const Loaded& l : loaded_) {
        kiln_device_memory devices[16];
        const int count = std::min(kiln_memory_devices(l.ctx, devices, 16), 16);
        for (int i = 0; i < count; ++i) {
            const bool known = std::any_of(memory.begin(), memory.end(),
                                           [&](const DeviceMemory& m) { return m.name == devices[i].name; });
            if (!known) memory.push_back({devices[i].name, devices[i].managed, devices[i].peak, devices[i].budget});
        }
    }
    std::sort(memory.begin(), memory.end(),
              [](const DeviceMemory& a, const DeviceMemory& b) { return a.name < b.name; });
    return memory;
}

void ModelRegistry::evict_least_recent() {
    kiln_context* ctx = nullptr;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (loaded_.empty()) return;
        std::fprintf(stderr, "kiln serve: unloading %s\n", loaded_.back().name.c_str());
        ctx = loaded_.back().ctx;
        loaded_.pop_back();
    }
    kiln_context_free(ctx);
}

kiln_status ModelRegistry::acquire(const ModelEntry& model, const ModelParts& parts, kiln_context** ctx,
                                   std::string* error) {
    const std::string with = parts.describe();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = loaded_.begin(); it != loaded_.end(); ++it) {
            if (it->name == model.name && it->parts == with) {
                loaded_.splice(loaded_.begin(), loaded_, it);
                *ctx = it->ctx;
                return KILN_OK;
            }
        }
    }
    while (loaded().size() >= static_cast<size_t>(std::max(1, options_.max_loaded_models))) evict_least_recent();
    kiln_context_params params = options_.context;
    params.model_path = model.path.c_str();
    parts.apply(params);
    for (;;) {
        std::fprintf(stderr, "kiln serve: loading %s%s\n", model.name.c_str(), with.c_str());
        char* message = nullptr;
        kiln_context* created = nullptr;
        const kiln_status status = kiln_context_create(&params, &created, &message);
        if (status == KILN_OK) {
            {
                std::lock_guard<std::mutex> lock(mutex_);
                loaded_.push_front({model.name, with, created});
            }
            *ctx = created;
            return KILN_OK;
        }
        *error = message ? message : "loading " + model.name + " failed";
        kiln_free_string(message);
        // Out of memory with others loaded: free the least recently used and try again.
        if (status != KILN_ERROR_OUT_OF_MEMORY || loaded().empty()) return status;
        evict_least_recent();
    }
}

}  // namespace kiln::server
