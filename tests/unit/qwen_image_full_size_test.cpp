// Full-size Qwen-Image in the forms people download, written as sparse files
// (headers only, no byte of data written or read;
// training/fixtures/make_qwen_image_specs.py's specs):
//   bf16: qwen_image_bf16.safetensors (tests/fixtures/qwen_image.spec, 40.9 GB:
//         diffusers' names, no prefix, as Comfy-Org's split file), ComfyUI's
//         qwen_2.5_vl_7b.safetensors (qwen25_vl_7b.spec: HF names under model.,
//         the vision tower and lm_head too, 16.6 GB) with --tokenizer
//         llm=third_party/llama-vocab/ggml-vocab-qwen2.gguf (Qwen2's BPE), and
//         qwen_image_vae.safetensors (qwen_image_vae.spec, Wan 2.1's VAE, BF16);
//   GGUF: Qwen_Image-Q4_K_M.gguf (QuantStack's layout from ComfyUI-GGUF's
//         tools: the names kept, the blocks' matrices Q4_K, the other matrices
//         BF16, vectors F32) and Qwen2.5-VL-7B-Instruct.Q8_0.gguf (llama.cpp's
//         names, arch qwen2vl, every matrix Q8_0, vectors F32, no vision tower:
//         that is the separate mmproj file; the tokenizer of ggml-vocab-qwen2.gguf
//         carried), with the same VAE.
// kiln info names each file, the loader configures every network from the
// shapes and metadata, and kiln plan places sd-cli's 1024x1024 job
// (docs/qwen_image.md: --diffusion-fa, cfg 2.5) on a loopback RPC device under
// budgets of 24, 16, 12 and 8 GiB: the budget table of docs/qwen_image.md.
// (The loopback device reports this machine's memory, so larger budgets are
// not seen.)
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include "gguf.h"
#include "golden.h"
#include "image/image_io.h"
#include "models/nets/llm_encoder.h"
#include "models/nets/qwen_image_dit.h"
#include "pipeline/model.h"
#include "random_model.h"
#include "rpc_child.h"
#include "test_files.h"

