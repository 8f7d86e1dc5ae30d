// A1111's "Model hash" and "Lora hashes" (io/file_hashes.h): the hashes
// against sha256sum's, the cache in memory and in hashes.json (used for the
// same size and modification time only, never an error when it is corrupt
// or cannot be written), and the real kiln binary writing both into an
// image's parameters, and reading no file for them under
// --disable-image-metadata.
#include "io/file_hashes.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "image/png_metadata.h"
#include "test_files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::run_command;
using test::TempDir;

constexpr const char* kAbcSha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// sha256sum's digest of a file's bytes from `offset` on (tail -c +N counts from 1).
std::string sha256sum(const std::string& path, uint64_t offset = 0) {
    auto r = run_command("tail -c +" + std::to_string(offset + 1) + " '" + path + "' | sha256sum");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.substr(0, 64);
}

uint64_t safetensors_header_length(const std::vector<uint8_t>& bytes) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
    return n;
}

void set_mtime(const std::string& path, time_t seconds) {
    const struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

std::string absolute(const std::string& path) { return fs::absolute(path).lexically_normal().string(); }

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// A LoRA-like safetensors file: two small F32 tensors, and `metadata`.
std::vector<uint8_t> small_safetensors(const std::vector<std::pair<std::string, std::string>>& metadata = {}) {
    return test::build_safetensors({{"lora_unet_a.lora_down.weight", "F32", {2, 4}, test::f32_bytes(8, 1.0f)},
                                    {"lora_unet_a.lora_up.weight", "F32", {4, 2}, test::f32_bytes(8, -3.0f)}},
                                   metadata);
}

TEST(FileHashes, ModelHashIsTheFilesSha256First10HexDigits) {
    TempDir dir;
    test::ScopedEnv cache("KILN_CACHE", dir.file("cache"));
    const std::string abc = dir.write("abc.ckpt", "abc");
    EXPECT_EQ(io::compute_file_hash(abc, io::FileHashKind::Sha256).value(), kAbcSha256);
    EXPECT_EQ(io::model_short_hash(abc).value(), std::string(kAbcSha256).substr(0, 10));

    // Longer than the 1 MiB read buffer, against sha256sum.
    std::vector<uint8_t> big(3 * (1 << 20) + 12345);
    uint32_t x = 12345;
    for (uint8_t& b : big) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
    const std::string file = dir.write("model.safetensors", big);
    const std::string expected = sha256sum(file);
    EXPECT_EQ(io::compute_file_hash(file, io::FileHashKind::Sha256).value(), expected);
    EXPECT_EQ(io::model_short_hash(file).value(), expected.substr(0, 10));

    EXPECT_FALSE(io::model_short_hash(dir.file("missing.safetensors")).ok());
    EXPECT_FALSE(io::model_short_hash(dir.path()).ok());  // a folder has no one hash
}

TEST(FileHashes, LoraHashOfSafetensorsIsTheAddnetHashOfItsData) {
    TempDir dir;
    test::ScopedEnv cache("KILN_CACHE", dir.file("cache"));
    const std::vector<uint8_t> bytes = small_safetensors({{"ss_output_name", "a"}});
    const uint64_t header = safetensors_header_length(bytes);
    const std::string lora = dir.write("lora.safetensors", bytes);
    const std::string data_hash = sha256sum(lora, 8 + header);
    ASSERT_NE(data_hash, sha256sum(lora));
    EXPECT_EQ(io::compute_file_hash(lora, io::FileHashKind::Addnet).value(), data_hash);
    EXPECT_EQ(io::lora_short_hash(lora).value(), data_hash.substr(0, 12));

    // The same tensors under other metadata: the same hash (the point of
    // kohya's addnet hash); the extension in any case.
    const std::string renamed = dir.write("renamed.SafeTensors", small_safetensors({{"ss_output_name", "other"}}));
    EXPECT_EQ(io::lora_short_hash(renamed).value(), data_hash.substr(0, 12));

    // Other files: the whole file's SHA-256, 12 digits.
    const std::string pt = dir.write("lora.pt", bytes);
    EXPECT_EQ(io::lora_short_hash(pt).value(), sha256sum(pt).substr(0, 12));
    const std::string sft = dir.write("lora.sft", bytes);
    EXPECT_EQ(io::lora_short_hash(sft).value(), sha256sum(sft).substr(0, 12));

    // kohya's trainer stores the hash as sshs_model_hash: A1111 takes it as given.
    const std::string stored = dir.write(
        "stored.safetensors",
        small_safetensors({{"sshs_model_hash", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}));
    EXPECT_EQ(io::lora_short_hash(stored).value(), "0123456789ab");
    // ... but only hex digits: anything else would break the "Lora hashes" list.
    const std::string odd = dir.write("odd.safetensors", small_safetensors({{"sshs_model_hash", "a, b: c"}}));
    EXPECT_EQ(io::lora_short_hash(odd).value(),
              sha256sum(odd, 8 + safetensors_header_length(test::read_bytes(odd))).substr(0, 12));

    // A header length past the end: A1111 hashes nothing.
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + 20);
    const std::string short_file = dir.write("cut.safetensors", cut);
    EXPECT_EQ(io::compute_file_hash(short_file, io::FileHashKind::Addnet).value(), kEmptySha256);
}

TEST(FileHashes, CacheFileAnswersForTheSameSizeAndTimeOnly) {
    TempDir dir;
    const std::string file = dir.write("model.gguf", "model bytes");
    set_mtime(file, 1700000000);
    const std::string cache_file = dir.file("cache/hashes.json");
    const std::string seeded(64, '1');
    std::ofstream(cache_file)
        << json{{"hashes",
                 {{absolute(file), {{"size", 11}, {"mtime_ns", 1700000000LL * 1000000000LL}, {"sha256", seeded}}}}}}
               .dump();
    {
        io::FileHashCache cache(cache_file);
        EXPECT_EQ(cache.hash(file, io::FileHashKind::Sha256).value(), seeded);
        // Another kind of hash has entries of its own (this one: "model by"
        // read as a header length runs past the end, so nothing is hashed).
        EXPECT_EQ(cache.hash(file, io::FileHashKind::Addnet).value(), kEmptySha256);
    }
    // Touched: the entry is stale; the file is hashed again and the entry replaced.
    set_mtime(file, 1700000100);
    const std::string real = sha256sum(file);
    {
        io::FileHashCache cache(cache_file);
        EXPECT_EQ(cache.hash(file, io::FileHashKind::Sha256).value(), real);
        // Memory answers next, whatever the file says now.
        std::ofstream(cache_file) << "{}";
        EXPECT_EQ(cache.hash(file, io::FileHashKind::Sha256).value(), real);
    }
    {
        // A cache writes what it computes; a new one (as in a new process) reads it.
        io::FileHashCache first(cache_file);
        ASSERT_EQ(first.hash(file, io::FileHashKind::Sha256).value(), real);
        json written = read_json(cache_file);
        const json& entry = written["hashes"][absolute(file)];
        EXPECT_EQ(entry["size"], 11);
        EXPECT_EQ(entry["mtime_ns"], 1700000100LL * 1000000000LL);
        EXPECT_EQ(entry["sha256"], real);
        written["hashes"][absolute(file)]["sha256"] = std::string(64, '2');
        std::ofstream(cache_file) << written.dump();
        io::FileHashCache second(cache_file);
        EXPECT_EQ(second.hash(file, io::FileHashKind::Sha256).value(), std::string(64, '2'));
    }
    // Another size at the same time: stale too.
    std::ofstream(file, std::ios::app) << "!";
    set_mtime(file, 1700000100);
    io::FileHashCache cache(cache_file);
    EXPECT_EQ(cache.hash(file, io::FileHashKind::Sha256).value(), sha256sum(file));
}

TEST(FileHashes, CorruptOrUnwritableCacheFileIsIgnored) {
    TempDir dir;
    const std::string file = dir.write("abc.safetensors", "abc");
    for (const char* text : {"{ not json", "[1, 2]", "{\"hashes\": [1, 2]}",
                             "{\"hashes\": {\"ABS\": {\"size\": 3, \"mtime_ns\": \"x\", \"sha256\": \"y\"}}}"}) {
        std::string corrupt = text;
        if (const size_t at = corrupt.find("ABS"); at != std::string::npos) corrupt.replace(at, 3, absolute(file));
        const std::string cache_file = dir.write("hashes.json", corrupt);
        io::FileHashCache cache(cache_file);
        EXPECT_EQ(cache.hash(file, io::FileHashKind::Sha256).value(), kAbcSha256) << text;
        // Rewritten whole, with the new entry.
        EXPECT_EQ(read_json(cache_file)["hashes"][absolute(file)]["sha256"], kAbcSha256) << text;
    }
    // A cache file that cannot be written (its folder is a file), or none at all.
    const std::string blocker = dir.write("blocker", "x");
    io::FileHashCache unwritable(blocker + "/hashes.json");
    EXPECT_EQ(unwritable.hash(file, io::FileHashKind::Sha256).value(), kAbcSha256);
    io::FileHashCache memory_only("");
    EXPECT_EQ(memory_only.hash(file, io::FileHashKind::Sha256).value(), kAbcSha256);
    // Only temporary files of its own are ever left behind: none.
    for (const auto& entry : fs::directory_iterator(dir.path())) {
        EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
    }
}

TEST(FileHashes, ProcessCacheLivesUnderKilnCache) {
    TempDir dir;
    test::ScopedEnv cache("KILN_CACHE", dir.file("kiln-cache"));
    EXPECT_EQ(io::file_hash_cache_path(), dir.file("kiln-cache") + "/hashes.json");
    const std::string file = dir.write("abc.gguf", "abc");
    EXPECT_EQ(io::cached_file_hash(file, io::FileHashKind::Sha256).value(), kAbcSha256);
    EXPECT_EQ(read_json(dir.file("kiln-cache/hashes.json"))["hashes"][absolute(file)]["sha256"], kAbcSha256);
}

// The real binary on the default model with the circles-to-squares LoRA
// (tests/unit/lora_semantic_test.cpp's).
TEST(FileHashes, GeneratedImagesCarryModelAndLoraHashes) {
    TempDir dir;
    const std::string lora_dir = (fs::path(KILN_DEFAULT_MODEL).parent_path() / "loras").string();
    const std::string lora = lora_dir + "/circles-to-squares.safetensors";
    const std::string cache = dir.file("cache");
    const std::string out = dir.file("lora.png");
    auto r =
        run_command("KILN_CACHE='" + cache + "' " + KILN_BIN + " -t 1 -m " + KILN_DEFAULT_MODEL + " --lora-model-dir " +
                    lora_dir + " -p \"<lora:circles-to-squares:0.5> a red circle\" --steps 2 -s 3 -o " + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto text = image::read_png_text(out);
    ASSERT_TRUE(text.ok()) << text.error().message;
    const std::string& parameters = text->at(image::kParametersKeyword);

    const std::string model_hash = sha256sum(KILN_DEFAULT_MODEL).substr(0, 10);
    const std::string lora_hash = sha256sum(lora, 8 + safetensors_header_length(test::read_bytes(lora))).substr(0, 12);
    EXPECT_NE(parameters.find(", Model hash: " + model_hash + ", Model: kiln-tiny, "), std::string::npos) << parameters;
    EXPECT_NE(parameters.find(", Lora hashes: \"circles-to-squares: " + lora_hash + "\", "), std::string::npos)
        << parameters;
    const image::GenerationInfo info = image::parse_a1111_parameters(parameters);
    const std::pair<std::string, std::string> model_entry{"Model hash", model_hash};
    const std::pair<std::string, std::string> lora_entry{"Lora hashes", "circles-to-squares: " + lora_hash};
    EXPECT_NE(std::find(info.extra.begin(), info.extra.end(), model_entry), info.extra.end()) << parameters;
    EXPECT_NE(std::find(info.extra.begin(), info.extra.end(), lora_entry), info.extra.end()) << parameters;

    // Both hashes are kept for the next run.
    const json kept = read_json(cache + "/hashes.json");
    EXPECT_EQ(kept["hashes"][absolute(KILN_DEFAULT_MODEL)]["sha256"].get<std::string>().substr(0, 10), model_hash);
    EXPECT_EQ(kept["hashes-addnet"][absolute(lora)]["sha256"].get<std::string>().substr(0, 12), lora_hash);

    // No metadata written: no file read to hash, nothing cached.
    const std::string bare_cache = dir.file("bare-cache");
    auto bare = run_command(
        "KILN_CACHE='" + bare_cache + "' " + KILN_BIN + " -t 1 -m " + KILN_DEFAULT_MODEL + " --lora-model-dir " +
        lora_dir + " -p \"<lora:circles-to-squares:0.5> a red circle\" --steps 1 --disable-image-metadata -o " +
        dir.file("bare.png"));
    ASSERT_EQ(bare.exit_code, 0) << bare.err;
    EXPECT_FALSE(fs::exists(bare_cache + "/hashes.json"));
}

}  // namespace
}  // namespace kiln
