// An ESRGAN / Real-ESRGAN upscaler (models/nets/rrdbnet.h) loaded from its file
// and run over an image in overlapping tiles, so memory is bounded by the
// tile size, not the image's: sd-cli's --upscale-model with
// --upscale-tile-size, kiln's -M upscale, and the hires fix's model upscaler.
//
// Tiles are blended as the VAE's are (pipeline/vae_tiling.h, run_tiled):
// every output pixel is a weighted average of the tiles covering it, with
// linear ramps across each overlap. The network's receptive field is wider
// than the overlap, so a tiled result is close to the untiled one, not equal;
// an image that fits one tile is the untiled run exactly.
//
// Runs on the CPU (the tile bounds its compute buffers; the weights of real
// upscalers are 17-67 MB). The hires fix counts an upscaler in RAM's books
// and kiln plan forecasts it (memory()).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "image/image.h"
#include "io/model_file.h"
#include "models/nets/rrdbnet.h"
#include "runtime/compute.h"
#include "runtime/graph_session.h"
#include "runtime/module_weights.h"
#include "util/result.h"

namespace kiln::pipeline {

// sd-cli's default --upscale-tile-size, in input pixels.
constexpr int kDefaultUpscaleTile = 128;
// Smaller tiles would be mostly zero padding to the network (and under a
// pixel unshuffle by 4, fewer than 8 of its pixels).
constexpr int kMinUpscaleTile = 32;
// Share of a tile overlapping its neighbour.
constexpr float kUpscaleTileOverlap = 0.25f;
// --upscale-repeats: each repeat multiplies the size by the model's scale.
constexpr int kMaxUpscaleRepeats = 8;

// A tile side in [kMinUpscaleTile, image::kMaxDimension]; the error
// (invalid request) names `flag` and the range.
Status validate_upscale_tile(int tile, const char* flag = "--upscale-tile-size");

// How many runs of an upscaler of `scale` take a width x height image to at
// least target_w x target_h (at most kMaxUpscaleRepeats): the hires fix's
// model upscaler, A1111's way.
int repeats_to_reach(int scale, int64_t width, int64_t height, int64_t target_w, int64_t target_h);

// RAM an upscale takes besides its input and output images: the weights and
// the compute buffers of its largest tile.
struct UpscalerMemory {
    uint64_t weights = 0;
    uint64_t tile_compute = 0;
    int64_t tile_w = 0, tile_h = 0;  // that tile's size in input pixels
    uint64_t total() const { return weights + tile_compute; }
};

class Upscaler {
  public:
    // Opens the model file (.safetensors, .pth/.ckpt, .gguf), reads the
    // network's configuration from it and loads its weights. threads <= 0:
    // every core. Errors: BadFile for a file that cannot be read or is not
    // an RRDBNet (naming the tensor), OutOfMemory.
    static Result<std::unique_ptr<Upscaler>> load(const std::string& path, int threads);
    ~Upscaler();

    // Output pixels per input pixel along each side (2, 4, ...).
    int scale() const { return net_->config().scale(); }
    // The file's stem ("RealESRGAN_x4plus"), the name A1111 records.
    const std::string& name() const { return name_; }
    const models::RrdbNet& network() const { return *net_; }
    // Asked before every tile: true stops the run with a Cancelled error
    // (the hires fix passes its model's kiln_cancel flag).
    void set_cancel_check(std::function<bool()> cancelled) { cancelled_ = std::move(cancelled); }

    // pixels: planar [3, height, width] in [0, 1] -> planar [3, height *
    // scale, width * scale], unclamped, computed in tiles of `tile` input
    // pixels (validate_upscale_tile). Any width and height >= 1: sides that
    // are not a multiple of the network's pixel unshuffle are padded with
    // their edge pixels and the padding cropped from the result.
    Result<std::vector<float>> upscale_planar(const std::vector<float>& pixels, int width, int height, int tile);
    // An 8-bit image (any channel count; alpha is dropped) -> an RGB image
    // `scale` times larger, `repeats` times over. Errors: a bad tile or
    // repeat count (invalid request), a result larger than
    // image::kMaxDimension (invalid request), a failed graph.
    Result<image::Image> upscale(const image::Image& image, int tile, int repeats = 1);
    // What upscale() of a width x height image with `tile` takes in RAM
    // (the tile graph measured, not run), its last repeat's tile being the
    // largest. Errors: a bad tile (invalid request).
    Result<UpscalerMemory> memory(int width, int height, int tile, int repeats = 1);

  private:
    Upscaler() = default;
    Result<std::vector<float>> run_tile(const std::vector<float>& pixels, int64_t width, int64_t height);

    std::string name_;
    std::function<bool()> cancelled_;
    std::unique_ptr<io::ModelFile> file_;
    std::unique_ptr<runtime::ModuleWeights> weights_;  // before net_: its tensors live here
    std::unique_ptr<models::RrdbNet> net_;
    std::unique_ptr<runtime::Compute> compute_;
    // The last tile's graph: every tile but an image's only one has the same
    // size, so the graph and its allocation serve them all.
    std::unique_ptr<runtime::GraphSession> session_;
    ggml_tensor* session_input_ = nullptr;
    ggml_tensor* session_output_ = nullptr;
};

// `parameters` (an image's A1111 text, possibly empty) with A1111's
// postprocessing keys added: "Postprocess upscale by: <factor>, Postprocess
// upscaler: <upscaler>".
std::string add_postprocess_upscale(const std::string& parameters, const std::string& upscaler, int factor);

}  // namespace kiln::pipeline