namespace kiln {
namespace {

std::string fixture(const std::string& name) { return std::string(KILN_FIXTURES_DIR) + "/" + name; }
std::string repo_root() { return std::string(KILN_FIXTURES_DIR) + "/../.."; }
std::string qwen2_vocab_gguf() { return repo_root() + "/third_party/llama-vocab/ggml-vocab-qwen2.gguf"; }
const char* kSetupHint = " is missing: run scripts/setup.sh, which provisions the real tokenizers the tests use";

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// Qwen_Image-Q4_K_M.gguf as ComfyUI-GGUF's convert.py and patched
// llama-quantize write it (QuantStack's upload; arch "qwen_image", which kiln
// does not read): the names kept, vectors F32 (convert.py), the 60 blocks'
// matrices Q4_K, the embedders, norm_out and proj_out as released (BF16).
// The patched quantizer's Q4_K_M also makes each block's attn.to_v Q6_K
// (0.14 GiB more in all); this leaves that out.
test::SparseGgufOptions dit_gguf_options() {
    test::SparseGgufOptions o;
    o.type = [](const std::string& name, const std::vector<int64_t>& shape, ggml_type spec_type) {
        if (shape.size() == 1) return GGML_TYPE_F32;
        const bool block = name.rfind("transformer_blocks.", 0) == 0;
        return block && shape.size() == 2 ? GGML_TYPE_Q4_K : spec_type;
    };
    o.metadata = {{"general.architecture", std::string("qwen_image")},
                  {"general.quantization_version", uint32_t{2}},
                  {"general.file_type", uint32_t{15}}};  // LLAMA_FTYPE_MOSTLY_Q4_K_M
    return o;
}

// llama.cpp's names for Qwen2's tensors: Qwen3's map, the q/k/v biases beside
// their weights (blk.N.attn_q.bias).
std::string qwen2_llama_cpp_name(const std::string& hf_name) {
    const std::string bias = ".bias";
    if (hf_name.size() > bias.size() && hf_name.compare(hf_name.size() - bias.size(), bias.size(), bias) == 0) {
        const std::string weight =
            test::qwen3_llama_cpp_name(hf_name.substr(0, hf_name.size() - bias.size()) + ".weight");
        return weight.substr(0, weight.size() - 7) + bias;
    }
    return test::qwen3_llama_cpp_name(hf_name);
}

// mradermacher's Qwen2.5-VL-7B-Instruct.Q8_0.gguf (sd-cli's docs link it):
// convert_hf_to_gguf.py's qwen2vl text model (its vision tower goes to the
// separate mmproj file) and llama-quantize Q8_0: every matrix Q8_0,
// token_embd and output (lm_head) included, vectors F32. Its
// qwen2vl.rope.dimension_sections array ([16, 24, 24, 0]: the M-RoPE
// sections, one position for text-only prompts) is left out: the sparse
// writer takes no arrays, and kiln does not read the key.
test::SparseGgufOptions qwen25_vl_q8_0_gguf_options() {
    test::SparseGgufOptions o;
    o.rename = qwen2_llama_cpp_name;
    o.type = [](const std::string&, const std::vector<int64_t>& shape, ggml_type) {
        return shape.size() == 1 ? GGML_TYPE_F32 : GGML_TYPE_Q8_0;
    };
    o.metadata = {
        {"general.architecture", std::string("qwen2vl")},
        {"general.type", std::string("model")},
        {"general.name", std::string("Qwen2.5 VL 7B Instruct")},
        {"general.size_label", std::string("7B")},
        {"general.file_type", uint32_t{7}},  // LLAMA_FTYPE_MOSTLY_Q8_0
        {"general.quantization_version", uint32_t{2}},
        {"qwen2vl.block_count", uint32_t{28}},
        {"qwen2vl.context_length", uint32_t{128000}},
        {"qwen2vl.embedding_length", uint32_t{3584}},
        {"qwen2vl.feed_forward_length", uint32_t{18944}},
        {"qwen2vl.attention.head_count", uint32_t{28}},
        {"qwen2vl.attention.head_count_kv", uint32_t{4}},
        {"qwen2vl.rope.freq_base", 1000000.0f},
        {"qwen2vl.attention.layer_norm_rms_epsilon", 1e-6f},
    };
    o.copy_metadata_from = qwen2_vocab_gguf();
    return o;
}

// `spec` without the vision tower's lines, written into `dir`: the text
// model a llama.cpp GGUF holds.
Result<std::string> text_model_spec(const test::TempDir& dir, const std::string& spec) {
    std::ifstream in(spec);
    if (!in) return Error{spec + ": cannot open"};
    std::ostringstream out;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("visual.", 0) != 0) out << line << "\n";
    }
    return dir.write("qwen25_vl_7b_text.spec", out.str());
}

struct Set {
    const char* name;
    std::string dit, llm;
    std::string tokenizer;  // --tokenizer, or empty
};

