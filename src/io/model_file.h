// One logical model from one file, several files, split files
// (`name-00001-of-00003.safetensors`), or a diffusers folder. Lists every
// tensor (name, dtype, shape, byte range) from the headers alone and serves a
// tensor's bytes on demand from a read-only mmap of its file.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/mapped_file.h"
#include "io/name_map.h"
#include "io/tensor_info.h"
#include "util/result.h"

namespace kiln::io {

struct SourceFile {
    std::string path;
    FileFormat format = FileFormat::Safetensors;
    std::shared_ptr<MappedFile> map;
    // The diffusers subfolder it came from ("unet", "vae", "text_encoder"),
    // empty for single-file models.
    std::string component;
};

class ModelFile {
  public:
    // Opens every path (file or folder) as one model. A folder must be a
    // diffusers folder (model_index.json) or a component folder holding
    // weights; a split file pulls in all its parts. Fails with the first
    // problem: a missing or broken file, a missing part, or a tensor name that
    // two files both define.
    static Result<ModelFile> open(const std::vector<std::string>& paths);
    // A model of one parsed header and no bytes: its tensor list and
    // metadata, named `label` in messages. What networks read from headers
    // (create(), declarations checked by ModuleWeights::load_params(Disk))
    // works on it; data() must not be called. For the model-config fuzz
    // target and tests that vary a layout without writing files.
    static Result<ModelFile> from_header(ParsedFile parsed, const std::string& label);

    const std::vector<SourceFile>& sources() const { return sources_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    // Metadata of all files; on a key clash the first file's value stays.
    const Metadata& metadata() const { return metadata_; }
    bool is_diffusers() const { return diffusers_; }
    // A metadata value as a number (numeric kinds, or a string that is one)
    // or as text; `fallback` when the key is absent or not a number.
    double metadata_number(const std::string& key, double fallback) const;
    std::string metadata_string(const std::string& key, const std::string& fallback) const;
    // A metadata value that must be a whole number in [min, max] (a model's
    // head count): nullopt when the key is absent; an error naming the key,
    // the value and the range when it is anything else (text, NaN, 3.5, 1e30).
    Result<std::optional<int64_t>> metadata_integer(const std::string& key, int64_t min, int64_t max) const;

    // Renames the tensors of a file that holds one diffusers component in its
    // own naming (diffusers', or HF transformers' for text encoders), given
    // on its own rather than inside a folder (a text_encoder_2/model.safetensors
    // passed as --clip_g), to kiln's ldm names, as in a diffusers folder of
    // `family` (io/diffusers_names.h). Names the map does not know stay.
    void rename_as_diffusers_component(ModelFamily family, ModelComponent component);
    // A diffusers ControlNet's tensors to the ldm names under "control_model."
    // (io/diffusers_names.h). Error when two tensors would share a name.
    Status rename_as_diffusers_controlnet();

    // nullptr if there is no tensor of that name.
    const TensorInfo* find(std::string_view name) const;
    // The tensor's bytes inside the mapping; valid while this ModelFile lives.
    const uint8_t* data(const TensorInfo& tensor) const;

  private:
    Status add_file(const std::string& path, const std::string& component);
    // Adds one parsed file's tensors (renamed under `component/`) and metadata.
    Status add_parsed(ParsedFile parsed, const std::string& path, std::shared_ptr<MappedFile> map,
                      const std::string& component);
    Status add_folder(const std::string& path);
    // Sets TensorInfo::scale of source `source`'s F8 weights from their
    // X.scale_weight siblings (ComfyUI's scaled FP8).
    Status read_fp8_scales(size_t source);
    Status add_component_folder(const std::string& folder, const std::string& component);

    std::vector<SourceFile> sources_;
    std::vector<TensorInfo> tensors_;
    std::unordered_map<std::string, size_t> by_name_;
    Metadata metadata_;
    bool diffusers_ = false;
};

// Parses one file's bytes by its format (detected from the magic bytes, then
// the extension). Errors start with `label`.
Result<ParsedFile> parse_model_bytes(const uint8_t* data, size_t size, const std::string& label);

// For `dir/name-00002-of-00003.ext`: every part's path in order, and an error
// naming the first part that does not exist. For other paths: just `path`.
Result<std::vector<std::string>> expand_split_parts(const std::string& path);

}  // namespace kiln::io
