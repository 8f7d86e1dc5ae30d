// Devices: module names, --backend assignments, --rpc-servers endpoints, and end to
// end `kiln --list-devices` and `kiln rpc-server` (a real ggml RPC server on
// 127.0.0.1, started as a child process).
#include "runtime/devices.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "image/image_io.h"
#include "io/model_file.h"
#include "pipeline/module_roles.h"
#include "pipeline/placement.h"
#include "pixel_difference.h"
#include "rpc_child.h"
#include "runtime/module_weights.h"
#include "test_files.h"

namespace kiln {
namespace {

using pipeline::normalize_module_name;
using pipeline::parse_backend_assignments;
using runtime::parse_rpc_endpoints;
using test::free_port;
using test::KilnChild;
using test::run_command;
using test::TempDir;

std::string kiln(const std::string& args) { return std::string(KILN_BIN) + " " + args; }

// --- module names and --backend ---------------------------------------------

TEST(Devices, ModuleNamesIgnoreCaseDashesAndUnderscores) {
    for (const char* name : {"clip_vision", "clip-vision", "clipvision", "Clip_Vision", "CLIP-VISION"})
        EXPECT_EQ(normalize_module_name(name), "clip_vision") << name;
    for (const char* name : {"diffusion", "unet", "UNet", "dit", "transformer", "Diffusion"})
        EXPECT_EQ(normalize_module_name(name), "diffusion") << name;
    for (const char* name : {"te", "clip", "text_encoder", "text-encoders", "TextEncoder", "cond_stage"})
        EXPECT_EQ(normalize_module_name(name), "te") << name;
    EXPECT_EQ(normalize_module_name("VAE"), "vae");
    EXPECT_EQ(normalize_module_name("v_a_e"), "vae");
    EXPECT_EQ(normalize_module_name("encoder"), "");
    EXPECT_EQ(normalize_module_name(""), "");
}

const std::vector<std::string> kDevices = {"CUDA0", "RPC0", "CPU"};

TEST(Devices, OneDeviceForEveryModule) {
    auto a = parse_backend_assignments("cuda0", kDevices);
    ASSERT_TRUE(a.ok()) << a.error().message;
    const std::map<std::string, std::string> expected = {
        {"diffusion", "CUDA0"}, {"te", "CUDA0"}, {"vae", "CUDA0"}, {"clip_vision", "CUDA0"}, {"control", "CUDA0"}};
    EXPECT_EQ(*a, expected);
}

TEST(Devices, PerModuleAssignments) {
    auto a = parse_backend_assignments("diffusion=rpc0, TE=cpu,vae=Cpu,clip-vision=cuda0", kDevices);
    ASSERT_TRUE(a.ok()) << a.error().message;
    const std::map<std::string, std::string> expected = {
        {"diffusion", "RPC0"}, {"te", "CPU"}, {"vae", "CPU"}, {"clip_vision", "CUDA0"}};
    EXPECT_EQ(*a, expected);
    a = parse_backend_assignments("unet=cuda0", kDevices);
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(*a, (std::map<std::string, std::string>{{"diffusion", "CUDA0"}}));  // the others: not assigned
}

TEST(Devices, UnknownModuleListsTheValidNames) {
    auto a = parse_backend_assignments("diffusion=cpu,upscaler=cpu", kDevices);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().message,
              "--backend: unknown module 'upscaler' (valid modules: diffusion, te, vae, clip_vision, control; aliases: "
              "unet, dit, transformer, clip, text_encoder, cond_stage, controlnet)");
}

TEST(Devices, UnknownDeviceListsTheValidNames) {
    auto a = parse_backend_assignments("vulkan0", kDevices);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().message, "--backend: unknown device 'vulkan0' (valid devices: CUDA0, RPC0, CPU)");
    a = parse_backend_assignments("diffusion=cuda1", kDevices);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().message, "--backend: unknown device 'cuda1' (valid devices: CUDA0, RPC0, CPU)");
}

TEST(Devices, MalformedAssignments) {
    EXPECT_NE(parse_backend_assignments("unet=cpu,diffusion=cpu", kDevices).error().message.find("assigned twice"),
              std::string::npos);
    EXPECT_NE(parse_backend_assignments("diffusion=cpu,cuda0", kDevices).error().message.find("expected module=device"),
              std::string::npos);
    EXPECT_NE(parse_backend_assignments("vae=", kDevices).error().message.find("needs a device"), std::string::npos);
    EXPECT_NE(parse_backend_assignments("cpu,cuda0", kDevices).error().message.find("give one device"),
              std::string::npos);
    EXPECT_FALSE(parse_backend_assignments("", kDevices).ok());
}

