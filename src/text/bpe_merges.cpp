#include "text/bpe_merges.h"

#include "util/message_text.h"

namespace kiln::text {

bool split_merge(std::string_view line, BpeMerge& out) {
    std::string_view parts[2];
    size_t count = 0;
    size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
        const size_t start = i;
        while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
        if (i > start) {
            if (count == 2) return false;
            parts[count++] = line.substr(start, i - start);
        }
    }
    if (count != 2) return false;
    out = {std::string(parts[0]), std::string(parts[1])};
    return true;
}

Result<std::vector<BpeMerge>> parse_merges_text(std::string_view text, const std::string& label) {
    std::vector<BpeMerge> merges;
    size_t pos = 0;
    size_t line_no = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line_no == 1 && line.substr(0, 8) == "#version") continue;
        if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
        BpeMerge merge;
        if (!split_merge(line, merge)) {
            return Error::bad_file(label + ": line " + std::to_string(line_no) + ": expected two symbols, got " +
                                   quoted_text(line));
        }
        merges.push_back(std::move(merge));
    }
    return merges;
}

}  // namespace kiln::text
