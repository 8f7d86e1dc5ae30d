// Writes the seed corpora for the fuzz targets:
//   OUT/safetensors/*.safetensors  (hand-built: valid and near-valid files)
//   OUT/gguf/*.gguf                (ggml's own gguf writer)
// The committed seeds in tests/fuzz/corpus/ were made with
//   build-fuzz/tests/fuzz/make_seed_corpus tests/fuzz/corpus
// Output is deterministic; rerunning it rewrites the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ggml.h"
#include "gguf.h"

namespace fs = std::filesystem;

namespace {

bool write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
    FILE* f = std::fopen(path.string().c_str(), "wb");
    if (!f) return false;
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    return std::fclose(f) == 0 && ok;
}

// ---- safetensors ----------------------------------------------------------

// 8-byte little-endian header length, the JSON header (padded with spaces to
// a multiple of 8 when `pad`, as the reference writer does), then `data`.
std::vector<uint8_t> safetensors(const std::string& header_json, const std::vector<uint8_t>& data, bool pad = true) {
    std::string header = header_json;
    if (pad) {
        while ((8 + header.size()) % 8 != 0) header += ' ';
    }
    std::vector<uint8_t> out;
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 37 * i);
    return v;
}

bool write_safetensors(const fs::path& dir) {
    bool ok = true;
    // Every dtype family, metadata, a 0-d tensor and an empty tensor.
    // Byte ranges: F32 [2,3]=24, F16 [4]=8, BF16 [2,2]=8, F8_E4M3 [3]=3,
    // BOOL [5]=5, I64 [1]=8, U8 [2,1,2]=4, scalar F32 []=4, I32 [0,3]=0.
    ok &= write_file(dir / "all_dtypes.safetensors",
                     safetensors(R"({"__metadata__":{"format":"pt","kiln.seed":"all_dtypes"},)"
                                 R"("a.f32":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                 R"("b.f16":{"dtype":"F16","shape":[4],"data_offsets":[24,32]},)"
                                 R"("c.bf16":{"dtype":"BF16","shape":[2,2],"data_offsets":[32,40]},)"
                                 R"("d.f8":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[40,43]},)"
                                 R"("e.bool":{"dtype":"BOOL","shape":[5],"data_offsets":[43,48]},)"
                                 R"("f.i64":{"dtype":"I64","shape":[1],"data_offsets":[48,56]},)"
                                 R"("g.u8":{"dtype":"U8","shape":[2,1,2],"data_offsets":[56,60]},)"
                                 R"("h.scalar":{"dtype":"F32","shape":[],"data_offsets":[60,64]},)"
                                 R"("i.empty":{"dtype":"I32","shape":[0,3],"data_offsets":[64,64]}})",
                                 pattern(64, 1)));
    // The smallest valid file: an empty header.
    ok &= write_file(dir / "empty_header.safetensors", safetensors("{}", {}, /*pad=*/false));
    // Metadata only, no tensors.
    ok &= write_file(dir / "metadata_only.safetensors",
                     safetensors(R"({"__metadata__":{"modelspec.architecture":"stable-diffusion-v1","x":""}})", {}));
    // Remaining dtypes; entries not in offset order, a gap, and an empty
    // tensor placed inside another tensor's range (allowed: it has no bytes).
    ok &= write_file(dir / "unordered_gaps.safetensors",
                     safetensors(R"({"z.f64":{"dtype":"F64","shape":[1,1],"data_offsets":[16,24]},)"
                                 R"("y.i8":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},)"
                                 R"("x.i16":{"dtype":"I16","shape":[2],"data_offsets":[4,8]},)"
                                 R"("w.f8":{"dtype":"F8_E5M2","shape":[2,2],"data_offsets":[24,28]},)"
                                 R"("v.empty":{"dtype":"F16","shape":[0],"data_offsets":[17,17]},)"
                                 R"("u.i32":{"dtype":"I32","shape":[1],"data_offsets":[28,32]}})",
                                 pattern(40, 7)));
    // Near-valid (rejected): two tensors overlap by two bytes.
    ok &= write_file(dir / "overlap_invalid.safetensors",
                     safetensors(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                                 R"("b":{"dtype":"F16","shape":[2],"data_offsets":[2,6]}})",
                                 pattern(8, 3)));
    // Near-valid (rejected): shape x dtype does not match the byte range.
    ok &= write_file(dir / "size_mismatch_invalid.safetensors",
                     safetensors(R"({"__metadata__":{"format":"pt"},)"
                                 R"("w":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})",
                                 pattern(4, 9)));
    return ok;
}

