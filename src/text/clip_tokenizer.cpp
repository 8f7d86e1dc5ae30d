#include "text/clip_tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "text/bpe_merges.h"
#include "util/format.h"
#include "util/message_text.h"
namespace kiln::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Larger ids are rejected: they would only make id_to_token_ huge (the real
// vocabulary has 49408 entries).
constexpr int64_t kMaxVocabId = (int64_t{1} << 24) - 1;
// open_clip and HF's slow CLIPTokenizer use this many merges of
// bpe_simple_vocab_16e6.txt: 49152 tokens minus bytes and the two specials.
constexpr size_t kClipMergeCount = 49152 - 256 - 2;
// Bound on the per-piece BPE cache; a long-running server sees unbounded
// distinct words.
constexpr size_t kMaxCacheEntries = 1 << 16;
constexpr char32_t kReplacement = 0xFFFD;

struct Range {
    char32_t lo;
    char32_t hi;
};

bool in_ranges(const Range* begin, const Range* end, char32_t c) {
    const Range* it = std::upper_bound(begin, end, c, [](char32_t v, const Range& r) { return v < r.lo; });
    return it != begin && c <= (it - 1)->hi;
}

// Non-ASCII whitespace: the `regex` module's \s (Unicode White_Space).
constexpr Range kSpaceRanges[] = {{0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                                  {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}};

// The tables below were generated from Python 3.11's unicodedata (Unicode
// 14.0), the data HF's and open_clip's `regex` patterns follow; unassigned
// code points between two members are folded into their range, which only
// matters for text no font can show.

// Non-ASCII \p{L}: general categories Lu Ll Lt Lm Lo.
// clang-format off
constexpr Range kLetterRanges[] = {
    {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x2C1}, {0x2C6, 0x2D1}, {0x2E0, 0x2E4},
    {0x2EC, 0x2EC}, {0x2EE, 0x2EE}, {0x370, 0x374}, {0x376, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x3F5},
    {0x3F7, 0x481}, {0x48A, 0x559}, {0x560, 0x588}, {0x5D0, 0x5F2}, {0x620, 0x64A}, {0x66E, 0x66F}, {0x671, 0x6D3},
    {0x6D5, 0x6D5}, {0x6E5, 0x6E6}, {0x6EE, 0x6EF}, {0x6FA, 0x6FC}, {0x6FF, 0x6FF}, {0x710, 0x710}, {0x712, 0x72F},
    {0x74D, 0x7A5}, {0x7B1, 0x7B1}, {0x7CA, 0x7EA}, {0x7F4, 0x7F5}, {0x7FA, 0x7FA}, {0x800, 0x815}, {0x81A, 0x81A},
    {0x824, 0x824}, {0x828, 0x828}, {0x840, 0x858}, {0x860, 0x887}, {0x889, 0x88E}, {0x8A0, 0x8C9}, {0x904, 0x939},
    {0x93D, 0x93D}, {0x950, 0x950}, {0x958, 0x961}, {0x971, 0x980}, {0x985, 0x9B9}, {0x9BD, 0x9BD}, {0x9CE, 0x9CE},
    {0x9DC, 0x9E1}, {0x9F0, 0x9F1}, {0x9FC, 0x9FC}, {0xA05, 0xA39}, {0xA59, 0xA5E}, {0xA72, 0xA74}, {0xA85, 0xAB9},
    {0xABD, 0xABD}, {0xAD0, 0xAE1}, {0xAF9, 0xAF9}, {0xB05, 0xB39}, {0xB3D, 0xB3D}, {0xB5C, 0xB61}, {0xB71, 0xB71},
    {0xB83, 0xBB9}, {0xBD0, 0xBD0}, {0xC05, 0xC39}, {0xC3D, 0xC3D}, {0xC58, 0xC61}, {0xC80, 0xC80}, {0xC85, 0xCB9},
    {0xCBD, 0xCBD}, {0xCDD, 0xCE1}, {0xCF1, 0xCF2}, {0xD04, 0xD3A}, {0xD3D, 0xD3D}, {0xD4E, 0xD4E}, {0xD54, 0xD56},
    {0xD5F, 0xD61}, {0xD7A, 0xD7F}, {0xD85, 0xDC6}, {0xE01, 0xE30}, {0xE32, 0xE33}, {0xE40, 0xE46}, {0xE81, 0xEB0},
    {0xEB2, 0xEB3}, {0xEBD, 0xEC6}, {0xEDC, 0xF00}, {0xF40, 0xF6C}, {0xF88, 0xF8C}, {0x1000, 0x102A}, {0x103F, 0x103F},
    {0x1050, 0x1055}, {0x105A, 0x105D}, {0x1061, 0x1061}, {0x1065, 0x1066}, {0x106E, 0x1070}, {0x1075, 0x1081},
    {0x108E, 0x108E}, {0x10A0, 0x10FA}, {0x10FC, 0x135A}, {0x1380, 0x138F}, {0x13A0, 0x13FD}, {0x1401, 0x166C},
    {0x166F, 0x167F}, {0x1681, 0x169A}, {0x16A0, 0x16EA}, {0x16F1, 0x1711}, {0x171F, 0x1731}, {0x1740, 0x1751},
    {0x1760, 0x1770}, {0x1780, 0x17B3}, {0x17D7, 0x17D7}, {0x17DC, 0x17DC}, {0x1820, 0x1884}, {0x1887, 0x18A8},
    {0x18AA, 0x191E}, {0x1950, 0x19C9}, {0x1A00, 0x1A16}, {0x1A20, 0x1A54}, {0x1AA7, 0x1AA7}, {0x1B05, 0x1B33},
    {0x1B45, 0x1B4C}, {0x1B83, 0x1BA0}, {0x1BAE, 0x1BAF}, {0x1BBA, 0x1BE5}, {0x1C00, 0x1C23}, {0x1C4D, 0x1C4F},
    {0x1C5A, 0x1C7D}, {0x1C80, 0x1CBF}, {0x1CE9, 0x1CEC}, {0x1CEE, 0x1CF3}, {0x1CF5, 0x1CF6}, {0x1CFA, 0x1DBF},
    {0x1E00, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FCC}, {0x1FD0, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FFC},
    {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D},
    {0x212F, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0x2D00, 0x2D6F}, {0x2D80, 0x2DDE}, {0x2E2F, 0x2E2F}, {0x3005, 0x3006},
    {0x3031, 0x3035}, {0x303B, 0x303C}, {0x3041, 0x3096}, {0x309D, 0x309F}, {0x30A1, 0x30FA}, {0x30FC, 0x318E},
    {0x31A0, 0x31BF}, {0x31F0, 0x31FF}, {0x3400, 0x4DBF}, {0x4E00, 0xA48C}, {0xA4D0, 0xA4FD}, {0xA500, 0xA60C},
    {0xA610, 0xA61F}, {0xA62A, 0xA66E}, {0xA67F, 0xA69D}, {0xA6A0, 0xA6E5}, {0xA717, 0xA71F}, {0xA722, 0xA788},
    {0xA78B, 0xA801}, {0xA803, 0xA805}, {0xA807, 0xA80A}, {0xA80C, 0xA822}, {0xA840, 0xA873}, {0xA882, 0xA8B3},
    {0xA8F2, 0xA8F7}, {0xA8FB, 0xA8FB}, {0xA8FD, 0xA8FE}, {0xA90A, 0xA925}, {0xA930, 0xA946}, {0xA960, 0xA97C},
    {0xA984, 0xA9B2}, {0xA9CF, 0xA9CF}, {0xA9E0, 0xA9E4}, {0xA9E6, 0xA9EF}, {0xA9FA, 0xAA28}, {0xAA40, 0xAA42},
    {0xAA44, 0xAA4B}, {0xAA60, 0xAA76}, {0xAA7A, 0xAA7A}, {0xAA7E, 0xAAAF}, {0xAAB1, 0xAAB1}, {0xAAB5, 0xAAB6},
    {0xAAB9, 0xAABD}, {0xAAC0, 0xAAC0}, {0xAAC2, 0xAADD}, {0xAAE0, 0xAAEA}, {0xAAF2, 0xAAF4}, {0xAB01, 0xAB5A},
    {0xAB5C, 0xAB69}, {0xAB70, 0xABE2}, {0xAC00, 0xD7FB}, {0xF900, 0xFB1D}, {0xFB1F, 0xFB28}, {0xFB2A, 0xFBB1},
    {0xFBD3, 0xFD3D}, {0xFD50, 0xFDC7}, {0xFDF0, 0xFDFB}, {0xFE70, 0xFEFC}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A},
    {0xFF66, 0xFFDC}, {0x10000, 0x100FA}, {0x10280, 0x102D0}, {0x10300, 0x1031F}, {0x1032D, 0x10340},
    {0x10342, 0x10349}, {0x10350, 0x10375}, {0x10380, 0x1039D}, {0x103A0, 0x103CF}, {0x10400, 0x1049D},
    {0x104B0, 0x10563}, {0x10570, 0x10855}, {0x10860, 0x10876}, {0x10880, 0x1089E}, {0x108E0, 0x108F5},
    {0x10900, 0x10915}, {0x10920, 0x10939}, {0x10980, 0x109B7}, {0x109BE, 0x109BF}, {0x10A00, 0x10A00},
    {0x10A10, 0x10A35}, {0x10A60, 0x10A7C}, {0x10A80, 0x10A9C}, {0x10AC0, 0x10AC7}, {0x10AC9, 0x10AE4},
    {0x10B00, 0x10B35}, {0x10B40, 0x10B55}, {0x10B60, 0x10B72}, {0x10B80, 0x10B91}, {0x10C00, 0x10CF2},
    {0x10D00, 0x10D23}, {0x10E80, 0x10EA9}, {0x10EB0, 0x10F1C}, {0x10F27, 0x10F45}, {0x10F70, 0x10F81},
    {0x10FB0, 0x10FC4}, {0x10FE0, 0x10FF6}, {0x11003, 0x11037}, {0x11071, 0x11072}, {0x11075, 0x11075},
    {0x11083, 0x110AF}, {0x110D0, 0x110E8}, {0x11103, 0x11126}, {0x11144, 0x11144}, {0x11147, 0x11172},
    {0x11176, 0x11176}, {0x11183, 0x111B2}, {0x111C1, 0x111C4}, {0x111DA, 0x111DA}, {0x111DC, 0x111DC},
    {0x11200, 0x1122B}, {0x11280, 0x112A8}, {0x112B0, 0x112DE}, {0x11305, 0x11339}, {0x1133D, 0x1133D},
    {0x11350, 0x11350}, {0x1135D, 0x11361}, {0x11400, 0x11434}, {0x11447, 0x1144A}, {0x1145F, 0x114AF},
    {0x114C4, 0x114C5}, {0x114C7, 0x114C7}, {0x11580, 0x115AE}, {0x115D8, 0x115DB}, {0x11600, 0x1162F},
    {0x11644, 0x11644}, {0x11680, 0x116AA}, {0x116B8, 0x116B8}, {0x11700, 0x1171A}, {0x11740, 0x1182B},
    {0x118A0, 0x118DF}, {0x118FF, 0x1192F}, {0x1193F, 0x1193F}, {0x11941, 0x11941}, {0x119A0, 0x119D0},
    {0x119E1, 0x119E1}, {0x119E3, 0x119E3}, {0x11A00, 0x11A00}, {0x11A0B, 0x11A32}, {0x11A3A, 0x11A3A},
    {0x11A50, 0x11A50}, {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D}, {0x11AB0, 0x11C2E}, {0x11C40, 0x11C40},
    {0x11C72, 0x11C8F}, {0x11D00, 0x11D30}, {0x11D46, 0x11D46}, {0x11D60, 0x11D89}, {0x11D98, 0x11D98},
    {0x11EE0, 0x11EF2}, {0x11FB0, 0x11FB0}, {0x12000, 0x12399}, {0x12480, 0x12FF0}, {0x13000, 0x1342E},
    {0x14400, 0x16A5E}, {0x16A70, 0x16ABE}, {0x16AD0, 0x16AED}, {0x16B00, 0x16B2F}, {0x16B40, 0x16B43},
    {0x16B63, 0x16E7F}, {0x16F00, 0x16F4A}, {0x16F50, 0x16F50}, {0x16F93, 0x16FE1}, {0x16FE3, 0x16FE3},
    {0x17000, 0x1BC99}, {0x1D400, 0x1D6C0}, {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714},
    {0x1D716, 0x1D734}, {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8},
    {0x1D7AA, 0x1D7C2}, {0x1D7C4, 0x1D7CB}, {0x1DF00, 0x1DF1E}, {0x1E100, 0x1E12C}, {0x1E137, 0x1E13D},
    {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AD}, {0x1E2C0, 0x1E2EB}, {0x1E7E0, 0x1E8C4}, {0x1E900, 0x1E943},
    {0x1E94B, 0x1E94B}, {0x1EE00, 0x1EEBB}, {0x20000, 0x3134A},
};
// clang-format on

// Non-ASCII \p{N}: general categories Nd Nl No.
// clang-format off
constexpr Range kNumberRanges[] = {
    {0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}, {0x660, 0x669}, {0x6F0, 0x6F9}, {0x7C0, 0x7C9}, {0x966, 0x96F},
    {0x9E6, 0x9EF}, {0x9F4, 0x9F9}, {0xA66, 0xA6F}, {0xAE6, 0xAEF}, {0xB66, 0xB6F}, {0xB72, 0xB77}, {0xBE6, 0xBF2},
    {0xC66, 0xC6F}, {0xC78, 0xC7E}, {0xCE6, 0xCEF}, {0xD58, 0xD5E}, {0xD66, 0xD78}, {0xDE6, 0xDEF}, {0xE50, 0xE59},
    {0xED0, 0xED9}, {0xF20, 0xF33}, {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0},
    {0x17E0, 0x17F9}, {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A99}, {0x1B50, 0x1B59},
    {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089},
    {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x2CFD, 0x2CFD},
    {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A}, {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F},
    {0x3251, 0x325F}, {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF}, {0xA830, 0xA835},
    {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9},
    {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x10140, 0x10178}, {0x1018A, 0x1018B}, {0x102E1, 0x102FB},
    {0x10320, 0x10323}, {0x10341, 0x10341}, {0x1034A, 0x1034A}, {0x103D1, 0x103D5}, {0x104A0, 0x104A9},
    {0x10858, 0x1085F}, {0x10879, 0x1087F}, {0x108A7, 0x108AF}, {0x108FB, 0x108FF}, {0x10916, 0x1091B},
    {0x109BC, 0x109BD}, {0x109C0, 0x109FF}, {0x10A40, 0x10A48}, {0x10A7D, 0x10A7E}, {0x10A9D, 0x10A9F},
    {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F}, {0x10B78, 0x10B7F}, {0x10BA9, 0x10BAF}, {0x10CFA, 0x10CFF},
    {0x10D30, 0x10E7E}, {0x10F1D, 0x10F26}, {0x10F51, 0x10F54}, {0x10FC5, 0x10FCB}, {0x11052, 0x1106F},
    {0x110F0, 0x110F9}, {0x11136, 0x1113F}, {0x111D0, 0x111D9}, {0x111E1, 0x111F4}, {0x112F0, 0x112F9},
    {0x11450, 0x11459}, {0x114D0, 0x114D9}, {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x11730, 0x1173B},
    {0x118E0, 0x118F2}, {0x11950, 0x11959}, {0x11C50, 0x11C6C}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9},
    {0x11FC0, 0x11FD4}, {0x12400, 0x1246E}, {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9}, {0x16B50, 0x16B61},
    {0x16E80, 0x16E96}, {0x1D2E0, 0x1D2F3}, {0x1D360, 0x1D378}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149},
    {0x1E2F0, 0x1E2F9}, {0x1E8C7, 0x1E8CF}, {0x1E950, 0x1E959}, {0x1EC71, 0x1ECAB}, {0x1ECAD, 0x1ECAF},
    {0x1ECB1, 0x1ED2D}, {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9},
};
// clang-format on