class QwenImageFullSize : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        sets_ = new std::vector<Set>();
        vae_ = new std::string(dir_->file("qwen_image_vae.safetensors"));
        setup_error_ = new std::string();
        if (!exists(qwen2_vocab_gguf())) *setup_error_ += qwen2_vocab_gguf() + kSetupHint + "\n";
        if (!setup_error_->empty()) return;
        const Set bf16{"bf16", dir_->file("qwen_image_bf16.safetensors"), dir_->file("qwen_2.5_vl_7b.safetensors"),
                       "llm=" + qwen2_vocab_gguf()};
        const Set gguf{"GGUF", dir_->file("Qwen_Image-Q4_K_M.gguf"), dir_->file("Qwen2.5-VL-7B-Instruct.Q8_0.gguf"),
                       ""};
        auto text_spec = text_model_spec(*dir_, fixture("qwen25_vl_7b.spec"));
        if (!text_spec.ok()) {
            *setup_error_ += text_spec.error().message + "\n";
            return;
        }
        const Status written[] = {
            test::write_sparse_model(fixture("qwen_image.spec"), bf16.dit),
            test::write_sparse_model(fixture("qwen25_vl_7b.spec"), bf16.llm),
            test::write_sparse_model(fixture("qwen_image_vae.spec"), *vae_),
            test::write_sparse_gguf(fixture("qwen_image.spec"), gguf.dit, dit_gguf_options()),
            test::write_sparse_gguf(*text_spec, gguf.llm, qwen25_vl_q8_0_gguf_options()),
        };
        for (const Status& s : written) {
            if (!s.ok()) *setup_error_ += s.error().message + "\n";
        }
        *sets_ = {bf16, gguf};
    }
    static void TearDownTestSuite() {
        delete setup_error_;
        delete vae_;
        delete sets_;
        delete dir_;  // removes the sparse files
    }
    void SetUp() override { ASSERT_TRUE(setup_error_->empty()) << *setup_error_; }

    static const Set& bf16() { return (*sets_)[0]; }
    static const Set& gguf() { return (*sets_)[1]; }
    static pipeline::ModelPaths paths(const Set& set) {
        pipeline::ModelPaths p;
        p.diffusion_model = set.dit;
        p.llm = set.llm;
        p.vae = *vae_;
        p.tokenizer = set.tokenizer;
        return p;
    }
    static Result<std::unique_ptr<pipeline::Model>> load_plan_only(const pipeline::ModelPaths& p) {
        pipeline::ModelOptions options;
        options.plan_only = true;
        return pipeline::Model::load(p, options);
    }

    static test::TempDir* dir_;
    static std::vector<Set>* sets_;
    static std::string* vae_;
    static std::string* setup_error_;
};
test::TempDir* QwenImageFullSize::dir_ = nullptr;
std::vector<Set>* QwenImageFullSize::sets_ = nullptr;
std::string* QwenImageFullSize::vae_ = nullptr;
std::string* QwenImageFullSize::setup_error_ = nullptr;

std::string info(const std::string& path) {
    auto r = test::run_command(std::string(KILN_BIN) + " info " + path);
    EXPECT_EQ(r.exit_code, 0) << path << "\n" << r.err;
    return r.out;
}

void expect_lines(const std::string& out, std::initializer_list<const char*> lines) {
    for (const char* line : lines) EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
}

TEST_F(QwenImageFullSize, InfoNamesEveryFile) {
    expect_lines(info(bf16().dit), {"family: Qwen-Image", "total: 1933 tensors, 38.05 GiB"});
    // ComfyUI's Qwen2.5-VL file is one text encoder: the text model (339
    // tensors: the embedding, 28 layers of 12, the final norm, lm_head) and
    // the vision tower's 390, which a text-to-image job never reads.
    expect_lines(info(bf16().llm), {"family: Qwen2 (an LLM text encoder)",
                                    "text encoder: text_encoder\n    729 tensors", "total: 729 tensors"});
    expect_lines(info(*vae_), {"family: Wan 2.1 VAE", "VAE: vae\n    194 tensors", "total: 194 tensors"});
    // The DiT GGUF: the 14 matrices of each of the 60 blocks Q4_K.
    expect_lines(info(gguf().dit),
                 {"general.architecture = qwen_image", "family: Qwen-Image", "total: 1933 tensors", "Q4_K x840"});
    // The LLM GGUF: llama.cpp's names and Q8_0, its tokenizer carried.
    const std::string llm = info(gguf().llm);
    expect_lines(llm, {"general.architecture = qwen2vl", "tokenizer.ggml.pre = qwen2", "text encoder: text_encoder",
                       "total: 339 tensors", "F32 x141 Q8_0 x198"});
    EXPECT_EQ(llm.find("model.layers."), std::string::npos) << llm;
}