// ---- gguf -------------------------------------------------------------------

struct GgufSeed {
    gguf_context* gguf = gguf_init_empty();
    ggml_context* ggml = nullptr;

    // ggml's writer lays tensors out with the context's alignment, which only
    // its parser sets from general.alignment (gguf_set_val_u32 does not), so a
    // non-default alignment starts from a parsed header holding just that key.
    explicit GgufSeed(uint32_t alignment = 32) {
        ggml_init_params params{/*mem_size=*/1 << 20, /*mem_buffer=*/nullptr, /*no_alloc=*/false};
        ggml = ggml_init(params);
        if (alignment != 32) {
            gguf_set_val_u32(gguf, "general.alignment", alignment);
            std::vector<uint8_t> header(gguf_get_meta_size(gguf));
            gguf_get_meta_data(gguf, header.data());
            gguf_free(gguf);
            gguf = gguf_init_from_buffer(header.data(), header.size(), gguf_init_params{/*no_alloc=*/true, nullptr});
        }
    }
    ~GgufSeed() {
        gguf_free(gguf);
        ggml_free(ggml);
    }

    // A tensor with deterministic contents; ne is innermost first.
    void add_tensor(const char* name, ggml_type type, std::vector<int64_t> ne) {
        ggml_tensor* t = ggml_new_tensor(ggml, type, static_cast<int>(ne.size()), ne.data());
        ggml_set_name(t, name);
        const int64_t n = ggml_nelements(t);
        std::vector<float> values(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 17) * 0.25f - 2.0f;
        if (type == GGML_TYPE_F32) {
            std::memcpy(t->data, values.data(), ggml_nbytes(t));
        } else if (type == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(values.data(), static_cast<ggml_fp16_t*>(t->data), n);
        } else {
            ggml_quantize_chunk(type, values.data(), t->data, 0, n / ne[0], ne[0], nullptr);
        }
        gguf_add_tensor(gguf, t);
        tensors.push_back(t);
    }

    // Files without 0-element tensors go through gguf_write_to_file. For the
    // others, ggml's writer memcpy()s from a null pointer (UB that the fuzz
    // build's UBSan stops on), so the data section is appended here after
    // ggml's own header (gguf_get_meta_data, padded to the alignment).
    bool write(const fs::path& path) {
        bool has_empty = false;
        for (const ggml_tensor* t : tensors) has_empty |= ggml_nbytes(t) == 0;
        if (!has_empty) return gguf_write_to_file(gguf, path.string().c_str(), /*only_meta=*/false);

        std::vector<uint8_t> bytes(gguf_get_meta_size(gguf));
        gguf_get_meta_data(gguf, bytes.data());
        const size_t alignment = gguf_get_alignment(gguf);
        for (const ggml_tensor* t : tensors) {
            const auto* p = static_cast<const uint8_t*>(t->data);
            if (ggml_nbytes(t) != 0) bytes.insert(bytes.end(), p, p + ggml_nbytes(t));
            while (bytes.size() % alignment != 0) bytes.push_back(0);
        }
        return write_file(path, bytes);
    }

    std::vector<const ggml_tensor*> tensors;
};

