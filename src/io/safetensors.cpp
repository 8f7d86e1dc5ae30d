#include "io/safetensors.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "util/format.h"

namespace kiln::io {
namespace {

using json = nlohmann::json;

uint64_t read_u64_le(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

// A shape for error messages. Not json::dump(): that recurses once per
// nesting level, and a header nesting arrays 100k deep inside "shape" (200 KB,
// far below the header limit) overflowed the stack. Nested values print as
// their JSON type, long values and long shapes are cut.
std::string shape_text(const json& shape) {
    std::string s = "[";
    size_t i = 0;
    for (const json& dim : shape) {
        if (i) s += ", ";
        if (i == 8) {
            s += "... (" + std::to_string(shape.size()) + " dimensions)";
            break;
        }
        std::string d = dim.is_structured() ? std::string("<") + dim.type_name() + ">" : dim.dump();
        if (d.size() > 40) d = d.substr(0, 40) + "...";
        s += d;
        ++i;
    }
    return s + "]";
}

Result<TensorInfo> parse_entry(const std::string& name, const json& entry, uint64_t data_start, uint64_t data_size,
                               const std::string& label) {
    const std::string where = label + ": tensor '" + escaped(name) + "'";
    if (!entry.is_object()) return Error{where + ": entry is not a JSON object"};
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) return Error{where + ": missing or non-string \"dtype\""};
    if (shape_it == entry.end() || !shape_it->is_array()) return Error{where + ": missing or non-array \"shape\""};
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
        return Error{where + ": \"data_offsets\" must be an array of two integers"};
    }

    TensorInfo info;
    info.name = name;
    const auto& dtype_name_str = dtype_it->get_ref<const std::string&>();
    auto dtype = dtype_from_safetensors(dtype_name_str);
    if (!dtype) return Error{where + ": unknown dtype '" + escaped(dtype_name_str) + "'"};
    info.dtype = *dtype;

    int64_t elements = 1;
    for (const json& dim : *shape_it) {
        if (!dim.is_number_unsigned() ||
            dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return Error{where + ": shape " + shape_text(*shape_it) +
                         " has a dimension that is not a non-negative integer"};
        }
        const auto d = dim.get<int64_t>();
        if (d != 0 && elements > std::numeric_limits<int64_t>::max() / d) {
            return Error{where + ": shape " + shape_text(*shape_it) + " has too many elements"};
        }
        elements *= d;
        info.shape.push_back(d);
    }

    const json& begin_j = (*offsets_it)[0];
    const json& end_j = (*offsets_it)[1];
    if (!begin_j.is_number_unsigned() || !end_j.is_number_unsigned()) {
        return Error{where + ": \"data_offsets\" must be non-negative integers"};
    }
    const auto begin = begin_j.get<uint64_t>();
    const auto end = end_j.get<uint64_t>();
    if (begin > end) {
        return Error{where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] end before they begin"};
    }
    if (end > data_size) {
        return Error{where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] are out of bounds: the data section is " + std::to_string(data_size) + " bytes"};
    }
    const auto expected = dtype_byte_size(info.dtype, elements);
    if (!expected || *expected != end - begin) {
        return Error{where + ": shape " + info.shape_string() + " of " + dtype_name_str + " needs " +
                     (expected ? std::to_string(*expected) : std::string("an impossible number of")) +
                     " bytes but data_offsets span " + std::to_string(end - begin)};
    }
    info.offset = data_start + begin;
    info.nbytes = end - begin;
    return info;
}

Status check_no_overlap(std::vector<TensorInfo> tensors, const std::string& label) {
    std::sort(tensors.begin(), tensors.end(),
              [](const TensorInfo& a, const TensorInfo& b) { return a.offset < b.offset; });
    const TensorInfo* previous = nullptr;
    for (const TensorInfo& t : tensors) {
        if (t.nbytes == 0) continue;  // empty tensors occupy no bytes
        if (previous && t.offset < previous->offset + previous->nbytes) {
            return Error{label + ": tensors '" + escaped(previous->name) + "' and '" + escaped(t.name) +
                         "' overlap in the data section"};
        }
        previous = &t;
    }
    return Status::Ok();
}

// The first pass over the header (SAX, no values kept): syntax errors with
// nlohmann's message, and the first top-level key given twice (the DOM keeps
// only the last of duplicates).
struct HeaderCheck : json::json_sax_t {
    std::unordered_set<std::string> keys;
    std::string duplicate;
    std::string error;
    size_t depth = 0;

    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override {
        ++depth;
        return true;
    }
    bool key(string_t& k) override {
        if (depth == 1 && duplicate.empty() && !keys.insert(k).second) duplicate = k;
        return true;
    }
    bool end_object() override {
        --depth;
        return true;
    }
    bool start_array(std::size_t) override {
        ++depth;
        return true;
    }
    bool end_array() override {
        --depth;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        error = e.what();
        return false;
    }
};

}  // namespace

Result<ParsedFile> parse_safetensors(const uint8_t* data, size_t size, const std::string& label) {
    if (size < 8) {
        return Error{label + ": truncated: " + std::to_string(size) +
                     " bytes, too short for the 8-byte safetensors header length"};
    }
    const uint64_t header_len = read_u64_le(data);
    if (header_len > size - 8) {
        return Error{label + ": header length " + std::to_string(header_len) + " is larger than the file (" +
                     std::to_string(size) + " bytes): truncated or not a safetensors file"};
    }
    if (header_len > kSafetensorsMaxHeaderBytes) {
        return Error{label + ": header length " + std::to_string(header_len) + " exceeds the " +
                     std::to_string(kSafetensorsMaxHeaderBytes) + "-byte limit"};
    }

    // Two linear passes. nlohmann's parser callback would do both jobs in
    // one, but it rescans the enclosing object each time a nested value ends
    // (to drop discarded values), which made a header of n tensors cost n^2:
    // 80k tensors took 29 s.
    const char* header = reinterpret_cast<const char*>(data + 8);
    HeaderCheck check;
    json::sax_parse(header, header + header_len, &check, json::input_format_t::json, /*strict=*/true);
    if (!check.error.empty()) return Error{label + ": malformed JSON header: " + check.error};
    json root = json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) return Error{label + ": malformed JSON header"};
    const std::string duplicate = check.duplicate;
    if (!root.is_object()) return Error{label + ": JSON header is not an object"};
    if (!duplicate.empty()) return Error{label + ": duplicate tensor name '" + escaped(duplicate) + "' in the header"};

    ParsedFile parsed;
    parsed.format = FileFormat::Safetensors;
    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = size - data_start;
    for (auto it = root.begin(); it != root.end(); ++it) {
        if (it.key() == "__metadata__") {
            if (!it->is_object()) return Error{label + ": \"__metadata__\" is not an object"};
            for (auto m = it->begin(); m != it->end(); ++m) {
                if (!m->is_string())
                    return Error{label + ": __metadata__ value '" + escaped(m.key()) + "' is not a string"};
                parsed.metadata[m.key()] = MetaValue::of_string(m->get<std::string>());
            }
            continue;
        }
        auto info = parse_entry(it.key(), *it, data_start, data_size, label);
        if (!info.ok()) return info.error();
        parsed.tensors.push_back(std::move(info).value());
    }
    KILN_TRY(check_no_overlap(parsed.tensors, label));
    return parsed;
}

}  // namespace kiln::io
