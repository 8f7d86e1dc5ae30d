#include "io/model_report.h"

#include <filesystem>
#include <sstream>

#include "io/model_summary.h"
#include "util/format.h"

namespace kiln::io {
namespace {

void print_metadata(const Metadata& metadata, std::ostream& out) {
    out << "metadata: " << metadata.size() << (metadata.size() == 1 ? " key\n" : " keys\n");
    for (const auto& [key, value] : metadata) {
        std::string text = value.to_string();
        if (text.size() > 200) text = text.substr(0, 200) + "... (" + std::to_string(text.size()) + " chars)";
        out << "  " << escaped(key) << " = " << escaped(text) << '\n';
    }
}

void print_components(const ModelSummary& summary, const std::string& family, std::ostream& out) {
    out << "family: " << family << '\n';
    out << "components:\n";
    for (const ComponentSummary& c : summary.components) {
        out << "  " << component_kind_name(c.kind) << ": " << c.name;
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

void print_tensors(const ModelFile& model, std::ostream& out) {
    out << "tensors:\n";
    for (const TensorInfo& t : model.tensors()) {
        out << "  " << escaped(t.name) << "  " << dtype_name(t.dtype) << ' ' << t.shape_string() << "  bytes "
            << t.offset << ".." << t.offset + t.nbytes;
        if (model.sources().size() > 1)
            out << " in " << escaped(std::filesystem::path(model.sources()[t.source].path).filename().string());
        out << '\n';
    }
}

}  // namespace

std::string describe_model(const ModelFile& model, const std::string& label, const std::string& family,
                           bool list_tensors) {
    std::ostringstream out;
    out << "model: " << label << (model.is_diffusers() ? " (diffusers folder)" : "") << '\n';
    for (const SourceFile& s : model.sources()) {
        out << "  file: " << s.path << " (" << file_format_name(s.format) << ", " << human_bytes(s.map->size()) << ")";
        if (!s.component.empty()) out << " component " << s.component;
        out << '\n';
    }
    print_metadata(model.metadata(), out);
    print_components(summarize_model(model), family, out);
    if (list_tensors) print_tensors(model, out);
    return out.str();
}

}  // namespace kiln::io
