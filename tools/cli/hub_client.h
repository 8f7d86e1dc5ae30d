// HTTP access to a Hugging Face-style hub (libcurl): a repository's file
// list and the bytes of one file. HTTPS, redirects (the public hub sends
// large files to a CDN) and byte ranges (resuming) are libcurl's; what the
// answers mean for kiln (errors that name the repo, file and HF_TOKEN) is
// here. Nothing here touches the disk: file_download.h does.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "util/result.h"

namespace kiln::cli {

// One file of a repository, as the hub lists it.
struct HubFile {
    std::string path;              // rfilename: "vocab.json", "text_encoder/model.safetensors"
    std::optional<uint64_t> size;  // the file's size, when the hub says
    std::string sha256;            // lfs.sha256 (64 lowercase hex digits), "" when not given
};

// What a GET of a file's bytes turned out to be, told to the body's sink
// before its first byte.
struct FetchStart {
    uint64_t offset = 0;            // where the body starts in the file: the asked offset (206) or 0 (200)
    std::optional<uint64_t> total;  // the whole file's size, from Content-Range or Content-Length
};

// Receives a body: `start` once, then `write` for each chunk. An error from
// either (a disk error) stops the transfer and is what fetch() returns.
struct BodySink {
    std::function<Status(const FetchStart&)> start;
    std::function<Status(const char* data, size_t size)> write;
};

class HubClient {
  public:
    // `hub_url`: "https://huggingface.co" or a test server's
    // "http://127.0.0.1:PORT" (a trailing slash is ignored). `token`: sent as
    // "Authorization: Bearer TOKEN" when not empty (libcurl does not forward
    // it when a redirect leads to another host).
    HubClient(std::string hub_url, std::string token);

    // GET /api/models/{repo}/revision/{revision}?blobs=true: the `siblings`
    // array. A path that could leave the destination folder ("..", an
    // absolute path) is a BadFile error naming it, as is a reply that is not
    // the JSON the hub sends.
    Result<std::vector<HubFile>> list_files(const std::string& repo, const std::string& revision) const;

    // GET /{repo}/resolve/{revision}/{file} from byte `offset` (a Range
    // request when offset > 0), following redirects, into `sink`. A server
    // that ignores the range answers 200 and the sink is told offset 0.
    // `range_refused` (may be null) is set when the server answers 416 (the
    // offset is past the file's end); fetch() then returns Ok and the sink
    // sees nothing. A cut connection is an error saying how many bytes came.
    Status fetch(const std::string& repo, const std::string& revision, const std::string& file, uint64_t offset,
                 const BodySink& sink, bool* range_refused = nullptr) const;

    const std::string& hub_url() const { return hub_url_; }

  private:
    std::string hub_url_;
    std::string token_;
};

// A repository name as the hub writes it: NAME or OWNER/NAME, each part of
// letters, digits, '-', '_' and '.', not starting with '.'. Returns the
// problem, or nullopt when the name is fine.
std::optional<std::string> check_repo_name(const std::string& repo);

// A revision: a branch, tag or commit ("main", "v1.0", "refs/pr/3"):
// printable, no spaces, no ".." part. Returns the problem or nullopt.
std::optional<std::string> check_revision(const std::string& revision);

}  // namespace kiln::cli
