// Full-size Wan 2.1 text-to-video in the forms people download, written as
// sparse files (headers only, no byte of data written or read;
// training/fixtures/make_wan_specs.py's specs):
//   fp16: ComfyUI's wan2.1_t2v_14B_fp16.safetensors (tests/fixtures/
//         wan21_t2v_14b.spec: the original names, no prefix, 26.6 GiB),
//         umt5_xxl_fp16.safetensors (umt5_xxl.spec: HF's UMT5EncoderModel
//         names, 10.6 GiB) with --tokenizer t5xxl=<a small real SentencePiece
//         model> (kiln plan needs a loadable tokenizer, not umT5's own), and
//         wan_2.1_vae.safetensors (qwen_image_vae.spec: Qwen-Image's VAE is
//         Wan 2.1's, the same file);
//   Q8_0: wan2.1-t2v-14b-Q8_0.gguf as city96's tools write it (arch "wan",
//         the names kept, the blocks' 400 matrices Q8_0, the embedders and
//         the head F16, vectors and modulations F32, patch_embedding a 5-D F32
//         tensor) and umt5-xxl-encoder-Q8_0.gguf (llama.cpp's names, arch
//         t5encoder, every matrix Q8_0 but the position tables, which
//         llama-quantize never quantizes), with the same VAE;
//   and wan2.1_t2v_1.3B_fp16.safetensors (wan21_t2v_1_3b.spec, under
//   ComfyUI's "model.diffusion_model." prefix, which that file keeps) and Wan
//   2.2 TI2V-5B's DiT (wan22_ti2v_5b.spec, 48 channels).
// kiln info names each file, the loader configures every network from the
// shapes, and kiln plan places sd-cli's Wan job (docs/wan.md: 832x480, 33
// frames, cfg 6, --diffusion-fa) on a loopback RPC device under budgets of 24,
// 16, 12 and 8 GiB: the budget table of docs/wan.md. (The loopback device
// reports this machine's memory, so larger budgets are not seen.)
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include "gguf.h"
#include "image/image_io.h"
#include "models/nets/t5_encoder.h"
#include "models/nets/wan_dit.h"
#include "pipeline/model.h"
#include "random_model.h"
#include "rpc_child.h"
#include "test_files.h"