// The writer's GGUF files as ggml's own reader (llama.cpp's, sd.cpp's) sees
// them: the types above, the data section ending where the file does, and
// no disk blocks for the data.
TEST_F(QwenImageFullSize, SparseGgufFilesAreWhatGgmlReads) {
    for (const std::string* path : {&gguf().llm, &gguf().dit}) {
        SCOPED_TRACE(*path);
        gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
        std::unique_ptr<gguf_context, void (*)(gguf_context*)> g(gguf_init_from_file(path->c_str(), params), gguf_free);
        ASSERT_TRUE(g);
        const int64_t n = gguf_get_n_tensors(g.get());
        const size_t end = gguf_get_data_offset(g.get()) + gguf_get_tensor_offset(g.get(), n - 1) +
                           GGML_PAD(gguf_get_tensor_size(g.get(), n - 1), gguf_get_alignment(g.get()));
        struct stat st {};
        ASSERT_EQ(::stat(path->c_str(), &st), 0);
        EXPECT_EQ(static_cast<size_t>(st.st_size), end);
        EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{64} << 20) << "the data must not be written";
        auto type = [&](const char* name) {
            const int64_t id = gguf_find_tensor(g.get(), name);
            return id < 0 ? GGML_TYPE_COUNT : gguf_get_tensor_type(g.get(), id);
        };
        if (path == &gguf().llm) {
            EXPECT_EQ(n, 339);
            EXPECT_EQ(type("token_embd.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("output.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("output_norm.weight"), GGML_TYPE_F32);
            EXPECT_EQ(type("blk.0.attn_q.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(type("blk.0.attn_q.bias"), GGML_TYPE_F32);
            EXPECT_EQ(type("blk.27.attn_v.bias"), GGML_TYPE_F32);
            EXPECT_EQ(type("blk.27.ffn_down.weight"), GGML_TYPE_Q8_0);
            EXPECT_EQ(gguf_find_tensor(g.get(), "visual.merger.mlp.0.weight"), -1) << "the tower is the mmproj's";
            EXPECT_EQ(gguf_get_arr_n(g.get(), gguf_find_key(g.get(), "tokenizer.ggml.tokens")), 151936u);
        } else {
            EXPECT_EQ(n, 1933);
            EXPECT_EQ(type("transformer_blocks.0.img_mod.1.weight"), GGML_TYPE_Q4_K);
            EXPECT_EQ(type("transformer_blocks.59.txt_mlp.net.2.weight"), GGML_TYPE_Q4_K);
            EXPECT_EQ(type("transformer_blocks.0.attn.to_add_out.weight"), GGML_TYPE_Q4_K);
            EXPECT_EQ(type("transformer_blocks.0.attn.to_q.bias"), GGML_TYPE_F32);
            EXPECT_EQ(type("transformer_blocks.0.attn.norm_added_k.weight"), GGML_TYPE_F32);
            EXPECT_EQ(type("txt_in.weight"), GGML_TYPE_BF16);
            EXPECT_EQ(type("norm_out.linear.weight"), GGML_TYPE_BF16);
            EXPECT_EQ(type("txt_norm.weight"), GGML_TYPE_F32);
        }
    }
}

// The shapes every module is configured from, in both forms.
void expect_qwen_image(const pipeline::Model& m) {
    EXPECT_EQ(m.family_label(), "Qwen-Image");
    EXPECT_EQ(m.size_stride(), 16);
    EXPECT_EQ(m.defaults().width, 1024);
    EXPECT_EQ(m.defaults().steps, 20);
    EXPECT_FLOAT_EQ(m.defaults().cfg_scale, 2.5f);
    const auto* dit = dynamic_cast<const models::QwenImageDit*>(&m.diffusion());
    ASSERT_NE(dit, nullptr);
    const models::QwenImageConfig& q = dit->config();
    EXPECT_EQ(q.hidden, 3072);
    EXPECT_EQ(q.heads, 24);
    EXPECT_EQ(q.head_dim(), 128);
    EXPECT_EQ(q.mlp_hidden, 12288);
    EXPECT_EQ(q.context_dim, 3584);
    EXPECT_EQ(q.depth, 60);
    EXPECT_EQ(q.channels, 16);
    EXPECT_EQ(q.patch, 2);
    EXPECT_EQ(q.axes_dim, (std::vector<int>{16, 56, 56}));
    ASSERT_EQ(m.text_encoders().size(), 1u);
    const auto* encoder = dynamic_cast<const models::LlmEncoder*>(m.text_encoders()[0].network);
    ASSERT_NE(encoder, nullptr);
    const models::LlmConfig& c = encoder->config();
    EXPECT_EQ(c.arch, models::LlmConfig::Arch::Qwen2);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.vocab, 152064);
    EXPECT_EQ(c.width, 3584);
    EXPECT_EQ(c.layers, 28);
    EXPECT_EQ(encoder->declared_layers(), 28) << "Qwen-Image reads the final-normed last layer: all of them";
    EXPECT_EQ(c.heads, 28);
    EXPECT_EQ(c.kv_heads, 4);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.ffn, 18944);
    EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
    EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
    EXPECT_EQ(m.vae().format().latent_channels, 16);
}

