// `kiln pull` against a hub on 127.0.0.1: a cpp-httplib server in the test
// process serves the hub's URL layout (/api/models/{repo}/revision/{rev},
// /{repo}/resolve/{rev}/{file}) from a folder the test writes, and the real
// kiln binary downloads from it. Sizes and sha256 sums in the served lists
// come from the system's sha256sum, not from kiln.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "download_progress.h"
#include "golden.h"
#include "image/image_io.h"
#include "test_files.h"
#include "util/sha256.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::TempDir;

std::string read_text(const std::string& path) {
    auto b = test::read_bytes(path);
    return std::string(b.begin(), b.end());
}

bool exists(const std::string& path) { return fs::exists(path); }

// sha256sum's digest of a file: the reference the served lists carry.
std::string reference_sha256(const std::string& path) {
    auto r = run_command("sha256sum '" + path + "'");
    return r.exit_code == 0 ? r.out.substr(0, 64) : "";
}

// `count` bytes no two neighbouring windows of which repeat, so a resumed
// download stitched at the wrong offset cannot pass for the original.
std::vector<uint8_t> pattern_bytes(size_t count) {
    std::vector<uint8_t> out(count);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < count; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out[i] = static_cast<uint8_t>(x);
    }
    return out;
}

// The hub: ROOT/OWNER/NAME/PATH is file PATH of repository OWNER/NAME, at
// every revision. JSON files are listed without lfs (as the public hub
// lists small git files), all others with lfs.sha256.
class LocalHub {
  public:
    explicit LocalHub(std::string root) : root_(std::move(root)) {
        server_.Get(R"(/api/models/([^/]+/[^/]+)/revision/([^/]+))",
                    [this](const httplib::Request& req, httplib::Response& res) { list(req, res); });
        server_.Get(R"(/([^/]+/[^/]+)/resolve/([^/]+)/(.+))",
                    [this](const httplib::Request& req, httplib::Response& res) { resolve(req, res, false); });
        server_.Get(R"(/cdn/([^/]+/[^/]+)/(.+))",
                    [this](const httplib::Request& req, httplib::Response& res) { resolve(req, res, true); });
        port_ = server_.bind_to_any_port("127.0.0.1");
        thread_ = std::thread([this] { server_.listen_after_bind(); });
        while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ~LocalHub() {
        server_.stop();
        thread_.join();
    }

    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

    // Behaviour, set before the first request.
    std::string required_token;                     // non-empty: 401 without "Bearer TOKEN"
    std::map<std::string, size_t> cut_after;        // "REPO/PATH": the first GET sends this many bytes, then hangs up
    std::map<std::string, std::string> listed_sha;  // "REPO/PATH": the sha256 the list gives instead
    std::set<std::string> redirected;               // "REPO/PATH": resolve answers 302 to /cdn/REPO/PATH
    std::set<std::string> unserved;                 // "REPO/PATH": listed, but resolve answers 404
    std::string extra_sibling;                      // a raw JSON object appended to every list
    bool ignore_ranges = false;                     // answer every GET with 200 and the whole file, as some servers do
    std::set<std::string> endless;                  // "REPO/PATH": resolve sends the file, then zeros for ever
    std::set<std::string> unsized;                  // "REPO/PATH": listed without a size (nor lfs)

    // What the server saw.
    std::vector<std::string> range_headers() {
        std::lock_guard<std::mutex> lock(mutex_);
        return ranges_;
    }
    int cdn_requests() const { return cdn_requests_; }
    int file_requests() const { return file_requests_; }

  private:
    bool authorized(const httplib::Request& req, httplib::Response& res) {
        if (required_token.empty() || req.get_header_value("Authorization") == "Bearer " + required_token) return true;
        res.status = 401;
        res.set_content(R"({"error":"Invalid credentials in Authorization header"})", "application/json");
        return false;
    }

    void list(const httplib::Request& req, httplib::Response& res) {
        if (!authorized(req, res)) return;
        const std::string repo = req.matches[1];
        const fs::path folder = fs::path(root_) / repo;
        if (!fs::is_directory(folder)) {
            res.status = 404;
            res.set_content(R"({"error":"Repository not found"})", "application/json");
            return;
        }
        std::vector<std::string> paths;
        for (const auto& e : fs::recursive_directory_iterator(folder)) {
            if (e.is_regular_file()) paths.push_back(fs::relative(e.path(), folder).string());
        }
        std::sort(paths.begin(), paths.end());
        std::string json = R"({"id":")" + repo + R"(","sha":"0123456789abcdef0123456789abcdef01234567","siblings":[)";
        for (size_t i = 0; i < paths.size(); ++i) {
            const std::string full = (folder / paths[i]).string();
            const std::string size = std::to_string(fs::file_size(full));
            json += (i ? "," : "") + std::string(R"({"rfilename":")") + paths[i] + '"';
            if (unsized.count(repo + "/" + paths[i])) {
                json += "}";
                continue;
            }
            json += R"(,"size":)" + size;
            if (fs::path(paths[i]).extension() != ".json") {
                auto it = listed_sha.find(repo + "/" + paths[i]);
                const std::string sha = it != listed_sha.end() ? it->second : reference_sha256(full);
                json += R"(,"lfs":{"sha256":")" + sha + R"(","size":)" + size + "}";
            }
            json += "}";
        }
        if (!extra_sibling.empty()) json += (paths.empty() ? "" : ",") + extra_sibling;
        json += "]}";
        res.set_content(json, "application/json");
    }

    void resolve(const httplib::Request& req, httplib::Response& res, bool from_cdn) {
        if (!from_cdn && !authorized(req, res)) return;
        const std::string repo = req.matches[1];
        const std::string path = from_cdn ? req.matches[2] : req.matches[3];
        const std::string key = repo + "/" + path;
        const fs::path file = fs::path(root_) / repo / path;
        if (!fs::is_regular_file(file) || unserved.count(key)) {
            res.status = 404;
            res.set_content("Entry not found", "text/plain");
            return;
        }
        if (!from_cdn && redirected.count(key)) {
            res.set_redirect("/cdn/" + key);
            return;
        }
        if (from_cdn) ++cdn_requests_;
        ++file_requests_;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ranges_.push_back(req.get_header_value("Range"));
        }
        auto data = std::make_shared<std::string>(read_text(file.string()));
        auto cut = cut_after.find(key);
        if (endless.count(key)) {
            // Chunked, so no length is announced: the file, then zeros until the client hangs up.
            res.set_chunked_content_provider(
                "application/octet-stream", [data](size_t offset, httplib::DataSink& sink) {
                    static const std::string zeros(65536, '\0');
                    return offset < data->size() ? sink.write(data->data() + offset, data->size() - offset)
                                                 : sink.write(zeros.data(), zeros.size());
                });
            return;
        }
        if (cut == cut_after.end() && ignore_ranges) {
            // Chunked: the one kind of answer httplib does not cut to the Range.
            res.set_chunked_content_provider("application/octet-stream",
                                             [data](size_t offset, httplib::DataSink& sink) {
                                                 if (offset < data->size()) {
                                                     sink.write(data->data() + offset, data->size() - offset);
                                                 } else {
                                                     sink.done();
                                                 }
                                                 return true;
                                             });
            return;
        }
        if (cut == cut_after.end()) {
            res.set_content(*data, "application/octet-stream");  // httplib answers a Range with 206
            return;
        }
        const size_t limit = cut->second;
        cut_after.erase(cut);
        // The whole length is announced, then the connection closes early.
        res.set_content_provider(data->size(), "application/octet-stream",
                                 [data, limit](size_t offset, size_t length, httplib::DataSink& sink) {
                                     if (offset >= limit) return false;
                                     sink.write(data->data() + offset, std::min(length, limit - offset));
                                     return offset + length <= limit;
                                 });
    }