namespace kiln {
namespace {

std::string fixture(const std::string& name) { return std::string(KILN_FIXTURES_DIR) + "/" + name; }
std::string spiece() { return std::string(KILN_GOLDEN_DIR) + "/text/umt5_like_spiece.model"; }
std::string tokenizer_flag() { return "t5xxl=" + spiece(); }

// wan2.1-t2v-14b-Q8_0.gguf (city96/Wan2.1-T2V-14B-gguf): ComfyUI-GGUF's
// tools/convert.py on Wan-AI's F32 release (arch "wan", the names kept;
// 1-D tensors and keys_hiprec ".modulation" F32, the other matrices F16; the
// 5-D patch_embedding set aside and added back as F32 by fix_5d_tensors.py),
// then its patched llama-quantize Q8_0, whose LLM_ARCH_WAN rules quantize
// only 2-D tensors outside modulation, patch_embedding, text_embedding,
// time_projection, time_embedding and head: the 40 blocks' 10 matrices.
test::SparseGgufOptions dit_q8_0_gguf_options() {
    test::SparseGgufOptions o;
    o.type = [](const std::string& name, const std::vector<int64_t>& shape, ggml_type) {
        if (shape.size() == 1 || name.find("modulation") != std::string::npos ||
            name.rfind("patch_embedding.", 0) == 0) {
            return GGML_TYPE_F32;
        }
        return name.rfind("blocks.", 0) == 0 && shape.size() == 2 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    };
    o.metadata = {{"general.architecture", std::string("wan")},
                  {"general.quantization_version", uint32_t{2}},
                  {"general.file_type", uint32_t{7}}};  // LLAMA_FTYPE_MOSTLY_Q8_0
    return o;
}

// llama.cpp's names for HF's umT5 encoder (tensor_mapping.py's T5 encoder
// rows, as city96's umt5-xxl-encoder GGUFs have them).
std::string umt5_llama_cpp_name(const std::string& hf_name) {
    static const std::pair<const char*, const char*> kBlock[] = {
        {"layer.0.SelfAttention.q.weight", "attn_q.weight"},
        {"layer.0.SelfAttention.k.weight", "attn_k.weight"},
        {"layer.0.SelfAttention.v.weight", "attn_v.weight"},
        {"layer.0.SelfAttention.o.weight", "attn_o.weight"},
        {"layer.0.SelfAttention.relative_attention_bias.weight", "attn_rel_b.weight"},
        {"layer.0.layer_norm.weight", "attn_norm.weight"},
        {"layer.1.DenseReluDense.wi_0.weight", "ffn_gate.weight"},
        {"layer.1.DenseReluDense.wi_1.weight", "ffn_up.weight"},
        {"layer.1.DenseReluDense.wo.weight", "ffn_down.weight"},
        {"layer.1.layer_norm.weight", "ffn_norm.weight"},
    };
    if (hf_name == "shared.weight") return "token_embd.weight";
    if (hf_name == "encoder.final_layer_norm.weight") return "enc.output_norm.weight";
    static const std::regex block("^encoder\\.block\\.(\\d+)\\.(.+)$");
    std::smatch m;
    if (!std::regex_match(hf_name, m, block)) return hf_name;
    for (const auto& [hf, cpp] : kBlock) {
        if (m[2] == hf) return "enc.blk." + m[1].str() + "." + cpp;
    }
    return hf_name;
}

// umt5-xxl-encoder-Q8_0.gguf (city96): llama.cpp's convert_hf_to_gguf.py
// (arch t5encoder) and llama-quantize Q8_0: every matrix Q8_0 but the
// relative position tables ("do not quantize relative position bias (T5)",
// kept F16 as converted), vectors F32. The real file carries umT5's
// SentencePiece vocabulary as tokenizer.ggml.* arrays; the sparse writer
// copies arrays only from a vocab GGUF, of which there is none for umT5 here,
// so the test passes --tokenizer instead.
test::SparseGgufOptions umt5_q8_0_gguf_options() {
    test::SparseGgufOptions o;
    o.rename = umt5_llama_cpp_name;
    o.type = [](const std::string& name, const std::vector<int64_t>& shape, ggml_type) {
        if (shape.size() == 1) return GGML_TYPE_F32;
        return name.find("attn_rel_b") != std::string::npos ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
    };
    o.metadata = {
        {"general.architecture", std::string("t5encoder")},
        {"general.name", std::string("Umt5 Xxl")},
        {"general.file_type", uint32_t{7}},  // LLAMA_FTYPE_MOSTLY_Q8_0
        {"general.quantization_version", uint32_t{2}},
        {"t5encoder.context_length", uint32_t{512}},
        {"t5encoder.embedding_length", uint32_t{4096}},
        {"t5encoder.feed_forward_length", uint32_t{10240}},
        {"t5encoder.block_count", uint32_t{24}},
        {"t5encoder.attention.head_count", uint32_t{64}},
        {"t5encoder.attention.key_length", uint32_t{64}},
        {"t5encoder.attention.value_length", uint32_t{64}},
        {"t5encoder.attention.layer_norm_epsilon", 1e-6f},
        {"t5encoder.attention.relative_buckets_count", uint32_t{32}},
        {"t5encoder.attention.layer_norm_rms_epsilon", 1e-6f},
    };
    return o;
}

// The spec's lines with `name`'s shape replaced (outermost first), written into `dir`.
Result<std::string> spec_with_shape(const test::TempDir& dir, const std::string& spec, const std::string& file_name,
                                    const std::string& name, const std::string& shape) {
    std::ifstream in(spec);
    if (!in) return Error{spec + ": cannot open"};
    std::ostringstream out;
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string first, dtype;
        fields >> first >> dtype;
        out << (first == name ? first + " " + dtype + " " + shape : line) << "\n";
    }
    return dir.write(file_name, out.str());
}

uint64_t read_u64(const std::string& s, size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, s.data() + at, 8);
    return v;
}

// One tensor of a GGUF header, read here rather than by ggml's gguf reader,
// which (like kiln's, src/io/gguf_file.cpp) takes at most 4 dimensions.
struct GgufTensor {
    std::string name;
    std::vector<uint64_t> ne;  // innermost first
    uint32_t type = 0;
    uint64_t offset = 0;
    size_t dims_at = 0;  // where n_dims lies in the header
};

struct GgufHeader {
    std::string bytes;  // the header through its last tensor info
    std::vector<GgufTensor> tensors;
    uint64_t data_offset = 0;  // the data section: the header padded to 32 bytes
};

