#include "hub_client.h"

#include <curl/curl.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>

#include "util/format.h"

namespace kiln::cli {
namespace {

// The largest file list kiln reads (the biggest repositories list a few MB).
constexpr size_t kMaxListingBytes = 64u << 20;
// An error page is kept only to quote its start.
constexpr size_t kMaxErrorBodyBytes = 4096;

void global_init_once() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Percent-encodes everything but RFC 3986's unreserved characters, and '/'
// when `keep_slash` (a file path inside the repo keeps its folders).
std::string url_encode(const std::string& text, bool keep_slash) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : text) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out;
}

bool starts_with_nocase(const std::string& text, const char* prefix) {
    size_t i = 0;
    for (; prefix[i]; ++i) {
        if (i >= text.size() || std::tolower(static_cast<unsigned char>(text[i])) != prefix[i]) return false;
    }
    return true;
}

std::optional<uint64_t> parse_u64(const std::string& text) {
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (errno == ERANGE || end == text.c_str()) return std::nullopt;
    return static_cast<uint64_t>(v);
}

std::string trim(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
}

// One transfer's state, shared by libcurl's callbacks. With redirects
// followed, every response's headers arrive here; a status line starts a
// new response, so what is kept is the last (the one whose body comes).
struct Transfer {
    long status = 0;
    std::optional<uint64_t> content_length;
    std::optional<uint64_t> range_start;  // Content-Range: bytes START-END/TOTAL
    std::optional<uint64_t> range_total;

    const BodySink* sink = nullptr;  // null: collect the body into `body`
    size_t body_limit = 0;
    std::string body;
    bool body_too_large = false;
    bool started = false;
    uint64_t received = 0;  // body bytes of a 2xx answer
    Status sink_error;

    bool success() const { return status >= 200 && status < 300; }
    // A status line: the headers before it belonged to a redirect.
    void new_response(long new_status) {
        status = new_status;
        content_length.reset();
        range_start.reset();
        range_total.reset();
        body.clear();
    }
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const std::string line(data, size * count);
    if (line.rfind("HTTP/", 0) == 0) {
        const auto space = line.find(' ');
        t->new_response(space == std::string::npos ? 0 : std::atol(line.c_str() + space + 1));
    } else if (starts_with_nocase(line, "content-length:")) {
        t->content_length = parse_u64(trim(line.substr(15)));
    } else if (starts_with_nocase(line, "content-range:")) {
        // "bytes 100-999/1000" ("bytes */1000" on a 416).
        const std::string value = trim(line.substr(14));
        const auto dash = value.find('-');
        const auto slash = value.find('/');
        if (value.rfind("bytes ", 0) == 0 && dash != std::string::npos) {
            t->range_start = parse_u64(value.substr(6, dash - 6));
        }
        if (slash != std::string::npos) t->range_total = parse_u64(value.substr(slash + 1));
    }
    return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const size_t n = size * count;
    if (!t->sink || !t->success()) {
        // A listing, or an error page kept to quote.
        const size_t limit = t->success() ? t->body_limit : kMaxErrorBodyBytes;
        if (t->body.size() + n > limit) {
            if (t->success()) {
                t->body_too_large = true;
                return 0;  // stops the transfer
            }
            t->body.append(data, limit - t->body.size());
            return n;
        }
        t->body.append(data, n);
        return n;
    }
    if (!t->started) {
        t->started = true;
        FetchStart start;
        if (t->status == 206) {
            start.offset = t->range_start.value_or(0);
            start.total = t->range_total;
        } else {
            start.total = t->content_length;
        }
        t->sink_error = t->sink->start(start);
        if (!t->sink_error.ok()) return 0;
    }
    t->received += n;
    t->sink_error = t->sink->write(data, n);
    return t->sink_error.ok() ? n : 0;
}

struct CurlHandle {
    CURL* curl = nullptr;
    curl_slist* headers = nullptr;
    ~CurlHandle() {
        curl_slist_free_all(headers);
        if (curl) curl_easy_cleanup(curl);
    }
};

// The first line of an error page, for the message (the hub answers JSON
// such as {"error":"Repository not found"}).
std::string quoted_body(const std::string& body) {
    std::string line = body.substr(0, body.find('\n'));
    if (line.size() > 200) line = line.substr(0, 200) + "...";
    line = trim(line);
    return line.empty() ? "" : " (the server said: " + escaped(line) + ")";
}

}  // namespace

HubClient::HubClient(std::string hub_url, std::string token) : hub_url_(std::move(hub_url)), token_(std::move(token)) {
    while (!hub_url_.empty() && hub_url_.back() == '/') hub_url_.pop_back();
}

