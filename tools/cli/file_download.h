// One hub file onto the disk, safely (docs/pull.md):
//   - resumable: bytes go to FINAL.kiln-part; a later run asks the server
//     for the rest with an HTTP Range and appends;
//   - verified: the size always (the hub's list, else the server's
//     Content-Length), the sha256 when the hub lists one (lfs.sha256);
//     a body longer than that size (or --max-size, when none is known) is
//     stopped as it arrives;
//   - atomic: FINAL.kiln-part is renamed to FINAL only once complete and
//     verified, so nothing unverified ever carries the final name;
//   - confined: nothing is written outside the target folder's real path
//     (a symlinked subfolder or part is refused), and no listed file can
//     be mistaken for a part: names ending in .kiln-part are refused.
// A file already at FINAL with the listed size (and sha256) is kept as is.
#pragma once

#include <string>

#include "download_progress.h"
#include "hub_client.h"
#include "util/result.h"

namespace kiln::cli {

enum class DownloadOutcome {
    Fetched,       // downloaded (from byte 0 or resumed) and verified
    AlreadyThere,  // FINAL already held the listed file
};

// What a partial download's name ends with. No hub name may: see is_part_name.
constexpr const char* kPartSuffix = ".kiln-part";
bool is_part_name(const std::string& path);

// Downloads `file` of `repo` at `revision` to folder/PATH (its folders are
// created). `max_bytes` bounds a file whose size neither the hub nor the
// server gives. Errors name the file: network failures and cut connections
// keep the part for the next run and say so; a wrong size or sha256 deletes
// it (BadFile); a disk error names the path and the system's reason.
Result<DownloadOutcome> download_file(const HubClient& hub, const std::string& repo, const std::string& revision,
                                      const HubFile& file, const std::string& folder, uint64_t max_bytes,
                                      DownloadProgress& progress);

}  // namespace kiln::cli
