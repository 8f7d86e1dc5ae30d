#include "image/image_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

// jpeglib.h needs FILE and size_t declared first (<cstdio> above).
#include <jpeglib.h>
// After jpeglib.h: which warning codes exist depends on JPEG_LIB_VERSION.
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include "image/png_metadata.h"
#include "util/files.h"
#include "util/format.h"
#include "util/log.h"

// libpng and libjpeg report errors by calling a handler that must not
// return; kiln's handlers longjmp back. C++ forbids a longjmp that would skip
// a non-trivial destructor, so every codec call that can fail runs inside a
// small helper (`*_step` below) whose own frame holds the setjmp and no C++
// objects. The owning objects (pixel buffers, codec structs' guards) live in
// the caller, allocated before the helper runs and released normally after
// it returns, whichever way it returns.

namespace kiln::image {

namespace {

std::string dims(uint64_t w, uint64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

Error too_large(const std::string& label, uint64_t w, uint64_t h) {
    return Error{label + ": image is " + dims(w, h) + " pixels, larger than the " + dims(kMaxDimension, kMaxDimension) +
                 " limit"};
}

// The header's size against the limits, before any pixel is decoded.
Status check_size(const std::string& label, uint64_t w, uint64_t h, const DecodeLimits& limits) {
    if (w > static_cast<uint64_t>(kMaxDimension) || h > static_cast<uint64_t>(kMaxDimension)) {
        return too_large(label, w, h);
    }
    if (w * h > limits.max_pixels) {
        return Error{label + ": image is " + dims(w, h) + " = " + std::to_string(w * h) +
                     " pixels, more than the limit of " + std::to_string(limits.max_pixels) +
                     " (--max-image-pixels); checked from the header, nothing was decoded"};
    }
    if (decoded_image_bytes(w, h) > limits.max_bytes) {
        return Error::out_of_memory(label + ": out of memory: decoding this " + dims(w, h) + " image takes " +
                                    human_bytes(decoded_image_bytes(w, h)) + " of RAM, but " + limits.memory_owner +
                                    " leaves " + human_bytes(limits.max_bytes) +
                                    "; checked from the header, nothing was decoded");
    }
    return Status::Ok();
}

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t n) {
    return size >= n && std::memcmp(data, magic, n) == 0;
}

// Why bytes that are no PNG, JPEG or WebP cannot be read, naming the format
// when the signature is a known one.
std::string describe_unknown(const uint8_t* data, size_t size) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (size < 8 && std::memcmp(data, png_sig, size) == 0) return "truncated PNG (the file ends inside the signature)";
    if (size < 3 && std::memcmp(data, "\xff\xd8\xff", size) == 0) {
        return "truncated JPEG (the file ends inside the signature)";
    }
    if (size < 12 && starts_with(data, size, "RIFF", 4)) {
        return "truncated RIFF file (too short to hold the WebP signature)";
    }
    struct Known {
        const char* magic;
        size_t n;
        const char* name;
    };
    static const Known known[] = {{"GIF87a", 6, "GIF"},     {"GIF89a", 6, "GIF"}, {"BM", 2, "BMP"},
                                  {"II*\0", 4, "TIFF"},     {"MM\0*", 4, "TIFF"}, {"\0\0\0\x0cjP  ", 8, "JPEG 2000"},
                                  {"8BPS", 4, "Photoshop"}, {"qoif", 4, "QOI"},   {"\x76\x2f\x31\x01", 4, "OpenEXR"}};
    for (const Known& k : known) {
        if (starts_with(data, size, k.magic, k.n)) {
            return std::string("unsupported image format ") + k.name + " (kiln reads PNG, JPEG and WebP)";
        }
    }
    if (size >= 12 && std::memcmp(data + 4, "ftyp", 4) == 0) {
        return "unsupported image format HEIF/AVIF (kiln reads PNG, JPEG and WebP)";
    }
    return "not a PNG, JPEG or WebP image (unrecognised signature)";
}

// ---- PNG ------------------------------------------------------------------

// Shared by libpng's error callback and kiln's read callback; a plain array
// so that filling it cannot throw inside a C callback.
struct CodecError {
    char message[256] = {};
    bool truncated = false;
    bool unsupported = false;  // valid but beyond what the codec build handles (e.g. 12-bit JPEG)
};

struct PngSource {
    const uint8_t* data;
    size_t size;
    size_t pos;
};

void png_error_cb(png_structp png, png_const_charp message) {
    auto* err = static_cast<CodecError*>(png_get_error_ptr(png));
    std::snprintf(err->message, sizeof(err->message), "%s", message);
    png_longjmp(png, 1);
}

void png_warning_cb(png_structp, png_const_charp message) {
    // E.g. a CRC error in a skipped ancillary chunk: harmless to the pixels.
    KILN_LOG_DEBUG("libpng: %s", message);
}

void png_read_cb(png_structp png, png_bytep out, size_t n) {
    auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
    if (n > src->size - src->pos) {
        static_cast<CodecError*>(png_get_error_ptr(png))->truncated = true;
        png_error(png, "the file ends early");
    }
    std::memcpy(out, src->data + src->pos, n);
    src->pos += n;
}

struct PngReadGuard {
    png_structp png = nullptr;
    png_infop info = nullptr;
    ~PngReadGuard() {
        if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    }
};

struct PngLayout {
    png_uint_32 width = 0, height = 0;
    int channels = 0;
    size_t row_bytes = 0;
};

bool png_header_step(png_structp png, png_infop info, PngLayout* layout) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_read_info(png, info);
    layout->width = png_get_image_width(png, info);
    layout->height = png_get_image_height(png, info);
    return true;
}