    std::string root_;
    httplib::Server server_;
    int port_ = 0;
    std::thread thread_;
    std::mutex mutex_;
    std::vector<std::string> ranges_;
    std::atomic<int> cdn_requests_{0};
    std::atomic<int> file_requests_{0};
};

// A hub folder with repository acme/tiny: a 300 KB weight file (lfs), a
// config (plain git file), a nested file and a README.
struct Fixture {
    TempDir hub_root;
    TempDir work;
    std::string weights_path, config_path, nested_path, readme_path;
    Fixture() {
        weights_path = hub_root.write("acme/tiny/model.safetensors", pattern_bytes(300000));
        config_path = hub_root.write("acme/tiny/config.json", R"({"hidden": 4})");
        nested_path = hub_root.write("acme/tiny/text_encoder/model.safetensors", pattern_bytes(5000));
        readme_path = hub_root.write("acme/tiny/README.md", "# tiny\n");
    }
    std::string cache() const { return work.path() + "/cache"; }
    // kiln with only the environment the test gives it.
    std::string kiln(const std::string& env = "") const {
        return "env -u HF_TOKEN -u HF_ENDPOINT KILN_CACHE='" + cache() + "' " + env + " " + KILN_BIN + " ";
    }
};

bool same_file(const std::string& a, const std::string& b) {
    return exists(a) && exists(b) && test::read_bytes(a) == test::read_bytes(b);
}

