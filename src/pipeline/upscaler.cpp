#include "pipeline/upscaler.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "image/png_metadata.h"
#include "pipeline/vae_tiling.h"
#include "util/log.h"

namespace kiln::pipeline {

Status validate_upscale_tile(int tile, const char* flag) {
    if (tile < kMinUpscaleTile || tile > image::kMaxDimension) {
        return Error::invalid_request(std::string(flag) + " must be in [" + std::to_string(kMinUpscaleTile) + ", " +
                                      std::to_string(image::kMaxDimension) + "] pixels, got " + std::to_string(tile));
    }
    return Status::Ok();
}

Upscaler::~Upscaler() {
    // The graph's buffers belong to the compute: free the session first.
    session_.reset();
}

Result<std::unique_ptr<Upscaler>> Upscaler::load(const std::string& path, int threads) {
    std::unique_ptr<Upscaler> up(new Upscaler());
    auto file = io::ModelFile::open({path});
    if (!file.ok()) return file.error().as(ErrorKind::BadFile);
    up->file_ = std::make_unique<io::ModelFile>(std::move(file).value());
    // The whole file's names: the network finds its own prefix in them.
    up->weights_ = std::make_unique<runtime::ModuleWeights>(*up->file_, "", std::nullopt);
    auto net = models::RrdbNet::create(*up->weights_);
    if (!net.ok()) return net.error();
    up->net_ = std::move(net).value();
    auto compute = runtime::Compute::create(threads);
    if (!compute.ok()) return compute.error();
    up->compute_ = std::move(compute).value();
    KILN_TRY(up->weights_->load(up->compute_->weights_backend()));
    up->name_ = std::filesystem::path(path).stem().string();
    const models::RrdbNetConfig& c = up->net_->config();
    KILN_LOG_VERBOSE("upscaler %s: RRDBNet x%d, %d blocks, %lld features, growth %lld%s", up->name_.c_str(), c.scale(),
                     c.blocks, static_cast<long long>(c.features), static_cast<long long>(c.growth),
                     c.unshuffle > 1 ? (", pixel unshuffle " + std::to_string(c.unshuffle)).c_str() : "");
    return up;
}

Result<std::vector<float>> Upscaler::run_tile(const std::vector<float>& pixels, int64_t width, int64_t height) {
    if (cancelled_ && cancelled_()) return Error::cancelled("cancelled");
    const int64_t channels = net_->config().image_channels;
    if (!session_ || session_input_->ne[0] != width || session_input_->ne[1] != height) {
        session_.reset();
        session_ = std::make_unique<runtime::GraphSession>();
        session_input_ = session_->input(GGML_TYPE_F32, {width, height, channels, 1}, pixels.data(), "image");
        session_output_ = net_->build(session_->ctx(), session_input_, nn::ComputeTarget::Cpu);
    } else {
        session_->set_input(session_input_, pixels.data());
    }
    KILN_TRY(session_->run(*compute_, session_output_));
    return runtime::GraphSession::read(session_output_);
}

Result<std::vector<float>> Upscaler::upscale_planar(const std::vector<float>& pixels, int width, int height, int tile) {
    KILN_TRY(validate_upscale_tile(tile));
    const int64_t channels = net_->config().image_channels;
    if (width < 1 || height < 1 || static_cast<int64_t>(pixels.size()) != channels * width * height) {
        return Error::invalid_request("upscale: the image has " + std::to_string(pixels.size()) + " values, expected " +
                                      std::to_string(channels) + " x " + std::to_string(width) + "x" +
                                      std::to_string(height));
    }
    // Whole unshuffle cells: pad right and bottom with the edge pixels.
    const int64_t r = net_->config().unshuffle, s = scale();
    const int64_t pw = (width + r - 1) / r * r, ph = (height + r - 1) / r * r;
    std::vector<float> padded(static_cast<size_t>(channels * pw * ph));
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t y = 0; y < ph; ++y) {
            const float* src = pixels.data() + (c * height + std::min<int64_t>(y, height - 1)) * width;
            float* dst = padded.data() + (c * ph + y) * pw;
            for (int64_t x = 0; x < pw; ++x) dst[x] = src[std::min<int64_t>(x, width - 1)];
        }
    }
    TiledMap map;
    map.grid_w = pw / r;
    map.grid_h = ph / r;
    map.in_channels = map.out_channels = channels;
    map.in_scale = r;
    map.out_scale = r * s;
    VaeTiling tiling{static_cast<int>(tile / r), kUpscaleTileOverlap};
    TileFn fn = [&](const std::vector<float>& in, int64_t w, int64_t h) { return run_tile(in, w * r, h * r); };
    auto tiled = run_tiled(padded, map, tiling, fn);
    if (!tiled.ok()) return tiled.error();
    if (pw == width && ph == height) return tiled;
    std::vector<float> out(static_cast<size_t>(channels * width * s * height * s));
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t y = 0; y < height * s; ++y) {
            const float* src = tiled->data() + (c * ph * s + y) * pw * s;
            std::copy(src, src + width * s, out.begin() + (c * height * s + y) * width * s);
        }
    }
    return out;
}