// Asks libpng for 8-bit RGB or RGBA whatever the file holds.
bool png_transform_step(png_structp png, png_infop info, PngLayout* layout) {
    if (setjmp(png_jmpbuf(png))) return false;
    const int color_type = png_get_color_type(png, info);
    const int bit_depth = png_get_bit_depth(png, info);
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (bit_depth == 16) png_set_scale_16(png);  // rounds, where strip_16 would truncate
    if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    layout->channels = png_get_channels(png, info);
    layout->row_bytes = png_get_rowbytes(png, info);
    return true;
}

bool png_pixels_step(png_structp png, png_bytepp rows) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_read_image(png, rows);
    // Reads through IEND, so a file cut after its image data is still
    // reported, and the trailing chunks' CRCs are checked.
    png_read_end(png, nullptr);
    return true;
}

Error png_failure(const std::string& label, const CodecError& err) {
    if (err.truncated) return Error{label + ": truncated PNG (the file ends before the image does)"};
    return Error{label + ": corrupt PNG: " + err.message};
}

Result<Image> decode_png(const uint8_t* data, size_t size, const std::string& label, const DecodeLimits& limits) {
    CodecError err;
    PngSource src{data, size, 0};
    PngReadGuard guard;
    guard.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, png_error_cb, png_warning_cb);
    if (!guard.png) return Error{label + ": out of memory starting the PNG decoder"};
    guard.info = png_create_info_struct(guard.png);
    if (!guard.info) return Error{label + ": out of memory starting the PNG decoder"};
    png_set_read_fn(guard.png, &src, png_read_cb);
    // Skip every ancillary chunk but tRNS unread (text is read by
    // png_metadata, colour profiles are not applied). Besides saving work,
    // this matters for damaged files: libpng allocates and zero-fills a text
    // chunk's declared length before reading it, so a corrupt length field
    // would cost up to 2 GiB.
    png_set_keep_unknown_chunks(guard.png, PNG_HANDLE_CHUNK_NEVER, nullptr, -1);

    PngLayout layout;
    if (!png_header_step(guard.png, guard.info, &layout)) return png_failure(label, err);
    KILN_TRY(check_size(label, layout.width, layout.height, limits));
    // Deflate packs at most about 1032 bytes into one, so a file too small to
    // hold its image is cut short; saying so now saves allocating up to 1 GiB
    // of pixels for a few bytes of header.
    const uint64_t file_row_bits =
        uint64_t(layout.width) * png_get_channels(guard.png, guard.info) * png_get_bit_depth(guard.png, guard.info);
    const uint64_t raw_bytes = uint64_t(layout.height) * ((file_row_bits + 7) / 8 + 1);
    if (raw_bytes / 1032 > size) {
        return Error{label + ": truncated PNG (" + std::to_string(size) + " bytes cannot hold a " +
                     dims(layout.width, layout.height) + " image)"};
    }
    if (!png_transform_step(guard.png, guard.info, &layout)) return png_failure(label, err);
    if ((layout.channels != 3 && layout.channels != 4) || layout.row_bytes != size_t(layout.width) * layout.channels) {
        return Error{label + ": unsupported PNG layout (" + std::to_string(layout.channels) +
                     " channels after conversion)"};
    }

    Image image = make_image(static_cast<int>(layout.width), static_cast<int>(layout.height), layout.channels);
    std::vector<png_bytep> rows(layout.height);
    for (png_uint_32 y = 0; y < layout.height; ++y) rows[y] = image.pixel(0, static_cast<int>(y));
    if (!png_pixels_step(guard.png, rows.data())) return png_failure(label, err);
    return image;
}

