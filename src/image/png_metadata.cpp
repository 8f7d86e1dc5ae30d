#include "image/png_metadata.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "image/image_io.h"

namespace kiln::image {

bool GenerationInfo::operator==(const GenerationInfo& o) const {
    return prompt == o.prompt && negative_prompt == o.negative_prompt && steps == o.steps && sampler == o.sampler &&
           scheduler == o.scheduler && cfg_scale == o.cfg_scale && seed == o.seed && width == o.width &&
           height == o.height && model == o.model && extra == o.extra;
}

namespace {

// ---- text helpers ---------------------------------------------------------

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

constexpr uint32_t kReplacement = 0xFFFD;

// Decodes UTF-8 into code points; each malformed byte becomes U+FFFD.
std::vector<uint32_t> utf8_code_points(const std::string& s) {
    static const uint32_t kMinForLength[4] = {0, 0x80, 0x800, 0x10000};  // rejects overlong forms
    std::vector<uint32_t> out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const auto b0 = static_cast<unsigned char>(s[i]);
        int extra = 0;
        uint32_t cp = b0;
        if (b0 >= 0x80) {
            if ((b0 & 0xE0) == 0xC0) {
                extra = 1, cp = b0 & 0x1Fu;
            } else if ((b0 & 0xF0) == 0xE0) {
                extra = 2, cp = b0 & 0x0Fu;
            } else if ((b0 & 0xF8) == 0xF0) {
                extra = 3, cp = b0 & 0x07u;
            } else {
                extra = -1;
            }
        }
        bool ok = extra >= 0 && i + static_cast<size_t>(extra) < s.size();
        for (int k = 1; ok && k <= extra; ++k) {
            const auto b = static_cast<unsigned char>(s[i + k]);
            ok = (b & 0xC0) == 0x80;
            cp = (cp << 6) | (b & 0x3Fu);
        }
        ok = ok && cp >= kMinForLength[extra] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        out.push_back(ok ? cp : kReplacement);
        i += ok ? static_cast<size_t>(extra) + 1 : 1;
    }
    return out;
}

std::string latin1_to_utf8(const uint8_t* data, size_t size) {
    std::string out;
    out.reserve(size);
    for (size_t i = 0; i < size; ++i) append_utf8(out, data[i]);
    return out;
}

// UTF-16 code units (big- or little-endian bytes) to UTF-8; unpaired
// surrogates become U+FFFD.
std::string utf16_to_utf8(const uint8_t* data, size_t size, bool big_endian) {
    std::string out;
    auto unit = [&](size_t i) -> uint32_t {
        return big_endian ? (uint32_t(data[2 * i]) << 8) | data[2 * i + 1]
                          : (uint32_t(data[2 * i + 1]) << 8) | data[2 * i];
    };
    const size_t n = size / 2;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t u = unit(i);
        if (u >= 0xD800 && u <= 0xDBFF && i + 1 < n && unit(i + 1) >= 0xDC00 && unit(i + 1) <= 0xDFFF) {
            append_utf8(out, 0x10000 + ((u - 0xD800) << 10) + (unit(i + 1) - 0xDC00));
            ++i;
        } else if (u >= 0xD800 && u <= 0xDFFF) {
            append_utf8(out, kReplacement);
        } else {
            append_utf8(out, u);
        }
    }
    return out;
}

// Python's str.strip() for the characters that matter here: ASCII
// whitespace and the information separators \x1c..\x1f.
bool is_py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

std::string py_strip(const std::string& s) {
    size_t b = 0, e = s.size();
    while (b < e && is_py_space(s[b])) ++b;
    while (e > b && is_py_space(s[e - 1])) --e;
    return s.substr(b, e - b);
}

// Python's \w on str: letters, digits and '_'. Bytes of multi-byte UTF-8
// sequences count as word characters, which makes every non-ASCII letter one
// (and non-ASCII punctuation too; A1111 keys never contain any).
bool is_word(char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x80 || std::isalnum(u) || c == '_';
}

// ---- A1111 quoting (modules/infotext_utils.py) -----------------------------

