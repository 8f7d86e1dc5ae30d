// The name (or name pattern) given to -o for generated images. A pattern
// holds at most one integer field in printf's spelling ("out_%d.png",
// "out_%03d.png") and any number of "%%" for a literal percent sign. The
// field is filled by kiln itself, never by printf: no other conversion can
// reach a format function.
#pragma once

#include <string>

#include "util/result.h"

namespace kiln::cli {

class OutputPattern {
  public:
    // Refuses every '%' that is not "%%" or the one integer field
    // ("%d", "%i", "%u", optionally with '0' and a width of at most 9);
    // the error names the pattern and what is wrong.
    static Result<OutputPattern> parse(const std::string& text);

    // The name of image `index` of `count`: with a field, the field holds
    // `index`; without one, batches get "_<index + 1>" before the extension
    // from the second image on.
    std::string path(int index, int count) const;

  private:
    std::string prefix_;  // everything before the field ("%%" already turned into "%")
    std::string suffix_;  // everything after it; the whole name when there is no field
    bool has_field_ = false;
    bool zero_pad_ = false;
    int width_ = 0;
};

}  // namespace kiln::cli
