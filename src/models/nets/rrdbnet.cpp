#include "models/nets/rrdbnet.h"

#include <array>

namespace kiln::models {
namespace {

constexpr float kSlope = 0.2f;          // every leaky ReLU's
constexpr float kResidualScale = 0.2f;  // dense blocks' and RRDBs'
constexpr int kMaxUpsamplers = 4;       // x16 at most

// The tensor names of one naming, relative to the config's prefix.
struct Names {
    RrdbNaming naming;
    int blocks = 0;
    int upsamplers = 0;

    bool esrgan() const { return naming == RrdbNaming::Esrgan; }
    std::string conv_first() const { return esrgan() ? "model.0" : "conv_first"; }
    // Convolution `conv` (1..5) of dense block `rdb` (1..3) of RRDB `block`.
    std::string dense(int block, int rdb, int conv) const {
        const std::string b = std::to_string(block), r = std::to_string(rdb), c = std::to_string(conv);
        return esrgan() ? "model.1.sub." + b + ".RDB" + r + ".conv" + c + ".0" : "body." + b + ".rdb" + r + ".conv" + c;
    }
    std::string conv_body() const { return esrgan() ? "model.1.sub." + std::to_string(blocks) : "conv_body"; }
    // Upsampler k (1-based): ESRGAN's Sequential puts one every three modules.
    std::string conv_up(int k) const {
        return esrgan() ? "model." + std::to_string(3 * k) : "conv_up" + std::to_string(k);
    }
    std::string conv_hr() const { return esrgan() ? "model." + std::to_string(3 * upsamplers + 2) : "conv_hr"; }
    std::string conv_last() const { return esrgan() ? "model." + std::to_string(3 * upsamplers + 4) : "conv_last"; }
};

struct DenseBlock {
    std::array<nn::Conv2d, 5> conv;
};

struct Rrdb {
    std::array<DenseBlock, 3> rdb;
};

ggml_tensor* lrelu(ggml_context* ctx, ggml_tensor* x) { return ggml_leaky_relu(ctx, x, kSlope, false); }

// Each convolution sees the block's input and every earlier output, stacked on channels.
ggml_tensor* apply_dense(ggml_context* ctx, nn::ComputeTarget target, const DenseBlock& d, ggml_tensor* x) {
    ggml_tensor* stacked = x;
    for (int j = 0; j < 4; ++j) {
        stacked = ggml_concat(ctx, stacked, lrelu(ctx, nn::conv2d(ctx, target, d.conv[j], stacked)), 2);
    }
    return ggml_add(ctx, ggml_scale(ctx, nn::conv2d(ctx, target, d.conv[4], stacked), kResidualScale), x);
}

ggml_tensor* apply_rrdb(ggml_context* ctx, nn::ComputeTarget target, const Rrdb& b, ggml_tensor* x) {
    ggml_tensor* h = x;
    for (const DenseBlock& d : b.rdb) h = apply_dense(ctx, target, d, h);
    return ggml_add(ctx, ggml_scale(ctx, h, kResidualScale), x);
}

// PyTorch's pixel_unshuffle of ne [W, H, C, 1] by r -> ne [W/r, H/r, C*r*r, 1],
// output channel c*r*r + i*r + j holding input pixel (x*r + j, y*r + i). One
// channel at a time, since the full rearrangement needs five dimensions.
ggml_tensor* pixel_unshuffle(ggml_context* ctx, ggml_tensor* x, int r) {
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2];
    ggml_tensor* out = nullptr;
    for (int64_t c = 0; c < C; ++c) {
        ggml_tensor* plane = ggml_cont(ctx, ggml_view_2d(ctx, x, W, H, x->nb[1], static_cast<size_t>(c) * x->nb[2]));
        ggml_tensor* t = ggml_reshape_4d(ctx, plane, r, W / r, r, H / r);  // (j, x, i, y)
        t = ggml_cont(ctx, ggml_permute(ctx, t, 2, 0, 3, 1));              // (x, y, j, i)
        t = ggml_reshape_4d(ctx, t, W / r, H / r, r * r, 1);
        out = out ? ggml_concat(ctx, out, t, 2) : t;
    }
    return out;
}

Error bad(const io::ModelFile& file, const std::string& what) {
    return Error::bad_file(file.sources().front().path + ": " + what);
}

}  // namespace

struct RrdbNet::Layers {
    nn::Conv2d first;
    std::vector<Rrdb> blocks;
    nn::Conv2d body;
    std::vector<nn::Conv2d> up;
    nn::Conv2d hr;
    nn::Conv2d last;
};

RrdbNet::RrdbNet() = default;
RrdbNet::~RrdbNet() = default;