// quote(): values containing ',', ':' or a newline become JSON strings, as
// Python's json.dumps(value, ensure_ascii=False) writes them.
std::string a1111_quote(const std::string& value) {
    if (value.find_first_of(",:\n") == std::string::npos) return value;
    std::string out = "\"";
    for (char c : value) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// json.loads of a text that must be exactly one JSON string; nullopt where
// Python would raise (unquote() then keeps the raw text).
std::optional<std::string> json_string(const std::string& text) {
    if (text.size() < 2 || text.front() != '"' || text.back() != '"') return std::nullopt;
    std::string out;
    size_t i = 1;
    auto read_hex4 = [&](size_t at, uint32_t& v) {
        if (at + 4 > text.size()) return false;
        v = 0;
        for (size_t k = 0; k < 4; ++k) {
            const int h = hex_value(text[at + k]);
            if (h < 0) return false;
            v = (v << 4) | static_cast<uint32_t>(h);
        }
        return true;
    };
    while (i < text.size()) {
        const char c = text[i];
        if (c == '"') return i == text.size() - 1 ? std::optional<std::string>(out) : std::nullopt;
        if (static_cast<unsigned char>(c) < 0x20) return std::nullopt;  // strict mode: raw control characters
        if (c != '\\') {
            out += c;
            ++i;
            continue;
        }
        if (i + 1 >= text.size()) return std::nullopt;
        const char e = text[i + 1];
        i += 2;
        switch (e) {
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u': {
                uint32_t u = 0;
                if (!read_hex4(i, u)) return std::nullopt;
                i += 4;
                uint32_t low = 0;
                if (u >= 0xD800 && u <= 0xDBFF && i + 6 <= text.size() && text[i] == '\\' && text[i + 1] == 'u' &&
                    read_hex4(i + 2, low) && low >= 0xDC00 && low <= 0xDFFF) {
                    u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
                    i += 6;
                } else if (u >= 0xD800 && u <= 0xDFFF) {
                    u = kReplacement;  // Python keeps a lone surrogate; UTF-8 cannot
                }
                append_utf8(out, u);
                break;
            }
            default: return std::nullopt;
        }
    }
    return std::nullopt;
}

std::string a1111_unquote(const std::string& value) {
    std::optional<std::string> s = json_string(value);
    return s ? *s : value;
}

