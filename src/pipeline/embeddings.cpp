#include "pipeline/embeddings.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "io/model_file.h"
#include "io/tensor_convert.h"
#include "util/files.h"
#include "util/log.h"

namespace fs = std::filesystem;

namespace kiln::pipeline {

namespace {

// The tensor of `file` that holds `target`'s vectors (read_embedding's
// choice), or null when none has its width.
const io::TensorInfo* vectors_for(const io::ModelFile& file, const EmbeddingTarget& target) {
    const io::TensorInfo* chosen = nullptr;
    const int64_t width = target.width;
    auto fits = [&](const io::TensorInfo& t) {
        return io::dtype_is_float(t.dtype) && !t.shape.empty() && t.shape.size() <= 2 && t.shape.back() == width;
    };
    for (const std::string& preferred : {target.name, std::string("string_to_param.*"), std::string("emb_params")}) {
        if (const io::TensorInfo* t = file.find(preferred); t && fits(*t)) chosen = t;
        if (chosen) break;
    }
    if (!chosen) {
        for (const io::TensorInfo& t : file.tensors()) {
            if (fits(t)) {
                chosen = &t;
                break;
            }
        }
    }
    return chosen;
}

std::string no_vectors_message(const std::string& path, const EmbeddingTarget& target) {
    return path + ": no embedding vectors of width " + std::to_string(target.width) + " (the " + target.name +
           " text encoder's) in the file";
}

Result<std::vector<float>> read_vectors(const io::ModelFile& file, const io::TensorInfo& tensor,
                                        const std::string& path) {
    auto values = io::convert_tensor(tensor, file.data(tensor), GGML_TYPE_F32);
    if (!values.ok()) return Error{path + ": " + values.error().message};
    std::vector<float> out(values->size() / sizeof(float));
    std::memcpy(out.data(), values->data(), values->size());
    return out;
}

}  // namespace

Result<std::vector<float>> read_embedding(const std::string& path, const EmbeddingTarget& target) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) return file.error();
    const io::TensorInfo* tensor = vectors_for(*file, target);
    if (!tensor) return Error{no_vectors_message(path, target)};
    return read_vectors(*file, *tensor, path);
}

Result<std::vector<EmbeddingTable>> load_embeddings(const std::string& folder,
                                                    const std::vector<EmbeddingTarget>& targets,
                                                    text::ClipTokenizer& tokenizer) {
    if (targets.empty()) return Error{"--embd-dir: no CLIP text encoder to take the embeddings"};
    const PathStatus status = path_status(folder);
    if (status.kind == PathKind::SymlinkLoop) return path_error(folder, status);
    if (status.kind != PathKind::Folder) return Error{folder + ": --embd-dir is not a folder"};
    auto entries = list_folder(folder);  // sorted: ids in a stable order
    if (!entries) return entries.error();
    std::vector<fs::path> files;
    for (const FolderEntry& entry : *entries) {
        const std::string ext = fs::path(entry.name).extension().string();
        if (ext != ".pt" && ext != ".bin" && ext != ".safetensors") continue;
        if (entry.status.kind == PathKind::File) {
            files.push_back(entry.path);
        } else if (entry.status.kind == PathKind::SymlinkLoop) {
            return path_error(entry.path, entry.status);
        }
    }
    std::vector<EmbeddingTable> tables(targets.size());
    for (size_t t = 0; t < targets.size(); ++t) tables[t].width = targets[t].width;
    for (const fs::path& f : files) {
        auto file = io::ModelFile::open({f.string()});
        if (!file.ok()) return file.error();
        // A file made for another model (an SD1.5 embedding beside SDXL ones
        // in a shared folder: no vectors of this model's widths) is skipped,
        // as A1111 skips it; its word stays plain text.
        std::vector<const io::TensorInfo*> tensors;
        for (const EmbeddingTarget& target : targets) tensors.push_back(vectors_for(*file, target));
        if (const auto missing = std::find(tensors.begin(), tensors.end(), nullptr); missing != tensors.end()) {
            KILN_LOG_WARN("--embd-dir: skipped %s (made for another model)",
                          no_vectors_message(f.string(), targets[size_t(missing - tensors.begin())]).c_str());
            continue;
        }
        // The one word stands for the same number of tokens in every encoder.
        std::vector<std::vector<float>> vectors;
        for (const io::TensorInfo* tensor : tensors) {
            auto v = read_vectors(*file, *tensor, f.string());
            if (!v.ok()) return v.error();
            vectors.push_back(std::move(v).value());
        }
        const auto n = static_cast<int>(vectors.front().size() / static_cast<size_t>(targets.front().width));
        for (size_t t = 1; t < targets.size(); ++t) {
            const auto m = static_cast<int>(vectors[t].size() / static_cast<size_t>(targets[t].width));
            if (m != n) {
                return Error{f.string() + ": " + std::to_string(n) + " vectors for " + targets.front().name + " but " +
                             std::to_string(m) + " for " + targets[t].name};
            }
        }
        auto first = tokenizer.add_embedding_token(f.stem().string(), n);
        if (!first.ok()) return Error{f.string() + ": " + first.error().message};
        for (size_t t = 0; t < targets.size(); ++t) {
            tables[t].vectors.insert(tables[t].vectors.end(), vectors[t].begin(), vectors[t].end());
        }
    }
    return tables;
}

}  // namespace kiln::pipeline