std::vector<std::string> files_under(const std::string& folder) {
    std::vector<std::string> out;
    if (!fs::exists(folder)) return out;
    for (const auto& e : fs::recursive_directory_iterator(folder)) {
        if (e.is_regular_file()) out.push_back(fs::relative(e.path(), folder).string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

TEST(Pull, RepositoryWithIncludePatternsIntoTheCache) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    auto r =
        run_command(f.kiln() + "pull acme/tiny --include '*.json' --include 'text_encoder/*' --hub-url " + hub.url());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string folder = f.cache() + "/models/acme/tiny/main";
    EXPECT_EQ(files_under(folder), (std::vector<std::string>{"config.json", "text_encoder/model.safetensors"}));
    EXPECT_TRUE(same_file(folder + "/config.json", f.config_path));
    EXPECT_TRUE(same_file(folder + "/text_encoder/model.safetensors", f.nested_path));
    EXPECT_NE(r.out.find("sha256 ok"), std::string::npos) << r.out;  // the lfs file was checked
    EXPECT_NE(r.out.find("size ok"), std::string::npos) << r.out;    // the git file by size

    // A second run finds both verified and fetches nothing.
    const int requests = hub.file_requests();
    r = run_command(f.kiln() + "pull acme/tiny --include '*.json' --include 'text_encoder/*' --hub-url " + hub.url());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(hub.file_requests(), requests);
    EXPECT_NE(r.out.find("0 fetched, 2 already there"), std::string::npos) << r.out;
}

TEST(Pull, WholeRepositoryIntoAFolderWithTo) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    const std::string to = f.work.path() + "/models";
    auto r = run_command(f.kiln() + "pull acme/tiny --revision v1.0 --to " + to + " --hub-url " + hub.url());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(files_under(to), (std::vector<std::string>{"README.md", "config.json", "model.safetensors",
                                                         "text_encoder/model.safetensors"}));
    EXPECT_TRUE(same_file(to + "/model.safetensors", f.weights_path));
    EXPECT_TRUE(same_file(to + "/README.md", f.readme_path));
    EXPECT_FALSE(exists(f.cache())) << "--to writes nothing into the cache";
}

TEST(Pull, ResumesWithARangeAfterACutConnection) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    hub.cut_after["acme/tiny/model.safetensors"] = 120000;
    const std::string cmd = f.kiln() + "pull acme/tiny --include model.safetensors --hub-url " + hub.url();
    const std::string final_path = f.cache() + "/models/acme/tiny/main/model.safetensors";

    auto first = run_command(cmd);
    EXPECT_EQ(first.exit_code, 1);
    EXPECT_NE(first.err.find("run the same command again to resume"), std::string::npos) << first.err;
    EXPECT_FALSE(exists(final_path));
    ASSERT_TRUE(exists(final_path + ".kiln-part"));
    EXPECT_EQ(fs::file_size(final_path + ".kiln-part"), 120000u);

    auto second = run_command(cmd);
    ASSERT_EQ(second.exit_code, 0) << second.err;
    EXPECT_EQ(hub.range_headers(), (std::vector<std::string>{"", "bytes=120000-"}));
    EXPECT_TRUE(same_file(final_path, f.weights_path));
    EXPECT_FALSE(exists(final_path + ".kiln-part"));
    EXPECT_NE(second.out.find("resuming at"), std::string::npos) << second.out;
    EXPECT_NE(second.out.find("sha256 ok"), std::string::npos) << second.out;
}