// ---- JPEG -----------------------------------------------------------------

struct JpegError {
    jpeg_error_mgr mgr;  // first, so that cinfo->err points at the whole struct
    jmp_buf jump;
    CodecError error;
};

void jpeg_error_exit_cb(j_common_ptr cinfo) {
    auto* err = reinterpret_cast<JpegError*>(cinfo->err);
    char buffer[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, buffer);
    std::snprintf(err->error.message, sizeof(err->error.message), "%s", buffer);
    const int code = cinfo->err->msg_code;
    err->error.unsupported = code == JERR_BAD_PRECISION || code == JERR_NOTIMPL || code == JERR_NOT_COMPILED ||
                             code == JERR_CONVERSION_NOTIMPL;
    std::longjmp(err->jump, 1);
}

// libjpeg reports damaged entropy-coded data as warnings and fills the rest
// of the picture with grey; kiln treats those as errors so a cut or
// corrupted file is never taken for an image. Other warnings (unknown JFIF
// revision, extraneous bytes between markers) leave the pixels intact.
void jpeg_emit_message_cb(j_common_ptr cinfo, int level) {
    if (level >= 0) return;  // trace messages
    const int code = cinfo->err->msg_code;
    if (code == JWRN_JPEG_EOF) reinterpret_cast<JpegError*>(cinfo->err)->error.truncated = true;
    if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_HUFF_BAD_CODE || code == JWRN_MUST_RESYNC ||
        code == JWRN_NOT_SEQUENTIAL) {
        jpeg_error_exit_cb(cinfo);
    }
    cinfo->err->num_warnings++;
    char buffer[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, buffer);
    KILN_LOG_DEBUG("libjpeg: %s", buffer);
}

void init_jpeg_error(JpegError* err) {
    jpeg_std_error(&err->mgr);
    err->mgr.error_exit = jpeg_error_exit_cb;
    err->mgr.emit_message = jpeg_emit_message_cb;
}

struct JpegDecompressGuard {
    jpeg_decompress_struct cinfo{};
    ~JpegDecompressGuard() { jpeg_destroy_decompress(&cinfo); }  // a no-op before jpeg_create_decompress
};

bool jpeg_header_step(jpeg_decompress_struct* cinfo, JpegError* err, const uint8_t* data, size_t size) {
    if (setjmp(err->jump)) return false;
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
    jpeg_read_header(cinfo, TRUE);
    return true;
}

void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, JDIMENSION width, bool inverted) {
    for (JDIMENSION x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
        // Adobe writes CMYK JPEGs with every sample inverted.
        const unsigned k = inverted ? cmyk[3] : 255u - cmyk[3];
        for (int c = 0; c < 3; ++c) {
            const unsigned v = inverted ? cmyk[c] : 255u - cmyk[c];
            rgb[c] = static_cast<uint8_t>((v * k + 127u) / 255u);
        }
    }
}

bool jpeg_pixels_step(jpeg_decompress_struct* cinfo, JpegError* err, uint8_t* pixels, uint8_t* cmyk_row) {
    if (setjmp(err->jump)) return false;
    jpeg_start_decompress(cinfo);
    if (cinfo->output_width != cinfo->image_width || cinfo->output_height != cinfo->image_height ||
        cinfo->output_components != (cmyk_row ? 4 : 3)) {
        std::snprintf(err->error.message, sizeof(err->error.message), "unexpected decoder output layout");
        return false;
    }
    const size_t stride = static_cast<size_t>(cinfo->output_width) * 3;
    while (cinfo->output_scanline < cinfo->output_height) {
        uint8_t* dst = pixels + cinfo->output_scanline * stride;
        JSAMPROW row = cmyk_row ? cmyk_row : dst;
        if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
            std::snprintf(err->error.message, sizeof(err->error.message), "the decoder returned no scanline");
            return false;
        }
        if (cmyk_row) cmyk_to_rgb(cmyk_row, dst, cinfo->output_width, cinfo->saw_Adobe_marker);
    }
    jpeg_finish_decompress(cinfo);
    return true;
}

Error jpeg_failure(const std::string& label, const JpegError& err) {
    if (err.error.truncated) return Error{label + ": truncated JPEG (the file ends before the image does)"};
    if (err.error.unsupported) return Error{label + ": unsupported JPEG: " + err.error.message};
    return Error{label + ": corrupt JPEG: " + err.error.message};
}

