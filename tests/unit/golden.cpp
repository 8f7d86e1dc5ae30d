#include "golden.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "io/name_map.h"

namespace kiln::test {

std::string golden_path(const std::string& relative) { return std::string(KILN_GOLDEN_DIR) + "/" + relative; }

std::string kiln_with_sd1_tiny(const std::string& args) {
    return std::string(KILN_BIN) + " -t 1 -m " + golden_path("models/sd1_tiny.safetensors") + " --tokenizer " +
           KILN_FIXTURES_DIR + "/tiny_tokenizer " + args;
}

std::vector<int64_t> ggml_ne(const std::vector<int64_t>& torch_shape) {
    return std::vector<int64_t>(torch_shape.rbegin(), torch_shape.rend());
}

std::unique_ptr<runtime::Compute> golden_cpu() {
    auto c = runtime::Compute::create(1);
    if (!c.ok()) throw std::runtime_error(c.error().message);
    return std::move(c).value();
}

FixtureTensor fixture_tensor(const io::ModelFile& file, const std::string& name) {
    FixtureTensor out;
    const io::TensorInfo* t = file.find(name);
    if (!t) {
        ADD_FAILURE() << "fixture tensor '" << name << "' missing";
        return out;
    }
    out.shape = t->shape;
    const int64_t n = t->element_count();
    out.values.resize(static_cast<size_t>(n));
    const uint8_t* data = file.data(*t);
    if (t->dtype == io::DType::F32) {
        std::memcpy(out.values.data(), data, static_cast<size_t>(n) * 4);
    } else if (t->dtype == io::DType::I32) {
        for (int64_t i = 0; i < n; ++i) {
            int32_t v;
            std::memcpy(&v, data + 4 * i, 4);
            out.values[static_cast<size_t>(i)] = static_cast<float>(v);
        }
    } else {
        ADD_FAILURE() << "fixture tensor '" << name << "' has dtype " << io::dtype_name(t->dtype);
    }
    return out;
}

double relative_error(const std::vector<float>& actual, const std::vector<float>& expected) {
    if (actual.size() != expected.size()) return INFINITY;
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(actual[i]) - expected[i]));
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(expected[i])));
        if (std::isnan(actual[i])) return INFINITY;
    }
    return max_diff / std::max(max_ref, 1e-6);
}

SafetensorsEntry copy_entry(const io::ModelFile& file, const io::TensorInfo& t, std::string name) {
    const uint8_t* data = file.data(t);
    const char* dtype = t.dtype == io::DType::F16    ? "F16"
                        : t.dtype == io::DType::BF16 ? "BF16"
                        : t.dtype == io::DType::F32  ? "F32"
                                                     : "I64";
    return {std::move(name), dtype, t.shape, std::vector<uint8_t>(data, data + t.nbytes)};
}

std::vector<uint8_t> with_tensor_shape(const std::string& path, const std::string& name,
                                       const std::vector<int64_t>& shape,
                                       const std::vector<std::pair<std::string, std::string>>& metadata) {
    auto file = io::ModelFile::open({path});
    EXPECT_TRUE(file.ok()) << path;
    if (!file.ok()) return {};
    std::vector<SafetensorsEntry> entries;
    for (const io::TensorInfo& t : file->tensors()) {
        SafetensorsEntry e = copy_entry(*file, t, t.name);
        if (t.name == name) {
            const size_t element = e.data.size() / static_cast<size_t>(t.element_count());
            int64_t count = 1;
            for (int64_t d : shape) count *= d;
            e.shape = shape;
            e.data.resize(static_cast<size_t>(count) * element, 0);
        }
        entries.push_back(std::move(e));
    }
    return build_safetensors(entries, metadata);
}

// HF's CLIPTextModelWithProjection names of an open_clip text tower, with
// q/k/v split and text_projection transposed (io/name_map.h).
std::vector<SafetensorsEntry> to_diffusers(const SafetensorsEntry& e, const io::NameMap& map, std::string* folder) {
    std::vector<SafetensorsEntry> out;
    auto names = map.ldm_to_diffusers(e.name);
    if (!names) return out;  // extras such as logit_scale
    *folder = std::string(io::diffusers_folder(names->component));
    for (const io::NameMapping& m : names->tensors) {
        SafetensorsEntry d{m.name, e.dtype, e.shape, {}};
        if (m.op == io::NameMapping::Op::Slice3) {
            d.shape[0] /= 3;
            const size_t bytes = e.data.size() / 3;
            d.data.assign(e.data.begin() + bytes * m.part, e.data.begin() + bytes * (m.part + 1));
        } else if (m.op == io::NameMapping::Op::Transpose) {
            const size_t rows = static_cast<size_t>(e.shape[0]), cols = static_cast<size_t>(e.shape[1]);
            const size_t es = e.data.size() / (rows * cols);
            d.shape = {e.shape[1], e.shape[0]};
            d.data.resize(e.data.size());
            for (size_t r = 0; r < rows; ++r) {
                for (size_t c = 0; c < cols; ++c)
                    std::memcpy(&d.data[(c * rows + r) * es], &e.data[(r * cols + c) * es], es);
            }
        } else {
            if (io::vae_attention_needs_reshape(e.name)) d.shape.resize(2);
            d.data = e.data;
        }
        out.push_back(std::move(d));
    }
    return out;
}

