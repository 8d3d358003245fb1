// Journal: kvo's durable event store. Append-only segmented files of length-prefixed, checksummed
// records; each record is one encoded EventBatch with its sequence number. Crash-safe: a torn or
// corrupt tail is detected on Open and truncated, never returned.
//
// Thread-safety: Journal methods may be called from any thread (internally serialised).
// A JournalReader is owned by one thread and reads a consistent prefix of the journal.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/file_system.h"
#include "common/result.h"

namespace kvo {

enum class FsyncPolicy {
  kNever,       // leave it to the OS (fastest; survives process crash, not power loss)
  kEveryBatch,  // fdatasync after every Append
  kInterval,    // fdatasync when fsync_interval_ms has passed since the last sync
};

// "never" | "batch" | "interval"; anything else is InvalidArgument naming the value.
Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name);

struct JournalOptions {
  std::string dir;                         // created (0700) when missing
  uint64_t segment_bytes = 64ull << 20;    // roll to a new segment file past this size
  FsyncPolicy fsync = FsyncPolicy::kNever;
  int64_t fsync_interval_ms = 100;
  FileSystem* fs = nullptr;                // Default: DefaultFileSystem()
  bool read_only = false;                  // for inspection tools: never truncates or writes
};

struct JournalRecord {
  uint64_t seq = 0;
  std::string payload;  // one msgpack EventBatch, exactly as published
};

class JournalReader {
 public:
  virtual ~JournalReader() = default;
  // Fills *record with the next record; returns false at the end of the journal.
  virtual Result<bool> Next(JournalRecord* record) = 0;
};

class Journal {
 public:
  virtual ~Journal() = default;

  // Opens or creates the journal in options.dir, validating every segment; a torn or corrupt tail
  // of the last segment is truncated (and logged). Corruption in the middle is an error.
  static Result<std::unique_ptr<Journal>> Open(const JournalOptions& options);

  // REQUIRES: seq > last_seq() when the journal is not empty (strictly increasing; gaps allowed).
  virtual Status Append(uint64_t seq, std::string_view payload) = 0;
  virtual Status Sync() = 0;

  virtual bool empty() const = 0;
  // Sequence numbers of the oldest and newest record kept. REQUIRES: !empty().
  virtual uint64_t first_seq() const = 0;
  virtual uint64_t last_seq() const = 0;

  // A reader positioned at the first record with seq >= from_seq.
  virtual Result<std::unique_ptr<JournalReader>> NewReader(uint64_t from_seq) = 0;

  // Compaction hook: deletes whole segments whose records all have seq < seq.
  virtual Status DropSegmentsBefore(uint64_t seq) = 0;
};

}  // namespace kvo
