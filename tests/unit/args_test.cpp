#include "args.h"

#include <gtest/gtest.h>

namespace kiln::cli {
namespace {

Options parse_ok(const std::vector<std::string>& args) {
    auto parsed = parse_args(args);
    if (auto* e = std::get_if<UsageError>(&parsed)) {
        ADD_FAILURE() << "unexpected usage error: " << e->message;
        return {};
    }
    return std::get<Options>(parsed);
}

UsageError parse_error(const std::vector<std::string>& args) {
    auto parsed = parse_args(args);
    if (auto* e = std::get_if<UsageError>(&parsed)) return *e;
    ADD_FAILURE() << "expected a usage error";
    return {};
}

TEST(Args, SdCliFlagsShortAndLong) {
    const Options o = parse_ok({"-m",
                                "sd15.safetensors",
                                "--vae",
                                "vae.safetensors",
                                "--clip_l",
                                "clip.safetensors",
                                "-p",
                                "a red circle",
                                "-n",
                                "blurry",
                                "-o",
                                "out.png",
                                "-W",
                                "512",
                                "-H",
                                "768",
                                "--steps",
                                "20",
                                "-s",
                                "-1",
                                "--cfg-scale",
                                "4.5",
                                "-b",
                                "2",
                                "-t",
                                "2",
                                "--sampling-method",
                                "euler_a",
                                "--diffusion-model",
                                "unet.gguf",
                                "--type",
                                "q8_0"});
    EXPECT_EQ(o.command, Command::Generate);
    EXPECT_EQ(o.model, "sd15.safetensors");
    EXPECT_EQ(o.vae, "vae.safetensors");
    EXPECT_EQ(o.clip_l, "clip.safetensors");
    EXPECT_EQ(o.diffusion_model, "unet.gguf");
    EXPECT_EQ(o.prompt, "a red circle");
    EXPECT_EQ(o.negative_prompt, "blurry");
    EXPECT_EQ(o.output, "out.png");
    EXPECT_EQ(o.width, 512);
    EXPECT_EQ(o.height, 768);
    EXPECT_EQ(o.steps, 20);
    EXPECT_EQ(o.seed, -1);
    EXPECT_FLOAT_EQ(o.cfg_scale, 4.5f);
    EXPECT_EQ(o.batch_count, 2);
    EXPECT_EQ(o.threads, 2);
    EXPECT_EQ(o.sampling_method, "euler_a");
    EXPECT_EQ(o.weight_type, "q8_0");
    EXPECT_EQ(parse_ok({"--model=x.gguf"}).model, "x.gguf");
}

// sd-cli's placement switches, and its switches for choices kiln makes itself.
TEST(Args, SdCliPlacementAndPathSwitches) {
    const Options o = parse_ok({"-p", "x", "--clip-on-cpu", "--vae-on-cpu", "--control-net-cpu", "--mmap",
                                "--vae-conv-direct", "--diffusion-conv-direct"});
    EXPECT_EQ(o.modules_on_cpu, "te,vae,control");
    EXPECT_EQ(parse_ok({"-p", "x"}).modules_on_cpu, "");
    EXPECT_NE(parse_error({"--mmap=yes"}).message.find("--mmap"), std::string::npos);
}

// Wan 2.2 A14B's flags, as sd-cli spells them.
TEST(Args, HighNoiseExpertFlags) {
    const Options o =
        parse_ok({"--high-noise-diffusion-model", "high.gguf", "--high-noise-steps", "8", "--high-noise-cfg-scale",
                  "3.5", "--high-noise-sampling-method", "euler", "--high-noise-eta", "0.5", "--moe-boundary", "0.9"});
    EXPECT_EQ(o.high_noise_diffusion_model, "high.gguf");
    EXPECT_EQ(o.high_noise_steps, 8);
    EXPECT_EQ(o.high_noise_cfg_scale, 3.5f);
    EXPECT_EQ(o.high_noise_sampling_method, "euler");
    EXPECT_EQ(o.high_noise_eta, 0.5f);
    EXPECT_EQ(o.moe_boundary, 0.9f);
    EXPECT_EQ(parse_ok({}).high_noise_steps, -1);
    EXPECT_EQ(parse_error({"--moe-boundary", "1.5"}).message,
              "--moe-boundary: expected a number from 0 to 1, got '1.5'");
    EXPECT_EQ(parse_error({"--high-noise-steps", "-2"}).message.rfind("--high-noise-steps: ", 0), 0u);
    EXPECT_EQ(parse_error({"--high-noise-sampling-method", "warp"}).message.rfind("--high-noise-sampling-method: ", 0),
              0u);
    // Guidance the experts do not take: accepted and ignored, as sd-cli ignores it for Wan.
    EXPECT_EQ(parse_ok({"--high-noise-guidance", "3.5"}).ignored_sd_cli_options,
              std::vector<std::string>{"--high-noise-guidance"});
}

// sd-cli's aliases, and its options for features kiln lacks: a usage error
// that names the option and the feature, not "unknown option".
TEST(Args, SdCliAliasesAndOptionsOfMissingFeatures) {
    EXPECT_EQ(parse_ok({"--tae", "taesd.safetensors"}).taesd, "taesd.safetensors");
    EXPECT_EQ(parse_ok({"--qwen2vl", "qwen.gguf"}).llm, "qwen.gguf");
    EXPECT_EQ(parse_ok({"--qwen2vl_vision", "mmproj.gguf"}).llm_vision, "mmproj.gguf");
    EXPECT_EQ(parse_ok({"--llm_vision", "mmproj.gguf"}).llm_vision, "mmproj.gguf");
    EXPECT_TRUE(parse_ok({"--model-args", "qwen_image_zero_cond_t=true"}).qwen_image_zero_cond_t);
    EXPECT_TRUE(parse_ok({"--qwen-image-zero-cond-t"}).qwen_image_zero_cond_t);
    EXPECT_EQ(parse_ok({"--clip_vision", "clip_vision_h.safetensors"}).clip_vision, "clip_vision_h.safetensors");
    EXPECT_EQ(parse_ok({"--end-img", "last.png"}).end_image, "last.png");
    EXPECT_EQ(parse_ok({"--control-video", "frames/"}).control_video, "frames/");
    EXPECT_EQ(parse_ok({"--vace-strength", "0.5"}).vace_strength, 0.5f);
    EXPECT_EQ(parse_error({"--vace-strength", "-1"}).message.rfind("--vace-strength: ", 0), 0u);
    for (const char* flag : {"--photo-maker", "--motion-module", "--high-noise-slg-scale", "--cache-preset",
                             "--img-cfg-scale", "--qwen-image-layers"}) {
        const UsageError e = parse_error({"-p", "x", flag, "1"});
        EXPECT_EQ(e.message.rfind(std::string(flag) + " is ", 0), 0u) << e.message;
        EXPECT_NE(e.message.find("kiln"), std::string::npos) << e.message;
    }
}

TEST(Args, CircularFlagsSetTheSeams) {
    const Options both = parse_ok({"-p", "x", "--circular"});
    EXPECT_TRUE(both.circular_x && both.circular_y);
    const Options x = parse_ok({"-p", "x", "--circularx"});
    EXPECT_TRUE(x.circular_x && !x.circular_y);
    const Options y = parse_ok({"-p", "x", "--circulary"});
    EXPECT_TRUE(!y.circular_x && y.circular_y);
    const Options none = parse_ok({"-p", "x"});
    EXPECT_FALSE(none.circular_x || none.circular_y);
}

TEST(Args, SdCliSamplingOptions) {
    const Options o = parse_ok({"--eta", "0.3", "--sampler-rng", "cpu", "--sigmas", "[14.6, 7.8,3.5,0]",
                                "--vae-relative-tile-size", "0.5x2", "--force-sdxl-vae-conv-scale"});
    EXPECT_FLOAT_EQ(*o.eta, 0.3f);
    EXPECT_EQ(o.sampler_rng, "cpu");
    EXPECT_EQ(o.sigmas, (std::vector<float>{14.6f, 7.8f, 3.5f, 0.0f}));
    EXPECT_FLOAT_EQ(o.vae_relative_tile_w, 0.5f);
    EXPECT_FLOAT_EQ(o.vae_relative_tile_h, 2.0f);
    EXPECT_FLOAT_EQ(parse_ok({"--vae-relative-tile-size", "3"}).vae_relative_tile_h, 3.0f);
    EXPECT_EQ(parse_error({"--eta", "1.5"}).message, "--eta: expected a number from 0 to 1, got '1.5'");
    EXPECT_EQ(parse_error({"--sigmas", "1,,0"}).message, "--sigmas: an empty value in '1,,0'");
    EXPECT_EQ(parse_error({"--sigmas", "1,x"}).message, "--sigmas: 'x' is not a number");
    EXPECT_EQ(parse_error({"--sampler-rng", "mt19937"}).message,
              "--sampler-rng: unknown RNG 'mt19937' (valid: cpu, cuda, std_default)");
    EXPECT_NE(parse_error({"--vae-relative-tile-size", "0x1"}).message.find("(0, 1000]"), std::string::npos);
    const Options refs = parse_ok({"-r", "a.png", "--increase-ref-index", "--disable-auto-resize-ref-image",
                                   "--chroma-disable-dit-mask", "--chroma-enable-t5-mask", "--chroma-t5-mask-pad", "4"});
    EXPECT_TRUE(refs.increase_ref_index);
    EXPECT_TRUE(refs.disable_auto_resize_ref_image);
    EXPECT_TRUE(refs.chroma_disable_dit_mask);
    EXPECT_TRUE(refs.chroma_enable_t5_mask);
    EXPECT_EQ(refs.chroma_t5_mask_pad, 4);
    EXPECT_EQ(parse_ok({}).chroma_t5_mask_pad, -1);
    EXPECT_EQ(parse_ok({"--timestep-shift", "250"}).timestep_shift, 250);
    const Options slg = parse_ok({"--slg-scale", "2.5", "--skip-layers", "[7, 8,9]", "--skip-layer-start", "0.05",
                                  "--skip-layer-end", "0.5"});
    EXPECT_FLOAT_EQ(slg.slg_scale, 2.5f);
    EXPECT_EQ(slg.skip_layers, (std::vector<int>{7, 8, 9}));
    EXPECT_FLOAT_EQ(slg.skip_layer_start, 0.05f);
    EXPECT_FLOAT_EQ(slg.skip_layer_end, 0.5f);
    EXPECT_EQ(parse_ok({}).skip_layers, (std::vector<int>{7, 8, 9}));
    EXPECT_NE(parse_error({"--skip-layers", "[7,x]"}).message.find("--skip-layers: expected an integer"),
              std::string::npos);
    EXPECT_NE(parse_error({"--timestep-shift", "1001"}).message.find("from 0 to 1000"), std::string::npos);
    // Checked even when they do not apply (no --slg-scale, no --hires).
    EXPECT_EQ(parse_error({"--skip-layer-start", "99999999999"}).message,
              "--skip-layer-start: expected a number from 0 to 1, got '99999999999'");
    EXPECT_EQ(parse_error({"--skip-layer-end", "-1"}).message,
              "--skip-layer-end: expected a number from 0 to 1, got '-1'");
    EXPECT_EQ(parse_error({"--hires-denoising-strength", "2"}).message,
              "--hires-denoising-strength: expected a number from 0 to 1, got '2'");
}

TEST(Args, Modes) {
    EXPECT_EQ(parse_ok({"-M", "convert"}).command, Command::Convert);
    EXPECT_EQ(parse_ok({"--mode", "img_gen"}).command, Command::Generate);
    EXPECT_EQ(parse_error({"-M", "paint"}).message,
              "--mode: unknown mode 'paint' (valid: img_gen, vid_gen, convert, metadata, upscale)");
    const Options video = parse_ok({"-M", "vid_gen", "--video-frames", "33", "--fps", "24"});
    EXPECT_EQ(video.command, Command::Generate);
    EXPECT_TRUE(video.video_mode);
    EXPECT_EQ(video.video_frames, 33);
    EXPECT_EQ(video.fps, 24);
    EXPECT_FALSE(parse_ok({"-M", "img_gen"}).video_mode);
    EXPECT_EQ(parse_ok({"plan", "-M", "vid_gen"}).command, Command::Plan);
}

TEST(Args, LastLoggingOptionWins) {
    EXPECT_EQ(parse_ok({}).log_level, LogLevel::Info);
    EXPECT_EQ(parse_ok({"-v"}).log_level, LogLevel::Verbose);
    EXPECT_EQ(parse_ok({"--verbose", "--log-level", "error"}).log_level, LogLevel::Error);
    EXPECT_EQ(parse_ok({"--log-level", "debug", "-v"}).log_level, LogLevel::Verbose);
    EXPECT_EQ(parse_ok({"--log-level", "WARN"}).log_level, LogLevel::Warn);
    EXPECT_TRUE(parse_ok({"--color"}).color);
    EXPECT_EQ(parse_error({"--log-level", "loud"}).message,
              "--log-level: unknown log level 'loud' (valid: debug, verbose, info, warn, error)");
}

TEST(Args, UnknownFlagSuggestsTheClosestOne) {
    UsageError e = parse_error({"--vea", "x"});
    EXPECT_EQ(e.message, "unknown option '--vea'");
    EXPECT_EQ(e.hint, "did you mean '--vae'?");
    EXPECT_EQ(parse_error({"--cfg_scale", "7"}).hint, "did you mean '--cfg-scale'?");
    EXPECT_EQ(parse_error({"--completely-unrelated-thing"}).hint, "see 'kiln --help'");
}

TEST(Args, BadValues) {
    EXPECT_EQ(parse_error({"--steps", "abc"}).message, "--steps: expected an integer, got 'abc'");
    EXPECT_EQ(parse_error({"--steps", "0"}).message, "--steps: expected an integer from 1 to 10000, got 0");
    EXPECT_EQ(parse_error({"-W", "12x"}).message, "--width: expected an integer, got '12x'");
    EXPECT_EQ(parse_error({"--cfg-scale", "nan"}).message, "--cfg-scale: expected a number from 0 to 1000, got 'nan'");
    EXPECT_EQ(parse_error({"--cfg-scale", "1e39"}).message,
              "--cfg-scale: expected a number from 0 to 1000, got '1e39'");
    EXPECT_EQ(parse_error({"-s", "-2"}).message, "--seed: expected an integer from -1 to 9223372036854775807, got -2");
    // Out of long long's range: the message still says what is accepted.
    EXPECT_EQ(parse_error({"-s", "18446744073709551615"}).message,
              "--seed: expected an integer from -1 to 9223372036854775807, got 18446744073709551615");
    EXPECT_EQ(parse_error({"-s", "99999999999999999999"}).message,
              "--seed: expected an integer from -1 to 9223372036854775807, got 99999999999999999999");
    // Names are checked by the parsers that use them, at flag time.
    EXPECT_EQ(parse_error({"--sampling-method", "fast"})
                  .message.rfind("--sampling-method: unknown sampling method 'fast' (valid: euler", 0),
              0u);
    EXPECT_EQ(parse_error({"--scheduler", "weird"}).message.rfind("--scheduler: unknown scheduler 'weird'", 0), 0u);
    EXPECT_EQ(parse_error({"--rng", "gpu"}).message, "--rng: unknown RNG 'gpu' (valid: cpu, cuda, std_default)");
    EXPECT_EQ(parse_error({"-m"}).message, "--model: missing value PATH");
    EXPECT_EQ(parse_error({"-m", ""}).message, "--model: expected a path, got an empty string");
    EXPECT_EQ(parse_error({"--color=yes"}).message, "--color takes no value");
    EXPECT_EQ(parse_error({"stray"}).message, "unexpected argument 'stray'");
}

TEST(Args, InfoCommand) {
    const Options o = parse_ok({"info", "--tensors", "a.safetensors", "folder", "-v"});
    EXPECT_EQ(o.command, Command::Info);
    EXPECT_TRUE(o.info_list_tensors);
    EXPECT_EQ(o.info_paths, (std::vector<std::string>{"a.safetensors", "folder"}));
    EXPECT_EQ(o.log_level, LogLevel::Verbose);
    EXPECT_TRUE(parse_ok({"info"}).info_paths.empty());  // the default model
    EXPECT_EQ(parse_error({"--tensors"}).message, "unknown option '--tensors'");
    EXPECT_EQ(parse_error({"-v", "info", "x"}).hint, "'info' must come first: kiln info FILE...");
}

TEST(Args, DeviceFlags) {
    Options o = parse_ok({"--list-devices", "--rpc-servers", "127.0.0.1:50052,gpu-box:50053"});
    EXPECT_EQ(o.command, Command::ListDevices);
    EXPECT_EQ(o.rpc_servers, "127.0.0.1:50052,gpu-box:50053");
    o = parse_ok({"-p", "x", "--backend", "diffusion=rpc0,te=cpu"});
    EXPECT_EQ(o.command, Command::Generate);
    EXPECT_EQ(o.backend, "diffusion=rpc0,te=cpu");
    EXPECT_EQ(parse_error({"--rpc-servers", "127.0.0.1"}).message, "--rpc-servers: 127.0.0.1: expected host:port");
    EXPECT_EQ(parse_error({"--rpc-servers", "h:0"}).message,
              "--rpc-servers: h:0: the port must be a number from 1 to 65535, got '0'");
    EXPECT_EQ(parse_error({"--rpc-servers", "h:1,:2"}).message, "--rpc-servers: :2: empty host (expected host:port)");
    EXPECT_EQ(parse_error({"--backend", ""}).message,
              "--backend: expected a device or module=device pairs, got an empty string");
}

TEST(Args, RpcServerCommand) {
    Options o = parse_ok({"rpc-server"});
    EXPECT_EQ(o.command, Command::RpcServer);
    EXPECT_EQ(o.rpc_host, "127.0.0.1");
    EXPECT_EQ(o.rpc_port, 50052);
    EXPECT_EQ(o.rpc_device, "");
    o = parse_ok({"rpc-server", "--host", "0.0.0.0", "--port", "6000", "--device", "cpu", "-t", "2"});
    EXPECT_EQ(o.rpc_host, "0.0.0.0");
    EXPECT_EQ(o.rpc_port, 6000);
    EXPECT_EQ(o.rpc_device, "cpu");
    EXPECT_EQ(o.threads, 2);
    EXPECT_EQ(parse_ok({"rpc-server", "--host", "localhost"}).rpc_host, "127.0.0.1");
    EXPECT_EQ(parse_error({"rpc-server", "--port", "0"}).message, "--port: expected an integer from 1 to 65535, got 0");
    EXPECT_EQ(parse_error({"rpc-server", "--host", "example.com"}).message,
              "--host: expected an IPv4 address such as 127.0.0.1 or 0.0.0.0, got 'example.com'");
    EXPECT_EQ(parse_error({"--port", "6000"}).message, "unknown option '--port'");  // rpc-server only
    EXPECT_EQ(parse_error({"-v", "rpc-server"}).hint, "'rpc-server' must come first: kiln rpc-server --port P");
}

TEST(Args, ServeKeysHostNamesAndCorsOrigins) {
    // HTTP drops a header value's outer whitespace: no client could send these keys.
    for (const std::string key : {"   ", " key", "key\t", "a\nb"}) {
        const UsageError e = parse_error({"serve", "--api-key", key});
        EXPECT_EQ(e.message.rfind("--api-key: ", 0), 0u) << e.message;
    }
    EXPECT_EQ(parse_ok({"serve", "--api-key", "in side"}).api_key, "in side");
    const Options o = parse_ok({"serve", "--host-name", "kiln.lan", "--host-name", "box", "--cors-origin",
                                "http://localhost:3000", "--cors-origin", "*"});
    EXPECT_EQ(o.host_names, (std::vector<std::string>{"kiln.lan", "box"}));
    EXPECT_EQ(o.cors_origins, (std::vector<std::string>{"http://localhost:3000", "*"}));
    EXPECT_EQ(parse_error({"serve", "--host-name", "evil.example:80"}).message,
              "--host-name: expected a host name such as kiln.lan, got 'evil.example:80'");
    for (const std::string origin : {"localhost:3000", "http://", "http://a.example/path"}) {
        EXPECT_EQ(parse_error({"serve", "--cors-origin", origin}).message.rfind("--cors-origin: expected an origin", 0),
                  0u)
            << origin;
    }
}

TEST(Args, HelpListsEveryFlag) {
    const std::string help = help_text();
    for (const char* flag : {"--model", "--diffusion-model", "--vae", "--clip_l", "--mode", "--help", "--log-level",
                             "--verbose", "--color", "--type", "--tensors", "--list-devices", "--rpc-servers",
                             "--backend", "rpc-server", "--host", "--port", "--device"}) {
        EXPECT_NE(help.find(flag), std::string::npos) << flag;
    }
    EXPECT_EQ(parse_ok({"-h"}).command, Command::Help);
}

// --help reads by group, every main option in one; each command and -M
// mode has a help of its own options.
TEST(Args, HelpIsGroupedAndEachCommandHasItsOwn) {
    EXPECT_EQ(flags_outside_help_groups(), std::vector<std::string>{});
    const std::string full = help_text();
    for (const char* group : {"\nmodel files:\n", "\ngeneration:\n", "\nsampling:\n", "\noutput:\n", "\nlogging:\n"}) {
        EXPECT_NE(full.find(group), std::string::npos) << group;
    }
    const Options serve = parse_ok({"serve", "--help"});
    EXPECT_EQ(serve.command, Command::Help);
    EXPECT_EQ(serve.help_topic, Command::Serve);
    const std::string serve_help = help_text(serve.help_topic);
    EXPECT_EQ(serve_help.rfind("usage: kiln serve", 0), 0u) << serve_help;
    EXPECT_NE(serve_help.find("--listen-port"), std::string::npos);
    EXPECT_EQ(serve_help.find("--sampling-method"), std::string::npos);

    const Options metadata = parse_ok({"-M", "metadata", "-h"});
    const std::string metadata_help = help_text(metadata.help_topic);
    EXPECT_NE(metadata_help.find("--metadata-format"), std::string::npos);
    EXPECT_EQ(metadata_help.find("--listen-port"), std::string::npos);
    for (const char* command : {"info", "plan", "pull", "rpc-server"}) {
        const Options o = parse_ok({command, "--help"});
        EXPECT_EQ(help_text(o.help_topic).rfind(std::string("usage: kiln ") + command, 0), 0u) << command;
    }
}

TEST(Args, QuietLeavesWarningsAndErrors) {
    const Options o = parse_ok({"-q", "-p", "x"});
    EXPECT_TRUE(o.quiet);
    EXPECT_EQ(o.log_level, LogLevel::Warn);
    EXPECT_EQ(parse_ok({"--quiet", "-v"}).log_level, LogLevel::Verbose);  // the last one wins
}

}  // namespace
}  // namespace kiln::cli