// sd-cli's layer split ("diffusion=cuda0&cuda1"): the list is checked name
// by name and kept in order, in the registry's spelling.
TEST(Devices, DeviceListsAreCheckedNameByName) {
    auto split = parse_backend_assignments("diffusion=cuda0&rpc0,te=rpc0", kDevices);
    ASSERT_TRUE(split.ok()) << split.error().message;
    EXPECT_EQ(split->at("diffusion"), "CUDA0&RPC0");
    EXPECT_EQ(split->at("te"), "RPC0");
    auto error_of = [](const std::string& spec) { return parse_backend_assignments(spec, kDevices).error().message; };
    EXPECT_EQ(error_of("diffusion=rpc0&RPC0"), "--backend: 'rpc0&RPC0' lists RPC0 twice");
    EXPECT_EQ(error_of("te=cuda0&cuda9").rfind("--backend: unknown device 'cuda9' (valid devices: ", 0), 0u);
    EXPECT_EQ(error_of("diffusion=cuda0&disk")
                  .rfind("--backend: 'disk' holds weights (--params-backend), it "
                         "computes nothing (valid devices: ",
                         0),
              0u);
    EXPECT_EQ(error_of("diffusion=cuda0&"), "--backend: 'cuda0&' has an empty device in its list");
    EXPECT_EQ(error_of("vae=cuda0&rpc0"),
              "--backend: 'vae=cuda0&rpc0': only diffusion and te can be split across devices");
    EXPECT_EQ(pipeline::parse_params_backend("diffusion=cpu&disk", kDevices).error().message,
              "--params-backend: 'cpu&disk': takes one place per module, not a list ('&')");
}

TEST(Devices, RegisteredDevices) {
    auto cpu = runtime::find_device("cpu");
    ASSERT_TRUE(cpu.ok()) << cpu.error().message;
    EXPECT_EQ(ggml_backend_dev_type(*cpu), GGML_BACKEND_DEVICE_TYPE_CPU);
    auto missing = runtime::find_device("cuda7");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().message.rfind("unknown device 'cuda7' (valid: ", 0), 0u) << missing.error().message;
    EXPECT_NE(missing.error().message.find("CPU"), std::string::npos);
    bool saw_cpu = false;
    for (const auto& d : runtime::list_devices()) {
        if (d.type == runtime::DeviceInfo::Cpu) {
            saw_cpu = true;
            EXPECT_GT(d.total, 0u);
        }
    }
    EXPECT_TRUE(saw_cpu);
    auto a = parse_backend_assignments("diffusion=CPU");
    ASSERT_TRUE(a.ok()) << a.error().message;
}

// --- --rpc-servers endpoints ---------------------------------------------------------

TEST(Devices, RpcEndpoints) {
    auto e = parse_rpc_endpoints("127.0.0.1:50052, gpu-box:8080,127.0.0.1:50052");
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(*e, (std::vector<std::string>{"127.0.0.1:50052", "gpu-box:8080"}));
    EXPECT_EQ(parse_rpc_endpoints("host").error().message, "--rpc-servers: host: expected host:port");
    EXPECT_EQ(parse_rpc_endpoints(":1").error().message, "--rpc-servers: :1: empty host (expected host:port)");
    EXPECT_EQ(parse_rpc_endpoints("h:65536").error().message,
              "--rpc-servers: h:65536: the port must be a number from 1 to 65535, got '65536'");
    EXPECT_EQ(parse_rpc_endpoints("h:x1").error().message,
              "--rpc-servers: h:x1: the port must be a number from 1 to 65535, got 'x1'");
    EXPECT_FALSE(parse_rpc_endpoints("h:1,").ok());
    EXPECT_FALSE(parse_rpc_endpoints("::1:80").ok());
}

// --- end to end -----------------------------------------------------------------