// str.lower() for code points >= 0x80 whose lower case is one code point:
// c in [lo, hi] with (c - lo) % stride == 0 maps to c + delta.
struct LowerRange {
    char32_t lo;
    char32_t hi;
    int stride;
    int32_t delta;
};
// clang-format off
constexpr LowerRange kLowerRanges[] = {
    {0xC0, 0xD6, 1, 32}, {0xD8, 0xDE, 1, 32}, {0x100, 0x12E, 2, 1}, {0x132, 0x136, 2, 1}, {0x139, 0x147, 2, 1},
    {0x14A, 0x176, 2, 1}, {0x178, 0x178, 1, -121}, {0x179, 0x17D, 2, 1}, {0x181, 0x181, 1, 210}, {0x182, 0x184, 2, 1},
    {0x186, 0x186, 1, 206}, {0x187, 0x187, 1, 1}, {0x189, 0x18A, 1, 205}, {0x18B, 0x18B, 1, 1}, {0x18E, 0x18E, 1, 79},
    {0x18F, 0x18F, 1, 202}, {0x190, 0x190, 1, 203}, {0x191, 0x191, 1, 1}, {0x193, 0x193, 1, 205},
    {0x194, 0x194, 1, 207}, {0x196, 0x196, 1, 211}, {0x197, 0x197, 1, 209}, {0x198, 0x198, 1, 1},
    {0x19C, 0x19C, 1, 211}, {0x19D, 0x19D, 1, 213}, {0x19F, 0x19F, 1, 214}, {0x1A0, 0x1A4, 2, 1},
    {0x1A6, 0x1A6, 1, 218}, {0x1A7, 0x1A7, 1, 1}, {0x1A9, 0x1A9, 1, 218}, {0x1AC, 0x1AC, 1, 1}, {0x1AE, 0x1AE, 1, 218},
    {0x1AF, 0x1AF, 1, 1}, {0x1B1, 0x1B2, 1, 217}, {0x1B3, 0x1B5, 2, 1}, {0x1B7, 0x1B7, 1, 219}, {0x1B8, 0x1B8, 1, 1},
    {0x1BC, 0x1BC, 1, 1}, {0x1C4, 0x1C4, 1, 2}, {0x1C5, 0x1C5, 1, 1}, {0x1C7, 0x1C7, 1, 2}, {0x1C8, 0x1C8, 1, 1},
    {0x1CA, 0x1CA, 1, 2}, {0x1CB, 0x1DB, 2, 1}, {0x1DE, 0x1EE, 2, 1}, {0x1F1, 0x1F1, 1, 2}, {0x1F2, 0x1F4, 2, 1},
    {0x1F6, 0x1F6, 1, -97}, {0x1F7, 0x1F7, 1, -56}, {0x1F8, 0x21E, 2, 1}, {0x220, 0x220, 1, -130}, {0x222, 0x232, 2, 1},
    {0x23A, 0x23A, 1, 10795}, {0x23B, 0x23B, 1, 1}, {0x23D, 0x23D, 1, -163}, {0x23E, 0x23E, 1, 10792},
    {0x241, 0x241, 1, 1}, {0x243, 0x243, 1, -195}, {0x244, 0x244, 1, 69}, {0x245, 0x245, 1, 71}, {0x246, 0x24E, 2, 1},
    {0x370, 0x372, 2, 1}, {0x376, 0x376, 1, 1}, {0x37F, 0x37F, 1, 116}, {0x386, 0x386, 1, 38}, {0x388, 0x38A, 1, 37},
    {0x38C, 0x38C, 1, 64}, {0x38E, 0x38F, 1, 63}, {0x391, 0x3A1, 1, 32}, {0x3A3, 0x3AB, 1, 32}, {0x3CF, 0x3CF, 1, 8},
    {0x3D8, 0x3EE, 2, 1}, {0x3F4, 0x3F4, 1, -60}, {0x3F7, 0x3F7, 1, 1}, {0x3F9, 0x3F9, 1, -7}, {0x3FA, 0x3FA, 1, 1},
    {0x3FD, 0x3FF, 1, -130}, {0x400, 0x40F, 1, 80}, {0x410, 0x42F, 1, 32}, {0x460, 0x480, 2, 1}, {0x48A, 0x4BE, 2, 1},
    {0x4C0, 0x4C0, 1, 15}, {0x4C1, 0x4CD, 2, 1}, {0x4D0, 0x52E, 2, 1}, {0x531, 0x556, 1, 48}, {0x10A0, 0x10C5, 1, 7264},
    {0x10C7, 0x10C7, 1, 7264}, {0x10CD, 0x10CD, 1, 7264}, {0x13A0, 0x13EF, 1, 38864}, {0x13F0, 0x13F5, 1, 8},
    {0x1C90, 0x1CBA, 1, -3008}, {0x1CBD, 0x1CBF, 1, -3008}, {0x1E00, 0x1E94, 2, 1}, {0x1E9E, 0x1E9E, 1, -7615},
    {0x1EA0, 0x1EFE, 2, 1}, {0x1F08, 0x1F0F, 1, -8}, {0x1F18, 0x1F1D, 1, -8}, {0x1F28, 0x1F2F, 1, -8},
    {0x1F38, 0x1F3F, 1, -8}, {0x1F48, 0x1F4D, 1, -8}, {0x1F59, 0x1F5F, 2, -8}, {0x1F68, 0x1F6F, 1, -8},
    {0x1F88, 0x1F8F, 1, -8}, {0x1F98, 0x1F9F, 1, -8}, {0x1FA8, 0x1FAF, 1, -8}, {0x1FB8, 0x1FB9, 1, -8},
    {0x1FBA, 0x1FBB, 1, -74}, {0x1FBC, 0x1FBC, 1, -9}, {0x1FC8, 0x1FCB, 1, -86}, {0x1FCC, 0x1FCC, 1, -9},
    {0x1FD8, 0x1FD9, 1, -8}, {0x1FDA, 0x1FDB, 1, -100}, {0x1FE8, 0x1FE9, 1, -8}, {0x1FEA, 0x1FEB, 1, -112},
    {0x1FEC, 0x1FEC, 1, -7}, {0x1FF8, 0x1FF9, 1, -128}, {0x1FFA, 0x1FFB, 1, -126}, {0x1FFC, 0x1FFC, 1, -9},
    {0x2126, 0x2126, 1, -7517}, {0x212A, 0x212A, 1, -8383}, {0x212B, 0x212B, 1, -8262}, {0x2132, 0x2132, 1, 28},
    {0x2160, 0x216F, 1, 16}, {0x2183, 0x2183, 1, 1}, {0x24B6, 0x24CF, 1, 26}, {0x2C00, 0x2C2F, 1, 48},
    {0x2C60, 0x2C60, 1, 1}, {0x2C62, 0x2C62, 1, -10743}, {0x2C63, 0x2C63, 1, -3814}, {0x2C64, 0x2C64, 1, -10727},
    {0x2C67, 0x2C6B, 2, 1}, {0x2C6D, 0x2C6D, 1, -10780}, {0x2C6E, 0x2C6E, 1, -10749}, {0x2C6F, 0x2C6F, 1, -10783},
    {0x2C70, 0x2C70, 1, -10782}, {0x2C72, 0x2C72, 1, 1}, {0x2C75, 0x2C75, 1, 1}, {0x2C7E, 0x2C7F, 1, -10815},
    {0x2C80, 0x2CE2, 2, 1}, {0x2CEB, 0x2CED, 2, 1}, {0x2CF2, 0x2CF2, 1, 1}, {0xA640, 0xA66C, 2, 1},
    {0xA680, 0xA69A, 2, 1}, {0xA722, 0xA72E, 2, 1}, {0xA732, 0xA76E, 2, 1}, {0xA779, 0xA77B, 2, 1},
    {0xA77D, 0xA77D, 1, -35332}, {0xA77E, 0xA786, 2, 1}, {0xA78B, 0xA78B, 1, 1}, {0xA78D, 0xA78D, 1, -42280},
    {0xA790, 0xA792, 2, 1}, {0xA796, 0xA7A8, 2, 1}, {0xA7AA, 0xA7AA, 1, -42308}, {0xA7AB, 0xA7AB, 1, -42319},
    {0xA7AC, 0xA7AC, 1, -42315}, {0xA7AD, 0xA7AD, 1, -42305}, {0xA7AE, 0xA7AE, 1, -42308}, {0xA7B0, 0xA7B0, 1, -42258},
    {0xA7B1, 0xA7B1, 1, -42282}, {0xA7B2, 0xA7B2, 1, -42261}, {0xA7B3, 0xA7B3, 1, 928}, {0xA7B4, 0xA7C2, 2, 1},
    {0xA7C4, 0xA7C4, 1, -48}, {0xA7C5, 0xA7C5, 1, -42307}, {0xA7C6, 0xA7C6, 1, -35384}, {0xA7C7, 0xA7C9, 2, 1},
    {0xA7D0, 0xA7D0, 1, 1}, {0xA7D6, 0xA7D8, 2, 1}, {0xA7F5, 0xA7F5, 1, 1}, {0xFF21, 0xFF3A, 1, 32},
    {0x10400, 0x10427, 1, 40}, {0x104B0, 0x104D3, 1, 40}, {0x10570, 0x1057A, 1, 39}, {0x1057C, 0x1058A, 1, 39},
    {0x1058C, 0x10592, 1, 39}, {0x10594, 0x10595, 1, 39}, {0x10C80, 0x10CB2, 1, 64}, {0x118A0, 0x118BF, 1, 32},
    {0x16E40, 0x16E5F, 1, 32}, {0x1E900, 0x1E921, 1, 34},
};
// clang-format on