namespace {

// Runs one GET of `url` into `t`; the error is a network failure naming the
// URL (HTTP statuses are the caller's to read from `t`).
Status perform_get(const std::string& url, const std::string& token, uint64_t offset, Transfer& t) {
    global_init_once();
    CurlHandle h;
    h.curl = curl_easy_init();
    if (!h.curl) return Error{"could not start an HTTP transfer (libcurl's curl_easy_init failed)"};
    char curl_error[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(h.curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h.curl, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(h.curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h.curl, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h.curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h.curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h.curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h.curl, CURLOPT_CONNECTTIMEOUT, 30L);
    // A stalled transfer (under 1 byte/s for a minute) is a network failure.
    curl_easy_setopt(h.curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h.curl, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h.curl, CURLOPT_USERAGENT, "kiln/" KILN_VERSION);
    curl_easy_setopt(h.curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h.curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h.curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h.curl, CURLOPT_WRITEDATA, &t);
    // A plain Range header, not CURLOPT_RESUME_FROM: a server that ignores
    // it answers 200 with the whole file, which kiln takes from byte 0.
    const std::string range = std::to_string(offset) + "-";
    if (offset > 0) curl_easy_setopt(h.curl, CURLOPT_RANGE, range.c_str());
    if (!token.empty()) {
        h.headers = curl_slist_append(h.headers, ("Authorization: Bearer " + token).c_str());
        curl_easy_setopt(h.curl, CURLOPT_HTTPHEADER, h.headers);
    }
    const CURLcode code = curl_easy_perform(h.curl);
    if (!t.sink_error.ok()) return t.sink_error;
    if (t.body_too_large) {
        return Error::bad_file(url + ": the reply is larger than " + human_bytes(t.body_limit) +
                               ", more than any file list");
    }
    if (code == CURLE_OK) return Status::Ok();
    const std::string why = curl_error[0] ? curl_error : curl_easy_strerror(code);
    if (t.success() && t.started) {
        return Error{"the connection was cut after " + grouped(t.received) + " bytes of " + url + " (" + why + ")"};
    }
    return Error{"network error on " + url + ": " + why};
}

// The error for an HTTP status of 400 or more. `what` names what was asked
// for: "repository owner/name at revision main", "file x of owner/name ...".
Error http_error(long status, const std::string& url, const std::string& what, const std::string& body,
                 bool token_sent) {
    const std::string head = "HTTP " + std::to_string(status) + " from " + url;
    if (status == 401 || status == 403) {
        return Error{head + ": the hub refused access to " + what + quoted_body(body) +
                     (token_sent ? "; the token in HF_TOKEN does not give access to it (a gated repository needs "
                                   "its terms accepted on the hub first)"
                                 : "; it is private, gated or does not exist: set HF_TOKEN to an access token "
                                   "that can read it")};
    }
    if (status == 404) return Error{head + ": no " + what + " on the hub" + quoted_body(body)};
    return Error{head + " for " + what + quoted_body(body)};
}

bool is_hex64(const std::string& s) {
    if (s.size() != 64) return false;
    for (char c : s) {
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    }
    return true;
}

// A listed file path must stay inside the folder it is written to.
std::optional<std::string> check_listed_path(const std::string& path) {
    if (path.empty()) return "an empty file name";
    if (path.size() > 1024) return "a file name of " + std::to_string(path.size()) + " bytes";
    if (path[0] == '/') return "an absolute path";
    // What kiln's messages escape (control and bidirectional control
    // characters, invalid UTF-8, backslashes) has no place in a file name:
    // a U+202E shows "gpj.exe" as "exe.jpg".
    if (escaped(path) != path) {
        return "a control character, bidirectional control, invalid UTF-8 or backslash in a file name";
    }
    size_t start = 0;
    while (true) {
        const size_t slash = path.find('/', start);
        const std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        if (part.empty() || part == "." || part == "..") return "a '" + part + "' part in a file name";
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    return std::nullopt;
}

}  // namespace

Result<std::vector<HubFile>> HubClient::list_files(const std::string& repo, const std::string& revision) const {
    const std::string url =
        hub_url_ + "/api/models/" + url_encode(repo, true) + "/revision/" + url_encode(revision, false) + "?blobs=true";
    Transfer t;
    t.body_limit = kMaxListingBytes;
    KILN_TRY(perform_get(url, token_, 0, t));
    const std::string what = "repository " + repo + " at revision " + revision;
    if (!t.success()) return http_error(t.status, url, what, t.body, !token_.empty());

    const nlohmann::json doc = nlohmann::json::parse(t.body, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
        return Error::bad_file(url + ": the reply is not a JSON object" + quoted_body(t.body));
    }
    auto siblings = doc.find("siblings");
    if (siblings == doc.end() || !siblings->is_array()) {
        return Error::bad_file(url + ": the reply has no 'siblings' list of files");
    }
    std::vector<HubFile> files;
    for (const nlohmann::json& s : *siblings) {
        const auto name = s.is_object() ? s.find("rfilename") : s.end();
        if (!s.is_object() || name == s.end() || !name->is_string()) {
            return Error::bad_file(url + ": a 'siblings' entry without an 'rfilename' string");
        }
        HubFile f;
        f.path = name->get<std::string>();
        if (auto problem = check_listed_path(f.path)) {
            return Error::bad_file(url + ": the file list names '" + escaped(f.path) + "', " + *problem +
                                   ", which kiln refuses to write");
        }
        if (auto size = s.find("size"); size != s.end() && size->is_number_unsigned()) f.size = size->get<uint64_t>();
        if (auto lfs = s.find("lfs"); lfs != s.end() && lfs->is_object()) {
            if (auto sha = lfs->find("sha256"); sha != lfs->end() && sha->is_string()) {
                f.sha256 = sha->get<std::string>();
                if (!is_hex64(f.sha256)) {
                    return Error::bad_file(url + ": lfs.sha256 of " + f.path + " is '" + escaped(f.sha256) +
                                           "', not 64 hex digits");
                }
                for (char& c : f.sha256) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            }
            if (auto size = lfs->find("size"); !f.size && size != lfs->end() && size->is_number_unsigned()) {
                f.size = size->get<uint64_t>();
            }
        }
        files.push_back(std::move(f));
    }
    return files;
}

Status HubClient::fetch(const std::string& repo, const std::string& revision, const std::string& file, uint64_t offset,
                        const BodySink& sink, bool* range_refused) const {
    const std::string url = hub_url_ + "/" + url_encode(repo, true) + "/resolve/" + url_encode(revision, false) + "/" +
                            url_encode(file, true);
    if (range_refused) *range_refused = false;
    Transfer t;
    t.sink = &sink;
    KILN_TRY(perform_get(url, token_, offset, t));
    if (t.status == 416 && offset > 0 && range_refused) {
        *range_refused = true;
        return Status::Ok();
    }
    if (!t.success()) {
        return http_error(t.status, url, "file " + file + " in repository " + repo + " at revision " + revision, t.body,
                          !token_.empty());
    }
    if (!t.started) {
        // An empty body: the sink still learns where it starts.
        FetchStart start;
        start.offset = t.status == 206 ? t.range_start.value_or(0) : 0;
        start.total = t.status == 206 ? t.range_total : t.content_length;
        KILN_TRY(sink.start(start));
    }
    return Status::Ok();
}

std::optional<std::string> check_repo_name(const std::string& repo) {
    if (repo.empty()) return std::string("expected a repository name such as openai/clip-vit-large-patch14");
    size_t start = 0;
    int parts = 0;
    while (true) {
        const size_t slash = repo.find('/', start);
        const std::string part = repo.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        ++parts;
        if (part.empty() || part[0] == '.' || part.size() > 96) {
            return "'" + escaped(repo) + "' is not a repository name (expected OWNER/NAME, e.g. " +
                   "openai/clip-vit-large-patch14)";
        }
        for (unsigned char c : part) {
            if (!std::isalnum(c) && c != '-' && c != '_' && c != '.') {
                return "'" + escaped(repo) + "' is not a repository name: only letters, digits, '-', '_' and '.' " +
                       "may appear in OWNER and NAME";
            }
        }
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    if (parts > 2) return "'" + escaped(repo) + "' is not a repository name (expected OWNER/NAME, one '/')";
    return std::nullopt;
}

std::optional<std::string> check_revision(const std::string& revision) {
    if (revision.empty()) return std::string("expected a branch, tag or commit, got an empty string");
    for (unsigned char c : revision) {
        if (c <= 0x20 || c >= 0x7f || c == '\\') {
            return "'" + escaped(revision) + "' is not a revision: spaces, control characters, backslashes and " +
                   "non-ASCII are not allowed";
        }
    }
    if (revision[0] == '/' || revision.back() == '/' || revision.find("//") != std::string::npos || revision == ".." ||
        revision.rfind("../", 0) == 0 || revision.find("/..") != std::string::npos || revision[0] == '.') {
        return "'" + escaped(revision) + "' is not a revision (empty, '.' or '..' parts)";
    }
    return std::nullopt;
}

}  // namespace kiln::cli