TEST_F(QwenImageFullSize, LoaderReadsTheBf16Files) {
    auto model = load_plan_only(paths(bf16()));
    ASSERT_TRUE(model.ok()) << model.error().message;
    expect_qwen_image(**model);
    const auto& c = dynamic_cast<const models::LlmEncoder&>(*(*model)->text_encoders()[0].network).config();
    EXPECT_NE(c.naming, models::LlmConfig::Naming::LlamaCpp);
    EXPECT_FLOAT_EQ(c.rope_theta, 1e6f) << "no metadata: Qwen2's default";
    // ggml-vocab-qwen2.gguf as --tokenizer: llama.cpp's Qwen2 vocabulary.
    EXPECT_EQ((*model)->llm_tokenizer().size(), 151936);
}

TEST_F(QwenImageFullSize, LoaderReadsTheGgufFilesAndTheTokenizerTheLlmCarries) {
    auto model = load_plan_only(paths(gguf()));  // no --tokenizer
    ASSERT_TRUE(model.ok()) << model.error().message;
    expect_qwen_image(**model);
    const auto& c = dynamic_cast<const models::LlmEncoder&>(*(*model)->text_encoders()[0].network).config();
    EXPECT_EQ(c.naming, models::LlmConfig::Naming::LlamaCpp);
    EXPECT_EQ((*model)->llm_tokenizer().size(), 151936);
}

// /proc/meminfo's MemTotal in bytes (0 when it cannot be read).
uint64_t ram_total() {
    std::ifstream in("/proc/meminfo");
    for (std::string key; in >> key;) {
        uint64_t kib = 0;
        in >> kib;
        if (key == "MemTotal:") return kib * 1024;
        in.ignore(256, '\n');
    }
    return 0;
}

