// Paths that are not plain files or folders: symlink loops and FIFOs given
// as models, folders, images and masks. Each is a one-line error naming the
// path, within a second, with no output file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "golden.h"
#include "image/image_io.h"
#include "test_files.h"
#include "util/files.h"

namespace kiln {
namespace {

using test::run_command;
using test::TempDir;

// `timeout` turns a hang into exit 124, so a regression fails instead of
// blocking the suite.
std::string kiln(const std::string& args) { return "timeout 20 " + std::string(KILN_BIN) + " " + args; }

std::string with_model(const std::string& args) {
    return kiln("-t 1 -m " + test::golden_path("models/sd1_tiny.safetensors") + " --tokenizer " + KILN_FIXTURES_DIR +
                "/tiny_tokenizer -p x -W 32 -H 32 --steps 1 " + args);
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

// `name` -> `name`: every stat of it fails with ELOOP.
std::string make_loop(const TempDir& dir, const std::string& name) {
    const std::string path = dir.file(name);
    EXPECT_EQ(::symlink(path.c_str(), path.c_str()), 0) << path;
    return path;
}

std::string make_fifo(const TempDir& dir, const std::string& name) {
    const std::string path = dir.file(name);
    EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
    return path;
}

void expect_clean_failure(const test::CommandResult& r, int exit_code, const std::string& message,
                          const std::string& out) {
    EXPECT_EQ(r.exit_code, exit_code) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_FALSE(exists(out)) << out;
}

TEST(Files, PathStatusNamesEveryKindWithoutThrowing) {
    TempDir dir;
    EXPECT_EQ(path_status(dir.write("f.bin", std::string("abc"))).kind, PathKind::File);
    EXPECT_EQ(path_status(dir.write("f.bin", std::string("abc"))).size, 3u);
    EXPECT_EQ(path_status(dir.path()).kind, PathKind::Folder);
    EXPECT_EQ(path_status(dir.file("none")).kind, PathKind::Missing);
    EXPECT_EQ(path_status(make_loop(dir, "loop")).kind, PathKind::SymlinkLoop);
    EXPECT_EQ(path_status(make_fifo(dir, "fifo")).kind, PathKind::Special);
    EXPECT_EQ(path_status("/dev/zero").kind, PathKind::Special);
    EXPECT_EQ(path_error(dir.file("loop"), path_status(dir.file("loop"))).message,
              dir.file("loop") + ": symlink loop (too many levels of symbolic links)");
    EXPECT_EQ(path_error(dir.file("fifo"), path_status(dir.file("fifo"))).message,
              dir.file("fifo") + ": not a regular file (a FIFO)");

    auto entries = list_folder(dir.path());
    ASSERT_TRUE(entries.ok()) << entries.error().message;
    ASSERT_EQ(entries->size(), 3u);
    EXPECT_EQ((*entries)[0].name, "f.bin");
    EXPECT_EQ((*entries)[1].status.kind, PathKind::Special);
    EXPECT_EQ((*entries)[2].status.kind, PathKind::SymlinkLoop);
    EXPECT_FALSE(list_folder(dir.file("loop")).ok());
    EXPECT_FALSE(open_regular_file(dir.file("fifo")).ok());  // returns at once: nobody writes to it
}

TEST(HostilePaths, SymlinkLoopAsModelSaysSo) {
    TempDir dir;
    const std::string loop = make_loop(dir, "loop.safetensors");
    const std::string out = dir.file("out.png");
    expect_clean_failure(run_command(kiln("-m " + loop + " -p x -o " + out)), 1, loop + ": symlink loop", out);
    expect_clean_failure(run_command(kiln("info " + loop)), 1, loop + ": symlink loop", out);
}

TEST(HostilePaths, SymlinkLoopInsideAScannedFolderIsAnErrorNotAnAbort) {
    TempDir dir;
    const std::string folder = dir.file("model");
    dir.write("model/readme.txt", std::string("a folder with a loop in it"));
    const std::string loop = make_loop(dir, "model/diffusion_pytorch_model.safetensors");
    const std::string out = dir.file("out.png");
    expect_clean_failure(run_command(kiln("info " + folder)), 1, loop + ": symlink loop", out);
    expect_clean_failure(run_command(kiln("-m " + folder + " -p x -o " + out)), 1, loop + ": symlink loop", out);
    const std::string gguf = dir.file("out.gguf");
    expect_clean_failure(run_command(kiln("-M convert -m " + folder + " -o " + gguf)), 1, loop + ": symlink loop",
                         gguf);

    // A diffusers folder whose model_index.json is a loop.
    make_loop(dir, "pipe/model_index.json");
    expect_clean_failure(run_command(kiln("info " + dir.file("pipe"))), 1, "model_index.json: symlink loop", out);
}

TEST(HostilePaths, SymlinkLoopInTheEmbeddingFolderIsAnError) {
    TempDir dir;
    const std::string loop = make_loop(dir, "embd/star.pt");
    const std::string out = dir.file("out.png");
    expect_clean_failure(run_command(with_model("--embd-dir " + dir.file("embd") + " -o " + out)), 1,
                         loop + ": symlink loop", out);
    const std::string folder_loop = make_loop(dir, "embd2");
    expect_clean_failure(run_command(with_model("--embd-dir " + folder_loop + " -o " + out)), 1,
                         folder_loop + ": symlink loop", out);
}

TEST(HostilePaths, FifosAndDevicesAreRefusedBeforeAnyRead) {
    TempDir dir;
    const std::string out = dir.file("out.png");
    const std::string fifo = make_fifo(dir, "model.safetensors");
    expect_clean_failure(run_command(kiln("-m " + fifo + " -p x -o " + out)), 1, fifo + ": not a regular file (a FIFO)",
                         out);
    expect_clean_failure(run_command(kiln("info " + fifo)), 1, fifo + ": not a regular file (a FIFO)", out);

    const std::string image = make_fifo(dir, "init.png");
    expect_clean_failure(run_command(with_model("-i " + image + " -o " + out)), 1,
                         image + ": not a regular file (a FIFO)", out);
    expect_clean_failure(run_command(with_model("-i /dev/zero -o " + out)), 1,
                         "/dev/zero: not a regular file (a character device)", out);
    expect_clean_failure(run_command(kiln("-M metadata -i " + image)), 1, image + ": not a regular file (a FIFO)", out);

    const std::string init = dir.file("real.png");
    ASSERT_TRUE(image::write_image(init, image::make_image(32, 32, 3, 128)).ok());
    const std::string mask = make_fifo(dir, "mask.png");
    expect_clean_failure(run_command(with_model("-i " + init + " --mask " + mask + " -o " + out)), 1,
                         mask + ": not a regular file (a FIFO)", out);
}

}  // namespace
}  // namespace kiln