// The tensor infos of a GGUF file whose first tensor is `first` (found by
// its length-prefixed name, after the metadata), walked to their end.
Result<GgufHeader> read_gguf_header(const std::string& path, const std::string& first) {
    std::ifstream in(path, std::ios::binary);
    std::string head(1 << 20, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    if (head.size() < 24 || head.compare(0, 4, "GGUF") != 0) return Error{path + ": not a GGUF file"};
    std::string key(8, '\0');
    const uint64_t length = first.size();
    std::memcpy(key.data(), &length, 8);
    const size_t infos = head.find(key + first);
    if (infos == std::string::npos) return Error{path + ": no tensor " + first + " in the header"};
    GgufHeader h;
    size_t at = infos;
    for (uint64_t t = read_u64(head, 8); t > 0; --t) {
        GgufTensor info;
        if (at + 12 > head.size()) return Error{path + ": a header longer than 1 MiB"};
        const uint64_t name_length = read_u64(head, at);
        info.name = head.substr(at + 8, name_length);
        at += 8 + name_length;
        info.dims_at = at;
        uint32_t n_dims = 0;
        std::memcpy(&n_dims, head.data() + at, 4);
        at += 4;
        for (uint32_t d = 0; d < n_dims; ++d, at += 8) info.ne.push_back(read_u64(head, at));
        std::memcpy(&info.type, head.data() + at, 4);
        info.offset = read_u64(head, at + 4);
        at += 12;
        h.tensors.push_back(std::move(info));
    }
    h.bytes = head.substr(0, at);
    h.data_offset = GGML_PAD(at, 32);
    return h;
}

// A GGUF tensor of more than ggml's 4 dimensions, as the gguf Python package
// writes it (fix_5d_tensors.py's patch_embedding): the sparse writer, like
// ggml, takes at most 4, so the tensor `name` (the spec's first) is written
// 4-D with the same bytes ([5120, 16, 2, 2] for [5120, 16, 1, 2, 2]) and its
// shape in the header then replaced by `ne` (innermost first); the header
// grows, the data section moves to the next aligned offset, and the data
// (none written) stays as long.
Status widen_tensor(const std::string& path, const std::string& name, const std::vector<uint64_t>& ne) {
    auto h = read_gguf_header(path, name);
    if (!h.ok()) return h.error();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Error{path + ": cannot stat"};
    const GgufTensor& t = h->tensors.front();
    std::string dims(4, '\0');
    const uint32_t n = static_cast<uint32_t>(ne.size());
    std::memcpy(dims.data(), &n, 4);
    for (uint64_t d : ne) dims.append(reinterpret_cast<const char*>(&d), 8);
    const size_t after = t.dims_at + 4 + 8 * t.ne.size();
    std::string out = h->bytes.substr(0, t.dims_at) + dims + h->bytes.substr(after);
    out.resize(GGML_PAD(out.size(), 32), '\0');
    const uint64_t data_bytes = static_cast<uint64_t>(st.st_size) - h->data_offset;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return Error{path + ": cannot write"};
    bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    ok = ok && std::fflush(f) == 0 && ftruncate(fileno(f), static_cast<off_t>(out.size() + data_bytes)) == 0;
    if (std::fclose(f) != 0 || !ok) return Error{path + ": write failed"};
    return Status::Ok();
}

// Wan 2.2 T2V A14B's experts as QuantStack's Wan2.2-T2V-A14B-{High,Low}Noise-Q4_K_M.gguf:
// the 14B's names and shapes (each expert is a Wan 2.1 14B), city96's tools
// with llama-quantize's Q4_K_M rule on the blocks' matrices (Q4_K, and Q6_K
// for the value projections and the FFN's down projection of the first and
// last eighth of the blocks and every third between: use_more_bits), the
// rest as in the Q8_0 file.
test::SparseGgufOptions dit_q4_k_m_gguf_options() {
    test::SparseGgufOptions o = dit_q8_0_gguf_options();
    const auto q8_0_type = o.type;
    o.type = [q8_0_type](const std::string& name, const std::vector<int64_t>& shape, ggml_type given) {
        const ggml_type base = q8_0_type(name, shape, given);
        if (base != GGML_TYPE_Q8_0) return base;
        const int block = std::stoi(name.substr(7)), blocks = 40;
        const bool more_bits = block < blocks / 8 || block >= 7 * blocks / 8 || (block - blocks / 8) % 3 == 2;
        const bool v_or_down = name.find(".v.weight") != std::string::npos || name.find("ffn.2.") != std::string::npos;
        return v_or_down && more_bits ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
    };
    o.metadata = {{"general.architecture", std::string("wan")},
                  {"general.quantization_version", uint32_t{2}},
                  {"general.file_type", uint32_t{15}}};  // LLAMA_FTYPE_MOSTLY_Q4_K_M
    return o;
}

// The files a user downloads, written sparse once for the suite.
struct Files {
    std::string dit_14b, umt5, vae;       // wan2.1_t2v_14B_fp16, umt5_xxl_fp16, wan_2.1_vae
    std::string dit_14b_q8_0, umt5_q8_0;  // city96's GGUFs
    std::string dit_1_3b, dit_5b;         // wan2.1_t2v_1.3B_fp16, wan2.2_ti2v_5B_fp16
    std::string a14b_high_q4_k_m, a14b_low_q4_k_m;  // Wan 2.2 A14B's experts
    std::string dit_i2v_14b, clip_vision_h;         // wan2.1_i2v_480p_14B_fp16, clip_vision_h
    std::string vae22;                              // wan2.2_vae
    std::string dit_vace_14b;                       // wan2.1_vace_14B_fp16
};

class WanFullSize : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        setup_error_ = new std::string();
        files_ = new Files{dir_->file("wan2.1_t2v_14B_fp16.safetensors"),
                           dir_->file("umt5_xxl_fp16.safetensors"),
                           dir_->file("wan_2.1_vae.safetensors"),
                           dir_->file("wan2.1-t2v-14b-Q8_0.gguf"),
                           dir_->file("umt5-xxl-encoder-Q8_0.gguf"),
                           dir_->file("wan2.1_t2v_1.3B_fp16.safetensors"),
                           dir_->file("wan2.2_ti2v_5B_fp16.safetensors"),
                           dir_->file("Wan2.2-T2V-A14B-HighNoise-Q4_K_M.gguf"),
                           dir_->file("Wan2.2-T2V-A14B-LowNoise-Q4_K_M.gguf"),
                           dir_->file("wan2.1_i2v_480p_14B_fp16.safetensors"),
                           dir_->file("clip_vision_h.safetensors"),
                           dir_->file("wan2.2_vae.safetensors"),
                           dir_->file("wan2.1_vace_14B_fp16.safetensors")};
        if (!std::ifstream(spiece()).good()) {
            *setup_error_ = spiece() + " is missing";
            return;
        }
        auto four_d = spec_with_shape(*dir_, fixture("wan21_t2v_14b.spec"), "wan21_t2v_14b_4d.spec",
                                      "patch_embedding.weight", "5120 16 2 2");
        if (!four_d.ok()) {
            *setup_error_ = four_d.error().message;
            return;
        }
        const Files& f = *files_;
        const Status written[] = {
            test::write_sparse_model(fixture("wan21_t2v_14b.spec"), f.dit_14b),
            test::write_sparse_model(fixture("umt5_xxl.spec"), f.umt5),
            test::write_sparse_model(fixture("qwen_image_vae.spec"), f.vae),
            test::write_sparse_gguf(*four_d, f.dit_14b_q8_0, dit_q8_0_gguf_options()),
            widen_tensor(f.dit_14b_q8_0, "patch_embedding.weight", {2, 2, 1, 16, 5120}),
            test::write_sparse_gguf(fixture("umt5_xxl.spec"), f.umt5_q8_0, umt5_q8_0_gguf_options()),
            test::write_sparse_model(fixture("wan21_t2v_1_3b.spec"), f.dit_1_3b),
            test::write_sparse_model(fixture("wan22_ti2v_5b.spec"), f.dit_5b),
            test::write_sparse_gguf(*four_d, f.a14b_high_q4_k_m, dit_q4_k_m_gguf_options()),
            widen_tensor(f.a14b_high_q4_k_m, "patch_embedding.weight", {2, 2, 1, 16, 5120}),
            test::write_sparse_gguf(*four_d, f.a14b_low_q4_k_m, dit_q4_k_m_gguf_options()),
            widen_tensor(f.a14b_low_q4_k_m, "patch_embedding.weight", {2, 2, 1, 16, 5120}),
            test::write_sparse_model(fixture("wan21_i2v_14b.spec"), f.dit_i2v_14b),
            test::write_sparse_model(fixture("clip_vision_h.spec"), f.clip_vision_h),
            test::write_sparse_model(fixture("wan22_vae.spec"), f.vae22),
            test::write_sparse_model(fixture("wan21_vace_14b.spec"), f.dit_vace_14b),
        };
        for (const Status& s : written) {
            if (!s.ok()) *setup_error_ += s.error().message + "\n";
        }
    }
    static void TearDownTestSuite() {
        delete setup_error_;
        delete files_;
        delete dir_;  // removes the sparse files
    }
    void SetUp() override { ASSERT_TRUE(setup_error_->empty()) << *setup_error_; }

    static const Files& files() { return *files_; }
    static Result<std::unique_ptr<pipeline::Model>> load_plan_only(const std::string& dit, const std::string& te) {
        pipeline::ModelPaths p;
        p.diffusion_model = dit;
        p.t5xxl = te;
        p.vae = files_->vae;
        p.tokenizer = tokenizer_flag();
        pipeline::ModelOptions options;
        options.plan_only = true;
        return pipeline::Model::load(p, options);
    }

    static test::TempDir* dir_;
    static Files* files_;
    static std::string* setup_error_;
};
test::TempDir* WanFullSize::dir_ = nullptr;
Files* WanFullSize::files_ = nullptr;
std::string* WanFullSize::setup_error_ = nullptr;