template <size_t N>
bool in_table(const Range (&table)[N], char32_t c) {
    return in_ranges(table, table + N, c);
}

// The `regex` module's \s (HF, open_clip); Python's re would add 0x1C..0x1F,
// which the clean-up drops anyway.
bool is_ascii_space(char32_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0D); }

bool is_space(char32_t c) { return c < 0x80 ? is_ascii_space(c) : in_table(kSpaceRanges, c); }

// ---- UTF-8 ----

// Python's bytes.decode("utf-8", errors="replace"): each maximal invalid
// subpart becomes one U+FFFD.
std::u32string decode_utf8(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const auto b = static_cast<uint8_t>(s[i]);
        if (b < 0x80) {
            out.push_back(b);
            ++i;
            continue;
        }
        int need = 0;
        char32_t cp = 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
            cp = b & 0x1Fu;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            cp = b & 0x0Fu;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            cp = b & 0x07u;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            out.push_back(kReplacement);
            ++i;
            continue;
        }
        size_t j = i + 1;
        int got = 0;
        while (got < need && j < s.size()) {
            const auto c = static_cast<uint8_t>(s[j]);
            const uint8_t l = got == 0 ? lo : uint8_t{0x80};
            const uint8_t h = got == 0 ? hi : uint8_t{0xBF};
            if (c < l || c > h) break;
            cp = (cp << 6) | (c & 0x3Fu);
            ++j;
            ++got;
        }
        out.push_back(got == need ? cp : kReplacement);
        i = j;
    }
    return out;
}