Result<Image> decode_jpeg(const uint8_t* data, size_t size, const std::string& label, const DecodeLimits& limits) {
    JpegError err;
    JpegDecompressGuard guard;
    guard.cinfo.err = &err.mgr;
    init_jpeg_error(&err);
    if (!jpeg_header_step(&guard.cinfo, &err, data, size)) return jpeg_failure(label, err);
    jpeg_decompress_struct& cinfo = guard.cinfo;
    KILN_TRY(check_size(label, cinfo.image_width, cinfo.image_height, limits));
    // libjpeg converts YCbCr, RGB and grey to RGB itself, but not CMYK.
    const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;

    Image image = make_image(static_cast<int>(cinfo.image_width), static_cast<int>(cinfo.image_height), 3);
    std::vector<uint8_t> cmyk_row(cmyk ? static_cast<size_t>(cinfo.image_width) * 4 : 0);
    if (!jpeg_pixels_step(&cinfo, &err, image.pixels.data(), cmyk ? cmyk_row.data() : nullptr)) {
        return jpeg_failure(label, err);
    }
    return image;
}

// ---- WebP -----------------------------------------------------------------

std::string webp_status_text(VP8StatusCode status) {
    switch (status) {
        case VP8_STATUS_OK: return "ok";
        case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
        case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
        case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
        case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
        case VP8_STATUS_SUSPENDED: return "decoder suspended";
        case VP8_STATUS_USER_ABORT: return "aborted";
        case VP8_STATUS_NOT_ENOUGH_DATA: return "not enough data";
    }
    return "status " + std::to_string(static_cast<int>(status));
}

Error webp_failure(const std::string& label, VP8StatusCode status) {
    if (status == VP8_STATUS_NOT_ENOUGH_DATA) {
        return Error{label + ": truncated WebP (the file ends before the image does)"};
    }
    return Error{label + ": corrupt WebP: " + webp_status_text(status)};
}

uint32_t le32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }

Result<Image> decode_webp(const uint8_t* data, size_t size, const std::string& label, const DecodeLimits& limits) {
    // libwebp can decode a stream cut a little short of its end without
    // complaint; the RIFF header states the full length, so compare.
    const uint64_t riff_end = uint64_t(le32(data + 4)) + 8;
    if (riff_end > size) {
        return Error{label + ": truncated WebP (the RIFF header says " + std::to_string(riff_end) +
                     " bytes, the file has " + std::to_string(size) + ")"};
    }
    size = static_cast<size_t>(riff_end);
    WebPDecoderConfig config;
    if (!WebPInitDecoderConfig(&config)) return Error{label + ": libwebp version mismatch"};
    VP8StatusCode status = WebPGetFeatures(data, size, &config.input);
    if (status != VP8_STATUS_OK) return webp_failure(label, status);
    if (config.input.has_animation) return Error{label + ": animated WebP is not supported"};
    KILN_TRY(check_size(label, static_cast<uint64_t>(config.input.width), static_cast<uint64_t>(config.input.height),
                        limits));
    const int channels = config.input.has_alpha ? 4 : 3;
    Image image = make_image(config.input.width, config.input.height, channels);
    config.output.colorspace = channels == 4 ? MODE_RGBA : MODE_RGB;
    config.output.is_external_memory = 1;
    config.output.u.RGBA.rgba = image.pixels.data();
    config.output.u.RGBA.stride = static_cast<int>(image.row_bytes());
    config.output.u.RGBA.size = image.pixels.size();
    status = WebPDecode(data, size, &config);
    WebPFreeDecBuffer(&config.output);
    if (status != VP8_STATUS_OK) return webp_failure(label, status);
    return image;
}

// ---- encoding -------------------------------------------------------------

void png_write_cb(png_structp png, png_bytep data, size_t n) {
    auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
    bool ok = true;
    try {
        out->insert(out->end(), data, data + n);
    } catch (...) {
        ok = false;
    }
    // Outside the catch block: longjmp must not leave a live exception behind.
    if (!ok) png_error(png, "out of memory");
}

void png_flush_cb(png_structp) {}

struct PngWriteGuard {
    png_structp png = nullptr;
    png_infop info = nullptr;
    ~PngWriteGuard() {
        if (png) png_destroy_write_struct(&png, info ? &info : nullptr);
    }
};

