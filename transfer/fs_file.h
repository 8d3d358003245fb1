// Low-level, symlink-safe block file I/O under one directory tree (internal to the file tier; the
// `kvo fs` commands use it too). Every path below root_dir is walked component by component with
// openat(O_NOFOLLOW | O_DIRECTORY); a symlink anywhere is an error, never followed. Files are
// opened O_NONBLOCK and used only when fstat says they are regular: a FIFO planted under a block's
// name is corrupt, never a hang.
//
// Integrity record (kvo only; the .bin stays byte-identical to vLLM's; schemas/fs_tier_format.md):
//   v2, 32 bytes: "kvo2" | u32 flags (0) | u64 length | u64 XXH3-64 of the body | u64 identity
//   v1, 24 bytes: "kvo1" | u32 flags (0) | u64 length | u64 XXH3-64 of the body  (read only)
// (little-endian). `identity` binds the record to the name the block was stored under
// (BlockIdentity: namespace, rank, group, hash), so a .bin renamed over another block's name is
// misfiled and never served. Stored as the extended attribute "user.kvo.xxh3" of the .bin (set on
// the temp file before the rename, so name, body and record appear atomically), or, where the file
// system has no user xattrs, in a sidecar file "<hex>.bin.kvo" renamed into place before the .bin.
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
inline constexpr size_t kRecordBytes = 32;    // version 2 (written)
inline constexpr size_t kRecordBytesV1 = 24;  // version 1 (read; no identity)

enum class ChecksumStore : uint8_t { kXattr, kSidecar };

struct IntegrityRecord {
  uint32_t version = 2;  // 2: binds the identity; 1: bytes only (written before identities)
  uint64_t length = 0;
  uint64_t xxh3 = 0;
  uint64_t identity = 0;  // version 2 only
};
// Version 2 bytes (version 1 bytes when r.version == 1: for tests of old tiers).
std::string EncodeRecord(const IntegrityRecord& r);
// Either version; nullopt for anything else (wrong size, magic or flags).
std::optional<IntegrityRecord> DecodeRecord(std::string_view bytes);
uint64_t Xxh3(const void* data, size_t n);

// What names a block file: XXH3-64 of "kvo.block\0<namespace>\0<rank>\0<group>\0<hex>" (decimal
// numbers). A record of one block copied or renamed to another name, group, rank or namespace
// does not match. REQUIRES: key validated.
uint64_t BlockIdentity(std::string_view ns_name, uint32_t rank, const FsBlockKey& key);

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
// a directory (then *not_a_dir, when given, is set: only this case is proof of a planted path;
// EACCES / EPERM / EROFS are FailedPrecondition too, with *not_a_dir false).
Result<Dir> OpenChildDir(const Dir& parent, std::string_view name, bool create, uint32_t dir_mode,
                         std::string_view what, bool* not_a_dir = nullptr);

// Opens `dir1`/`dir2` below `base` (one component each) in one openat2(RESOLVE_NO_SYMLINKS |
// RESOLVE_BENEATH) call; where that fails (missing and `create`, a symlink or non-directory on
// the way, no openat2) it walks one component at a time with OpenChildDir, whose errors it gives.
// NotFound when missing and !create. *created (when given): the leaf was created by this call.
Result<Dir> OpenBlockDir(const Dir& base, std::string_view dir1, std::string_view dir2, bool create,
                         uint32_t dir_mode, std::string_view what, bool* created = nullptr);

struct WriteOptions {
  uint32_t file_mode = 0600;
  bool o_direct = false;  // used only when buffer address and length are 4096-aligned
  ChecksumStore checksum = ChecksumStore::kXattr;
  bool write_checksum = true;
  uint64_t identity = 0;  // BlockIdentity of the name written, recorded with the checksum
  // `dir` was just created by this writer (OpenBlockDir's *created): skip the existence check.
  bool dir_is_new = false;
};

enum class WriteOutcome : uint8_t { kWritten, kExisted };

// Writes `data` as `name` in `dir`: skip when `name` exists (kExisted; a symlink or non-regular
// file there is an error), else a nameless O_TMPFILE + integrity record + linkat to `name` (never
// replacing: a concurrent writer's file wins, kExisted); where the file system or kernel cannot
// (no O_TMPFILE, no unprivileged link of one), temp file "<name>_<random 63-bit>.tmp"
// (O_CREAT|O_EXCL|O_NOFOLLOW) + record + renameat. On error no temp file is left; OutOfSpace on
// ENOSPC/EDQUOT.
Result<WriteOutcome> WriteFileAtomic(const Dir& dir, const std::string& name, const void* data,
                                     size_t n, const WriteOptions& opts);
// Tests: true makes every later write in this process take the fallback (named temp file +
// renameat), as on a file system or kernel that cannot link an O_TMPFILE; false re-detects.
void ForceNamedTempFilesForTest(bool on);

enum class ReadOutcome : uint8_t {
  kOk,       // read whole; checksum verified (or none recorded and none required)
  kMissing,  // no such file
  kCorrupt,  // wrong size, short read, checksum mismatch, misfiled, symlink/non-regular: removed
};
struct ReadResult {
  ReadOutcome outcome = ReadOutcome::kMissing;
  bool verified = false;        // a kvo integrity record was present and matched
  bool misfiled = false;        // kCorrupt: the record names another block (identity mismatch)
  uint32_t record_version = 0;  // of the record found (0: none)
  std::string detail;           // why corrupt
};
struct ReadOptions {
  bool o_direct = false;
  ChecksumStore checksum = ChecksumStore::kXattr;
  // A file without a version-2 record is corrupt (no record: vLLM's; version 1: no identity).
  bool require_checksum = false;
  bool remove_corrupt = true;
  std::optional<uint64_t> identity;  // BlockIdentity of `name`; a v2 record must match it
};
// Reads `name` (exactly n bytes) into `data`, verifying the integrity record. A corrupt file is
// removed (only if it is still the same inode). IOError for other failures (file left alone).
Result<ReadResult> ReadFileVerified(const Dir& dir, const std::string& name, void* data, size_t n,
                                    const ReadOptions& opts);

// ReadFileVerified of `dir1`/`dir2`/`name` below `base`, the file opened in one openat2
// (RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH) call: kMissing when any component is missing. nullopt
// when that call cannot decide (a symlink or non-directory on the way, no openat2, another open
// error, sidecar records): the caller then opens the directories and calls ReadFileVerified, which
// classifies it exactly as before.
Result<std::optional<ReadResult>> ReadBlockFileVerified(const Dir& base, std::string_view dir1,
                                                        std::string_view dir2,
                                                        const std::string& name, void* data,
                                                        size_t n, const ReadOptions& opts);

struct VerifyOptions {
  ChecksumStore checksum = ChecksumStore::kXattr;
  std::optional<uint64_t> identity;  // as ReadOptions::identity
  uint64_t expected_size = 0;        // the namespace's block size; 0: unknown (the record's)
  bool remove_corrupt = false;
};
// Verifies a file for `kvo fs verify`: a size other than expected_size (or the record's length) is
// corrupt without reading a byte; otherwise the body is hashed in bounded memory.
Result<ReadResult> VerifyFile(const Dir& dir, const std::string& name, const VerifyOptions& opts);

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