// re_param = r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)', matched
// as re.findall does: tried at every position, continuing after each match.
// The pattern never needs to backtrack across its parts (the key class
// excludes ':' and an unescaped '"' ends a quoted value), so a direct scan
// gives the same matches.
std::vector<std::pair<std::string, std::string>> find_params(const std::string& s) {
    std::vector<std::pair<std::string, std::string>> out;
    const size_t n = s.size();
    size_t pos = 0;
    while (pos < n) {
        size_t i = pos;
        while (i < n && is_py_space(s[i])) ++i;
        const size_t key_begin = i;
        size_t after_first = i;  // the key needs a second character, not just a second byte
        if (i < n && is_word(s[i])) {
            ++i;
            while (i < n && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;  // rest of a UTF-8 character
            after_first = i;
            while (i < n && (is_word(s[i]) || s[i] == ' ' || s[i] == '-' || s[i] == '/')) ++i;
        }
        if (i == after_first || i >= n || s[i] != ':') {
            // Next character, as Python steps through code points, not bytes.
            ++pos;
            while (pos < n && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
            continue;
        }
        const std::string key = s.substr(key_begin, i - key_begin);
        ++i;
        while (i < n && is_py_space(s[i])) ++i;
        size_t value_end = std::string::npos;
        if (i < n && s[i] == '"') {
            size_t j = i + 1;
            while (j < n) {
                if (s[j] == '\\' && j + 1 < n && s[j + 1] != '\n') {
                    j += 2;
                } else if (s[j] != '\\' && s[j] != '"') {
                    ++j;
                } else {
                    break;
                }
            }
            if (j > i + 1 && j < n && s[j] == '"' && (j + 1 == n || s[j + 1] == ',')) value_end = j + 1;
        }
        if (value_end == std::string::npos) {
            value_end = i;
            while (value_end < n && s[value_end] != ',') ++value_end;
        }
        out.emplace_back(key, s.substr(i, value_end - i));
        pos = value_end < n ? value_end + 1 : n;  // past the ',' that ended the value
    }
    return out;
}

// A1111's create_infotext order; keys not listed come between "Tiling" and
// "Version", where A1111 splices extra_generation_params in.
const char* const kA1111KeyOrder[] = {"Steps",
                                      "Sampler",
                                      "Schedule type",
                                      "CFG scale",
                                      "Image CFG scale",
                                      "Seed",
                                      "Face restoration",
                                      "Size",
                                      "Model hash",
                                      "Model",
                                      "FP8 weight",
                                      "Cache FP16 weight for LoRA",
                                      "VAE hash",
                                      "VAE",
                                      "Variation seed",
                                      "Variation seed strength",
                                      "Seed resize from",
                                      "Denoising strength",
                                      "Conditional mask weight",
                                      "Clip skip",
                                      "ENSD",
                                      "Token merging ratio",
                                      "Token merging ratio hr",
                                      "Init image hash",
                                      "RNG",
                                      "Tiling",
                                      /* extra_generation_params */ "Version",
                                      "User"};

double key_rank(const std::string& key) {
    const size_t count = std::size(kA1111KeyOrder);
    for (size_t i = 0; i < count; ++i) {
        if (key == kA1111KeyOrder[i]) return static_cast<double>(i);
    }
    return static_cast<double>(count - 2) - 0.5;  // just before "Version"
}

// Shortest fixed-point text that reads back as the same float: 7 -> "7",
// 7.5 -> "7.5", 0.1f -> "0.1". to_chars, unlike printf, ignores the locale.
std::string format_float(float v) {
    char buf[64];
    const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
    return std::string(buf, r.ec == std::errc() ? r.ptr : buf);
}

// Sets `out` only when all of `s` is one number (from_chars alone would
// also take the "20" of "20abc").
template <class T>
bool parse_number(const std::string& s, T& out) {
    T value{};
    const char* end = s.data() + s.size();
    auto [p, ec] = std::from_chars(s.data(), end, value);
    if (s.empty() || ec != std::errc() || p != end) return false;
    out = value;
    return true;
}

bool parse_size(const std::string& s, int& w, int& h) {
    const size_t x = s.find('x');
    if (x == std::string::npos) return false;
    const std::string a = s.substr(0, x), b = s.substr(x + 1);
    auto digits = [](const std::string& t) {
        return !t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    int pw = 0, ph = 0;
    if (!digits(a) || !digits(b) || !parse_number(a, pw) || !parse_number(b, ph)) return false;
    w = pw, h = ph;
    return true;
}

}  // namespace

std::string format_a1111_parameters(const GenerationInfo& info) {
    std::vector<std::pair<std::string, std::string>> params;
    if (info.steps > 0) params.emplace_back("Steps", std::to_string(info.steps));
    if (!info.sampler.empty()) params.emplace_back("Sampler", info.sampler);
    if (!info.scheduler.empty()) params.emplace_back("Schedule type", info.scheduler);
    if (info.cfg_scale != 0.0f) params.emplace_back("CFG scale", format_float(info.cfg_scale));
    if (info.seed >= 0) params.emplace_back("Seed", std::to_string(info.seed));
    if (info.width > 0 && info.height > 0) {
        params.emplace_back("Size", std::to_string(info.width) + "x" + std::to_string(info.height));
    }
    if (!info.model.empty()) params.emplace_back("Model", info.model);
    params.insert(params.end(), info.extra.begin(), info.extra.end());
    std::stable_sort(params.begin(), params.end(),
                     [](const auto& a, const auto& b) { return key_rank(a.first) < key_rank(b.first); });

    std::string line;
    for (const auto& [key, value] : params) {
        if (!line.empty()) line += ", ";
        line += key == value ? key : key + ": " + a1111_quote(value);
    }
    std::string text = info.prompt;
    if (!info.negative_prompt.empty()) text += "\nNegative prompt: " + info.negative_prompt;
    text += "\n" + line;
    return py_strip(text);
}

GenerationInfo parse_a1111_parameters(const std::string& text) {
    GenerationInfo info;
    std::vector<std::string> lines;
    const std::string stripped = py_strip(text);
    size_t start = 0;
    for (;;) {
        const size_t nl = stripped.find('\n', start);
        lines.push_back(stripped.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
        if (nl == std::string::npos) break;
        start = nl + 1;
    }
    std::string last = lines.back();
    lines.pop_back();
    std::vector<std::pair<std::string, std::string>> params = find_params(last);
    if (params.size() < 3) {
        lines.push_back(last);
        params.clear();
    }

    bool in_negative = false;
    for (std::string line : lines) {
        line = py_strip(line);
        if (line.rfind("Negative prompt:", 0) == 0) {
            in_negative = true;
            line = py_strip(line.substr(16));
        }
        std::string& target = in_negative ? info.negative_prompt : info.prompt;
        if (!target.empty()) target += "\n";
        target += line;
    }

    for (auto& [key, raw] : params) {
        // A1111 skips a pair whose value is empty (v[0] raises).
        if (raw.empty()) continue;
        const std::string value = raw.front() == '"' && raw.back() == '"' ? a1111_unquote(raw) : raw;
        bool taken = true;
        if (key == "Steps") {
            taken = parse_number(value, info.steps);
        } else if (key == "Sampler") {
            info.sampler = value;
        } else if (key == "Schedule type") {
            info.scheduler = value;
        } else if (key == "CFG scale") {
            float cfg = 0.0f;
            taken = parse_number(value, cfg) && std::isfinite(cfg);
            if (taken) info.cfg_scale = cfg;
        } else if (key == "Seed") {
            taken = parse_number(value, info.seed);
        } else if (key == "Size") {
            taken = parse_size(value, info.width, info.height);
        } else if (key == "Model") {
            info.model = value;
        } else {
            taken = false;
        }
        if (!taken) info.extra.emplace_back(key, value);
    }
    return info;
}

// ---- PNG text chunks -------------------------------------------------------

namespace {

uint32_t be32(const uint8_t* p) {
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

constexpr size_t kMaxInflatedText = size_t(16) << 20;

}  // namespace

Result<std::string> inflate_text(const uint8_t* data, size_t size, const std::string& what) {
    z_stream z{};
    if (inflateInit(&z) != Z_OK) return Error{what + ": zlib initialisation failed"};
    std::string out;
    char buffer[16384];
    z.next_in = const_cast<Bytef*>(data);
    z.avail_in = static_cast<uInt>(size);
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
        z.next_out = reinterpret_cast<Bytef*>(buffer);
        z.avail_out = sizeof(buffer);
        rc = inflate(&z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END) {
            inflateEnd(&z);
            return Error{what + ": compressed text is corrupt (" + (z.msg ? z.msg : "zlib error") + ")"};
        }
        out.append(buffer, sizeof(buffer) - z.avail_out);
        if (out.size() > kMaxInflatedText) {
            inflateEnd(&z);
            return Error{what + ": text inflates to more than " + std::to_string(kMaxInflatedText >> 20) + " MiB"};
        }
        if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
            inflateEnd(&z);
            return Error{what + ": compressed text is cut short"};
        }
    }
    inflateEnd(&z);
    return out;
}

namespace {

// One tEXt/zTXt/iTXt chunk body to (keyword, UTF-8 text).
Result<std::pair<std::string, std::string>> decode_text_chunk(const std::string& type, const uint8_t* body, size_t size,
                                                              const std::string& label) {
    const std::string what = label + ": " + type + " chunk";
    const auto* nul = static_cast<const uint8_t*>(std::memchr(body, 0, size));
    if (!nul || nul == body) return Error{what + " has no keyword"};
    const std::string keyword = latin1_to_utf8(body, static_cast<size_t>(nul - body));
    const uint8_t* p = nul + 1;
    const uint8_t* end = body + size;
    if (type == "tEXt") return std::make_pair(keyword, latin1_to_utf8(p, static_cast<size_t>(end - p)));
    if (type == "zTXt") {
        if (p >= end || *p != 0) return Error{what + " '" + keyword + "' uses an unknown compression method"};
        Result<std::string> text = inflate_text(p + 1, static_cast<size_t>(end - p - 1), what + " '" + keyword + "'");
        if (!text) return text.error();
        return std::make_pair(keyword, latin1_to_utf8(reinterpret_cast<const uint8_t*>(text->data()), text->size()));
    }
    // iTXt: compression flag, method, language tag\0, translated keyword\0, UTF-8 text.
    if (end - p < 2) return Error{what + " '" + keyword + "' is cut short"};
    const bool compressed = p[0] != 0;
    if (compressed && p[1] != 0) return Error{what + " '" + keyword + "' uses an unknown compression method"};
    p += 2;
    for (int field = 0; field < 2; ++field) {
        const auto* z = static_cast<const uint8_t*>(std::memchr(p, 0, static_cast<size_t>(end - p)));
        if (!z) return Error{what + " '" + keyword + "' is cut short"};
        p = z + 1;
    }
    if (!compressed)
        return std::make_pair(keyword, std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(end - p)));
    Result<std::string> text = inflate_text(p, static_cast<size_t>(end - p), what + " '" + keyword + "'");
    if (!text) return text.error();
    return std::make_pair(keyword, std::move(*text));
}

}  // namespace

Result<std::map<std::string, std::string>> parse_png_text(const uint8_t* data, size_t size, const std::string& label) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (size < 8 || std::memcmp(data, png_sig, 8) != 0) return Error{label + ": not a PNG file"};
    std::map<std::string, std::string> text;
    size_t pos = 8;
    for (;;) {
        if (size - pos < 12)
            return Error{label + ": truncated PNG (chunk at byte " + std::to_string(pos) + " is cut short)"};
        const uint32_t length = be32(data + pos);
        const std::string type(reinterpret_cast<const char*>(data + pos + 4), 4);
        if (length > 0x7FFFFFFFu) return Error{label + ": corrupt PNG (chunk length " + std::to_string(length) + ")"};
        if (size - pos - 12 < length) {
            return Error{label + ": truncated PNG (" + type + " chunk at byte " + std::to_string(pos) +
                         " is cut short)"};
        }
        const uint8_t* body = data + pos + 8;
        if (type == "tEXt" || type == "zTXt" || type == "iTXt") {
            const uint32_t crc = static_cast<uint32_t>(crc32(0L, data + pos + 4, length + 4));
            if (crc != be32(body + length)) return Error{label + ": corrupt PNG (" + type + " chunk fails its CRC)"};
            Result<std::pair<std::string, std::string>> entry = decode_text_chunk(type, body, length, label);
            if (!entry) return entry.error();
            text[entry->first] = std::move(entry->second);
        }
        if (type == "IEND") break;
        pos += 12 + static_cast<size_t>(length);
    }
    return text;
}