void append_utf8(char32_t c, std::string& out) {
    if (c < 0x80) {
        out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (c >> 6)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (c >> 12)));
        out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (c >> 18)));
        out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
}

std::string encode_utf8(const std::u32string& s, size_t begin = 0, size_t end = std::u32string::npos) {
    std::string out;
    end = std::min(end, s.size());
    for (size_t i = begin; i < end; ++i) append_utf8(s[i], out);
    return out;
}

// ---- bytes_to_unicode ----

// GPT-2/CLIP's reversible byte <-> character map: printable Latin-1 bytes
// map to themselves, the others to U+0100 upwards, so BPE never sees
// whitespace or control characters. Order matters: it is the order of the
// first 256 vocabulary entries.
struct ByteMap {
    std::array<char32_t, 256> byte_to_char{};
    std::array<int16_t, 512> char_to_byte{};  // -1 where no byte maps
    std::array<std::string, 256> byte_to_utf8;
    std::array<uint8_t, 256> order{};  // bytes in vocabulary order
};

const ByteMap& byte_map() {
    static const ByteMap map = [] {
        ByteMap m;
        m.char_to_byte.fill(-1);
        std::array<bool, 256> printable{};
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            printable[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            if (printable[b]) m.order[n++] = static_cast<uint8_t>(b);
        }
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const char32_t c = printable[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
            m.byte_to_char[b] = c;
            m.char_to_byte[c] = static_cast<int16_t>(b);
            append_utf8(c, m.byte_to_utf8[b]);
            if (!printable[b]) m.order[n++] = static_cast<uint8_t>(b);
        }
        return m;
    }();
    return map;
}