bool png_encode_step(png_structp png, png_infop info, const Image* image, png_bytepp rows, png_textp texts,
                     int num_texts) {
    if (setjmp(png_jmpbuf(png))) return false;
    const int color_type = image->channels == 1   ? PNG_COLOR_TYPE_GRAY
                           : image->channels == 3 ? PNG_COLOR_TYPE_RGB
                                                  : PNG_COLOR_TYPE_RGB_ALPHA;
    png_set_IHDR(png, info, static_cast<png_uint_32>(image->width), static_cast<png_uint_32>(image->height), 8,
                 color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (num_texts > 0) png_set_text(png, info, texts, num_texts);
    png_write_info(png, info);
    png_write_image(png, rows);
    png_write_end(png, nullptr);
    return true;
}

// PNG keywords: 1..79 Latin-1 characters, printable, no leading, trailing or
// consecutive spaces (PNG spec 11.3.4.2). kiln keeps to ASCII.
Status check_text_entry(const std::string& label, const std::string& key, const std::string& value) {
    bool ok = !key.empty() && key.size() <= 79 && key.front() != ' ' && key.back() != ' ' &&
              key.find("  ") == std::string::npos;
    for (char c : key) ok = ok && c >= 0x20 && c < 0x7f;
    if (!ok) {
        return Error{label + ": invalid PNG text keyword '" + key +
                     "' (1..79 printable ASCII characters, no leading, trailing or doubled spaces)"};
    }
    if (value.find('\0') != std::string::npos) return Error{label + ": PNG text '" + key + "' contains a NUL byte"};
    return Status::Ok();
}

bool is_ascii(const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

Result<std::vector<uint8_t>> encode_png(const Image& image, const ImageWriteOptions& options,
                                        const std::string& label) {
    std::vector<png_text> texts;
    for (const auto& [key, value] : options.text) {
        KILN_TRY(check_text_entry(label, key, value));
        png_text t{};
        // Plain ASCII stays tEXt, which every reader understands; anything
        // else is UTF-8 and needs iTXt (tEXt is Latin-1).
        t.compression = is_ascii(value) ? PNG_TEXT_COMPRESSION_NONE : PNG_ITXT_COMPRESSION_NONE;
        t.key = const_cast<char*>(key.c_str());  // libpng copies, never writes
        t.text = const_cast<char*>(value.c_str());
        t.text_length = value.size();
        texts.push_back(t);
    }
    std::vector<uint8_t> out;
    out.reserve(image.pixels.size() / 2 + 1024);
    CodecError err;
    PngWriteGuard guard;
    guard.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &err, png_error_cb, png_warning_cb);
    if (!guard.png) return Error{label + ": out of memory starting the PNG encoder"};
    guard.info = png_create_info_struct(guard.png);
    if (!guard.info) return Error{label + ": out of memory starting the PNG encoder"};
    png_set_write_fn(guard.png, &out, png_write_cb, png_flush_cb);
    std::vector<png_bytep> rows(image.height);
    for (int y = 0; y < image.height; ++y) rows[y] = const_cast<png_bytep>(image.pixel(0, y));
    if (!png_encode_step(guard.png, guard.info, &image, rows.data(), texts.data(), static_cast<int>(texts.size()))) {
        return Error{label + ": PNG encoder failed: " + err.message};
    }
    return out;
}

struct JpegCompressGuard {
    jpeg_compress_struct cinfo{};
    unsigned char* buffer = nullptr;  // jpeg_mem_dest's malloc'd output
    unsigned long size = 0;
    ~JpegCompressGuard() {
        jpeg_destroy_compress(&cinfo);
        std::free(buffer);
    }
};

bool jpeg_encode_step(JpegCompressGuard* g, JpegError* err, const Image* image, int quality, uint8_t* rgb_row,
                      const std::vector<uint8_t>* app1) {
    if (setjmp(err->jump)) return false;
    jpeg_compress_struct* cinfo = &g->cinfo;
    jpeg_create_compress(cinfo);
    jpeg_mem_dest(cinfo, &g->buffer, &g->size);
    cinfo->image_width = static_cast<JDIMENSION>(image->width);
    cinfo->image_height = static_cast<JDIMENSION>(image->height);
    cinfo->input_components = image->channels == 1 ? 1 : 3;
    cinfo->in_color_space = image->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(cinfo);
    jpeg_set_quality(cinfo, quality, TRUE);
    cinfo->optimize_coding = TRUE;  // a few percent smaller for little time
    jpeg_start_compress(cinfo, TRUE);
    if (app1) jpeg_write_marker(cinfo, JPEG_APP0 + 1, app1->data(), static_cast<unsigned>(app1->size()));
    while (cinfo->next_scanline < cinfo->image_height) {
        const uint8_t* src = image->pixel(0, static_cast<int>(cinfo->next_scanline));
        JSAMPROW row = const_cast<JSAMPROW>(src);
        if (image->channels == 4) {
            for (int x = 0; x < image->width; ++x) std::memcpy(rgb_row + 3 * x, src + 4 * x, 3);
            row = rgb_row;
        }
        jpeg_write_scanlines(cinfo, &row, 1);
    }
    jpeg_finish_compress(cinfo);
    return true;
}

// A JPEG marker segment holds at most 65533 bytes after its length field.
constexpr size_t kMaxJpegSegment = 65533;

Result<std::vector<uint8_t>> encode_jpeg(const Image& image, const ImageWriteOptions& options,
                                         const std::string& label) {
    std::vector<uint8_t> app1;
    if (auto it = options.text.find(kParametersKeyword); it != options.text.end()) {
        static const char exif_header[6] = {'E', 'x', 'i', 'f', 0, 0};
        app1.assign(exif_header, exif_header + 6);
        const std::vector<uint8_t> tiff = make_exif_user_comment(it->second);
        app1.insert(app1.end(), tiff.begin(), tiff.end());
        if (app1.size() > kMaxJpegSegment) {
            // Losing the image over its caption would be worse.
            KILN_LOG_WARN(
                "%s: generation parameters too long for JPEG EXIF (%zu bytes, limit %zu); written without them",
                label.c_str(), app1.size(), kMaxJpegSegment);
            app1.clear();
        }
    }
    JpegError err;
    JpegCompressGuard guard;
    guard.cinfo.err = &err.mgr;
    init_jpeg_error(&err);
    std::vector<uint8_t> rgb_row(image.channels == 4 ? static_cast<size_t>(image.width) * 3 : 0);
    if (!jpeg_encode_step(&guard, &err, &image, options.quality, rgb_row.data(), app1.empty() ? nullptr : &app1)) {
        return Error{label + ": JPEG encoder failed: " + err.error.message};
    }
    return std::vector<uint8_t>(guard.buffer, guard.buffer + guard.size);
}

struct WebPPictureGuard {
    WebPPicture picture;
    WebPMemoryWriter writer;
    bool picture_ready = false;
    WebPPictureGuard() { WebPMemoryWriterInit(&writer); }
    ~WebPPictureGuard() {
        if (picture_ready) WebPPictureFree(&picture);
        WebPMemoryWriterClear(&writer);
    }
};

struct WebPMuxGuard {
    WebPMux* mux = nullptr;
    WebPData assembled;
    WebPMuxGuard() { WebPDataInit(&assembled); }
    ~WebPMuxGuard() {
        WebPDataClear(&assembled);
        if (mux) WebPMuxDelete(mux);
    }
};

std::string webp_encode_error(WebPEncodingError code) {
    switch (code) {
        case VP8_ENC_ERROR_OUT_OF_MEMORY:
        case VP8_ENC_ERROR_BITSTREAM_OUT_OF_MEMORY: return "out of memory";
        case VP8_ENC_ERROR_BAD_DIMENSION: return "image dimensions not supported by WebP (at most 16383x16383)";
        case VP8_ENC_ERROR_PARTITION0_OVERFLOW:
        case VP8_ENC_ERROR_PARTITION_OVERFLOW: return "partition overflow (try a lower quality)";
        case VP8_ENC_ERROR_FILE_TOO_BIG: return "output larger than 4 GiB";
        default: return "error " + std::to_string(static_cast<int>(code));
    }
}

Result<std::vector<uint8_t>> encode_webp(const Image& image, const ImageWriteOptions& options,
                                         const std::string& label) {
    if (image.width > WEBP_MAX_DIMENSION || image.height > WEBP_MAX_DIMENSION) {
        return Error{label + ": " + dims(image.width, image.height) + " is larger than WebP allows (" +
                     dims(WEBP_MAX_DIMENSION, WEBP_MAX_DIMENSION) + ")"};
    }
    WebPConfig config;
    if (!WebPConfigInit(&config)) return Error{label + ": libwebp version mismatch"};
    config.quality = static_cast<float>(options.quality);
    config.lossless = options.lossless ? 1 : 0;
    // Lossless means every sample, including the colour under alpha 0,
    // which libwebp would otherwise replace to compress better.
    config.exact = options.lossless ? 1 : 0;
    if (!WebPValidateConfig(&config)) return Error{label + ": invalid WebP settings"};

    WebPPictureGuard g;
    if (!WebPPictureInit(&g.picture)) return Error{label + ": libwebp version mismatch"};
    g.picture_ready = true;
    g.picture.use_argb = options.lossless ? 1 : 0;
    g.picture.width = image.width;
    g.picture.height = image.height;
    g.picture.writer = WebPMemoryWrite;
    g.picture.custom_ptr = &g.writer;
    int imported = 0;
    if (image.channels == 4) {
        imported = WebPPictureImportRGBA(&g.picture, image.pixels.data(), static_cast<int>(image.row_bytes()));
    } else if (image.channels == 3) {
        imported = WebPPictureImportRGB(&g.picture, image.pixels.data(), static_cast<int>(image.row_bytes()));
    } else {
        Result<Image> rgb = convert_channels(image, 3);
        if (!rgb) return Error{label + ": " + rgb.error().message};
        imported = WebPPictureImportRGB(&g.picture, rgb->pixels.data(), static_cast<int>(rgb->row_bytes()));
    }
    if (!imported) return Error{label + ": WebP encoder failed: out of memory"};
    if (!WebPEncode(&config, &g.picture))
        return Error{label + ": WebP encoder failed: " + webp_encode_error(g.picture.error_code)};
    std::vector<uint8_t> out(g.writer.mem, g.writer.mem + g.writer.size);

    auto it = options.text.find(kParametersKeyword);
    if (it == options.text.end()) return out;
    const std::vector<uint8_t> exif = make_exif_user_comment(it->second);
    WebPMuxGuard m;
    WebPData bitstream{out.data(), out.size()};
    m.mux = WebPMuxCreate(&bitstream, 0);  // 0: refers to `out`, which outlives it
    WebPData exif_data{exif.data(), exif.size()};
    if (!m.mux || WebPMuxSetChunk(m.mux, "EXIF", &exif_data, 1) != WEBP_MUX_OK ||
        WebPMuxAssemble(m.mux, &m.assembled) != WEBP_MUX_OK) {
        return Error{label + ": adding EXIF metadata to the WebP file failed"};
    }
    return std::vector<uint8_t>(m.assembled.bytes, m.assembled.bytes + m.assembled.size);
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// write() until done, retrying interrupted and short writes.
bool write_all(int fd, const uint8_t* data, size_t size) {
    while (size > 0) {
        const ssize_t n = ::write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        data += n;
        size -= static_cast<size_t>(n);
    }
    return true;
}

}  // namespace

Status write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
    const std::string part = path + ".part";
    const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return Error{path + ": cannot create " + part + ": " + std::strerror(errno)};
    // Flushed before the rename so that a crash cannot leave a complete name
    // on incomplete contents.
    const char* step = nullptr;
    int error_number = 0;
    if (!write_all(fd, bytes.data(), bytes.size())) {
        step = "write";
        error_number = errno;
    } else if (::fsync(fd) != 0 && errno != EINVAL) {  // EINVAL: a file that cannot be synced, e.g. /dev/null
        step = "flush";
        error_number = errno;
    }
    if (::close(fd) != 0 && !step) {
        step = "close";
        error_number = errno;
    }
    if (step) {
        ::unlink(part.c_str());
        return Error{path + ": cannot " + step + " " + part + ": " + std::strerror(error_number)};
    }
    if (::rename(part.c_str(), path.c_str()) != 0) {
        const std::string reason = std::strerror(errno);
        ::unlink(part.c_str());
        return Error{path + ": cannot rename " + part + " into place: " + reason};
    }
    return Status::Ok();
}