bool write_gguf(const fs::path& dir) {
    bool ok = true;
    {  // Header only: no metadata, no tensors.
        GgufSeed s;
        ok &= s.write(dir / "empty.gguf");
    }
    {  // Every scalar type and both array kinds, no tensors.
        GgufSeed s;
        gguf_set_val_u8(s.gguf, "t.u8", 200);
        gguf_set_val_i8(s.gguf, "t.i8", -5);
        gguf_set_val_u16(s.gguf, "t.u16", 60000);
        gguf_set_val_i16(s.gguf, "t.i16", -300);
        gguf_set_val_u32(s.gguf, "t.u32", 4000000000u);
        gguf_set_val_i32(s.gguf, "t.i32", -70000);
        gguf_set_val_f32(s.gguf, "t.f32", 1.5f);
        gguf_set_val_u64(s.gguf, "t.u64", 1ull << 40);
        gguf_set_val_i64(s.gguf, "t.i64", -(1ll << 40));
        gguf_set_val_f64(s.gguf, "t.f64", -0.125);
        gguf_set_val_bool(s.gguf, "t.bool", true);
        gguf_set_val_str(s.gguf, "general.name", "kiln seed");
        const char* words[] = {"unet", "vae", "", "clip"};
        gguf_set_arr_str(s.gguf, "t.arr_str", words, 4);
        const int32_t ints[] = {1, -2, 3};
        gguf_set_arr_data(s.gguf, "t.arr_i32", GGUF_TYPE_INT32, ints, 3);
        const float floats[] = {0.5f, -1.0f};
        gguf_set_arr_data(s.gguf, "t.arr_f32", GGUF_TYPE_FLOAT32, floats, 2);
        const uint8_t bools[] = {1, 0, 1};
        gguf_set_arr_data(s.gguf, "t.arr_bool", GGUF_TYPE_BOOL, bools, 3);
        ok &= s.write(dir / "metadata_all_types.gguf");
    }
    {  // F32, F16, Q4_0 and Q8_0 tensors at the default alignment (32).
        GgufSeed s;
        gguf_set_val_str(s.gguf, "general.architecture", "sd1");
        gguf_set_val_u32(s.gguf, "general.file_type", 1);
        s.add_tensor("model.diffusion_model.input_blocks.0.0.bias", GGML_TYPE_F32, {3});
        s.add_tensor("first_stage_model.decoder.conv_in.weight", GGML_TYPE_F16, {3, 2, 1, 2});
        s.add_tensor("cond_stage_model.q4_0", GGML_TYPE_Q4_0, {32, 2});
        s.add_tensor("cond_stage_model.q8_0", GGML_TYPE_Q8_0, {64});
        ok &= s.write(dir / "tensors_mixed.gguf");
    }
    {  // general.alignment = 64, a 0-element tensor and 3-d/4-d shapes.
        GgufSeed s(64);
        const char* names[] = {"a"};
        gguf_set_arr_str(s.gguf, "tokenizer.ggml.tokens", names, 1);
        s.add_tensor("x.f32.3d", GGML_TYPE_F32, {2, 2, 2});
        s.add_tensor("x.empty", GGML_TYPE_F16, {0, 4});
        s.add_tensor("x.q8_0.4d", GGML_TYPE_Q8_0, {32, 1, 1, 2});
        ok &= s.write(dir / "aligned64.gguf");
    }
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUT_DIR   (writes OUT_DIR/safetensors/ and OUT_DIR/gguf/)\n", argv[0]);
        return 2;
    }
    const fs::path out = argv[1];
    std::error_code ec;
    fs::create_directories(out / "safetensors", ec);
    fs::create_directories(out / "gguf", ec);
    if (ec) {
        std::fprintf(stderr, "%s: %s\n", out.string().c_str(), ec.message().c_str());
        return 1;
    }
    const bool ok = write_safetensors(out / "safetensors") && write_gguf(out / "gguf");
    if (!ok) {
        std::fprintf(stderr, "failed to write the seeds under %s\n", out.string().c_str());
        return 1;
    }
    std::printf("seeds written under %s\n", out.string().c_str());
    return 0;
}
