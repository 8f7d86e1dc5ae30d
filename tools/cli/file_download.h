// One hub file onto the disk, safely (docs/pull.md):
//   - resumable: bytes go to FINAL.part; a later run asks the server for
//     the rest with an HTTP Range and appends;
//   - verified: the size always (the hub's list, else the server's
//     Content-Length), the sha256 when the hub lists one (lfs.sha256);
//   - atomic: FINAL.part is renamed to FINAL only once complete and
//     verified, so nothing unverified ever carries the final name.
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

// Downloads `file` of `repo` at `revision` to `final_path` (its folder is
// created). Errors name the file: network failures and cut connections
// keep FINAL.part for the next run and say so; a wrong size or sha256
// deletes it (BadFile); a disk error names the path and the system's reason.
Result<DownloadOutcome> download_file(const HubClient& hub, const std::string& repo, const std::string& revision,
                                      const HubFile& file, const std::string& final_path, DownloadProgress& progress);

}  // namespace kiln::cli