// The line of `out` that starts with `prefix`, or "".
std::string line_of(const std::string& out, const std::string& prefix) {
    const size_t at = out.find("\n" + prefix);
    if (at == std::string::npos) return "";
    return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

double gib_of(const std::smatch& m) { return std::stod(m[1]) / (m[2] == "MiB" ? 1024.0 : 1.0); }

test::CommandResult plan(const Set& set, const std::string& vae, const test::RpcServer& server, int gib,
                         const std::string& flags = "") {
    // sd-cli's docs/qwen_image.md job: 1024x1024, cfg 2.5, --diffusion-fa.
    const std::string command = std::string(KILN_BIN) + " plan --diffusion-model " + set.dit + " --llm " + set.llm +
                                " --vae " + vae + (set.tokenizer.empty() ? "" : " --tokenizer " + set.tokenizer) +
                                " --rpc-servers " + server.endpoint() + " --max-vram RPC0=" + std::to_string(gib) +
                                " -W 1024 -H 1024 --cfg-scale 2.5 --diffusion-fa -p 'a photo of a cat' -t 1" + flags;
    auto r = test::run_command(command);
    std::cout << "--- " << set.name << ", " << gib << " GiB" << flags << "\n" << r.out << r.err;
    return r;
}

// What kiln plan must say at each budget, without reading a weight: the job
// runs and the forecast peak stays within the budget; a DiT larger than the
// budget is cut at its blocks; one larger than this machine's RAM is read
// from disk at every step, and the plan says how much; the GGUF pair fits
// on the device whole where the device has room for both.
TEST_F(QwenImageFullSize, PlanRunsUnderEveryBudget) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    const std::regex peak("RPC0: peak ([0-9.]+) (GiB|MiB)");
    const std::regex limit("limit now ([0-9.]+) (GiB|MiB)");
    const double ram_gib = static_cast<double>(ram_total()) / (1 << 30);
    struct Sizes {
        const char* dit;  // the DiT's weights as kiln counts them
        const char* llm;  // the LLM's that are read (the 28 layers, no lm_head or tower)
    };
    for (const Set* set : {&bf16(), &gguf()}) {
        const bool bf = set == &bf16();
        const Sizes sizes = bf ? Sizes{"38.06 GiB", "13.17 GiB"} : Sizes{"10.77 GiB", "7.00 GiB"};
        const double dit_gib = bf ? 38.06 : 10.77;
        int previous_segments = 0;
        for (int gib : {24, 16, 12, 8}) {
            SCOPED_TRACE(std::string(set->name) + ", " + std::to_string(gib) + " GiB");
            auto r = plan(*set, *vae_, server, gib);
            ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
            EXPECT_TRUE(test::plan_runs(r.out)) << r.out;
            std::smatch m;
            ASSERT_TRUE(std::regex_search(r.out, m, peak)) << r.out;
            EXPECT_LE(gib_of(m), gib) << r.out;
            ASSERT_TRUE(std::regex_search(r.out, m, limit)) << r.out;
            const double device_gib = gib_of(m);
            const std::string dit = line_of(r.out, "  diffusion: computes on RPC0, weights ");
            const std::string te = line_of(r.out, "  te: computes on RPC0, weights ");
            ASSERT_FALSE(dit.empty() || te.empty()) << r.out;
            EXPECT_NE(dit.find("(" + std::string(sizes.dit) + ")"), std::string::npos) << dit;
            EXPECT_NE(te.find("(" + std::string(sizes.llm) + ")"), std::string::npos) << te;
            const int segments = test::plan_segments(r.out, "diffusion");
            ASSERT_GT(segments, 0) << r.out;
            if (dit_gib > gib) {
                EXPECT_EQ(dit.find("weights on RPC0"), std::string::npos) << dit;
                EXPECT_GE(segments, 2) << "a DiT larger than the budget runs in segments";
            }
            // While the LLM's weights are not kept on the device, a smaller
            // budget never cuts the DiT into fewer segments. (The GGUF
            // pair's LLM, kept there at 16 GiB, leaves the DiT 2 segments
            // that it runs whole in at 12 GiB.)
            if (te.find("weights on RPC0") == std::string::npos) {
                EXPECT_GE(segments, previous_segments) << r.out;
                previous_segments = segments;
            }
            const bool streams = r.out.find("\nfits: only by streaming") != std::string::npos;
            if (dit_gib > ram_gib) EXPECT_TRUE(streams) << "a DiT larger than RAM is read again at every step";
            if (streams) {
                EXPECT_NE(dit.find("weights on disk"), std::string::npos) << dit;
                EXPECT_NE(r.out.find("diffusion on RPC0: " + std::to_string(segments) + " segments"), std::string::npos)
                    << r.out;
                EXPECT_NE(r.out.find("reads its " + std::string(sizes.dit) + " of weights from disk"),
                          std::string::npos)
                    << r.out;
                EXPECT_NE(r.out.find("fits: only by streaming: every step reads " + std::string(sizes.dit)),
                          std::string::npos)
                    << r.out;
            }
            // Both GGUF files and the compute (19.2 GiB) fit a device with the room.
            if (!bf && gib >= 24 && device_gib >= 20.0) {
                EXPECT_NE(r.out.find("\nfits: yes\n"), std::string::npos) << r.out;
                EXPECT_NE(dit.find("weights on RPC0"), std::string::npos) << dit;
                EXPECT_NE(te.find("weights on RPC0"), std::string::npos) << te;
                EXPECT_EQ(segments, 1) << r.out;
            }
        }
    }
}