// A server that ignores the Range sends the whole file again, which
// replaces the part instead of being appended to it.
TEST(Pull, ServerIgnoringTheRangeRestartsTheFile) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    hub.cut_after["acme/tiny/model.safetensors"] = 70000;
    hub.ignore_ranges = true;
    const std::string cmd = f.kiln() + "pull acme/tiny --include model.safetensors --hub-url " + hub.url();
    const std::string final_path = f.cache() + "/models/acme/tiny/main/model.safetensors";
    EXPECT_EQ(run_command(cmd).exit_code, 1);
    ASSERT_EQ(fs::file_size(final_path + ".kiln-part"), 70000u);

    auto second = run_command(cmd);
    ASSERT_EQ(second.exit_code, 0) << second.err << second.out;
    EXPECT_EQ(hub.range_headers(), (std::vector<std::string>{"", "bytes=70000-"}));
    EXPECT_TRUE(same_file(final_path, f.weights_path));
    EXPECT_EQ(second.out.find("resuming at"), std::string::npos) << second.out;
}

TEST(Pull, WrongChecksumIsRejectedAndLeavesNothing) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    hub.listed_sha["acme/tiny/model.safetensors"] = std::string(64, 'a');
    auto r = run_command(f.kiln() + "pull acme/tiny --include model.safetensors --hub-url " + hub.url());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("model.safetensors: sha256 " + reference_sha256(f.weights_path) +
                         " does not match the hub's " + std::string(64, 'a')),
              std::string::npos)
        << r.err;
    EXPECT_EQ(files_under(f.cache() + "/models/acme/tiny/main"), std::vector<std::string>{});
}

TEST(Pull, UnauthorizedNamesHfToken) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    hub.required_token = "hf_secret";
    const std::string args = "pull acme/tiny --include config.json --hub-url " + hub.url();

    auto none = run_command(f.kiln() + args);
    EXPECT_EQ(none.exit_code, 1);
    EXPECT_NE(none.err.find("HTTP 401"), std::string::npos) << none.err;
    EXPECT_NE(none.err.find("acme/tiny"), std::string::npos) << none.err;
    EXPECT_NE(none.err.find("set HF_TOKEN"), std::string::npos) << none.err;

    auto wrong = run_command(f.kiln("HF_TOKEN=hf_wrong") + args);
    EXPECT_EQ(wrong.exit_code, 1);
    EXPECT_NE(wrong.err.find("the token in HF_TOKEN does not give access"), std::string::npos) << wrong.err;

    auto right = run_command(f.kiln("HF_TOKEN=hf_secret") + args);
    EXPECT_EQ(right.exit_code, 0) << right.err;
    EXPECT_TRUE(same_file(f.cache() + "/models/acme/tiny/main/config.json", f.config_path));
}

TEST(Pull, MissingRepositoryOrFileIsNamed) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    auto repo = run_command(f.kiln() + "pull acme/nothing --hub-url " + hub.url());
    EXPECT_EQ(repo.exit_code, 1);
    EXPECT_NE(repo.err.find("HTTP 404"), std::string::npos) << repo.err;
    EXPECT_NE(repo.err.find("no repository acme/nothing at revision main"), std::string::npos) << repo.err;

    hub.unserved.insert("acme/tiny/README.md");
    auto file = run_command(f.kiln() + "pull acme/tiny --include README.md --hub-url " + hub.url());
    EXPECT_EQ(file.exit_code, 1);
    EXPECT_NE(file.err.find("no file README.md in repository acme/tiny"), std::string::npos) << file.err;
    EXPECT_EQ(files_under(f.cache() + "/models/acme/tiny/main"), std::vector<std::string>{});
}