test::CommandResult info(const std::string& path) { return test::run_command(std::string(KILN_BIN) + " info " + path); }

void expect_lines(const std::string& out, std::initializer_list<const char*> lines) {
    for (const char* line : lines) EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
}

std::string info_ok(const std::string& path) {
    auto r = info(path);
    EXPECT_EQ(r.exit_code, 0) << path << "\n" << r.err;
    return r.out;
}

TEST_F(WanFullSize, InfoNamesEveryFile) {
    const Files& f = files();
    // 14.29 billion values in F16, as the published 28.6 GB.
    const std::string dit = info_ok(f.dit_14b);
    expect_lines(
        dit, {"family: Wan", "diffusion model: diffusion_model\n    1095 tensors", "total: 1095 tensors, 26.61 GiB"});
    EXPECT_EQ(dit.find("other"), std::string::npos) << "every tensor is the DiT's\n" << dit;
    // The 1.3B file keeps ComfyUI's prefix.
    expect_lines(info_ok(f.dit_1_3b), {"family: Wan", "diffusion model: diffusion_model (model.diffusion_model.*)",
                                       "total: 825 tensors, 2.64 GiB"});
    expect_lines(info_ok(f.dit_5b), {"family: Wan", "total: 825 tensors, 9.31 GiB"});
    // umT5-XXL: 24 blocks of 10 tensors (a position table in each), the
    // embedding and the final norm; 11.36 GB, the published 11.4 GB.
    expect_lines(info_ok(f.umt5),
                 {"(a text encoder)", "text encoder: text_encoder\n    242 tensors", "total: 242 tensors, 10.58 GiB"});
    expect_lines(info_ok(f.vae), {"family: Wan 2.1 VAE", "VAE: vae\n    194 tensors", "total: 194 tensors"});
    // The umT5 GGUF: llama.cpp's names, 169 matrices Q8_0, the 24 position tables F16.
    const std::string gguf = info_ok(f.umt5_q8_0);
    expect_lines(gguf, {"general.architecture = t5encoder", "(a text encoder)", "text encoder: text_encoder",
                        "total: 242 tensors, 5.62 GiB", "F16 x24 F32 x49 Q8_0 x169"});
    EXPECT_EQ(gguf.find("encoder.block."), std::string::npos) << gguf;
}