const char* image_format_name(ImageFormat format) {
    switch (format) {
        case ImageFormat::Png: return "PNG";
        case ImageFormat::Jpeg: return "JPEG";
        case ImageFormat::WebP: return "WebP";
    }
    return "?";
}

std::optional<ImageFormat> detect_image_format(const uint8_t* data, size_t size) {
    static const char png_sig[8] = {'\x89', 'P', 'N', 'G', '\r', '\n', '\x1a', '\n'};
    if (starts_with(data, size, png_sig, 8)) return ImageFormat::Png;
    if (starts_with(data, size, "\xff\xd8\xff", 3)) return ImageFormat::Jpeg;
    if (size >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0) {
        return ImageFormat::WebP;
    }
    return std::nullopt;
}

Result<std::vector<uint8_t>> read_file_bytes(const std::string& path, size_t max_bytes) {
    // Only regular files: a FIFO would block and a device such as /dev/zero
    // never ends, and either is refused before a byte is read.
    auto opened = open_regular_file(path);
    if (!opened) return opened.error();
    struct FdCloser {
        int fd;
        ~FdCloser() { ::close(fd); }
    } closer{*opened};
    struct stat st;
    if (::fstat(closer.fd, &st) != 0) return Error{path + ": cannot stat: " + std::strerror(errno)};
    if (static_cast<uint64_t>(st.st_size) > max_bytes) {
        return Error{path + ": file is " + std::to_string(st.st_size) + " bytes, more than the " +
                     std::to_string(max_bytes) + "-byte limit for an image"};
    }
    std::vector<uint8_t> bytes;
    try {
        // At most the size stat gave (itself within the limit): a file that
        // grows while it is read is cut there.
        bytes.resize(static_cast<size_t>(st.st_size));
        size_t used = 0;
        while (used < bytes.size()) {
            const ssize_t n = ::read(closer.fd, bytes.data() + used, bytes.size() - used);
            if (n < 0) {
                if (errno == EINTR) continue;
                return Error{path + ": cannot read: " + std::strerror(errno)};
            }
            if (n == 0) break;
            used += static_cast<size_t>(n);
        }
        bytes.resize(used);
    } catch (const std::bad_alloc&) {
        return Error{path + ": out of memory reading the file"};
    }
    if (bytes.empty()) return Error{path + ": file is empty"};
    return bytes;
}

Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& label, uint64_t max_pixels) {
    return decode_image(data, size, label, DecodeLimits{max_pixels});
}

Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& label, const DecodeLimits& limits) {
    if (size == 0) return Error{label + ": file is empty"};
    const std::optional<ImageFormat> format = detect_image_format(data, size);
    if (!format) return Error{label + ": " + describe_unknown(data, size)};
    try {
        switch (*format) {
            case ImageFormat::Png: return decode_png(data, size, label, limits);
            case ImageFormat::Jpeg: return decode_jpeg(data, size, label, limits);
            case ImageFormat::WebP: return decode_webp(data, size, label, limits);
        }
    } catch (const std::bad_alloc&) {
        return Error{label + ": out of memory decoding the image"};
    }
    return Error{label + ": unknown format"};
}