// ---- text clean-up (ftfy + html.unescape subset) ----

struct Entity {
    const char* name;
    char32_t value;
    bool legacy;  // HTML5 also accepts it without ';' (Python's html.unescape does)
};

constexpr Entity kEntities[] = {
    {"amp", '&', true},        {"lt", '<', true},        {"gt", '>', true},         {"quot", '"', true},
    {"apos", '\'', false},     {"nbsp", 0xA0, true},     {"copy", 0xA9, true},      {"reg", 0xAE, true},
    {"deg", 0xB0, true},       {"times", 0xD7, true},    {"divide", 0xF7, true},    {"middot", 0xB7, true},
    {"laquo", 0xAB, true},     {"raquo", 0xBB, true},    {"cent", 0xA2, true},      {"pound", 0xA3, true},
    {"yen", 0xA5, true},       {"sect", 0xA7, true},     {"para", 0xB6, true},      {"shy", 0xAD, true},
    {"hellip", 0x2026, false}, {"mdash", 0x2014, false}, {"ndash", 0x2013, false},  {"lsquo", 0x2018, false},
    {"rsquo", 0x2019, false},  {"ldquo", 0x201C, false}, {"rdquo", 0x201D, false},  {"bull", 0x2022, false},
    {"euro", 0x20AC, false},   {"trade", 0x2122, false}, {"hearts", 0x2665, false}, {"larr", 0x2190, false},
    {"rarr", 0x2192, false},
};

// Python's html: numeric references 0x80..0x9F are read as windows-1252.
constexpr char32_t kCp1252[32] = {0x20AC, 0x81,   0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                  0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x8D,   0x017D, 0x8F,
                                  0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                  0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D,   0x017E, 0x0178};

bool is_hex(char32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

int hex_value(char32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    return static_cast<int>(c - 'A' + 10);
}

const Entity* find_entity(const std::u32string& s, size_t begin, size_t len) {
    for (const Entity& e : kEntities) {
        const size_t n = std::char_traits<char>::length(e.name);
        if (n != len) continue;
        bool same = true;
        for (size_t k = 0; k < n && same; ++k) same = s[begin + k] == static_cast<char32_t>(e.name[k]);
        if (same) return &e;
    }
    return nullptr;
}

// One pass of Python's html.unescape for the entities above and every
// numeric reference.
std::u32string html_unescape(const std::u32string& s) {
    std::u32string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        if (s[i] != '&') {
            out.push_back(s[i++]);
            continue;
        }
        size_t j = i + 1;
        if (j < s.size() && s[j] == '#') {
            ++j;
            const bool hex = j < s.size() && (s[j] == 'x' || s[j] == 'X');
            if (hex) ++j;
            const size_t digits_begin = j;
            uint64_t value = 0;
            while (j < s.size() && (hex ? is_hex(s[j]) : (s[j] >= '0' && s[j] <= '9'))) {
                value =
                    std::min<uint64_t>(value * (hex ? 16 : 10) + static_cast<uint64_t>(hex_value(s[j])), 0x7FFFFFFF);
                ++j;
            }
            if (j == digits_begin) {  // "&#" or "&#x" without digits stays as it is
                out.push_back(s[i++]);
                continue;
            }
            if (j < s.size() && s[j] == ';') ++j;
            char32_t c;
            if (value == 0 || (value >= 0xD800 && value <= 0xDFFF) || value > 0x10FFFF) {
                c = kReplacement;
            } else if (value >= 0x80 && value <= 0x9F) {
                c = kCp1252[value - 0x80];
            } else {
                c = static_cast<char32_t>(value);
            }
            out.push_back(c);
            i = j;
            continue;
        }
        // Named: up to 32 characters other than \t \n \f space < & # ;
        while (j < s.size() && j - (i + 1) < 32 && s[j] != '\t' && s[j] != '\n' && s[j] != '\f' && s[j] != ' ' &&
               s[j] != '<' && s[j] != '&' && s[j] != '#' && s[j] != ';') {
            ++j;
        }
        const size_t name_len = j - (i + 1);
        const bool semicolon = j < s.size() && s[j] == ';';
        const Entity* e = semicolon ? find_entity(s, i + 1, name_len) : nullptr;
        if (e) {
            out.push_back(e->value);
            i = j + 1;
            continue;
        }
        // Longest legacy entity that prefixes the name ("&ampx" -> "&x").
        bool replaced = false;
        for (size_t len = name_len; len >= 2 && !replaced; --len) {
            const Entity* p = find_entity(s, i + 1, len);
            if (p && p->legacy) {
                out.push_back(p->value);
                i = i + 1 + len;
                replaced = true;
            }
        }
        if (!replaced) out.push_back(s[i++]);
    }
    return out;
}

// ftfy's remove_control_chars set.
bool is_removed_control(char32_t c) {
    return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
           c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

// ftfy's fix_latin_ligatures, fix_character_width and uncurl_quotes, and its
// control-character removal.
void ftfy_subset(const std::u32string& s, std::u32string& out) {
    out.clear();
    out.reserve(s.size());
    for (char32_t c : s) {
        if (is_removed_control(c)) continue;
        if (c >= 0xFF01 && c <= 0xFF5E) {
            out.push_back(c - 0xFEE0);
        } else if (c == 0x3000) {
            out.push_back(' ');
        } else if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B)) {
            out.push_back('\'');
        } else if (c >= 0x201C && c <= 0x201F) {
            out.push_back('"');
        } else if (c >= 0xFB00 && c <= 0xFB06) {
            static const char32_t* const kLigatures[] = {U"ff", U"fi", U"fl", U"ffi", U"ffl", U"\u017Ft", U"st"};
            out += kLigatures[c - 0xFB00];
        } else if (c == 0x132 || c == 0x133) {
            out += c == 0x132 ? U"IJ" : U"ij";
        } else if (c == 0x149) {  // ŉ -> ʼn, whose ʼ uncurl_quotes then straightens
            out += U"'n";
        } else if (c >= 0x1C4 && c <= 0x1CC) {
            static const char32_t* const kDigraphs[] = {U"D\u017D", U"D\u017E", U"d\u017E", U"LJ", U"Lj",
                                                        U"lj",      U"NJ",      U"Nj",      U"nj"};
            out += kDigraphs[c - 0x1C4];
        } else if (c >= 0x1F1 && c <= 0x1F3) {
            static const char32_t* const kDz[] = {U"DZ", U"Dz", U"dz"};
            out += kDz[c - 0x1F1];
        } else {
            out.push_back(c);
        }
    }
}

// whitespace_clean: runs of whitespace -> one space, ends trimmed.
std::u32string whitespace_clean(const std::u32string& s) {
    std::u32string out;
    out.reserve(s.size());
    bool pending_space = false;
    for (char32_t c : s) {
        if (is_space(c)) {
            pending_space = !out.empty();
            continue;
        }
        if (pending_space) out.push_back(' ');
        pending_space = false;
        out.push_back(c);
    }
    return out;
}

std::u32string clean_text(std::string_view text) {
    std::u32string s = html_unescape(html_unescape(decode_utf8(text)));
    std::u32string fixed;
    ftfy_subset(s, fixed);
    return whitespace_clean(fixed);
}