// The GGUF files as their tools write them: the types above, the data
// section ending where the file does, no disk blocks for the data, and the
// DiT's patch_embedding a 5-D tensor.
TEST_F(WanFullSize, SparseGgufFilesAreWhatTheToolsWrite) {
    for (const std::string* path : {&files().umt5_q8_0, &files().dit_14b_q8_0}) {
        SCOPED_TRACE(*path);
        const bool dit = path == &files().dit_14b_q8_0;
        auto h = read_gguf_header(*path, dit ? "patch_embedding.weight" : "token_embd.weight");
        ASSERT_TRUE(h.ok()) << h.error().message;
        const GgufTensor& last = h->tensors.back();
        uint64_t last_bytes = ggml_row_size(static_cast<ggml_type>(last.type), static_cast<int64_t>(last.ne[0]));
        for (size_t d = 1; d < last.ne.size(); ++d) last_bytes *= last.ne[d];
        struct stat st {};
        ASSERT_EQ(::stat(path->c_str(), &st), 0);
        EXPECT_EQ(static_cast<uint64_t>(st.st_size), h->data_offset + last.offset + GGML_PAD(last_bytes, 32));
        EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{64} << 20) << "the data must not be written";
        std::map<std::string, const GgufTensor*> by_name;
        for (const GgufTensor& t : h->tensors) by_name[t.name] = &t;
        auto type = [&](const char* name) {
            auto it = by_name.find(name);
            return it == by_name.end() ? GGML_TYPE_COUNT : static_cast<ggml_type>(it->second->type);
        };
        if (!dit) {
            EXPECT_EQ(h->tensors.size(), 242u);
            EXPECT_EQ(type("token_embd.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("enc.blk.0.attn_q.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("enc.blk.23.ffn_down.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("enc.blk.0.attn_rel_b.weight"), GGML_TYPE_F16);
            EXPECT_EQ(type("enc.blk.23.attn_rel_b.weight"), GGML_TYPE_F16);
            EXPECT_EQ(type("enc.blk.0.attn_norm.weight"), GGML_TYPE_F32);
            EXPECT_EQ(type("enc.output_norm.weight"), GGML_TYPE_F32);
            // ggml's own reader agrees (4-D at most here).
            gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
            std::unique_ptr<gguf_context, void (*)(gguf_context*)> g(gguf_init_from_file(path->c_str(), params),
                                                                     gguf_free);
            ASSERT_TRUE(g);
            EXPECT_EQ(gguf_get_n_tensors(g.get()), 242);
            EXPECT_EQ(gguf_get_data_offset(g.get()), h->data_offset);
        } else {
            EXPECT_EQ(h->tensors.size(), 1095u);
            const GgufTensor* patch = by_name.at("patch_embedding.weight");
            EXPECT_EQ(patch->ne, (std::vector<uint64_t>{2, 2, 1, 16, 5120}));
            EXPECT_EQ(type("patch_embedding.weight"), GGML_TYPE_F32);
            EXPECT_EQ(type("patch_embedding.bias"), GGML_TYPE_F32);
            EXPECT_EQ(type("blocks.0.self_attn.q.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("blocks.0.cross_attn.o.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("blocks.39.ffn.2.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("blocks.0.modulation"), GGML_TYPE_F32);
            EXPECT_EQ(by_name.at("blocks.0.modulation")->ne, (std::vector<uint64_t>{5120, 6, 1}));
            EXPECT_EQ(type("blocks.0.norm3.weight"), GGML_TYPE_F32);
            EXPECT_EQ(type("text_embedding.0.weight"), GGML_TYPE_F16);
            EXPECT_EQ(type("time_projection.1.weight"), GGML_TYPE_F16);
            EXPECT_EQ(type("head.head.weight"), GGML_TYPE_F16);
            EXPECT_EQ(type("head.modulation"), GGML_TYPE_F32);
            int q8_0 = 0;
            for (const GgufTensor& t : h->tensors) q8_0 += t.type == GGML_TYPE_Q8_0;
            EXPECT_EQ(q8_0, 400) << "the 40 blocks' 10 matrices";
        }
    }
}

void expect_umt5(const pipeline::Model& m, models::T5Config::Naming naming) {
    ASSERT_EQ(m.text_encoders().size(), 1u);
    const models::TextEncoderNetwork* network = m.text_encoders()[0].network;
    EXPECT_EQ(network->label(), "umT5");
    const auto* t5 = dynamic_cast<const models::T5Encoder*>(network);
    ASSERT_NE(t5, nullptr);
    const models::T5Config& c = t5->config();
    EXPECT_EQ(c.naming, naming);
    EXPECT_TRUE(c.per_block_position_bias);
    EXPECT_EQ(c.vocab, 256384);
    EXPECT_EQ(c.d_model, 4096);
    EXPECT_EQ(c.d_kv, 64);
    EXPECT_EQ(c.heads, 64);
    EXPECT_EQ(c.d_ff, 10240);
    EXPECT_EQ(c.layers, 24);
    EXPECT_EQ(c.buckets, 32);
}

const models::WanDitConfig* wan_config(const pipeline::Model& m) {
    const auto* dit = dynamic_cast<const models::WanDit*>(&m.diffusion());
    return dit ? &dit->config() : nullptr;
}

TEST_F(WanFullSize, LoaderReadsTheFp16Files) {
    auto model = load_plan_only(files().dit_14b, files().umt5);
    ASSERT_TRUE(model.ok()) << model.error().message;
    const pipeline::Model& m = **model;
    EXPECT_EQ(m.family_label(), "Wan");
    EXPECT_EQ(m.size_stride(), 16);
    EXPECT_EQ(m.defaults().width, 832);
    EXPECT_EQ(m.defaults().height, 480);
    EXPECT_FLOAT_EQ(m.defaults().cfg_scale, 6.0f);
    EXPECT_TRUE(m.diffusion().capabilities().video);
    const models::WanDitConfig* c = wan_config(m);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->dim, 5120);
    EXPECT_EQ(c->heads, 40);
    EXPECT_EQ(c->head_dim(), 128);
    EXPECT_EQ(c->ffn_dim, 13824);
    EXPECT_EQ(c->layers, 40);
    EXPECT_EQ(c->in_channels, 16);
    EXPECT_EQ(c->out_channels, 16);
    EXPECT_EQ(c->patch, 2);
    EXPECT_EQ(c->text_dim, 4096);
    EXPECT_EQ(c->freq_dim, 256);
    EXPECT_EQ(c->rope_axes(), (std::vector<int>{44, 42, 42}));
    expect_umt5(m, models::T5Config::Naming::HuggingFace);
    EXPECT_EQ(m.vae().format().latent_channels, 16);
    EXPECT_EQ(m.vae().format().temporal_downscale, 4);
}

TEST_F(WanFullSize, LoaderReadsTheUmt5GgufAndThe1_3BUnderComfysPrefix) {
    auto model = load_plan_only(files().dit_1_3b, files().umt5_q8_0);
    ASSERT_TRUE(model.ok()) << model.error().message;
    const models::WanDitConfig* c = wan_config(**model);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->dim, 1536);
    EXPECT_EQ(c->heads, 12);
    EXPECT_EQ(c->ffn_dim, 8960);
    EXPECT_EQ(c->layers, 30);
    EXPECT_EQ(c->in_channels, 16);
    expect_umt5(**model, models::T5Config::Naming::LlamaCpp);
}

// Wan 2.2 TI2V-5B's DiT is read, and its 48 channels ask for Wan 2.2's VAE:
// the Wan 2.1 VAE beside it is one clear error.
TEST_F(WanFullSize, Ti2v5BAsksForTheVaeItNeeds) {
    auto model = load_plan_only(files().dit_5b, files().umt5);
    ASSERT_FALSE(model.ok());
    EXPECT_NE(model.error().message.find("the VAE gives 16-channel latents but the Wan DiT predicts 48"),
              std::string::npos)
        << model.error().message;
    EXPECT_NE(model.error().message.find("TI2V-5B Wan 2.2's 48-channel one"), std::string::npos)
        << model.error().message;
}

// city96's wan2.1-t2v-14b-Q8_0.gguf holds patch_embedding as a 5-D F32
// tensor (fix_5d_tensors.py), which ggml's own GGUF parser refuses and
// kiln's reads (io/gguf_file.cpp).
TEST_F(WanFullSize, InfoAndLoaderReadTheQ8_0DitGguf) {
    expect_lines(info_ok(files().dit_14b_q8_0),
                 {"general.architecture = wan", "family: Wan", "total: 1095 tensors", "Q8_0 x400"});
    auto model = load_plan_only(files().dit_14b_q8_0, files().umt5_q8_0);
    ASSERT_TRUE(model.ok()) << model.error().message;
    const models::WanDitConfig* c = wan_config(**model);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->dim, 5120);
    EXPECT_EQ(c->layers, 40);
}

// The line of `out` that starts with `prefix`, or "".
std::string line_of(const std::string& out, const std::string& prefix) {
    const size_t at = out.find("\n" + prefix);
    if (at == std::string::npos) return "";
    return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

double gib_of(const std::smatch& m) { return std::stod(m[1]) / (m[2] == "MiB" ? 1024.0 : 1.0); }

// One row set of the budget table: the parts, any flags, and the weights'
// sizes as kiln counts them.
struct PlanSet {
    const char* name;
    std::string dit, te, flags;
    const char* dit_size;  // "" when not checked
    const char* te_size;
    double dit_gib;
};

// sd-cli's Wan job (docs/wan.md): 832x480, 33 frames (9 latent frames),
// cfg 6 against the empty negative prompt, --diffusion-fa.
test::CommandResult plan(const PlanSet& set, const std::string& vae, const test::RpcServer& server, int gib) {
    const std::string command = std::string(KILN_BIN) + " plan -M vid_gen --diffusion-model " + set.dit + " --t5xxl " +
                                set.te + " --vae " + vae + " --tokenizer " + tokenizer_flag() + set.flags +
                                " --rpc-servers " + server.endpoint() + " --max-vram RPC0=" + std::to_string(gib) +
                                " -W 832 -H 480 --video-frames 33 --diffusion-fa -p 'a cat walking on grass' -t 1";
    auto r = test::run_command(command);
    std::cout << "--- " << set.name << ", " << gib << " GiB\n" << r.out << r.err;
    return r;
}

// What kiln plan must say at each budget, without reading a weight: the
// job line names the clip; the forecast peak stays within the budget; a DiT
// larger than the budget is not kept on the device and runs in segments,
// never fewer at a smaller budget while the text encoder's weights are not
// kept there; one that streams from disk says how much. The job runs at
// every budget: a clip's decode that does not fit whole (a latent frame of
// Wan 2.1's VAE at 832x480 needs 6.61 GiB of compute on the device) is
// planned in spatial tiles (pipeline/clip_decode), which the plan says.
void check_plans(const PlanSet& set, const std::string& vae, std::initializer_list<int> budgets,
                 const std::function<void(int gib, const std::string& out)>& more = {}) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    const std::regex peak("RPC0: peak ([0-9.]+) (GiB|MiB)");
    int previous_segments = 0;
    for (int gib : budgets) {
        SCOPED_TRACE(std::string(set.name) + ", " + std::to_string(gib) + " GiB");
        auto r = plan(set, vae, server, gib);
        ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
        EXPECT_TRUE(test::plan_runs(r.out)) << r.out;
        EXPECT_NE(r.out.find("job: 832x480, 33 frames"), std::string::npos) << r.out;
        std::smatch m;
        ASSERT_TRUE(std::regex_search(r.out, m, peak)) << r.out;
        EXPECT_LE(gib_of(m), gib) << r.out;
        const std::string dit = line_of(r.out, "  diffusion: computes on RPC0, weights ");
        const std::string te = line_of(r.out, "  te: computes on RPC0, weights ");
        ASSERT_FALSE(dit.empty() || te.empty()) << r.out;
        if (*set.dit_size) EXPECT_NE(dit.find("(" + std::string(set.dit_size) + ")"), std::string::npos) << dit;
        if (*set.te_size) EXPECT_NE(te.find("(" + std::string(set.te_size) + ")"), std::string::npos) << te;
        const int segments = test::plan_segments(r.out, "diffusion");
        ASSERT_GT(segments, 0) << r.out;
        if (set.dit_gib > gib) {
            EXPECT_EQ(dit.find("weights on RPC0"), std::string::npos) << dit;
            EXPECT_GE(segments, 2) << "a DiT larger than the budget runs in segments";
        }
        if (te.find("weights on RPC0") == std::string::npos) {
            EXPECT_GE(segments, previous_segments) << r.out;
            previous_segments = segments;
        }
        if (r.out.find("\nfits: only by streaming") != std::string::npos) {
            EXPECT_NE(dit.find("weights on disk"), std::string::npos) << dit;
            if (*set.dit_size) {
                EXPECT_NE(r.out.find("reads its " + std::string(set.dit_size) + " of weights from disk"),
                          std::string::npos)
                    << r.out;
                EXPECT_NE(r.out.find("fits: only by streaming: every step reads " + std::string(set.dit_size)),
                          std::string::npos)
                    << r.out;
            }
        }
        // At 8 GiB no Wan VAE decodes a latent frame of 832x480 whole.
        if (gib <= 8) EXPECT_NE(line_of(r.out, "  vae on RPC0: ").find("in tiles"), std::string::npos) << r.out;
        if (more) more(gib, r.out);
    }
}

// Wan 2.1 T2V 14B fp16 with umT5-XXL fp16: the DiT (26.62 GiB) is larger
// than this machine's RAM beside the rest, so it streams from disk at every
// step.
TEST_F(WanFullSize, PlanFp16UnderEveryBudget) {
    const PlanSet set{"fp16", files().dit_14b, files().umt5, "", "26.62 GiB", "10.58 GiB", 26.62};
    check_plans(set, files().vae, {24, 16, 12, 8});
}

// The Q8_0 rows: city96's wan2.1-t2v-14b-Q8_0.gguf (its 400 block
// matrices Q8_0, the embedders and head F16: 14.36 GiB as kiln holds them)
// with umt5-xxl-encoder-Q8_0.gguf.
TEST_F(WanFullSize, PlanQ8_0GgufUnderEveryBudget) {
    const PlanSet set{"Q8_0 GGUF", files().dit_14b_q8_0, files().umt5_q8_0, "", "", "5.62 GiB", 14.36};
    check_plans(set, files().vae, {24, 16, 12, 8});
}

// Wan 2.1 T2V 1.3B fp16 at 8 GiB: the DiT (2.65 GiB) runs whole, the
// clip's decode in tiles.
TEST_F(WanFullSize, Plan1_3BAt8GiB) {
    const PlanSet set{"1.3B fp16", files().dit_1_3b, files().umt5, "", "2.65 GiB", "10.58 GiB", 2.65};
    check_plans(set, files().vae, {8},
                [](int, const std::string& out) { EXPECT_EQ(test::plan_segments(out, "diffusion"), 1) << out; });
}

// Wan 2.2 T2V A14B, the Q4_K_M pair with umt5-xxl-encoder-Q8_0.gguf, sd-cli's
// 20 steps split at --moe-boundary 0.875: both experts planned on the device,
// one after the other, neither kept there at a budget below the pair.
TEST_F(WanFullSize, PlanA14bQ4_K_MPairUnderEveryBudget) {
    expect_lines(info_ok(files().a14b_high_q4_k_m), {"family: Wan", "total: 1095 tensors", "Q4_K x"});
    const PlanSet set{"A14B Q4_K_M pair",
                      files().a14b_low_q4_k_m,
                      files().umt5_q8_0,
                      " --high-noise-diffusion-model " + files().a14b_high_q4_k_m,
                      "",
                      "5.62 GiB",
                      8.0};
    check_plans(set, files().vae, {24, 16, 12, 8}, [](int, const std::string& out) {
        EXPECT_GT(test::plan_segments(out, "diffusion.high_noise"), 0) << out;
        EXPECT_NE(out.find("time share: diffusion.high_noise samples steps 1-"), std::string::npos) << out;
    });
}

// Wan 2.1 I2V-14B fp16 (32.8 GB: the 14B with its image parts) with
// clip_vision_h.safetensors and a first frame: the plan encodes the frame
// with the VAE and reads it with CLIP vision (its weights in RAM, computing
// on the device) before the DiT, whose 30.55 GiB stream from disk.
TEST_F(WanFullSize, PlanI2v14bWithClipVisionUnderEveryBudget) {
    expect_lines(info_ok(files().clip_vision_h), {"total: 520 tensors"});
    const std::string first = dir_->file("first.png");
    ASSERT_TRUE(image::write_image(first, image::make_image(832, 480, 3, 90)).ok());
    const PlanSet set{"I2V 14B fp16",
                      files().dit_i2v_14b,
                      files().umt5_q8_0,
                      " --clip_vision " + files().clip_vision_h + " -i " + first,
                      "30.55 GiB",
                      "5.62 GiB",
                      30.55};
    check_plans(set, files().vae, {24, 16, 12, 8}, [](int, const std::string& out) {
        EXPECT_NE(out.find("te.clip_vision (first frame CLIP vision) on RPC0"), std::string::npos) << out;
        EXPECT_NE(out.find("vae (first frame encode) on RPC0"), std::string::npos) << out;
    });
}

// Wan 2.2 TI2V-5B fp16 (9.32 GiB) with wan2.2_vae.safetensors and umT5
// Q8_0, sd-cli's job, then with a first frame (-i), whose one-frame encode
// is planned before the DiT.
TEST_F(WanFullSize, PlanTi2v5BUnderEveryBudget) {
    expect_lines(info_ok(files().vae22), {"total: 196 tensors"});
    const PlanSet set{"TI2V 5B fp16", files().dit_5b, files().umt5_q8_0, "", "9.32 GiB", "5.62 GiB", 9.32};
    check_plans(set, files().vae22, {24, 16, 12, 8});
    const std::string first = dir_->file("first_ti2v.png");
    ASSERT_TRUE(image::write_image(first, image::make_image(832, 480, 3, 90)).ok());
    PlanSet with_image = set;
    with_image.name = "TI2V 5B fp16, -i";
    with_image.flags = " -i " + first;
    check_plans(with_image, files().vae22, {12}, [](int, const std::string& out) {
        EXPECT_NE(out.find("vae (first frame encode) on RPC0"), std::string::npos) << out;
    });
}

// Wan2.1-VACE-14B fp16 (34.7 GB: the 14B and 8 VACE blocks) with umT5
// Q8_0, a reference image (-i) and a folder of control frames: the plan
// encodes the context's two clips and the reference with the VAE before the
// DiT, whose 32.30 GiB stream from disk with its VACE blocks in the main
// blocks' segments.
TEST_F(WanFullSize, PlanVace14bUnderEveryBudget) {
    expect_lines(info_ok(files().dit_vace_14b), {"family: Wan", "total: 1331 tensors"});
    const std::string reference = dir_->file("vace_reference.png");
    ASSERT_TRUE(image::write_image(reference, image::make_image(832, 480, 3, 90)).ok());
    std::filesystem::create_directory(dir_->file("control"));
    for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(image::write_image(dir_->file("control/" + std::to_string(i) + ".png"),
                                       image::make_image(832, 480, 3, static_cast<uint8_t>(40 * i)))
                        .ok());
    }
    const PlanSet set{"VACE 14B fp16",
                      files().dit_vace_14b,
                      files().umt5_q8_0,
                      " -i " + reference + " --control-video " + dir_->file("control"),
                      "32.30 GiB",
                      "5.62 GiB",
                      32.30};
    check_plans(set, files().vae, {24, 16, 12, 8}, [](int, const std::string& out) {
        EXPECT_NE(out.find("vae (VACE context encode) on RPC0"), std::string::npos) << out;
    });
}

}  // namespace
}  // namespace kiln
