// Journal: kvo's durable event store. Append-only segmented files of length-prefixed, checksummed
// records; each record is one encoded EventBatch with its sequence number. Crash-safe: a torn or
// corrupt tail is detected on Open and truncated, never returned. The byte layout is specified in
// schemas/journal_format.md.
//
// Files: `dir/<first seq, 20 decimal digits>.kvj`, e.g. 00000000000000000042.kvj holds records
// 42, 43, ... up to the next segment's first seq. `dir/seq-floor-<20 digits>` is an empty file
// whose name is the sequence floor (below). Other names in `dir` are ignored.
//
// Sequence floor: the lowest seq a new record may take. It is one past the newest record, or the
// seq last passed to RaiseSeqFloor, whichever is higher. A publisher whose appends fail keeps
// publishing (as vLLM, which has no journal) and raises the floor past every seq it sends
// unjournaled, so a restart resumes past them instead of reusing seqs subscribers have seen. The
// floor file is created empty on Open and only ever renamed, so raising it writes no data block:
// it works on a full disk, where the appends it stands in for fail.
//
// Durability: Append buffers records in user space (no syscall per record). Records reach the OS
// (and so survive a crash of this process) on Flush(), Sync(), NewReader(), a segment roll, or when
// the 64 KiB buffer fills; they survive power loss once fsynced (Sync(), or the FsyncPolicy).
// A publisher therefore appends a run of batches, calls Flush() (or Sync()), then publishes them.
//
// Thread-safety: Journal methods may be called from any thread (internally serialised).
// A JournalReader is owned by one thread; it reads the records appended before NewReader returned
// and is safe while the writer keeps appending. A segment dropped by DropSegmentsBefore while a
// reader still had to open it makes that reader's Next return NotFound.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/file_system.h"
#include "common/result.h"

namespace kvo {

enum class FsyncPolicy {
  kNever,       // leave it to the OS (fastest; survives process crash once flushed, not power loss)
  kEveryBatch,  // fdatasync after every Append
  kInterval,    // fdatasync on Append when fsync_interval_ms has passed since the last sync
};

// "never" | "batch" | "interval"; anything else is InvalidArgument naming the value.
Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name);
std::string_view FsyncPolicyName(FsyncPolicy policy);

struct JournalOptions {
  std::string dir;                       // created (0700) when missing (unless read_only)
  uint64_t segment_bytes = 64ull << 20;  // roll to a new segment file past this size
  FsyncPolicy fsync = FsyncPolicy::kNever;
  int64_t fsync_interval_ms = 100;
  FileSystem* fs = nullptr;  // Default: DefaultFileSystem()
  Clock* clock = nullptr;    // Default: SystemClock(); only FsyncPolicy::kInterval reads it
  bool read_only = false;  // for inspection tools: never truncates or writes; stops at a torn tail
};

struct JournalRecord {
  uint64_t seq = 0;
  std::string payload;  // one msgpack EventBatch, exactly as published
};

// Format constants (schemas/journal_format.md).
inline constexpr char kJournalSegmentSuffix[] = ".kvj";
inline constexpr char kJournalSeqFloorPrefix[] = "seq-floor-";
inline constexpr uint32_t kJournalFormatVersion = 1;
inline constexpr size_t kJournalSegmentHeaderBytes = 32;
inline constexpr size_t kJournalRecordHeaderBytes = 20;
// Largest payload Append accepts; a larger length field on disk is corruption.
inline constexpr size_t kJournalMaxPayloadBytes = 256u << 20;

// The file name of the segment whose first record is `first_seq`: "%020llu.kvj".
std::string JournalSegmentName(uint64_t first_seq);
// The name of the floor file for `floor`: "seq-floor-%020llu".
std::string JournalSeqFloorName(uint64_t floor);
// The checksum stored in a record (XXH3-64 over its length, seq and payload fields).
uint64_t JournalRecordChecksum(uint64_t seq, std::string_view payload);

class JournalReader {
 public:
  virtual ~JournalReader() = default;
  // Fills *record with the next record (reusing its capacity); returns false at the end of the
  // journal as it was when the reader was created. A record failing its checksum is Corruption
  // naming the file and offset.
  virtual Result<bool> Next(JournalRecord* record) = 0;
};

class Journal {
 public:
  virtual ~Journal() = default;

  // Opens or creates the journal in options.dir, validating every record of every segment. A torn
  // tail of the last segment (a partial or checksum-failing record with no valid record after it)
  // is truncated and logged (read_only: left alone and not read). Anything else that fails to
  // parse -- a bad record followed by valid ones, a torn non-last segment, a wrong magic, version
  // or name, decreasing seqs -- is Corruption naming the file and offset.
  static Result<std::unique_ptr<Journal>> Open(const JournalOptions& options);

  // Appends one record. InvalidArgument when seq < seq_floor() (strictly increasing; gaps allowed)
  // or the payload exceeds kJournalMaxPayloadBytes; FailedPrecondition when read-only. After a
  // write error every later Append fails (reopen to recover).
  virtual Status Append(uint64_t seq, std::string_view payload) = 0;
  // Records, durably against a crash of this process (and against power loss unless the fsync
  // policy is kNever), that seqs below `seq` are used: seq_floor() is at least `seq` from now on
  // and after every reopen. A lower value is a no-op. Works after a write error (a rename of the
  // empty floor file); FailedPrecondition when read-only.
  virtual Status RaiseSeqFloor(uint64_t seq) = 0;
  // The lowest seq the next Append may take: 0 for a new journal.
  virtual uint64_t seq_floor() const = 0;
  // Hands buffered records to the OS (survives a crash of this process).
  virtual Status Flush() = 0;
  // Flush, then fdatasync the active segment (survives power loss).
  virtual Status Sync() = 0;

  virtual bool empty() const = 0;
  // Sequence numbers of the oldest and newest record kept. REQUIRES: !empty().
  virtual uint64_t first_seq() const = 0;
  virtual uint64_t last_seq() const = 0;
  // Number of segment files, and their total size in bytes (including buffered bytes).
  virtual size_t segment_count() const = 0;
  virtual uint64_t total_bytes() const = 0;

  // A reader positioned at the first record with seq >= from_seq. Flushes first, so the reader sees
  // every record appended before this call.
  virtual Result<std::unique_ptr<JournalReader>> NewReader(uint64_t from_seq) = 0;

  // Compaction hook: deletes whole segments whose records all have seq < seq, oldest first; never
  // the active (last) segment. FailedPrecondition when read-only.
  virtual Status DropSegmentsBefore(uint64_t seq) = 0;
};

}  // namespace kvo