Result<std::map<std::string, std::string>> read_png_text(const std::string& path) {
    Result<std::vector<uint8_t>> bytes = read_file_bytes(path);
    if (!bytes) return bytes.error();
    return parse_png_text(bytes->data(), bytes->size(), path);
}

// ---- EXIF UserComment ------------------------------------------------------

namespace {

constexpr uint16_t kExifIfdPointerTag = 0x8769;
constexpr uint16_t kUserCommentTag = 0x9286;
const char kUnicodePrefix[8] = {'U', 'N', 'I', 'C', 'O', 'D', 'E', 0};
const char kAsciiPrefix[8] = {'A', 'S', 'C', 'I', 'I', 0, 0, 0};
const char kUndefinedPrefix[8] = {0, 0, 0, 0, 0, 0, 0, 0};

void put_be16(std::vector<uint8_t>& out, uint32_t v) {
    out.push_back(static_cast<uint8_t>(v >> 8));
    out.push_back(static_cast<uint8_t>(v));
}
void put_be32(std::vector<uint8_t>& out, uint32_t v) {
    put_be16(out, v >> 16);
    put_be16(out, v & 0xFFFF);
}

// Bounds-checked reads from a TIFF block in its byte order.
struct TiffReader {
    const uint8_t* data;
    size_t size;
    bool big_endian;
    bool u16(size_t at, uint32_t& v) const {
        if (at > size || size - at < 2) return false;
        v = big_endian ? (uint32_t(data[at]) << 8) | data[at + 1] : (uint32_t(data[at + 1]) << 8) | data[at];
        return true;
    }
    bool u32(size_t at, uint32_t& v) const {
        uint32_t a = 0, b = 0;
        if (!u16(at, a) || !u16(at + 2, b)) return false;
        v = big_endian ? (a << 16) | b : (b << 16) | a;
        return true;
    }
    // The 12-byte entry for `tag` in the IFD at `ifd`, as an offset.
    std::optional<size_t> find(size_t ifd, uint32_t tag) const {
        uint32_t count = 0;
        if (!u16(ifd, count)) return std::nullopt;
        for (uint32_t i = 0; i < count; ++i) {
            const size_t entry = ifd + 2 + 12 * static_cast<size_t>(i);
            uint32_t t = 0;
            if (!u16(entry, t) || entry + 12 > size) return std::nullopt;
            if (t == tag) return entry;
        }
        return std::nullopt;
    }
};

}  // namespace