TEST(Devices, ListDevicesShowsTheCpu) {
    auto r = run_command(kiln("--list-devices"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    bool saw_cpu = false;
    while (std::getline(lines, line)) {
        if (line.rfind("CPU ", 0) == 0) {
            saw_cpu = true;
            EXPECT_NE(line.find(" CPU "), std::string::npos) << line;  // its type
            EXPECT_NE(line.find("iB "), std::string::npos) << line;    // free and total, e.g. "23.54 GiB"
        }
    }
    EXPECT_TRUE(saw_cpu) << r.out;
}

TEST(Devices, UnreachableRpcServerIsACleanError) {
    auto r = run_command(kiln("--rpc-servers 127.0.0.1:1 --list-devices"));
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;  // not a crash (-1) or an abort
    EXPECT_EQ(r.err.rfind("error: --rpc-servers: 127.0.0.1:1: no ggml RPC server reachable", 0), 0u) << r.err;
    EXPECT_EQ(r.out, "");
    r = run_command(kiln("--rpc-servers 127.0.0.1:1 -p x --steps 1"));
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
}

TEST(Devices, NotAnRpcServerIsACleanError) {
    // Something that accepts connections but never answers the handshake.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    auto r = run_command(kiln("--rpc-servers " + endpoint + " --list-devices"));
    ::close(fd);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("error: --rpc-servers: " + endpoint + ": the server did not answer the RPC handshake", 0), 0u)
        << r.err;
}

TEST(Devices, RpcServerServesTheCpuAsAGpuTypeDevice) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    KilnChild server({"rpc-server", "--port", std::to_string(port), "-t", "1"});
    ASSERT_TRUE(server.started());
    ASSERT_TRUE(server.wait_listening(port)) << server.out() << server.err();

    const std::string endpoint = "127.0.0.1:" + std::to_string(port);
    auto r = run_command(kiln("--rpc-servers " + endpoint + " --list-devices"));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    std::istringstream lines(r.out);
    std::string line;
    bool saw_rpc = false;
    while (std::getline(lines, line)) {
        if (line.rfind("RPC0 ", 0) != 0) continue;
        saw_rpc = true;
        std::istringstream fields(line);
        std::string name, type, free_value, free_unit, total_value, total_unit, description;
        fields >> name >> type >> free_value >> free_unit >> total_value >> total_unit >> description;
        EXPECT_EQ(type, "GPU") << line;
        EXPECT_GT(std::stod(total_value), 0.0) << line;
        EXPECT_NE(total_unit, "B") << line;  // at least KiB
        EXPECT_EQ(description, endpoint) << line;
    }
    EXPECT_TRUE(saw_rpc) << r.out;

    // The default model with its UNet on the RPC device (a GPU-type device
    // that serves ggml's CPU kernels) makes the image of a plain CPU run
    // without BLAS, up to rounding: convolutions computing on the CPU multiply
    // F32 patches by the widened kernel (nn/layers.cpp, the form OpenBLAS
    // takes), while on a device the kernel keeps its type and goes first.
    // Measured: at most 2 levels apart, 0.05 on average.
    test::TempDir dir;
    const std::string common = " -t 1 -p \"a red circle on a white background\" --steps 4 -s 7 -o ";
    r = run_command("KILN_NO_BLAS=1 " + kiln("--rpc-servers " + endpoint + " --backend diffusion=rpc0,te=cpu,vae=cpu" +
                                             common + dir.file("rpc.png")));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    r = run_command("KILN_NO_BLAS=1 " + kiln(common + dir.file("cpu.png")));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto on_rpc = image::read_image(dir.file("rpc.png"));
    auto on_cpu = image::read_image(dir.file("cpu.png"));
    ASSERT_TRUE(on_rpc.ok() && on_cpu.ok());
    ASSERT_EQ(on_rpc->pixels.size(), on_cpu->pixels.size());
    const test::PixelDifference d = test::pixel_difference(*on_rpc, *on_cpu);
    EXPECT_LE(d.max, 6);
    EXPECT_LT(d.mean, 0.5);
    EXPECT_FALSE(server.exited()) << server.err();
}

TEST(Devices, UnknownBackendDeviceIsAUsageError) {
    auto r = run_command(kiln("--backend cuda0 -p x --steps 1"));
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("error: --backend: unknown device 'cuda0' (valid devices: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("CPU"), std::string::npos) << r.err;
    r = run_command(kiln("--backend vision=cpu -p x --steps 1"));
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("error: --backend: unknown module 'vision' (valid modules: ", 0), 0u) << r.err;
}

TEST(Devices, RpcServerWarnsWhenNotOnLoopback) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    KilnChild server({"rpc-server", "--host", "0.0.0.0", "--port", std::to_string(port), "-t", "1"});
    ASSERT_TRUE(server.wait_listening(port)) << server.out() << server.err();
    server.stop();
    const std::string all = server.out() + server.err();
    EXPECT_NE(all.find("no authentication"), std::string::npos) << all;
    EXPECT_NE(all.find("anyone who can reach port " + std::to_string(port)), std::string::npos) << all;
}