TEST(Pull, FollowsARedirect) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    hub.redirected.insert("acme/tiny/model.safetensors");
    auto r = run_command(f.kiln() + "pull acme/tiny --include model.safetensors --hub-url " + hub.url());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(hub.cdn_requests(), 1);
    EXPECT_TRUE(same_file(f.cache() + "/models/acme/tiny/main/model.safetensors", f.weights_path));
}

TEST(Pull, BadRequestsExitWithUsageErrors) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    struct Case {
        std::string args, message;
    };
    for (const Case& c : std::vector<Case>{
             {"pull", "name a repository"},
             {"pull a/b/c", "not a repository name"},
             {"pull --tokenizer clip-x",
              "unknown tokenizer 'clip-x' (valid: clip-l, clip-g, t5xxl, qwen3, qwen2, llama, umt5)"},
             {"pull acme/tiny --tokenizer clip-l", "give one"},
             {"pull --tokenizer clip-l --revision v2", "--include and --revision apply to a repository pull"},
             {"pull acme/tiny --revision ../x", "is not a revision"},
             {"pull acme/tiny -p cat", "unknown option '-p'"},
             {"pull acme/tiny --include '*.bin' --hub-url " + hub.url(),
              "no file of acme/tiny at revision main "
              "matches --include *.bin"},
         }) {
        auto r = run_command(f.kiln() + c.args);
        EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
    }
}