std::vector<uint8_t> make_exif_user_comment(const std::string& text) {
    // Layout as piexif.dump({"Exif": {UserComment: ...}}) writes it:
    // header, IFD0 with only the Exif IFD pointer, the Exif IFD with only
    // UserComment, then the comment bytes.
    std::vector<uint8_t> value(kUnicodePrefix, kUnicodePrefix + 8);
    for (uint32_t cp : utf8_code_points(text)) {
        if (cp >= 0x10000) {
            cp -= 0x10000;
            put_be16(value, 0xD800 + (cp >> 10));
            put_be16(value, 0xDC00 + (cp & 0x3FF));
        } else {
            put_be16(value, cp);
        }
    }
    const uint32_t ifd0 = 8, exif_ifd = ifd0 + 18, value_offset = exif_ifd + 18;
    std::vector<uint8_t> out = {'M', 'M', 0, 42};
    put_be32(out, ifd0);
    put_be16(out, 1);  // IFD0: one entry
    put_be16(out, kExifIfdPointerTag);
    put_be16(out, 4);  // LONG
    put_be32(out, 1);
    put_be32(out, exif_ifd);
    put_be32(out, 0);  // no next IFD
    put_be16(out, 1);  // Exif IFD: one entry
    put_be16(out, kUserCommentTag);
    put_be16(out, 7);  // UNDEFINED
    put_be32(out, static_cast<uint32_t>(value.size()));
    put_be32(out, value_offset);
    put_be32(out, 0);
    out.insert(out.end(), value.begin(), value.end());
    return out;
}

