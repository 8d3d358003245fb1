// Low-level, symlink-safe block file I/O under one directory tree (internal to the file tier; the
// `kvo fs` commands use it too). Every path below root_dir is walked component by component with
// openat(O_NOFOLLOW | O_DIRECTORY); a symlink anywhere is an error, never followed.
//
// Integrity record (kvo only; the .bin stays byte-identical to vLLM's): 24 bytes
//   "kvo1" | u32 flags (0) | u64 length | u64 XXH3-64 of the body      (little-endian)
// stored as the extended attribute "user.kvo.xxh3" of the .bin (set on the temp file before the
// rename, so name, body and record appear atomically), or, where the file system has no user
// xattrs, in a sidecar file "<hex>.bin.kvo" renamed into place before the .bin.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/status.h"
#include "transfer/fs_namespace.h"

namespace kvo::fs_internal {

inline constexpr char kXattrName[] = "user.kvo.xxh3";
inline constexpr char kSidecarSuffix[] = ".kvo";
inline constexpr size_t kRecordBytes = 24;

enum class ChecksumStore : uint8_t { kXattr, kSidecar };

struct IntegrityRecord {
  uint64_t length = 0;
  uint64_t xxh3 = 0;
};
std::string EncodeRecord(const IntegrityRecord& r);
std::optional<IntegrityRecord> DecodeRecord(std::string_view bytes);
uint64_t Xxh3(const void* data, size_t n);

// An open directory descriptor (closed on destruction).
class Dir {
 public:
  Dir() = default;
  explicit Dir(int fd) : fd_(fd) {}
  ~Dir();
  Dir(Dir&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Dir& operator=(Dir&& o) noexcept;
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Opens an absolute or relative directory path given by the user (root_dir); its last component
// must not be a symlink. NotFound / FailedPrecondition (not a directory) / IOError.
Result<Dir> OpenRootDir(const std::string& path);
// Opens child `name` of `parent` (a single component), creating it (mode dir_mode) when `create`.
// NotFound when missing and !create; FailedPrecondition naming `what` when it is a symlink or not
// a directory.
Result<Dir> OpenChildDir(const Dir& parent, std::string_view name, bool create, uint32_t dir_mode,
                         std::string_view what);

struct WriteOptions {
  uint32_t file_mode = 0600;
  bool o_direct = false;  // used only when buffer address and length are 4096-aligned
  ChecksumStore checksum = ChecksumStore::kXattr;
  bool write_checksum = true;
};

enum class WriteOutcome : uint8_t { kWritten, kExisted };

// Writes `data` as `name` in `dir`: skip when `name` exists (kExisted; a symlink or non-regular
// file there is an error), else temp file "<name>_<random 63-bit>.tmp" (O_CREAT|O_EXCL|O_NOFOLLOW)
// + integrity record + renameat. On error the temp file is removed; OutOfSpace on ENOSPC/EDQUOT.
Result<WriteOutcome> WriteFileAtomic(const Dir& dir, const std::string& name, const void* data,
                                     size_t n, const WriteOptions& opts);

enum class ReadOutcome : uint8_t {
  kOk,       // read whole; checksum verified (or none recorded and none required)
  kMissing,  // no such file
  kCorrupt,  // wrong size, short read, checksum mismatch, symlink/non-regular: removed
};
struct ReadResult {
  ReadOutcome outcome = ReadOutcome::kMissing;
  bool verified = false;  // a kvo integrity record was present and matched
  std::string detail;     // why corrupt
};
struct ReadOptions {
  bool o_direct = false;
  ChecksumStore checksum = ChecksumStore::kXattr;
  bool require_checksum = false;  // a file without a record is corrupt
  bool remove_corrupt = true;
};
// Reads `name` (exactly n bytes) into `data`, verifying the integrity record. A corrupt file is
// removed (only if it is still the same inode). IOError for other failures (file left alone).
Result<ReadResult> ReadFileVerified(const Dir& dir, const std::string& name, void* data, size_t n,
                                    const ReadOptions& opts);

// Verifies a file without knowing its expected size (size from the record). For `kvo fs verify`.
Result<ReadResult> VerifyFile(const Dir& dir, const std::string& name, ChecksumStore checksum,
                              bool remove_corrupt);

// Removes `name` and its sidecar from `dir`; ok when absent.
Status RemoveBlockFile(const Dir& dir, const std::string& name);

// Probes whether O_DIRECT writes and user xattrs work in `dir` (a temp file, removed). Errors when
// the directory is not writable (EROFS, EACCES) — naming `what`.
struct Probe {
  bool o_direct = false;
  bool xattr = false;
};
Result<Probe> ProbeDir(const Dir& dir, std::string_view what);

// One entry met while walking a rank directory (<ns>_r<rank>/<3 hex>/<2 hex>_g<group>/...).
struct WalkEntry {
  enum class Kind : uint8_t {
    kBlock,    // "<hex>.bin", name valid and placed in its own directories
    kTemp,     // "*.tmp": a write in flight or left by a crash
    kSidecar,  // "<hex>.bin.kvo" integrity sidecar
    kInvalid,  // anything else (bad name, misplaced hash, non-regular file)
    kSymlink,  // a symlink anywhere in the tree (never followed)
  };
  Kind kind = Kind::kInvalid;
  std::string rel_path;     // relative to the rank directory
  FsBlockKey key;           // kBlock only
  uint64_t size = 0;        // apparent bytes (regular files)
  uint64_t disk_bytes = 0;  // allocated bytes (st_blocks * 512)
  double age_seconds = 0;   // now - mtime
  std::string why;          // kInvalid / kSymlink
};
// Walks a rank directory; `fn(entry, leaf_dir, name)` is called for every entry (leaf_dir is the
// directory holding it, for removal or verification). Directories that cannot be opened become
// kInvalid entries; the walk goes on.
Status WalkRankDir(const Dir& rank,
                   const std::function<void(const WalkEntry&, const Dir&, const std::string&)>& fn);

// Entries of `dir` (sorted by name, "." and ".." excluded) with lstat results.
struct DirEntry {
  std::string name;
  bool is_dir = false;
  bool is_regular = false;
  bool is_symlink = false;
  uint64_t size = 0;
  uint64_t disk_bytes = 0;
};
Result<std::vector<DirEntry>> ListDirEntries(const Dir& dir, std::string_view what);

// Random 63-bit value, thread-local generator (temp names).
uint64_t RandomU63();

}  // namespace kvo::fs_internal
