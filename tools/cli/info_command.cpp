#include "info_command.h"

#include <filesystem>

#include "default_model.h"
#include "io/model_file.h"
#include "io/model_summary.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::cli {
namespace {

void print_metadata(const io::Metadata& metadata, std::ostream& out) {
    out << "metadata: " << metadata.size() << (metadata.size() == 1 ? " key\n" : " keys\n");
    for (const auto& [key, value] : metadata) {
        std::string text = value.to_string();
        if (text.size() > 200) text = text.substr(0, 200) + "... (" + std::to_string(text.size()) + " chars)";
        out << "  " << key << " = " << text << '\n';
    }
}

void print_components(const io::ModelSummary& summary, std::ostream& out) {
    out << "family: " << summary.family << '\n';
    out << "components:\n";
    for (const io::ComponentSummary& c : summary.components) {
        out << "  " << io::component_kind_name(c.kind) << ": " << c.name;
        if (!c.prefix.empty()) out << " (" << c.prefix << "*)";
        out << "\n    " << c.tensor_count << (c.tensor_count == 1 ? " tensor, " : " tensors, ")
            << grouped(static_cast<uint64_t>(c.parameters)) << " parameters, " << human_bytes(c.bytes) << " ("
            << grouped(c.bytes) << " bytes); dtypes:";
        for (const auto& [dtype, count] : c.dtype_counts) out << ' ' << dtype << " x" << count;
        out << '\n';
    }
    out << "total: " << summary.tensor_count << " tensors, " << human_bytes(summary.bytes) << " ("
        << grouped(summary.bytes) << " bytes)\n";
}

void print_tensors(const io::ModelFile& model, std::ostream& out) {
    out << "tensors:\n";
    for (const io::TensorInfo& t : model.tensors()) {
        out << "  " << t.name << "  " << io::dtype_name(t.dtype) << ' ' << t.shape_string() << "  bytes " << t.offset
            << ".." << t.offset + t.nbytes;
        if (model.sources().size() > 1)
            out << " in " << std::filesystem::path(model.sources()[t.source].path).filename().string();
        out << '\n';
    }
}

}  // namespace

int run_info(const Options& options, std::ostream& out) {
    std::vector<std::string> paths = options.info_paths;
    if (paths.empty()) {
        auto found = find_default_model();
        if (!found) {
            KILN_LOG_ERROR("info: no file given and the default model %s was not found", kDefaultModelFile);
            return 1;
        }
        paths.push_back(*found);
    }
    int exit_code = 0;
    // Each argument is one model: several files of one model are passed as a
    // folder or as a split file's first part.
    for (size_t i = 0; i < paths.size(); ++i) {
        const std::string& path = paths[i];
        auto model = io::ModelFile::open({path});
        if (!model.ok()) {
            KILN_LOG_ERROR("%s", model.error().message.c_str());
            exit_code = 1;
            continue;
        }
        if (i) out << '\n';
        out << "model: " << path << (model->is_diffusers() ? " (diffusers folder)" : "") << '\n';
        for (const io::SourceFile& s : model->sources()) {
            out << "  file: " << s.path << " (" << io::file_format_name(s.format) << ", " << human_bytes(s.map->size())
                << ")";
            if (!s.component.empty()) out << " component " << s.component;
            out << '\n';
        }
        print_metadata(model->metadata(), out);
        print_components(io::summarize_model(*model), out);
        if (options.info_list_tensors) print_tensors(*model, out);
    }
    out.flush();
    return exit_code;
}

}  // namespace kiln::cli
