#include "models/nets/taesd.h"

namespace kiln::models {
namespace {

// Layers past this index are not looked for: a TAESD decoder has 19.
constexpr int kMaxLayers = 64;

struct Block {
    nn::Conv2d conv0, conv2, conv4;
    std::optional<nn::Conv2d> skip;  // a 1x1 convolution without bias where the width changes
};

struct Stage {
    std::vector<Block> blocks;
    // After every stage but the last: a 2x nearest upsample, then this 3x3
    // convolution without bias.
    std::optional<nn::Conv2d> upsample_conv;
};

ggml_tensor* apply_block(ggml_context* ctx, nn::ComputeTarget target, const Block& b, ggml_tensor* x) {
    ggml_tensor* h = ggml_relu(ctx, nn::conv2d(ctx, target, b.conv0, x));
    h = ggml_relu(ctx, nn::conv2d(ctx, target, b.conv2, h));
    h = nn::conv2d(ctx, target, b.conv4, h);
    return ggml_relu(ctx, ggml_add(ctx, h, b.skip ? nn::conv2d(ctx, target, *b.skip, x) : x));
}

}  // namespace

struct Taesd::Layers {
    nn::Conv2d conv_in;
    std::vector<Stage> stages;
    nn::Conv2d conv_out;
};

Taesd::Taesd() = default;
Taesd::~Taesd() = default;

Result<std::unique_ptr<Taesd>> Taesd::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    // The naming: diffusers' decoder.layers.N from 0, or madebyollin's bare
    // Sequential indices from 1 (after the Clamp).
    std::string base = prefix + "decoder.layers.";
    int first = 0;
    if (!file.find(base + "0.weight")) {
        base = prefix;
        first = 1;
    }
    const std::string rel = base.substr(prefix.size());  // the layer names' start under `prefix`
    auto conv_shape = [&](int index, const char* part) -> const std::vector<int64_t>* {
        const io::TensorInfo* t = file.find(base + std::to_string(index) + part);
        return t && t->shape.size() == 4 ? &t->shape : nullptr;
    };
    const std::vector<int64_t>* in_shape = conv_shape(first, ".weight");
    if (!in_shape || (*in_shape)[2] != 3 || (*in_shape)[3] != 3) {
        return Error{"no tiny autoencoder decoder under '" + prefix + "' (neither decoder.layers.0.weight nor " +
                     "1.weight is a 3x3 convolution)"};
    }

    std::unique_ptr<Taesd> taesd(new Taesd());
    TaesdConfig& c = taesd->config_;
    c.latent_channels = (*in_shape)[1];
    c.channels = (*in_shape)[0];
    io::WeightDeclarer& w = weights;
    taesd->layers_ = std::make_unique<Layers>();
    Layers& l = *taesd->layers_;
    auto name = [&](int index) { return rel + std::to_string(index); };
    l.conv_in = nn::declare_conv2d(w, name(first), c.latent_channels, c.channels, 3, 1, 1);

    // After conv_in's ReLU: Blocks, and between stages a parameterless
    // Upsample then a convolution; the last convolution (3 outputs, with a
    // bias) ends the decoder.
    l.stages.emplace_back();
    int64_t width = c.channels;
    bool upsampled = false;  // an Upsample was passed and its convolution not yet
    bool ended = false;
    for (int i = first + 2; i < first + kMaxLayers && !ended; ++i) {
        if (const std::vector<int64_t>* block = conv_shape(i, ".conv.0.weight")) {
            if (upsampled)
                return Error{"tiny autoencoder: layer " + name(i) +
                             " follows an upsample; expected a "
                             "convolution"};
            const int64_t out = (*block)[0];
            Block b;
            b.conv0 = nn::declare_conv2d(w, name(i) + ".conv.0", width, out, 3, 1, 1);
            b.conv2 = nn::declare_conv2d(w, name(i) + ".conv.2", out, out, 3, 1, 1);
            b.conv4 = nn::declare_conv2d(w, name(i) + ".conv.4", out, out, 3, 1, 1);
            if (out != width) b.skip = nn::declare_conv2d(w, name(i) + ".skip", width, out, 1, 1, 0, false);
            l.stages.back().blocks.push_back(b);
            width = out;
        } else if (const std::vector<int64_t>* conv = conv_shape(i, ".weight")) {
            const int64_t out = (*conv)[0];
            if (upsampled) {
                l.stages.back().upsample_conv = nn::declare_conv2d(w, name(i), width, out, 3, 1, 1, false);
                l.stages.emplace_back();
                upsampled = false;
            } else {
                l.conv_out = nn::declare_conv2d(w, name(i), width, out, 3, 1, 1);
                ended = true;
            }
            width = out;
        } else {
            if (upsampled || l.stages.back().blocks.empty()) {
                return Error{"tiny autoencoder: no layer " + name(i) + " where a block or convolution belongs"};
            }
            upsampled = true;
        }
    }
    if (!ended) return Error{"tiny autoencoder under '" + prefix + "': no final convolution to 3 channels"};
    if (width != 3) {
        return Error{"tiny autoencoder: the final convolution gives " + std::to_string(width) +
                     " channels, not 3 (an encoder, not a decoder?)"};
    }
    if (l.stages.back().blocks.empty()) return Error{"tiny autoencoder: its last stage has no blocks"};
    for (const Stage& stage : l.stages) c.blocks_per_stage.push_back(static_cast<int>(stage.blocks.size()));
    return taesd;
}

ggml_tensor* Taesd::build_decoder(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const {
    const Layers& l = *layers_;
    ggml_tensor* h = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, latent, 1.0f / 3.0f)), 3.0f);
    h = ggml_relu(ctx, nn::conv2d(ctx, target, l.conv_in, h));
    for (size_t s = 0; s < l.stages.size(); ++s) {
        const Stage& stage = l.stages[s];
        for (const Block& b : stage.blocks) h = apply_block(ctx, target, b, h);
        if (stage.upsample_conv) {
            h = nn::conv2d(ctx, target, *stage.upsample_conv, nn::upsample_nearest_2x(ctx, h));
        }
        h = nn::mark_cut(h, "taesd.stage." + std::to_string(s));
    }
    return nn::conv2d(ctx, target, l.conv_out, h);
}

}  // namespace kiln::models
