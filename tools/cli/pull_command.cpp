#include "pull_command.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "cli.h"
#include "download_progress.h"
#include "file_download.h"
#include "hub_client.h"
#include "tokenizer_sources.h"
#include "util/format.h"
#include "util/kiln_cache.h"
#include "util/log.h"

namespace kiln::cli {
namespace {

constexpr const char* kDefaultHubUrl = "https://huggingface.co";

int fail(const Error& error) {
    KILN_LOG_ERROR("pull: %s", error.message.c_str());
    return exit_code_of(error.kind);
}

std::string env_or(const char* name, const std::string& fallback) {
    const char* value = std::getenv(name);
    return value && *value ? std::string(value) : fallback;
}

// What one `kiln pull` fetches, and where.
struct PullPlan {
    std::string repo;
    std::string revision;
    std::string folder;                 // files go to folder/PATH
    std::vector<std::string> wanted;    // exact paths (a tokenizer), or empty
    std::vector<std::string> patterns;  // --include patterns, or empty
};

Result<PullPlan> plan_of(const Options& options) {
    PullPlan plan;
    std::optional<std::string> cache_folder;
    if (const TokenizerSource* source = find_tokenizer_source(options.pull_tokenizer)) {
        plan.repo = source->repo;
        plan.revision = source->revision;
        plan.wanted = source->files;
        cache_folder = tokenizer_cache_folder(source->name);
    } else {
        plan.repo = options.pull_repo;
        plan.revision = options.pull_revision;
        plan.patterns = options.pull_includes;
        if (auto root = kiln_cache_root()) {
            cache_folder = *root + "/models/" + plan.repo + "/" + revision_folder_name(plan.revision);
        }
    }
    if (!options.pull_to.empty()) {
        plan.folder = options.pull_to;
    } else if (cache_folder) {
        plan.folder = *cache_folder;
    } else {
        return Error::invalid_request(
            "neither KILN_CACHE nor HOME is set, so kiln has no cache folder: set "
            "KILN_CACHE or pass --to DIR");
    }
    return plan;
}

bool matches_any(const std::string& path, const std::vector<std::string>& patterns) {
    for (const std::string& p : patterns) {
        if (fnmatch(p.c_str(), path.c_str(), 0) == 0) return true;
    }
    return false;
}

std::string joined(const std::vector<std::string>& items, size_t max_items) {
    std::string out;
    for (size_t i = 0; i < items.size() && i < max_items; ++i) out += (i ? ", " : "") + items[i];
    if (items.size() > max_items) out += ", ... (" + std::to_string(items.size()) + " in all)";
    return out;
}

// The listed files the plan asks for; an error names what is missing.
Result<std::vector<HubFile>> select_files(const PullPlan& plan, const std::vector<HubFile>& listed) {
    const std::string where = plan.repo + " at revision " + plan.revision;
    std::vector<std::string> names;
    for (const HubFile& f : listed) names.push_back(f.path);
    if (listed.empty()) return Error{where + " lists no files"};
    std::vector<HubFile> chosen;
    if (!plan.wanted.empty()) {
        for (const std::string& w : plan.wanted) {
            auto it = std::find_if(listed.begin(), listed.end(), [&](const HubFile& f) { return f.path == w; });
            if (it == listed.end()) return Error{where + " has no file " + w + " (it has: " + joined(names, 20) + ")"};
            chosen.push_back(*it);
        }
        return chosen;
    }
    for (const HubFile& f : listed) {
        if (plan.patterns.empty() || matches_any(f.path, plan.patterns)) chosen.push_back(f);
    }
    if (chosen.empty()) {
        return Error::invalid_request("no file of " + where + " matches --include " + joined(plan.patterns, 10) +
                                      " (it has: " + joined(names, 20) + ")");
    }
    return chosen;
}

}  // namespace

std::string revision_folder_name(const std::string& revision) {
    std::string out;
    for (char c : revision) out += c == '/' ? std::string("--") : std::string(1, c);
    return out;
}

int run_pull(const Options& options) {
    auto plan = plan_of(options);
    if (!plan.ok()) return fail(plan.error());
    const HubClient hub(options.pull_hub_url.empty() ? env_or("HF_ENDPOINT", kDefaultHubUrl) : options.pull_hub_url,
                        env_or("HF_TOKEN", ""));

    auto listed = hub.list_files(plan->repo, plan->revision);
    if (!listed.ok()) return fail(listed.error());
    auto files = select_files(*plan, *listed);
    if (!files.ok()) return fail(files.error());

    uint64_t total = 0;
    for (const HubFile& f : *files) total += f.size.value_or(0);
    KILN_LOG_INFO("pull: %s at %s from %s: %zu file(s), %s, into %s", plan->repo.c_str(), plan->revision.c_str(),
                  hub.hub_url().c_str(), files->size(), human_bytes(total).c_str(), plan->folder.c_str());

    DownloadProgress progress(isatty(STDOUT_FILENO) != 0);
    size_t fetched = 0;
    for (const HubFile& f : *files) {
        auto outcome =
            download_file(hub, plan->repo, plan->revision, f, plan->folder, options.pull_max_bytes, progress);
        if (!outcome.ok()) return fail(outcome.error());
        if (*outcome == DownloadOutcome::AlreadyThere) {
            KILN_LOG_INFO("pull: %s is already there (%s)", f.path.c_str(),
                          f.sha256.empty() ? "size matches" : "size and sha256 match");
        } else {
            ++fetched;
        }
    }
    KILN_LOG_INFO("pull: done: %zu file(s) in %s (%zu fetched, %zu already there)", files->size(), plan->folder.c_str(),
                  fetched, files->size() - fetched);
    return kExitOk;
}

}  // namespace kiln::cli