Result<Image> read_image(const std::string& path, uint64_t max_pixels) {
    return read_image(path, DecodeLimits{max_pixels});
}

Result<Image> read_image(const std::string& path, const DecodeLimits& limits) {
    Result<std::vector<uint8_t>> bytes = read_file_bytes(path);
    if (!bytes) return bytes.error();
    return decode_image(bytes->data(), bytes->size(), path, limits);
}

Result<ImageFormat> format_for_path(const std::string& path) {
    static const char* const kValid = "use .png, .jpg, .jpeg or .webp";
    const size_t slash = path.find_last_of('/');
    const size_t dot = path.find_last_of('.');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
        return Error{path + ": no file extension to choose the image format by (" + kValid + ")"};
    }
    const std::string ext = lower(path.substr(dot));
    if (ext == ".png") return ImageFormat::Png;
    if (ext == ".jpg" || ext == ".jpeg") return ImageFormat::Jpeg;
    if (ext == ".webp") return ImageFormat::WebP;
    return Error{path + ": unsupported image extension '" + path.substr(dot) + "' (" + kValid + ")"};
}

Result<std::vector<uint8_t>> encode_image(const Image& image, ImageFormat format, const ImageWriteOptions& options,
                                          const std::string& label) {
    KILN_TRY(validate_image(image, label));
    if (options.quality < 1 || options.quality > 100) {
        return Error{label + ": quality " + std::to_string(options.quality) + " is outside 1..100"};
    }
    try {
        switch (format) {
            case ImageFormat::Png: return encode_png(image, options, label);
            case ImageFormat::Jpeg: return encode_jpeg(image, options, label);
            case ImageFormat::WebP: return encode_webp(image, options, label);
        }
    } catch (const std::bad_alloc&) {
        return Error{label + ": out of memory encoding the image"};
    }
    return Error{label + ": unknown format"};
}

Status write_image(const std::string& path, const Image& image, const ImageWriteOptions& options) {
    Result<ImageFormat> format = format_for_path(path);
    if (!format) return format.error();
    Result<std::vector<uint8_t>> bytes = encode_image(image, *format, options, path);
    if (!bytes) return bytes.error();
    return write_file_atomically(path, *bytes);
}

}  // namespace kiln::image