TEST(Pull, NetworkAndDiskFailuresAreClearErrors) {
    Fixture f;
    // A port with nothing listening: bound, then closed.
    int port = 0;
    {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        ASSERT_GE(fd, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof addr;
        ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
        ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
        port = ntohs(addr.sin_port);
        ::close(fd);
    }
    auto offline = run_command(f.kiln() + "pull acme/tiny --hub-url http://127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(offline.exit_code, 1);
    EXPECT_NE(offline.err.find("network error on http://127.0.0.1:" + std::to_string(port)), std::string::npos)
        << offline.err;

    LocalHub hub(f.hub_root.path());
    const std::string blocker = f.work.write("not-a-folder", "x");
    auto disk =
        run_command(f.kiln() + "pull acme/tiny --include config.json --to " + blocker + "/sub --hub-url " + hub.url());
    EXPECT_EQ(disk.exit_code, 1);
    EXPECT_NE(disk.err.find(blocker), std::string::npos) << disk.err;

    // A list naming a path outside the destination is refused before any write.
    hub.extra_sibling = R"({"rfilename":"../escape.txt","size":1})";
    auto hostile = run_command(f.kiln() + "pull acme/tiny --to " + f.work.path() + "/dest --hub-url " + hub.url());
    EXPECT_EQ(hostile.exit_code, 1);
    EXPECT_NE(hostile.err.find("'../escape.txt', a '..' part in a file name"), std::string::npos) << hostile.err;
    EXPECT_FALSE(exists(f.work.path() + "/escape.txt"));
    EXPECT_FALSE(exists(f.work.path() + "/dest"));
}

// A hub that lists a size and then streams for ever is stopped at that
// size; with no size anywhere, at --max-size. Either way nothing is kept.
TEST(Pull, AnEndlessBodyStopsAtTheListedSizeOrMaxSize) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    hub.endless = {"acme/tiny/model.safetensors", "acme/tiny/README.md"};
    hub.unsized = {"acme/tiny/README.md"};
    const std::string to = f.work.path() + "/to";
    auto listed =
        run_command(f.kiln() + "pull acme/tiny --include model.safetensors --to " + to + " --hub-url " + hub.url());
    EXPECT_EQ(listed.exit_code, 1);
    EXPECT_NE(listed.err.find("model.safetensors: the server sends more than the 300,000 bytes the hub lists"),
              std::string::npos)
        << listed.err;
    auto unsized = run_command(f.kiln() + "pull acme/tiny --include README.md --max-size 1M --to " + to +
                               " --hub-url " + hub.url());
    EXPECT_EQ(unsized.exit_code, 1);
    EXPECT_NE(unsized.err.find("README.md: the server sends more than --max-size, 1,048,576 bytes"), std::string::npos)
        << unsized.err;
    EXPECT_EQ(files_under(to), std::vector<std::string>{});
    EXPECT_EQ(run_command(f.kiln() + "pull acme/tiny --max-size 0").exit_code, 2);
}

// A part name that is a symlink, or a subfolder that is one, would carry
// the download out of --to: refused, and the file outside stays as it was.
TEST(Pull, SymlinksAtThePartOrItsFolderAreNotFollowed) {
    Fixture f;
    LocalHub hub(f.hub_root.path());
    const std::string to = f.work.path() + "/to";
    const std::string outside = f.work.write("outside/victim.txt", "precious");
    fs::create_directories(to);
    fs::create_symlink(outside, to + "/config.json.kiln-part");
    auto part = run_command(f.kiln() + "pull acme/tiny --include config.json --to " + to + " --hub-url " + hub.url());
    EXPECT_EQ(part.exit_code, 1);
    EXPECT_NE(part.err.find("config.json.kiln-part is a symbolic link"), std::string::npos) << part.err;
    EXPECT_EQ(read_text(outside), "precious");
    EXPECT_FALSE(exists(to + "/config.json"));

    fs::create_symlink(f.work.path() + "/outside", to + "/text_encoder");
    auto folder =
        run_command(f.kiln() + "pull acme/tiny --include 'text_encoder/*' --to " + to + " --hub-url " + hub.url());
    EXPECT_EQ(folder.exit_code, 1);
    EXPECT_NE(folder.err.find("through a symbolic link"), std::string::npos) << folder.err;
    EXPECT_EQ(files_under(f.work.path() + "/outside"), std::vector<std::string>{"victim.txt"});
}

// A listed X.part is a file like any other, not X's partial download; a
// name ending in kiln's own part suffix is refused.
TEST(Pull, ListedFilesCannotBeMistakenForParts) {
    Fixture f;
    const std::string part_path = f.hub_root.write("acme/parts/ok.bin.part", pattern_bytes(3000));
    const std::string ok_path = f.hub_root.write("acme/parts/ok.bin", pattern_bytes(12000));
    LocalHub hub(f.hub_root.path());
    const std::string to = f.work.path() + "/to";
    auto r = run_command(f.kiln() + "pull acme/parts --to " + to + " --hub-url " + hub.url());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(same_file(to + "/ok.bin.part", part_path));
    EXPECT_TRUE(same_file(to + "/ok.bin", ok_path));

    f.hub_root.write("acme/parts/x.bin.kiln-part", "x");
    auto reserved = run_command(f.kiln() + "pull acme/parts --to " + to + " --hub-url " + hub.url());
    EXPECT_EQ(reserved.exit_code, 1);
    EXPECT_NE(reserved.err.find("x.bin.kiln-part, a name kiln keeps for its partial downloads"), std::string::npos)
        << reserved.err;
    EXPECT_FALSE(exists(to + "/x.bin.kiln-part"));
}

// U+202E (right-to-left override) shows "gpj.exe" as "exe.jpg": such names
// are refused, and the message shows the character escaped.
TEST(Pull, BidiControlsInFileNamesAreRefusedAndEscaped) {
    Fixture f;
    f.hub_root.write("acme/bidi/a\xe2\x80\xaegpj.exe", "x");
    LocalHub hub(f.hub_root.path());
    const std::string to = f.work.path() + "/to";
    auto r = run_command(f.kiln() + "pull acme/bidi --to " + to + " --hub-url " + hub.url());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("'a\\xe2\\x80\\xaegpj.exe', a control character, bidirectional control"), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("\xe2\x80\xae"), std::string::npos) << "the raw character reached the terminal";
    EXPECT_EQ(files_under(to), std::vector<std::string>{});
}