std::vector<SafetensorsEntry> wan_vae_in_diffusers_names(const std::string& path) {
    const io::NameMap map(io::ModelFamily::Wan);
    auto file = io::ModelFile::open({path});
    EXPECT_TRUE(file.ok()) << path;
    std::vector<SafetensorsEntry> out;
    if (!file.ok()) return out;
    for (const io::TensorInfo& t : file->tensors()) {
        std::string folder;
        auto renamed = to_diffusers(copy_entry(*file, t, "first_stage_model." + t.name), map, &folder);
        EXPECT_EQ(renamed.size(), 1u) << t.name;
        EXPECT_EQ(folder, "vae") << t.name;
        for (auto& d : renamed) out.push_back(std::move(d));
    }
    return out;
}

pipeline::ModelPaths model_at(const std::string& path) {
    pipeline::ModelPaths paths;
    paths.model = {path};
    return paths;
}

const pipeline::Module* module_named(const pipeline::Model& model, const std::string& name) {
    for (const auto& m : model.modules()) {
        if (m->spec.name == name) return m.get();
    }
    return nullptr;
}

std::vector<float> toy_denoiser(const std::vector<float>& x, float sigma) {
    const double s = sigma;
    const double scale = 0.25 / (0.25 + s * s);
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i] * scale + 0.1 * std::tanh(double{x[i]}));
    return out;
}

Records load_sampling_records(const std::string& file) {
    Records records;
    const std::string path = golden_path("sampling/" + file);
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << "cannot open " << path;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        std::string name;
        size_t count = 0;
        fields >> name >> count;
        std::vector<double> values(count);
        for (double& v : values) fields >> v;
        EXPECT_FALSE(fields.fail()) << "bad record " << name;
        records[name] = std::move(values);
    }
    return records;
}

const std::vector<double>& record(const Records& records, const std::string& name) {
    static const std::vector<double> kEmpty;
    auto it = records.find(name);
    if (it == records.end()) {
        ADD_FAILURE() << "missing fixture record " << name;
        return kEmpty;
    }
    return it->second;
}

image::Image fixture_image(const io::ModelFile& io, const std::string& name) {
    const FixtureTensor t = fixture_tensor(io, name);
    const int channels = static_cast<int>(t.shape[1]), h = static_cast<int>(t.shape[2]),
              w = static_cast<int>(t.shape[3]);
    image::Image img = image::make_image(w, h, channels);
    const size_t plane = static_cast<size_t>(w) * static_cast<size_t>(h);
    for (size_t i = 0; i < plane; ++i) {
        for (size_t c = 0; c < static_cast<size_t>(channels); ++c) {
            img.pixels[i * channels + c] = static_cast<uint8_t>(t.values[c * plane + i]);
        }
    }
    return img;
}

int difference_from_reference(const image::Image& img, const io::ModelFile& io, const std::string& key, int frame) {
    const auto want = fixture_tensor(io, key);
    const size_t plane = static_cast<size_t>(img.width) * img.height;
    // [1, 3, H, W], or a clip's [1, 3, F, H, W] of which `frame`.
    const size_t frames = want.shape.size() == 5 ? static_cast<size_t>(want.shape[2]) : 1;
    if (want.values.size() != plane * 3 * frames || img.channels != 3 || frame < 0 ||
        static_cast<size_t>(frame) >= frames) {
        return 255;
    }
    int worst = 0;
    for (size_t i = 0; i < plane; ++i) {
        for (size_t c = 0; c < 3; ++c) {
            const float v = std::clamp(
                (want.values[(c * frames + static_cast<size_t>(frame)) * plane + i] + 1.0f) * 0.5f, 0.0f, 1.0f);
            worst = std::max(worst, std::abs(static_cast<int>(std::lround(v * 255.0f)) - img.pixels[i * 3 + c]));
        }
    }
    return worst;
}

pipeline::ModelOptions golden_model_options() {
    pipeline::ModelOptions options;
    options.weight_type = GGML_TYPE_F32;
    options.threads = 1;
    return options;
}

}  // namespace kiln::test
