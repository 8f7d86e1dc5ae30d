// The name (or name pattern) given to -o for generated images, named as
// sd-cli names them (and a video's image sequence, image/video_file.h). A pattern holds at most one integer field in printf's
// spelling ("out_%d.png", "out_%03d.png") and any number of "%%" for a
// literal percent sign. The field is filled by kiln itself, never by printf:
// no other conversion can reach a format function. A name whose extension is
// not an image format kiln writes (.png, .jpg, .jpeg, .webp; for a video,
// .avi and .webm too) gets ".png" ("out" -> "out.png", "out.v2" ->
// "out.v2.png"). A video's frame pattern numbers its frames.
#pragma once

#include <string>

#include "util/result.h"

namespace kiln {

class OutputPattern {
  public:
    // Refuses every '%' that is not "%%" or the one integer field
    // ("%d", "%i", "%u", optionally with '0' and a width of at most 9);
    // the error names the pattern and what is wrong. `first_index` is
    // --output-begin-idx (>= 0).
    // With `video` (-M vid_gen), .avi and .webm names are kept too.
    static Result<OutputPattern> parse(const std::string& text, int first_index = 0, bool video = false);
    bool has_field() const { return has_field_; }

    // The name of image `index` of `count`, n = first_index + index: with a
    // field, the field holds n; without one, a batch of more than one image
    // gets "_<n>" before the extension ("b.png": b_0.png, b_1.png, ...).
    std::string path(int index, int count) const;

  private:
    std::string prefix_;  // everything before the field ("%%" already turned into "%")
    std::string suffix_;  // everything after it; the whole name when there is no field
    bool has_field_ = false;
    bool zero_pad_ = false;
    int width_ = 0;
    int first_index_ = 0;
};

}  // namespace kiln