std::optional<std::string> parse_exif_user_comment(const uint8_t* data, size_t size) {
    if (size >= 6 && std::memcmp(data, "Exif\0\0", 6) == 0) {
        data += 6;
        size -= 6;
    }
    if (size < 8) return std::nullopt;
    TiffReader r{data, size, data[0] == 'M'};
    if (!((data[0] == 'M' && data[1] == 'M') || (data[0] == 'I' && data[1] == 'I'))) return std::nullopt;
    uint32_t magic = 0, ifd0 = 0, exif_ifd = 0, count = 0, offset = 0;
    if (!r.u16(2, magic) || magic != 42 || !r.u32(4, ifd0)) return std::nullopt;
    const std::optional<size_t> pointer = r.find(ifd0, kExifIfdPointerTag);
    if (!pointer || !r.u32(*pointer + 8, exif_ifd)) return std::nullopt;
    const std::optional<size_t> entry = r.find(exif_ifd, kUserCommentTag);
    if (!entry || !r.u32(*entry + 4, count)) return std::nullopt;
    if (count <= 4) {
        offset = static_cast<uint32_t>(*entry + 8);
    } else if (!r.u32(*entry + 8, offset)) {
        return std::nullopt;
    }
    if (offset > size || size - offset < count) return std::nullopt;
    const uint8_t* value = data + offset;
    if (count < 8) return std::string(reinterpret_cast<const char*>(value), count);

    const uint8_t* body = value + 8;
    size_t body_size = count - 8;
    std::string text;
    if (std::memcmp(value, kUnicodePrefix, 8) == 0) {
        bool big_endian = r.big_endian;
        if (body_size >= 2 && ((body[0] == 0xFE && body[1] == 0xFF) || (body[0] == 0xFF && body[1] == 0xFE))) {
            big_endian = body[0] == 0xFE;
            body += 2;
            body_size -= 2;
        }
        text = utf16_to_utf8(body, body_size, big_endian);
    } else if (std::memcmp(value, kAsciiPrefix, 8) == 0 || std::memcmp(value, kUndefinedPrefix, 8) == 0) {
        text.assign(reinterpret_cast<const char*>(body), body_size);
    } else {
        // No (or an unknown, e.g. JIS) character-code prefix: the bytes as they are.
        text.assign(reinterpret_cast<const char*>(value), count);
    }
    while (!text.empty() && text.back() == '\0') text.pop_back();
    return text;
}