// A machine with 32 GiB of RAM, and one with 64 (kiln plan --ram), beside a
// 16 GiB card: with 32 the bf16 DiT (38.06 GiB) still streams from disk at
// every step while the LLM (13.17 GiB) stays in RAM; with 64 both stay in
// RAM and nothing is read again. The GGUF pair stays in RAM with 32.
TEST_F(QwenImageFullSize, PlanForThirtyTwoAndSixtyFourGibOfRam) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    auto bf_32 = plan(bf16(), *vae_, server, 16, " --ram 32G");
    ASSERT_EQ(bf_32.exit_code, 0) << bf_32.out << bf_32.err;
    EXPECT_NE(bf_32.out.find("diffusion: computes on RPC0, weights on disk (38.06 GiB)"), std::string::npos)
        << bf_32.out;
    EXPECT_NE(bf_32.out.find("te: computes on RPC0, weights in RAM (13.17 GiB)"), std::string::npos) << bf_32.out;
    EXPECT_NE(bf_32.out.find("\nfits: only by streaming: every step reads 38.06 GiB"), std::string::npos) << bf_32.out;
    auto bf_64 = plan(bf16(), *vae_, server, 16, " --ram 64G");
    ASSERT_EQ(bf_64.exit_code, 0) << bf_64.out << bf_64.err;
    EXPECT_NE(bf_64.out.find("diffusion: computes on RPC0, weights in RAM (38.06 GiB)"), std::string::npos)
        << bf_64.out;
    EXPECT_NE(bf_64.out.find("\nfits: yes\n"), std::string::npos) << bf_64.out;
    auto gguf_32 = plan(gguf(), *vae_, server, 16, " --ram 32G");
    ASSERT_EQ(gguf_32.exit_code, 0) << gguf_32.out << gguf_32.err;
    EXPECT_NE(gguf_32.out.find("\nfits: yes\n"), std::string::npos) << gguf_32.out;
    EXPECT_EQ(gguf_32.out.find("weights on disk"), std::string::npos) << gguf_32.out;
}

// An edit job's plan (-r, a 4:3 photo) with the bf16 DiT under each
// release's file name, the tower inside ComfyUI's LLM file: the first Edit
// release (qwen_image_edit_*) runs the vision tower on about 1024 x 1024
// pixels (1176 x 896: 1344 image rows in the prompt), 2509 on 384 x 384
// (448 x 308: 176 rows), and the plan counts each.
TEST_F(QwenImageFullSize, EditPlanSizesTheVisionImageByRelease) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    image::Image photo;
    photo.width = 1024;
    photo.height = 768;
    photo.channels = 3;
    photo.pixels.assign(static_cast<size_t>(1024 * 768 * 3), 128);
    const std::string ref = dir_->file("photo.png");
    ASSERT_TRUE(image::write_image(ref, photo).ok());
    const std::regex tower_compute(
        "te\\.llm_vision \\(reference image encode\\) on RPC0: whole graph, compute "
        "([0-9.]+) (GiB|MiB) whole");
    const std::regex context("contexts of ([0-9]+) and ([0-9]+) tokens");
    std::map<std::string, double> tower_gib;
    std::map<std::string, int> context_tokens;
    for (const char* name : {"qwen_image_edit_bf16.safetensors", "qwen_image_edit_2509_bf16.safetensors"}) {
        const std::string link = dir_->file(name);
        std::filesystem::remove(link);
        std::filesystem::create_symlink(bf16().dit, link);
        Set edit = bf16();
        edit.dit = link;
        // llama.cpp's Qwen2 test vocabulary lacks Qwen2.5-VL's vision tokens;
        // the tiny edit tokenizer has them (its ids are a few hundred).
        edit.tokenizer = "llm=" + test::golden_path("pipeline/qwen_image_edit_tiny/tokenizer");
        auto r = plan(edit, *vae_, server, 16, " -r " + ref + " -p 'make the cat blue' -v");
        ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
        const bool first = std::string(name).find("2509") == std::string::npos;
        EXPECT_NE((r.out + r.err).find(first ? "(Qwen-Image-Edit)" : "(Qwen-Image)"), std::string::npos) << r.err;
        std::smatch m;
        ASSERT_TRUE(std::regex_search(r.out, m, tower_compute)) << r.out;
        tower_gib[name] = gib_of(m);
        ASSERT_TRUE(std::regex_search(r.out, m, context)) << r.out;
        context_tokens[name] = std::stoi(m[1]);
    }
    const std::string first = "qwen_image_edit_bf16.safetensors", plus = "qwen_image_edit_2509_bf16.safetensors";
    // The prompt's image rows, and the text about them (under 100 tokens).
    EXPECT_GT(context_tokens[first], 1344);
    EXPECT_LT(context_tokens[first], 1344 + 100);
    EXPECT_GT(context_tokens[plus], 176);
    EXPECT_LT(context_tokens[plus], 176 + 100);
    // The tower's attention over 5376 patches against 704: far more compute.
    EXPECT_GT(tower_gib[first], 10 * tower_gib[plus]);
}

}  // namespace
}  // namespace kiln
