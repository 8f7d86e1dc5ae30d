#include "pipeline/embeddings.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "io/model_file.h"
#include "io/tensor_convert.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace kiln::pipeline {

Result<std::vector<float>> read_embedding(const std::string& path, int64_t width) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) return file.error();
    const io::TensorInfo* chosen = nullptr;
    auto fits = [&](const io::TensorInfo& t) {
        return io::dtype_is_float(t.dtype) && !t.shape.empty() && t.shape.size() <= 2 && t.shape.back() == width;
    };
    for (const char* preferred : {"string_to_param.*", "emb_params", "clip_l"}) {
        if (const io::TensorInfo* t = file->find(preferred); t && fits(*t)) chosen = t;
        if (chosen) break;
    }
    if (!chosen) {
        for (const io::TensorInfo& t : file->tensors()) {
            if (fits(t)) {
                chosen = &t;
                break;
            }
        }
    }
    if (!chosen) {
        return Error{path + ": no embedding vectors of width " + std::to_string(width) +
                     " (the text encoder's) in the file"};
    }
    auto values = io::convert_tensor(*chosen, file->data(*chosen), GGML_TYPE_F32);
    if (!values.ok()) return Error{path + ": " + values.error().message};
    std::vector<float> out(values->size() / sizeof(float));
    std::memcpy(out.data(), values->data(), values->size());
    return out;
}

Result<EmbeddingTable> load_embeddings(const std::string& folder, int64_t width, ClipTokenizer& tokenizer) {
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
    EmbeddingTable table;
    table.width = width;
    for (const fs::path& f : files) {
        auto vectors = read_embedding(f.string(), width);
        if (!vectors.ok()) return vectors.error();
        const auto n = static_cast<int>(vectors->size() / static_cast<size_t>(width));
        auto first = tokenizer.add_embedding_token(f.stem().string(), n);
        if (!first.ok()) return Error{f.string() + ": " + first.error().message};
        table.vectors.insert(table.vectors.end(), vectors->begin(), vectors->end());
    }
    return table;
}

}  // namespace kiln::pipeline