namespace {

std::optional<std::string> jpeg_user_comment(const uint8_t* data, size_t size) {
    size_t pos = 2;  // after SOI
    while (pos + 4 <= size && data[pos] == 0xFF) {
        const uint8_t marker = data[pos + 1];
        if (marker == 0xFF) {  // fill byte
            ++pos;
            continue;
        }
        if (marker == 0xDA || marker == 0xD9) break;  // image data or end: metadata comes before
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
            pos += 2;
            continue;
        }
        const size_t length = (size_t(data[pos + 2]) << 8) | data[pos + 3];
        if (length < 2 || pos + 2 + length > size) break;
        const uint8_t* segment = data + pos + 4;
        if (marker == 0xE1 && length - 2 >= 6 && std::memcmp(segment, "Exif\0\0", 6) == 0) {
            if (auto text = parse_exif_user_comment(segment, length - 2)) return text;
        }
        pos += 2 + length;
    }
    return std::nullopt;
}

std::optional<std::string> webp_user_comment(const uint8_t* data, size_t size) {
    const size_t riff_end =
        std::min<size_t>(size, size_t(data[4] | (data[5] << 8) | (data[6] << 16) | (uint32_t(data[7]) << 24)) + 8);
    size_t pos = 12;
    while (pos + 8 <= riff_end) {
        const uint32_t length =
            data[pos + 4] | (data[pos + 5] << 8) | (data[pos + 6] << 16) | (uint32_t(data[pos + 7]) << 24);
        if (riff_end - pos - 8 < length) break;
        if (std::memcmp(data + pos, "EXIF", 4) == 0) return parse_exif_user_comment(data + pos + 8, length);
        pos += 8 + static_cast<size_t>(length) + (length & 1);
    }
    return std::nullopt;
}

}  // namespace

Result<std::map<std::string, std::string>> read_image_text(const std::string& path) {
    Result<std::vector<uint8_t>> bytes = read_file_bytes(path);
    if (!bytes) return bytes.error();
    return image_text(bytes->data(), bytes->size(), path);
}

Result<std::map<std::string, std::string>> image_text(const uint8_t* data, size_t size, const std::string& label) {
    const std::optional<ImageFormat> format = detect_image_format(data, size);
    if (!format) return Error{label + ": not a PNG, JPEG or WebP image (unrecognised signature)"};
    if (*format == ImageFormat::Png) return parse_png_text(data, size, label);
    std::optional<std::string> comment =
        *format == ImageFormat::Jpeg ? jpeg_user_comment(data, size) : webp_user_comment(data, size);
    std::map<std::string, std::string> text;
    if (comment) text[kParametersKeyword] = std::move(*comment);
    return text;
}

}  // namespace kiln::image
