// Inspection of a file-tier root directory for operators (`kvo fs scan|verify|du`): every
// namespace (<model>_<digest12> with config.json; the digest is recomputed and checked), every
// rank directory, block counts per group, bytes (apparent and allocated), temp files, and with
// `verify` every block's size against its namespace's block size (so a vLLM-written tier, which has
// no records, is checked as vLLM's own load checks it: a short file is rejected) and its integrity
// record (bytes and identity). Never follows a symlink or opens anything but a regular file; never
// modifies anything unless remove_corrupt is set.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "transfer/fs_namespace.h"

namespace kvo {

struct FsInspectOptions {
  bool verify = false;          // read every block and check its integrity record
  bool remove_corrupt = false;  // with verify: remove corrupt blocks
  bool list_blocks = false;     // fill FsRankReport::blocks
  // With verify: every block's size in bytes (one CPU row, vLLM's row_stride). 0: inferred per
  // rank directory as the size most of its blocks have (ambiguous when two sizes tie).
  uint64_t block_bytes = 0;
};

struct FsRankReport {
  std::string dir;  // "<namespace>_r<rank>"
  uint32_t rank = 0;
  uint64_t blocks = 0;
  uint64_t bytes = 0;       // apparent size of the .bin files
  uint64_t disk_bytes = 0;  // allocated size of everything under the directory
  uint64_t temp_files = 0;
  std::map<uint32_t, uint64_t> blocks_per_group;
  std::map<uint64_t, uint64_t> blocks_per_size;  // file size -> count (one size per namespace)
  uint64_t verified = 0;                         // verify: record present and matching
  uint64_t unverified = 0;                       // verify: no record (e.g. written by vLLM)
  uint64_t corrupt = 0;                          // verify: unservable (misfiled included)
  uint64_t misfiled = 0;                         // verify: record names another block
  uint64_t block_bytes = 0;             // verify: the block size checked against (0: unknown)
  bool block_bytes_ambiguous = false;   // verify: sizes disagree and none is the most common
  std::vector<FsBlockKey> blocks_list;  // list_blocks
  std::vector<std::string> problems;    // "<path>: <why>"
};

struct FsNamespaceReport {
  std::string name;  // "<model>_<digest12>"
  bool has_config = false;
  bool digest_matches = false;  // sha256 of config.json's fields == the name's digest
  std::string model_name;       // from config.json
  std::vector<FsRankReport> ranks;
};

struct FsRootReport {
  std::string root_dir;
  std::vector<FsNamespaceReport> namespaces;
  std::vector<std::string> problems;  // entries at the root that are not the tier's
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  uint64_t disk_bytes = 0;
  uint64_t corrupt = 0;
  bool ambiguous = false;  // verify: some rank's block size could not be inferred
};

// NotFound / FailedPrecondition when root_dir is missing or not a directory.
Result<FsRootReport> InspectFsRoot(const std::string& root_dir, const FsInspectOptions& options);

// The report as one JSON object (stable key order) / as human-readable text.
std::string FsRootReportJson(const FsRootReport& report, bool with_blocks);
std::string FsRootReportText(const FsRootReport& report, bool with_blocks);

}  // namespace kvo