Result<std::unique_ptr<RrdbNet>> RrdbNet::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    std::unique_ptr<RrdbNet> net(new RrdbNet());
    RrdbNetConfig& c = net->config_;
    // The naming and the prefix: the first of these that has a first convolution.
    bool found = false;
    for (const char* prefix : {"", "params_ema.", "params."}) {
        for (RrdbNaming naming : {RrdbNaming::BasicSr, RrdbNaming::Esrgan}) {
            if (!found && file.find(prefix + Names{naming}.conv_first() + ".weight")) {
                c.prefix = prefix;
                c.naming = naming;
                found = true;
            }
        }
    }
    if (!found) {
        return bad(file,
                   "not an ESRGAN/Real-ESRGAN upscaler (RRDBNet): it has neither 'model.0.weight' (ESRGAN's names) "
                   "nor 'conv_first.weight' (BasicSR's), at the top level or under 'params_ema.' or 'params.'");
    }
    Names names{c.naming};
    auto find = [&](const std::string& name) { return file.find(c.prefix + name + ".weight"); };
    auto shape_of = [&](const std::string& name) -> Result<std::vector<int64_t>> {
        const io::TensorInfo* t = find(name);
        if (!t) return bad(file, "missing tensor '" + c.prefix + name + ".weight'");
        if (t->shape.size() != 4) {
            return bad(file, "tensor '" + c.prefix + name + ".weight' has shape " + t->shape_string() +
                                 ", expected a 2-D convolution's [out, in, kh, kw]");
        }
        return t->shape;
    };

    auto first = shape_of(names.conv_first());
    if (!first.ok()) return first.error();
    c.features = (*first)[0];
    c.blocks = 0;
    while (find(names.dense(c.blocks, 1, 1))) ++c.blocks;
    if (c.blocks == 0)
        return bad(file, "missing tensor '" + c.prefix + names.dense(0, 1, 1) + ".weight' (no RRDB blocks)");
    auto growth = shape_of(names.dense(0, 1, 1));
    if (!growth.ok()) return growth.error();
    c.growth = (*growth)[0];
    names.blocks = c.blocks;
    c.upsamplers = 0;
    while (c.upsamplers < kMaxUpsamplers && find(names.conv_up(c.upsamplers + 1))) ++c.upsamplers;
    names.upsamplers = c.upsamplers;
    auto last = shape_of(names.conv_last());
    if (!last.ok()) return last.error();
    c.image_channels = (*last)[0];
    // conv_first takes image_channels * r * r channels: the pixel unshuffle.
    const int64_t in = (*first)[1];
    c.unshuffle = 0;
    for (int r : {1, 2, 4}) {
        if (in == c.image_channels * r * r) c.unshuffle = r;
    }
    if (c.unshuffle == 0) {
        return bad(file, "conv_first takes " + std::to_string(in) + " channels and conv_last gives " +
                             std::to_string(c.image_channels) +
                             ": the input must have as many channels as the output, or 4 or 16 times as many "
                             "(Real-ESRGAN's pixel unshuffle by 2 or 4)");
    }
    if ((1 << c.upsamplers) < c.unshuffle) {
        return bad(file, "pixel unshuffle by " + std::to_string(c.unshuffle) + " with " + std::to_string(c.upsamplers) +
                             " upsampler(s): the network would downscale");
    }

    // `weights` is the whole file's (prefix ""): the network found its own prefix above.
    io::WeightDeclarer& w = weights;
    auto at = [&](const std::string& name) { return c.prefix + name; };
    net->layers_ = std::make_unique<Layers>();
    Layers& l = *net->layers_;
    const int64_t nf = c.features, gc = c.growth;
    l.first = nn::declare_conv2d(w, at(names.conv_first()), in, nf, 3, 1, 1);
    for (int b = 0; b < c.blocks; ++b) {
        Rrdb block;
        for (int r = 0; r < 3; ++r) {
            for (int j = 0; j < 5; ++j) {
                const int64_t out = j == 4 ? nf : gc;
                block.rdb[static_cast<size_t>(r)].conv[static_cast<size_t>(j)] =
                    nn::declare_conv2d(w, at(names.dense(b, r + 1, j + 1)), nf + j * gc, out, 3, 1, 1);
            }
        }
        l.blocks.push_back(block);
    }
    l.body = nn::declare_conv2d(w, at(names.conv_body()), nf, nf, 3, 1, 1);
    for (int k = 1; k <= c.upsamplers; ++k)
        l.up.push_back(nn::declare_conv2d(w, at(names.conv_up(k)), nf, nf, 3, 1, 1));
    l.hr = nn::declare_conv2d(w, at(names.conv_hr()), nf, nf, 3, 1, 1);
    l.last = nn::declare_conv2d(w, at(names.conv_last()), nf, c.image_channels, 3, 1, 1);
    return net;
}

ggml_tensor* RrdbNet::build(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target) const {
    const Layers& l = *layers_;
    ggml_tensor* x = config_.unshuffle > 1 ? pixel_unshuffle(ctx, image, config_.unshuffle) : image;
    ggml_tensor* feat = nn::conv2d(ctx, target, l.first, x);
    ggml_tensor* h = feat;
    for (size_t b = 0; b < l.blocks.size(); ++b) {
        h = nn::mark_cut(apply_rrdb(ctx, target, l.blocks[b], h), "body." + std::to_string(b));
    }
    feat = ggml_add(ctx, feat, nn::conv2d(ctx, target, l.body, h));
    for (const nn::Conv2d& up : l.up)
        feat = lrelu(ctx, nn::conv2d(ctx, target, up, nn::upsample_nearest_2x(ctx, feat)));
    return nn::conv2d(ctx, target, l.last, lrelu(ctx, nn::conv2d(ctx, target, l.hr, feat)));
}

}  // namespace kiln::models