TEST(Devices, RpcServerOnLoopbackDoesNotWarn) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    KilnChild server({"rpc-server", "--port", std::to_string(port), "-t", "1"});
    ASSERT_TRUE(server.wait_listening(port)) << server.out() << server.err();
    server.stop();
    EXPECT_EQ((server.out() + server.err()).find("no authentication"), std::string::npos);
    EXPECT_NE(server.out().find("serving CPU"), std::string::npos) << server.out();
}

// kiln rpc-server --cache-dir keeps a large weight a client sends (ggml's
// RPC tensor cache: 10 MiB and more, in buffers marked as weights), and a
// client sending the same weight again sends its hash only; the server then
// fills the tensor from its cache file. The test overwrites that file in
// between, so the second upload's values show where they came from.
TEST(Devices, RpcTensorCacheFillsAWeightSentBeforeFromItsHash) {
    TempDir cache;
    const int port = free_port();
    ASSERT_GT(port, 0);
    KilnChild server(
        {"rpc-server", "--port", std::to_string(port), "-t", "1", "--cache-dir", cache.path() + "/tensors"});
    ASSERT_TRUE(server.wait_listening(port)) << server.out() << server.err();
    EXPECT_NE(server.out().find("tensor cache in " + cache.path() + "/tensors"), std::string::npos) << server.out();
    ASSERT_TRUE(runtime::add_rpc_servers("127.0.0.1:" + std::to_string(port)).ok());
    auto device = runtime::find_device("RPC0");
    ASSERT_TRUE(device.ok()) << device.error().message;
    std::unique_ptr<ggml_backend, void (*)(ggml_backend_t)> backend(ggml_backend_dev_init(*device, nullptr),
                                                                    ggml_backend_free);
    ASSERT_NE(backend, nullptr);

    std::vector<float> values(size_t{4} << 20);  // 16 MiB
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) * 0.5f;
    std::vector<uint8_t> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    TempDir dir;
    auto file =
        io::ModelFile::open({dir.write("w.safetensors", test::build_safetensors({{"w", "F32", {1024, 4096}, bytes}}))});
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto upload = [&] {
        runtime::ModuleWeights weights(*file, "", std::nullopt);
        ggml_tensor* w = weights.require("w", {1024, 4096});
        EXPECT_TRUE(weights.load(backend.get()).ok());
        std::vector<float> back(values.size());
        ggml_backend_tensor_get(w, back.data(), 0, bytes.size());
        return back;
    };
    ASSERT_EQ(upload(), values);

    std::vector<std::filesystem::path> kept;
    for (const auto& entry : std::filesystem::directory_iterator(cache.path() + "/tensors"))
        kept.push_back(entry.path());
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_EQ(std::filesystem::file_size(kept[0]), bytes.size());
    std::vector<float> doubled = values;
    for (float& v : doubled) v *= 2.0f;
    {
        std::ofstream out(kept[0], std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(doubled.data()), static_cast<std::streamsize>(bytes.size()));
    }
    EXPECT_EQ(upload(), doubled) << "the second upload sent the hash and the server read its cache";
}

TEST(Devices, RpcServerCacheFolderThatCannotBeMadeIsAUsageError) {
    TempDir dir;
    const std::string blocker = dir.write("file", std::string_view("not a folder"));
    auto r = run_command(kiln("rpc-server --port 1 --cache-dir " + blocker + "/rpc"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("error: --cache-dir: cannot write to the folder '" + blocker + "/rpc': ", 0), 0u) << r.err;
    r = run_command("env -u HOME -u KILN_CACHE " + kiln("rpc-server --port 1 -c"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, "error: --cache: neither KILN_CACHE nor HOME is set; give the folder with --cache-dir DIR\n");
}

TEST(Devices, RpcServerBadFlagsAreUsageErrors) {
    auto r = run_command(kiln("rpc-server --device nosuchdevice --port 1"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("error: --device: unknown device 'nosuchdevice' (valid: ", 0), 0u) << r.err;
    r = run_command(kiln("rpc-server --port 99999"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("error: --port: ", 0), 0u) << r.err;
    r = run_command(kiln("rpc-server --host not-an-ip"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("error: --host: ", 0), 0u) << r.err;
}

TEST(Devices, RpcServerOnABusyPortFails) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(fd, 1), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    const int port = ntohs(addr.sin_port);
    auto r = run_command(kiln("rpc-server --port " + std::to_string(port)));
    ::close(fd);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("error: --port: cannot listen on 127.0.0.1:" + std::to_string(port), 0), 0u) << r.err;
}

}  // namespace
}  // namespace kiln