int repeats_to_reach(int scale, int64_t width, int64_t height, int64_t target_w, int64_t target_h) {
    int repeats = 1;
    for (int64_t f = scale; repeats < kMaxUpscaleRepeats && (width * f < target_w || height * f < target_h);
         f *= scale) {
        ++repeats;
    }
    return repeats;
}

Result<UpscalerMemory> Upscaler::memory(int width, int height, int tile, int repeats) {
    KILN_TRY(validate_upscale_tile(tile));
    UpscalerMemory m;
    m.weights = weights_->declared_bytes();
    // The tile of the last (largest) repeat, in whole unshuffle cells as upscale_planar cuts it.
    int64_t w = width, h = height;
    for (int i = 1; i < repeats; ++i) w *= scale(), h *= scale();
    const int64_t r = net_->config().unshuffle;
    const int64_t cell_tile = std::max<int64_t>(1, tile / r);
    m.tile_w = std::min(cell_tile, (w + r - 1) / r) * r;
    m.tile_h = std::min(cell_tile, (h + r - 1) / r) * r;
    runtime::GraphSession session;
    const int64_t channels = net_->config().image_channels;
    const std::vector<float> zeros(static_cast<size_t>(m.tile_w * m.tile_h * channels), 0.0f);
    ggml_tensor* input = session.input(GGML_TYPE_F32, {m.tile_w, m.tile_h, channels, 1}, zeros.data(), "image");
    ggml_cgraph* graph = session.graph(net_->build(session.ctx(), input, nn::ComputeTarget::Cpu));
    auto sched = compute_->measure_sched_for(graph);
    if (!sched.ok()) return sched.error();
    std::vector<size_t> sizes(static_cast<size_t>(ggml_backend_sched_get_n_backends(*sched)), 0);
    ggml_backend_sched_reserve_size(*sched, graph, sizes.data());
    for (size_t s : sizes) m.tile_compute += s;
    return m;
}

Result<image::Image> Upscaler::upscale(const image::Image& source, int tile, int repeats) {
    KILN_TRY(validate_upscale_tile(tile));
    if (repeats < 1 || repeats > kMaxUpscaleRepeats) {
        return Error::invalid_request("--upscale-repeats must be in [1, " + std::to_string(kMaxUpscaleRepeats) +
                                      "], got " + std::to_string(repeats));
    }
    int64_t factor = 1;
    for (int i = 0; i < repeats; ++i) factor *= scale();
    if (source.width * factor > image::kMaxDimension || source.height * factor > image::kMaxDimension) {
        return Error::invalid_request("upscaling " + std::to_string(source.width) + "x" +
                                      std::to_string(source.height) + " by " + std::to_string(factor) +
                                      " would exceed " + std::to_string(image::kMaxDimension) + " pixels a side");
    }
    auto rgb = image::convert_channels(source, 3);
    if (!rgb.ok()) return rgb.error();
    image::Image img = std::move(rgb).value();
    for (int i = 0; i < repeats; ++i) {
        const size_t plane = static_cast<size_t>(img.width) * static_cast<size_t>(img.height);
        std::vector<float> pixels(plane * 3);
        for (size_t p = 0; p < plane; ++p) {
            for (size_t c = 0; c < 3; ++c) pixels[c * plane + p] = img.pixels[p * 3 + c] / 255.0f;
        }
        auto out = upscale_planar(pixels, img.width, img.height, tile);
        if (!out.ok()) return out.error();
        image::Image next = image::make_image(img.width * scale(), img.height * scale(), 3);
        const size_t out_plane = static_cast<size_t>(next.width) * static_cast<size_t>(next.height);
        for (size_t p = 0; p < out_plane; ++p) {
            for (size_t c = 0; c < 3; ++c) {
                const float v = std::clamp((*out)[c * out_plane + p], 0.0f, 1.0f);
                next.pixels[p * 3 + c] = static_cast<uint8_t>(std::lround(v * 255.0f));
            }
        }
        img = std::move(next);
    }
    return img;
}

std::string add_postprocess_upscale(const std::string& parameters, const std::string& upscaler, int factor) {
    image::GenerationInfo info = image::parse_a1111_parameters(parameters);
    info.extra.emplace_back("Postprocess upscale by", std::to_string(factor));
    info.extra.emplace_back("Postprocess upscaler", upscaler);
    return image::format_a1111_parameters(info);
}

}  // namespace kiln::pipeline