char32_t lower_code_point(char32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    const LowerRange* end = kLowerRanges + std::size(kLowerRanges);
    const LowerRange* it =
        std::upper_bound(kLowerRanges, end, c, [](char32_t v, const LowerRange& r) { return v < r.lo; });
    if (it == kLowerRanges) return c;
    --it;
    if (c > it->hi || (c - it->lo) % static_cast<char32_t>(it->stride) != 0) return c;
    return static_cast<char32_t>(static_cast<int64_t>(c) + it->delta);
}

// Cased letters and case-ignorable characters, near enough for Python's
// final-sigma rule: Latin, Greek, Cyrillic, Armenian, Georgian and their
// extensions; apostrophes, dots, colons, combining marks, zero-width
// characters and modifier letters.
bool is_cased_near(char32_t c) {
    return char_class(c) == CharClass::Letter &&
           (c < 0x590 || (c >= 0x10A0 && c <= 0x10FF) || (c >= 0x1C80 && c <= 0x1CBF) || (c >= 0x1D00 && c <= 0x1FFF) ||
            (c >= 0x2C00 && c <= 0x2D2F) || (c >= 0xA640 && c <= 0xA7FF) || (c >= 0xFF21 && c <= 0xFF5A));
}

bool is_case_ignorable_near(char32_t c) {
    return c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xAD || c == 0xB7 || c == 0x387 ||
           c == 0x2018 || c == 0x2019 || c == 0x2024 || (c >= 0x2B0 && c <= 0x36F) || (c >= 0x1AB0 && c <= 0x1AFF) ||
           (c >= 0x1DC0 && c <= 0x1DFF) || (c >= 0x200B && c <= 0x200F) || (c >= 0x20D0 && c <= 0x20FF) ||
           (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0xFE20 && c <= 0xFE2F);
}

// Python's Final_Sigma: a cased letter before (skipping case-ignorables) and
// none after.
bool is_final_sigma(const std::u32string& s, size_t i, size_t begin, size_t end) {
    size_t k = i;
    while (k > begin && is_case_ignorable_near(s[k - 1])) --k;
    if (k == begin || !is_cased_near(s[k - 1])) return false;
    k = i + 1;
    while (k < end && is_case_ignorable_near(s[k])) ++k;
    return k == end || !is_cased_near(s[k]);
}

// Python's str.lower(): the table above, U+0130 -> "i\u0307", and capital
// sigma -> final sigma at the end of a word.
std::u32string lower(const std::u32string& s, size_t begin, size_t end) {
    std::u32string out;
    out.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) {
        const char32_t c = s[i];
        if (c == 0x130) {
            out.push_back('i');
            out.push_back(0x307);
        } else if (c == 0x3A3 && is_final_sigma(s, i, begin, end)) {
            out.push_back(0x3C2);
        } else {
            out.push_back(lower_code_point(c));
        }
    }
    return out;
}

// Characters that continue an embedding name, so "style" does not match in
// "style_v2" or "my-style".
bool is_name_char(char32_t c) {
    const CharClass k = char_class(c);
    return k == CharClass::Letter || k == CharClass::Number || c == '_' || c == '-';
}

bool starts_with(const std::u32string& s, size_t pos, const std::u32string& prefix) {
    return !prefix.empty() && s.size() - pos >= prefix.size() && s.compare(pos, prefix.size(), prefix) == 0;
}

// ---- files ----

Result<std::string> read_text_file(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return Error{path + ": no such file"};
    if (!fs::is_regular_file(path, ec)) return Error{path + ": not a regular file"};
    std::ifstream f(path, std::ios::binary);
    if (!f) return Error{path + ": cannot open file"};
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (f.bad()) return Error{path + ": read error"};
    return text;
}

Result<json> parse_json_file(const std::string& path) {
    auto text = read_text_file(path);
    if (!text.ok()) return text.error();
    try {
        return json::parse(text.value());
    } catch (const json::exception& e) {
        return Error{path + ": malformed JSON: " + e.what()};
    }
}

// {token: id} from a JSON object.
Result<std::unordered_map<std::string, int32_t>> vocab_from_json(const json& object, const std::string& where) {
    if (!object.is_object()) return Error{where + " is not a JSON object of token -> id"};
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(object.size());
    for (auto it = object.begin(); it != object.end(); ++it) {
        const json& id = it.value();
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxVocabId) {
            return Error{where + ": token '" + escaped(it.key()) + "' has id " + json_text(id) +
                         ", not an integer in [0, " + std::to_string(kMaxVocabId) + "]"};
        }
        vocab[it.key()] = static_cast<int32_t>(id.get<int64_t>());
    }
    return vocab;
}

}  // namespace

std::u32string utf8_to_u32(std::string_view text) { return decode_utf8(text); }

std::string u32_to_utf8(std::u32string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char32_t c : text) append_utf8(c, out);
    return out;
}

CharClass char_class(char32_t c) {
    if (c < 0x80) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::Letter;
        if (c >= '0' && c <= '9') return CharClass::Number;
        if (is_ascii_space(c)) return CharClass::Space;
        return CharClass::Other;
    }
    if (in_table(kSpaceRanges, c)) return CharClass::Space;
    if (in_table(kNumberRanges, c)) return CharClass::Number;
    if (in_table(kLetterRanges, c)) return CharClass::Letter;
    return CharClass::Other;
}

struct ClipTokenizer::Cache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> pieces;
};

ClipTokenizer::ClipTokenizer() : cache_(std::make_unique<Cache>()) {}
ClipTokenizer::ClipTokenizer(ClipTokenizer&&) noexcept = default;
ClipTokenizer& ClipTokenizer::operator=(ClipTokenizer&&) noexcept = default;
ClipTokenizer::~ClipTokenizer() = default;

Result<ClipTokenizer> ClipTokenizer::build(std::unordered_map<std::string, int32_t> vocab,
                                           const std::vector<std::pair<std::string, std::string>>& merges,
                                           const std::string& label) {
    ClipTokenizer t;
    int32_t max_id = -1;
    for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
    t.id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
    std::vector<bool> used(t.id_to_token_.size(), false);
    for (const auto& [token, id] : vocab) {
        if (used[id]) {
            // Report the pair in a stable order whatever the map's order.
            const std::string& other = t.id_to_token_[id];
            const std::string& a = std::min(token, other);
            const std::string& b = std::max(token, other);
            return Error{label + ": id " + std::to_string(id) + " is used by both '" + escaped(a) + "' and '" +
                         escaped(b) + "'"};
        }
        used[id] = true;
        t.id_to_token_[id] = token;
    }
    t.token_to_id_ = std::move(vocab);

    auto find_special = [&](const char* name, const char* alt) {
        int32_t id = t.token_id(name);
        return id >= 0 ? id : t.token_id(alt);
    };
    t.bos_id_ = find_special("<|startoftext|>", "<start_of_text>");
    t.eos_id_ = find_special("<|endoftext|>", "<end_of_text>");
    if (t.bos_id_ < 0) return Error{label + ": the vocabulary has no <|startoftext|> token"};
    if (t.eos_id_ < 0) return Error{label + ": the vocabulary has no <|endoftext|> token"};
    t.comma_id_ = t.token_id(",</w>");

    t.merge_ranks_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto& [a, b] = merges[rank];
        for (const std::string& symbol : {a, b, a + b}) {
            if (t.token_id(symbol) < 0) {
                return Error{label + ": merge " + std::to_string(rank) + " '" + escaped(a) + " " + escaped(b) +
                             "' uses '" + escaped(symbol) + "', which is not in the vocabulary"};
            }
        }
        // A repeated merge takes the later rank, as HF's dict(zip(...)) does.
        t.merge_ranks_[a + " " + b] = static_cast<int32_t>(rank);
    }
    t.next_embedding_id_ = t.vocab_size();
    return t;
}