// `kiln pull --tokenizer clip-l` fills the cache, and a model without a
// tokenizer of its own then generates without --tokenizer, exactly as
// with --tokenizer pointing at the same files.
TEST(Pull, TokenizerInTheCacheIsFoundWithoutTheFlag) {
    Fixture f;
    const std::string fixture = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    for (const char* name : {"vocab.json", "merges.txt"}) {
        fs::create_directories(f.hub_root.path() + "/openai/clip-vit-large-patch14");
        fs::copy_file(fixture + "/" + name, f.hub_root.path() + "/openai/clip-vit-large-patch14/" + name);
    }
    f.hub_root.write("openai/clip-vit-large-patch14/model.safetensors", pattern_bytes(1000));  // not fetched
    LocalHub hub(f.hub_root.path());
    const std::string generate = std::string(" -t 1 -m ") + test::golden_path("models/sd1_tiny.safetensors") +
                                 " -p \"a red circle\" -W 32 -H 32 --steps 2 -s 3 -o ";

    auto before = run_command(f.kiln() + generate + f.work.file("before.png"));
    EXPECT_EQ(before.exit_code, 1);
    EXPECT_NE(before.err.find("looked in: " + f.cache() + "/tokenizers/clip-l"), std::string::npos) << before.err;
    EXPECT_NE(before.err.find("kiln pull --tokenizer clip-l"), std::string::npos) << before.err;

    auto pull = run_command(f.kiln() + "pull --tokenizer clip-l --hub-url " + hub.url());
    ASSERT_EQ(pull.exit_code, 0) << pull.err;
    EXPECT_EQ(files_under(f.cache() + "/tokenizers/clip-l"), (std::vector<std::string>{"merges.txt", "vocab.json"}));

    auto after = run_command(f.kiln() + generate + f.work.file("cached.png"));
    ASSERT_EQ(after.exit_code, 0) << after.err;
    auto flagged = run_command(f.kiln() + " --tokenizer " + fixture + generate + f.work.file("flag.png"));
    ASSERT_EQ(flagged.exit_code, 0) << flagged.err;
    auto a = image::read_image(f.work.file("cached.png"));
    auto b = image::read_image(f.work.file("flag.png"));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->pixels, b->pixels);
}

// SHA-256 against FIPS 180-2's examples.
TEST(Pull, Sha256MatchesTheStandardsVectors) {
    auto digest = [](const std::string& text) {
        Sha256 h;
        h.update(text.data(), text.size());
        return h.hex_digest();
    };
    EXPECT_EQ(digest(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(digest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    Sha256 million;
    const std::string chunk(1000, 'a');
    for (int i = 0; i < 1000; ++i) million.update(chunk.data(), chunk.size());
    EXPECT_EQ(million.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Pull, ProgressBarShowsSpeedAndEta) {
    EXPECT_EQ(cli::DownloadProgress::speed_text(3.5 * 1024 * 1024), "3.50 MiB/s");
    EXPECT_EQ(cli::DownloadProgress::eta_text(62), "ETA 1:02");
    EXPECT_EQ(cli::DownloadProgress::eta_text(3723), "ETA 1:02:03");
    EXPECT_EQ(cli::DownloadProgress::eta_text(-1), "ETA --");

    TempDir dir;
    std::FILE* out = std::fopen(dir.file("bar").c_str(), "w+");
    ASSERT_NE(out, nullptr);
    cli::DownloadProgress bar(/*terminal=*/true, out);
    bar.begin("model.safetensors", 0, 1000);
    bar.advance(500);
    bar.advance(500);  // within the redraw interval: finish() draws it
    bar.finish("sha256 ok");
    std::fclose(out);
    const std::string text = read_text(dir.file("bar"));
    EXPECT_NE(text.find("\r  model.safetensors  [........................]   0%  0 B / 1000 B"), std::string::npos)
        << text;
    EXPECT_NE(text.find("\r  model.safetensors  [########################] 100%  1000 B / 1000 B"), std::string::npos)
        << text;
    EXPECT_NE(text.find("ETA"), std::string::npos) << text;
    EXPECT_NE(text.find(" sha256 ok\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace kiln
