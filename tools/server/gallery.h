// The server's outputs folder (--output-dir): every finished job's images
// are written there as files, so the web page's gallery outlives reloads
// and restarts, and the folder can be browsed like A1111's outputs/. Each
// file is named by when it was made and by its job ("20261206-101502-
// 3f2a-0.png"); its parameters travel inside it (the PNG "parameters"
// text, or EXIF for JPEG and WebP), so the folder needs no index.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::server {

struct Job;

struct GalleryImage {
    std::string file;        // the name in the folder
    std::string parameters;  // A1111's text, "" when the image carries none
    double created = 0;      // Unix seconds (the file's change time)
    uint64_t bytes = 0;
};

class Gallery {
  public:
    // `folder` "" keeps no outputs (the gallery is empty); it is created when missing.
    explicit Gallery(std::string folder);
    bool enabled() const { return !folder_.empty(); }
    const std::string& folder() const { return folder_; }

    // Writes the finished job's images (each to a temporary name first, then
    // renamed: the folder never shows half a file). A write that fails is
    // reported on stderr and leaves the job's results as they are.
    void save(const Job& job);
    // The newest images first, `limit` of them from `offset`, and how many there are.
    std::vector<GalleryImage> list(size_t offset, size_t limit, size_t* total) const;
    // The file's bytes and content type; nullopt for a name that is not an
    // image directly in the folder (no path separators, no dot files).
    std::optional<std::pair<std::string, std::string>> read(const std::string& file) const;

  private:
    std::string folder_;
};

}  // namespace kiln::server