Result<ClipTokenizer> ClipTokenizer::from_tokenizer_json(const std::string& path) {
    auto root = parse_json_file(path);
    if (!root.ok()) return root.error();
    const json& doc = root.value();
    if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object()) {
        return Error{path + ": not a tokenizer.json (no \"model\" object)"};
    }
    const json& model = doc["model"];
    if (model.contains("type") && model["type"] != "BPE") {
        return Error{path + ": model.type is " + json_text(model["type"]) + ", expected \"BPE\""};
    }
    if (!model.contains("vocab")) return Error{path + ": no model.vocab"};
    auto vocab = vocab_from_json(model["vocab"], path + ": model.vocab");
    if (!vocab.ok()) return vocab.error();

    if (doc.contains("added_tokens")) {
        const json& added = doc["added_tokens"];
        if (!added.is_array()) return Error{path + ": added_tokens is not an array"};
        for (const json& entry : added) {
            if (!entry.is_object() || !entry.contains("id") || !entry.contains("content") ||
                !entry["id"].is_number_integer() || !entry["content"].is_string() || entry["id"].get<int64_t>() < 0 ||
                entry["id"].get<int64_t>() > kMaxVocabId) {
                return Error{path + ": added_tokens entry " + json_text(entry) +
                             " needs an integer id and a string content"};
            }
            // The vocabulary already holds CLIP's special tokens; only new ones are added.
            vocab->emplace(entry["content"].get<std::string>(), static_cast<int32_t>(entry["id"].get<int64_t>()));
        }
    }

    if (!model.contains("merges") || !model["merges"].is_array()) return Error{path + ": no model.merges array"};
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(model["merges"].size());
    for (const json& m : model["merges"]) {
        std::pair<std::string, std::string> merge;
        if (m.is_string()) {
            if (!split_merge(m.get_ref<const std::string&>(), merge)) {
                return Error{path + ": merge " + std::to_string(merges.size()) + " " + json_text(m) +
                             " is not two space-separated symbols"};
            }
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            merge = {m[0].get<std::string>(), m[1].get<std::string>()};
        } else {
            return Error{path + ": merge " + std::to_string(merges.size()) + " " + json_text(m) +
                         " is neither \"a b\" nor [\"a\", \"b\"]"};
        }
        merges.push_back(std::move(merge));
    }
    return build(std::move(vocab.value()), merges, path);
}

Result<ClipTokenizer> ClipTokenizer::from_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
    auto root = parse_json_file(vocab_path);
    if (!root.ok()) return root.error();
    auto vocab = vocab_from_json(root.value(), vocab_path);
    if (!vocab.ok()) return vocab.error();
    auto text = read_text_file(merges_path);
    if (!text.ok()) return text.error();
    auto merges = parse_merges_text(text.value(), merges_path);
    if (!merges.ok()) return merges.error();
    return build(std::move(vocab.value()), merges.value(), vocab_path + " + " + merges_path);
}

Result<ClipTokenizer> ClipTokenizer::from_tokens_and_merges(std::vector<std::string> tokens,
                                                            const std::vector<std::string>& merges,
                                                            const std::string& label) {
    if (tokens.size() > static_cast<size_t>(kMaxVocabId) + 1) {
        return Error{label + ": " + std::to_string(tokens.size()) + " tokens is more than supported"};
    }
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(tokens.size());
    for (size_t id = 0; id < tokens.size(); ++id) {
        if (tokens[id].empty()) continue;  // a hole in the id space
        auto [it, inserted] = vocab.emplace(std::move(tokens[id]), static_cast<int32_t>(id));
        if (!inserted) {
            return Error{label + ": token '" + escaped(it->first) + "' appears at ids " + std::to_string(it->second) +
                         " and " + std::to_string(id)};
        }
    }
    std::vector<std::pair<std::string, std::string>> pairs;
    pairs.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        std::pair<std::string, std::string> merge;
        if (!split_merge(merges[i], merge)) {
            return Error{label + ": merge " + std::to_string(i) + " '" + escaped(merges[i].substr(0, 80)) +
                         "' is not two space-separated symbols"};
        }
        pairs.push_back(std::move(merge));
    }
    return build(std::move(vocab), pairs, label);
}

Result<ClipTokenizer> ClipTokenizer::from_clip_merges(std::string_view merges_text, const std::string& label) {
    auto parsed = parse_merges_text(merges_text, label);
    if (!parsed.ok()) return parsed.error();
    auto& merges = parsed.value();
    if (merges.size() > kClipMergeCount) merges.resize(kClipMergeCount);

    const ByteMap& bm = byte_map();
    std::vector<std::string> tokens;
    tokens.reserve(512 + merges.size() + 2);
    for (uint8_t b : bm.order) tokens.push_back(bm.byte_to_utf8[b]);
    for (uint8_t b : bm.order) tokens.push_back(bm.byte_to_utf8[b] + "</w>");
    for (const auto& [a, b] : merges) tokens.push_back(a + b);
    tokens.emplace_back("<|startoftext|>");
    tokens.emplace_back("<|endoftext|>");
    // open_clip's encoder is dict(zip(vocab, ids)): a repeated token keeps
    // its last id.
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(tokens.size());
    for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = static_cast<int32_t>(id);
    return build(std::move(vocab), merges, label);
}

Result<ClipTokenizer> ClipTokenizer::load(const std::string& path) {
    std::error_code ec;
    const fs::path p(path);
    if (fs::is_directory(p, ec)) {
        for (const fs::path& dir : {p, p / "tokenizer"}) {
            if (fs::is_regular_file(dir / "vocab.json", ec) && fs::is_regular_file(dir / "merges.txt", ec)) {
                return from_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
            }
            if (fs::is_regular_file(dir / "tokenizer.json", ec))
                return from_tokenizer_json((dir / "tokenizer.json").string());
        }
        return Error{path + ": no tokenizer.json or vocab.json + merges.txt here or in tokenizer/"};
    }
    if (!fs::exists(p, ec)) return Error{path + ": no such file or folder"};
    const std::string name = p.filename().string();
    const std::string ext = p.extension().string();
    if (name == "vocab.json") return from_vocab_merges(path, (p.parent_path() / "merges.txt").string());
    if (ext == ".json") return from_tokenizer_json(path);
    if (ext == ".txt") {
        auto text = read_text_file(path);
        if (!text.ok()) return text.error();
        return from_clip_merges(text.value(), path);
    }
    return Error{path + ": not a tokenizer file (expected tokenizer.json, vocab.json, a merges .txt or a folder)"};
}

int32_t ClipTokenizer::token_id(const std::string& token) const {
    auto it = token_to_id_.find(token);
    return it == token_to_id_.end() ? -1 : it->second;
}

const std::string& ClipTokenizer::token_text(int32_t id) const {
    static const std::string kEmpty;
    if (id < 0 || id >= vocab_size()) return kEmpty;
    return id_to_token_[static_cast<size_t>(id)];
}

