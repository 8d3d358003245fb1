// FsBlockStore: the file-system tier's block store (vllm-compat.md B.11): CPU rows <-> one file per
// block at vLLM's paths (transfer/fs_namespace.h), on two thread pools (n_read_threads prefer
// loads, n_write_threads prefer stores, each falls back to the other queue). Jobs follow the job
// contract (transfer/job.h): SubmitStore/SubmitLoad return at once; TakeFinished hands back
// results with per-block detail, in COMPLETION order (not submission order: a job's blocks run on
// many threads and a later small job may finish first); Drain waits for all. The manager's
// secondary tier reaches it through manager/fs_transport.h.
//
// Beyond vLLM: every block carries an XXH3 integrity record outside the .bin (transfer/fs_file.h)
// that also names the block (namespace, rank, group, hash); a load verifies it, and a torn,
// truncated, bit-flipped, misfiled (renamed over another block's name) or FIFO file is a miss, is
// removed (FIFOs are not), is reported per block (kCorrupt) and counted (corrupt_blocks,
// misfiled_blocks). An open that fails otherwise (ELOOP on a symlinked .bin, never followed;
// EACCES, EIO ...) is kError and leaves the path as it is (vLLM: only proof of damage removes).
// Scan rebuilds the tier's contents from disk (the manager's reconcile) validating every name. No
// symlink is followed under root_dir; hashes are validated before they become path components;
// files 0600 and directories 0700 by default.
//
// Thread-safety: all methods are thread-safe. The host region must outlive the tier; a job's
// rows must not be touched by the caller until the job is returned by TakeFinished.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/status.h"
#include "transfer/fs_namespace.h"
#include "transfer/job.h"
#include "transfer/kv_layout.h"

namespace kvo {

// The most threads of one pool (n_read_threads, n_write_threads); a config asking for more is
// rejected by name.
inline constexpr int kFsMaxThreadsPerPool = 1024;

struct FsBlockStoreOptions {
  std::string root_dir;
  FsRunFields fields;
  uint32_t rank = 0;  // the tier runs in the scheduler: _r0 (B.11)
  // Each 0..kFsMaxThreadsPerPool, together >= 1: a pool of 0 is fine, the other pool's threads
  // take its queue too.
  int n_read_threads = 16;
  int n_write_threads = 16;
  uint32_t file_mode = 0600;
  uint32_t dir_mode = 0700;
  bool try_o_direct = true;            // used when the startup probe shows O_DIRECT works
  bool require_checksum = false;       // true: a .bin without kvo's record (e.g. vLLM's) is a miss
  bool force_sidecar_records = false;  // keep records in sidecar files even where xattrs work
};

enum class FsBlockOutcome : uint8_t {
  kOk,       // stored / loaded (and verified when a record exists)
  kSkipped,  // store: the file already existed (vLLM semantics); counts as success
  kMiss,     // load: no such file
  kCorrupt,  // load: wrong size, short read, checksum mismatch, symlink; the file was removed
  kError,    // I/O error (disk full, read-only, planted symlink directory ...): see status
};
std::string_view FsBlockOutcomeName(FsBlockOutcome o);

// The contract's per-block result (status: for kCorrupt / kError what went wrong; bytes: the row
// for kOk, else 0; seconds: the block's I/O) plus the file store's outcome.
struct FsBlockResult : BlockResult {
  FsBlockOutcome outcome = FsBlockOutcome::kError;
  bool verified = false;  // load: the integrity record matched
  bool misfiled = false;  // load, kCorrupt: the file's record names another block
};

// The contract's job result (success: every block kOk or kSkipped; bytes: moved by kOk blocks;
// seconds: submit to last block done; status stays ok, the blocks say why) plus per-block detail.
struct FsJobResult : JobResultFields {
  bool is_store = false;
  std::vector<FsBlockResult> blocks;  // co-indexed with the job's keys
};

// The age (now - mtime) from which Scan removes a temp file ("*.tmp"). root_dir is shared by
// design (vLLM engines and other kvo engines write temp + rename there), so a younger temp file
// may be another writer's store in flight and is left alone; an hour is far beyond any single
// block write, so what is older was left by a crash.
inline constexpr double kFsStaleTempSeconds = 3600;

struct FsScanResult {
  std::vector<FsBlockKey> blocks;     // well-formed .bin files of this tier's rank directory
  std::vector<std::string> problems;  // "<relative path>: <why>" for what was skipped or removed
  uint64_t temp_files_removed = 0;
  uint64_t wrong_size_removed = 0;
  uint64_t orphan_sidecars_removed = 0;  // "<hex>.bin.kvo" without its .bin, as old as a temp
};

class FsBlockStore {
 public:
  // Validates the options, opens root_dir (NotFound when missing; FailedPrecondition when it is
  // not a writable directory), writes <namespace>/config.json when absent, probes O_DIRECT and
  // xattrs, starts the threads. `region` holds the rows (row_stride bytes each = file size).
  static Result<std::unique_ptr<FsBlockStore>> Open(FsBlockStoreOptions options, HostRegion region);
  ~FsBlockStore();  // waits for every job
  FsBlockStore(const FsBlockStore&) = delete;
  FsBlockStore& operator=(const FsBlockStore&) = delete;

  // keys[i] <-> slots[i]. InvalidArgument (no job) on a size mismatch, an empty job, a slot out
  // of range or an invalid hash.
  Result<JobId> SubmitStore(std::vector<FsBlockKey> keys, std::vector<int64_t> slots);
  Result<JobId> SubmitLoad(std::vector<FsBlockKey> keys, std::vector<int64_t> slots);
  // Appends finished jobs in completion order; each once.
  void TakeFinished(std::vector<FsJobResult>* out);
  // Blocks until `job_id` finished (result stays queued). NotFound if unknown or already taken.
  Status Wait(JobId job_id);
  void Drain();

  // One fstatat (caller's thread): whether the block's .bin exists as a regular file.
  bool Exists(const FsBlockKey& key);
  // Removes blocks (and records); ok when absent.
  Status Delete(const FsBlockKey& key);
  // Walks this tier's rank directory: validates every name, removes stale temp files and orphan
  // sidecar records (at least `temp_age_seconds` old; 0 removes all — only when no other writer
  // shares the directory) and .bin files whose size is not row_stride, and lists the rest. Symlinks
  // are reported, never followed.
  Result<FsScanResult> Scan(double temp_age_seconds = kFsStaleTempSeconds);

  // Loads that found a damaged file (size, short read, checksum, malformed record, symlink,
  // FIFO ...) / a whole file whose record names another block. Both removed and served as misses.
  uint64_t corrupt_blocks() const;
  uint64_t misfiled_blocks() const;

  const std::string& namespace_name() const { return ns_name_; }
  std::string rank_dir() const;  // root_dir/<namespace>_r<rank>
  bool o_direct() const { return o_direct_; }
  bool xattr_records() const { return xattr_; }
  const HostRegion& region() const { return region_; }

 private:
  struct Impl;
  FsBlockStore() = default;
  std::unique_ptr<Impl> impl_;
  std::string ns_name_;
  HostRegion region_;
  bool o_direct_ = false;
  bool xattr_ = true;
};

}  // namespace kvo
