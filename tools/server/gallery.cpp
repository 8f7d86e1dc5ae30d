#include "gallery.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "job_queue.h"

namespace fs = std::filesystem;

namespace kiln::server {
namespace {

const char* content_type_of_extension(const std::string& extension) {
    if (extension == ".png") return "image/png";
    if (extension == ".jpeg" || extension == ".jpg") return "image/jpeg";
    if (extension == ".webp") return "image/webp";
    return nullptr;
}

bool is_gallery_name(const std::string& name) {
    return !name.empty() && name.front() != '.' && name.find('/') == std::string::npos &&
           name.find('\\') == std::string::npos && content_type_of_extension(fs::path(name).extension().string());
}

// Local time as 20261206-101502: the files sort by when they were made.
std::string timestamp_now() {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char text[32];
    std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &local);
    return text;
}

double change_time_of(const fs::path& path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return 0;
    return double(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

}  // namespace

Gallery::Gallery(std::string folder) : folder_(std::move(folder)) {
    if (folder_.empty()) return;
    std::error_code ec;
    fs::create_directories(folder_, ec);
}

void Gallery::save(const Job& job) {
    if (folder_.empty()) return;
    const std::string stem = timestamp_now() + "-" + job.id;
    for (size_t i = 0; i < job.results.size(); ++i) {
        const std::string name = stem + "-" + std::to_string(i) + "." + job.request.output_format;
        const fs::path target = fs::path(folder_) / name;
        const fs::path partial = fs::path(folder_) / ("." + name + ".part");
        const std::vector<uint8_t>& bytes = job.results[i].bytes;
        bool written = false;
        {
            std::ofstream out(partial, std::ios::binary | std::ios::trunc);
            out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
            written = static_cast<bool>(out.flush());
        }
        std::error_code ec;
        if (written) fs::rename(partial, target, ec);
        if (!written || ec) {
            fs::remove(partial, ec);
            std::fprintf(stderr, "kiln serve: --output-dir %s: cannot write %s; the image stays in the job only\n",
                         folder_.c_str(), name.c_str());
        }
    }
}

std::vector<GalleryImage> Gallery::list(size_t offset, size_t limit, size_t* total) const {
    std::vector<GalleryImage> images;
    *total = 0;
    if (folder_.empty()) return images;
    std::error_code ec;
    for (fs::directory_iterator it(folder_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
        const std::string name = it->path().filename().string();
        std::error_code file_ec;
        // Only the server's own files: a symlink could lead anywhere.
        if (!is_gallery_name(name) || it->is_symlink(file_ec) || !it->is_regular_file(file_ec)) continue;
        GalleryImage image;
        image.file = name;
        image.created = change_time_of(it->path());
        image.bytes = it->file_size(file_ec);
        images.push_back(std::move(image));
    }
    // Newest first; the names (which start with the time) break ties.
    std::sort(images.begin(), images.end(), [](const GalleryImage& a, const GalleryImage& b) {
        return a.created != b.created ? a.created > b.created : a.file > b.file;
    });
    *total = images.size();
    images.erase(images.begin(), images.begin() + static_cast<std::ptrdiff_t>(std::min(offset, images.size())));
    if (images.size() > limit) images.resize(limit);
    // Only the page's own files are opened for their parameters.
    for (GalleryImage& image : images) {
        char* text = nullptr;
        char* error = nullptr;
        const std::string path = (fs::path(folder_) / image.file).string();
        if (kiln_image_read_parameters(path.c_str(), &text, &error) == KILN_OK && text) image.parameters = text;
        kiln_free_string(text);
        kiln_free_string(error);
    }
    return images;
}

std::optional<std::pair<std::string, std::string>> Gallery::read(const std::string& file) const {
    if (folder_.empty() || !is_gallery_name(file)) return std::nullopt;
    const fs::path path = fs::path(folder_) / file;
    std::error_code ec;
    if (fs::is_symlink(path, ec) || !fs::is_regular_file(path, ec)) return std::nullopt;
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return std::nullopt;
    return std::make_pair(std::move(bytes),
                          std::string(content_type_of_extension(fs::path(file).extension().string())));
}

}  // namespace kiln::server