void ClipTokenizer::bpe(const std::string& piece, std::vector<int32_t>& out) const {
    {
        std::lock_guard<std::mutex> lock(cache_->mutex);
        auto it = cache_->pieces.find(piece);
        if (it != cache_->pieces.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const ByteMap& bm = byte_map();
    std::vector<std::string> word;
    word.reserve(piece.size());
    for (char ch : piece) word.push_back(bm.byte_to_utf8[static_cast<uint8_t>(ch)]);
    if (word.empty()) return;
    word.back() += "</w>";

    // HF's loop: merge every occurrence of the lowest-ranked adjacent pair
    // until no adjacent pair has a rank.
    std::vector<std::string> next;
    std::string key;
    while (word.size() > 1) {
        int32_t best_rank = std::numeric_limits<int32_t>::max();
        size_t best = 0;
        for (size_t i = 0; i + 1 < word.size(); ++i) {
            key.assign(word[i]).append(" ").append(word[i + 1]);
            auto it = merge_ranks_.find(key);
            if (it != merge_ranks_.end() && it->second < best_rank) {
                best_rank = it->second;
                best = i;
            }
        }
        if (best_rank == std::numeric_limits<int32_t>::max()) break;
        const std::string first = word[best];
        const std::string second = word[best + 1];
        next.clear();
        for (size_t i = 0; i < word.size();) {
            if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
                next.push_back(first + second);
                i += 2;
            } else {
                next.push_back(std::move(word[i]));
                i += 1;
            }
        }
        word.swap(next);
    }

    std::vector<int32_t> ids;
    ids.reserve(word.size());
    for (const std::string& symbol : word) {
        const int32_t id = token_id(symbol);
        ids.push_back(id >= 0 ? id : eos_id_);  // HF: unknown -> unk_token = <|endoftext|>
    }
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->pieces.size() >= kMaxCacheEntries) cache_->pieces.clear();
    cache_->pieces.emplace(piece, std::move(ids));
}

void ClipTokenizer::encode_segment(const std::u32string& text, std::vector<int32_t>& out) const {
    static const std::u32string kContractions[] = {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
    const std::u32string bos_text = decode_utf8(token_text(bos_id_));
    const std::u32string eos_text = decode_utf8(token_text(eos_id_));
    size_t i = 0;
    while (i < text.size()) {
        // The regex's alternatives in order, at each position.
        if (starts_with(text, i, bos_text)) {
            out.push_back(bos_id_);
            i += bos_text.size();
            continue;
        }
        if (starts_with(text, i, eos_text)) {
            out.push_back(eos_id_);
            i += eos_text.size();
            continue;
        }
        size_t end = i;
        for (const std::u32string& c : kContractions) {
            if (starts_with(text, i, c)) {
                end = i + c.size();
                break;
            }
        }
        if (end == i) {
            const CharClass k = char_class(text[i]);
            if (k == CharClass::Space) {
                ++i;
                continue;
            }
            end = i + 1;
            if (k == CharClass::Letter || k == CharClass::Other) {
                while (end < text.size() && char_class(text[end]) == k) ++end;
            }
        }
        bpe(encode_utf8(text, i, end), out);
        i = end;
    }
}

std::vector<int32_t> ClipTokenizer::encode(std::string_view text) const {
    const std::u32string cleaned = clean_text(text);
    std::vector<int32_t> out;
    // Cut out embedding words first: their names are case-sensitive.
    size_t segment_begin = 0;
    size_t i = 0;
    while (i < cleaned.size()) {
        const bool at_boundary = i == 0 || !is_name_char(cleaned[i - 1]);
        const EmbeddingToken* hit = nullptr;
        size_t hit_len = 0;
        if (at_boundary) {
            for (size_t e = 0; e < embeddings_.size(); ++e) {
                const std::u32string& name = embedding_names_u32_[e];
                if (name.size() <= hit_len || !starts_with(cleaned, i, name)) continue;
                const size_t after = i + name.size();
                if (after < cleaned.size() && is_name_char(cleaned[after])) continue;
                hit = &embeddings_[e];
                hit_len = name.size();
            }
        }
        if (!hit) {
            ++i;
            continue;
        }
        encode_segment(lower(cleaned, segment_begin, i), out);
        for (int32_t k = 0; k < hit->n_vectors; ++k) out.push_back(hit->first_id + k);
        i += hit_len;
        segment_begin = i;
    }
    encode_segment(lower(cleaned, segment_begin, cleaned.size()), out);
    return out;
}

std::string ClipTokenizer::decode(const std::vector<int32_t>& ids) const {
    const ByteMap& bm = byte_map();
    std::string bytes;
    for (int32_t id : ids) {
        if (const EmbeddingToken* e = embedding_for_id(id)) {
            if (id == e->first_id) bytes += e->name + " ";
            continue;
        }
        for (char32_t c : decode_utf8(token_text(id))) {
            if (c < bm.char_to_byte.size() && bm.char_to_byte[c] >= 0) {
                bytes.push_back(static_cast<char>(bm.char_to_byte[c]));
            } else {
                append_utf8(c, bytes);  // not a byte character (a hand-made vocabulary)
            }
        }
    }
    std::string text;
    const std::string kWordEnd = "</w>";
    const std::string valid = encode_utf8(decode_utf8(bytes));
    for (size_t i = 0; i < valid.size();) {
        if (valid.compare(i, kWordEnd.size(), kWordEnd) == 0) {
            text.push_back(' ');
            i += kWordEnd.size();
        } else {
            text.push_back(valid[i++]);
        }
    }
    const size_t first = text.find_first_not_of(" \t\n\r\f\v");
    if (first == std::string::npos) return std::string();
    const size_t last = text.find_last_not_of(" \t\n\r\f\v");
    return text.substr(first, last - first + 1);
}

Result<int32_t> ClipTokenizer::add_embedding_token(const std::string& name, int n_vectors) {
    if (name.empty()) return Error{"embedding name is empty"};
    const std::u32string name32 = decode_utf8(name);
    if (is_space(name32.front()) || is_space(name32.back())) {
        return Error{"embedding name '" + name + "' starts or ends with whitespace"};
    }
    if (n_vectors < 1) {
        return Error{"embedding '" + name + "' has " + std::to_string(n_vectors) + " vectors, needs at least 1"};
    }
    for (const EmbeddingToken& e : embeddings_) {
        if (e.name == name) return Error{"embedding '" + name + "' is already registered"};
    }
    if (static_cast<int64_t>(next_embedding_id_) + n_vectors > std::numeric_limits<int32_t>::max()) {
        return Error{"embedding '" + name + "': token ids exhausted"};
    }
    const int32_t first = next_embedding_id_;
    embeddings_.push_back({name, first, n_vectors});
    embedding_names_u32_.push_back(name32);
    next_embedding_id_ += n_vectors;
    return first;
}

const EmbeddingToken* ClipTokenizer::embedding_for_id(int32_t id) const {
    if (id < vocab_size()) return nullptr;
    for (const EmbeddingToken& e : embeddings_) {
        if (id >= e.first_id && id < e.first_id + e.n_vectors) return &e;
    }
    return nullptr;
}

}  // namespace kiln::text
