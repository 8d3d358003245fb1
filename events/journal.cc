// Journal writer: Open (validation and torn-tail recovery), Append, segment roll, fsync policy,
// readers over a flushed snapshot, and compaction. Format helpers and the reader live in
// journal_segment.cc.
#include "events/journal.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "events/journal_internal.h"

namespace kvo {

Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name) {
  if (name == "never") return FsyncPolicy::kNever;
  if (name == "batch") return FsyncPolicy::kEveryBatch;
  if (name == "interval") return FsyncPolicy::kInterval;
  return Status::InvalidArgument("unknown journal fsync policy '" + std::string(name) +
                                 "' (expected never, batch or interval)");
}

std::string_view FsyncPolicyName(FsyncPolicy policy) {
  switch (policy) {
    case FsyncPolicy::kNever:
      return "never";
    case FsyncPolicy::kEveryBatch:
      return "batch";
    case FsyncPolicy::kInterval:
      return "interval";
  }
  return "unknown";
}

namespace {

using journal_internal::ParsedRecord;
using journal_internal::SegmentScanner;

struct Segment {
  uint64_t base_seq = 0;  // from the file name; the seq of its first record
  std::string path;
  uint64_t size = 0;  // valid bytes, header included (buffered bytes too for the active one)
  uint64_t records = 0;
  uint64_t first_seq = 0;  // valid when records > 0
  uint64_t last_seq = 0;   // valid when records > 0
};

std::string AtOffset(const std::string& path, uint64_t offset) {
  return "journal segment '" + path + "' at offset " + std::to_string(offset);
}

class JournalImpl final : public Journal {
 public:
  explicit JournalImpl(const JournalOptions& options)
      : options_(options),
        fs_(options.fs != nullptr ? options.fs : DefaultFileSystem()),
        clock_(options.clock != nullptr ? options.clock : SystemClock()) {}

  ~JournalImpl() override {
    MutexLock lock(&mu_);
    if (writer_ == nullptr) return;
    Status s = error_;
    if (s.ok() && options_.fsync != FsyncPolicy::kNever) s = writer_->Sync();
    Status c = writer_->Close();
    if (s.ok()) s = c;
    if (!s.ok()) KVO_LOG_ERROR("journal '{}': closing: {}", options_.dir, s.ToString());
  }

  Status Load();

  Status Append(uint64_t seq, std::string_view payload) override {
    MutexLock lock(&mu_);
    if (options_.read_only) return Status::FailedPrecondition("journal opened read-only");
    if (!error_.ok()) return error_;
    if (payload.size() > kJournalMaxPayloadBytes) {
      return Status::InvalidArgument(
          "journal append: payload of " + std::to_string(payload.size()) +
          " bytes exceeds the maximum " + std::to_string(kJournalMaxPayloadBytes));
    }
    if (last_seq_.has_value() && seq <= *last_seq_) {
      return Status::InvalidArgument("journal append: seq " + std::to_string(seq) +
                                     " is not greater than the last seq " +
                                     std::to_string(*last_seq_));
    }
    if (seq < floor_) {
      return Status::InvalidArgument("journal append: seq " + std::to_string(seq) +
                                     " is below the sequence floor " + std::to_string(floor_) +
                                     " (seqs published unjournaled)");
    }
    uint64_t bytes = kJournalRecordHeaderBytes + payload.size();
    if (writer_ == nullptr ||
        (segments_.back().records > 0 && segments_.back().size + bytes > options_.segment_bytes)) {
      KVO_RETURN_IF_ERROR(Sticky(Roll(seq)));
    }
    journal_internal::EncodeRecord(seq, payload, &scratch_);
    KVO_RETURN_IF_ERROR(Sticky(writer_->Append(scratch_)));
    Segment& active = segments_.back();
    active.size += bytes;
    if (active.records++ == 0) active.first_seq = seq;
    active.last_seq = seq;
    last_seq_ = seq;
    switch (options_.fsync) {
      case FsyncPolicy::kNever:
        break;
      case FsyncPolicy::kEveryBatch:
        return Sticky(writer_->Sync());
      case FsyncPolicy::kInterval: {
        int64_t now = clock_->MonotonicNanos();
        if (now - last_sync_nanos_ >= options_.fsync_interval_ms * 1'000'000) {
          last_sync_nanos_ = now;
          return Sticky(writer_->Sync());
        }
        break;
      }
    }
    return Status::Ok();
  }

  Status Flush() override {
    MutexLock lock(&mu_);
    return FlushLocked();
  }

  Status Sync() override {
    MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    if (writer_ == nullptr) return Status::Ok();
    last_sync_nanos_ = clock_->MonotonicNanos();
    return Sticky(writer_->Sync());
  }

  Status RaiseSeqFloor(uint64_t seq) override {
    MutexLock lock(&mu_);
    if (options_.read_only) return Status::FailedPrecondition("journal opened read-only");
    if (seq <= floor_) return Status::Ok();
    const std::string to = JoinPath(options_.dir, JournalSeqFloorName(seq));
    Status s;
    if (floor_path_.empty()) {
      // Open could not create the floor file: create this one (which may fail on a full disk).
      s = CreateEmptyFile(to);
    } else {
      s = fs_->Rename(floor_path_, to);
    }
    if (s.ok() && options_.fsync != FsyncPolicy::kNever) s = fs_->SyncDir(options_.dir);
    if (!s.ok()) {
      return s.WithContext("journal '" + options_.dir + "': raising the sequence floor to " +
                           std::to_string(seq));
    }
    floor_ = seq;
    floor_path_ = to;
    return Status::Ok();
  }

  uint64_t seq_floor() const override {
    MutexLock lock(&mu_);
    return last_seq_.has_value() ? std::max(floor_, *last_seq_ + 1) : floor_;
  }

  bool empty() const override {
    MutexLock lock(&mu_);
    return !last_seq_.has_value();
  }

  uint64_t first_seq() const override {
    MutexLock lock(&mu_);
    KVO_CHECK(last_seq_.has_value());
    for (const Segment& s : segments_) {
      if (s.records > 0) return s.first_seq;
    }
    return 0;
  }

  uint64_t last_seq() const override {
    MutexLock lock(&mu_);
    KVO_CHECK(last_seq_.has_value());
    return *last_seq_;
  }

  size_t segment_count() const override {
    MutexLock lock(&mu_);
    return segments_.size();
  }

  uint64_t total_bytes() const override {
    MutexLock lock(&mu_);
    uint64_t total = 0;
    for (const Segment& s : segments_) total += s.size;
    return total;
  }

  Result<std::unique_ptr<JournalReader>> NewReader(uint64_t from_seq) override {
    std::vector<journal_internal::SegmentRef> refs;
    {
      MutexLock lock(&mu_);
      KVO_RETURN_IF_ERROR(FlushLocked());
      refs.reserve(segments_.size());
      for (const Segment& s : segments_) {
        if (s.records == 0) continue;
        refs.push_back({s.base_seq, s.path, s.size});
      }
    }
    return journal_internal::NewSnapshotReader(fs_, std::move(refs), from_seq);
  }

  Status DropSegmentsBefore(uint64_t seq) override {
    MutexLock lock(&mu_);
    if (options_.read_only) return Status::FailedPrecondition("journal opened read-only");
    size_t dropped = 0;
    Status s;
    while (segments_.size() - dropped > 1) {
      const Segment& seg = segments_[dropped];
      if (seg.records > 0 && seg.last_seq >= seq) break;
      s = fs_->Remove(seg.path);
      if (!s.ok()) break;
      ++dropped;
    }
    if (dropped > 0) {
      KVO_LOG_DEBUG("journal '{}': dropped {} segment(s) below seq {}", options_.dir, dropped, seq);
      segments_.erase(segments_.begin(), segments_.begin() + static_cast<ptrdiff_t>(dropped));
      if (s.ok() && options_.fsync != FsyncPolicy::kNever) s = fs_->SyncDir(options_.dir);
    }
    return s;
  }

 private:
  // Records a write failure so that every later write fails too: after a partial write the file
  // may end in a torn record, and appending after it would turn the tear into mid-file corruption.
  Status Sticky(Status s) EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!s.ok() && error_.ok()) {
      error_ = s.WithContext("journal '" + options_.dir + "' stopped after a write error");
    }
    return s;
  }

  Status FlushLocked() EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!error_.ok()) return error_;
    if (writer_ == nullptr) return Status::Ok();
    return Sticky(writer_->Flush());
  }

  // Closes the active segment and starts a new one whose first record will be `seq`.
  Status Roll(uint64_t seq) EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates one segment; `is_last` allows (and repairs) a torn tail.
  Status LoadSegment(Segment* seg, bool is_last, bool* remove) EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status OpenWriterOnLast() EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status CreateEmptyFile(const std::string& path) {
    auto f = fs_->NewAppendableFile(path, FileOptions{});
    return f.ok() ? (*f)->Close() : f.status();
  }
  // Removes `stale` floor files and creates the floor file when there is none.
  Status PrepareFloorFile(const std::vector<std::string>& stale) EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes [from, to) of a file.
  Result<std::string> ReadRange(const std::string& path, uint64_t from, uint64_t to);

  const JournalOptions options_;
  FileSystem* const fs_;
  Clock* const clock_;

  mutable Mutex mu_;
  std::vector<Segment> segments_ GUARDED_BY(mu_);  // ordered by base_seq; the last is active
  std::optional<uint64_t> last_seq_ GUARDED_BY(mu_);
  std::unique_ptr<WritableFile> writer_ GUARDED_BY(mu_);  // on segments_.back(), when open
  std::string scratch_ GUARDED_BY(mu_);                   // one framed record, capacity reused
  int64_t last_sync_nanos_ GUARDED_BY(mu_) = 0;
  Status error_ GUARDED_BY(mu_);
  uint64_t floor_ GUARDED_BY(mu_) = 0;      // from the floor file's name (0: none)
  std::string floor_path_ GUARDED_BY(mu_);  // the floor file; empty when there is none
};

Status JournalImpl::Roll(uint64_t seq) {
  if (writer_ != nullptr) {
    if (options_.fsync != FsyncPolicy::kNever) KVO_RETURN_IF_ERROR(writer_->Sync());
    KVO_RETURN_IF_ERROR(writer_->Close());
    writer_.reset();
  }
  Segment seg;
  seg.base_seq = seq;
  seg.path = JoinPath(options_.dir, JournalSegmentName(seq));
  KVO_ASSIGN_OR_RETURN(writer_, fs_->NewAppendableFile(seg.path, FileOptions{}));
  if (writer_->Size() != 0) {
    writer_.reset();
    return Status::AlreadyExists("journal segment '" + seg.path + "' already exists");
  }
  KVO_RETURN_IF_ERROR(writer_->Append(journal_internal::EncodeSegmentHeader(seq)));
  if (options_.fsync != FsyncPolicy::kNever) {
    KVO_RETURN_IF_ERROR(writer_->Sync());
    KVO_RETURN_IF_ERROR(fs_->SyncDir(options_.dir));
  }
  seg.size = kJournalSegmentHeaderBytes;
  segments_.push_back(std::move(seg));
  return Status::Ok();
}

Status JournalImpl::LoadSegment(Segment* seg, bool is_last, bool* remove) {
  *remove = false;
  // Bounded by the file's size, so that a corrupt length field never makes the scanner try to
  // read (and allocate) far beyond the end of the file.
  KVO_ASSIGN_OR_RETURN(uint64_t file_size, fs_->FileSize(seg->path));
  SegmentScanner scanner(fs_, seg->path, file_size);
  bool torn_header = false;
  KVO_RETURN_IF_ERROR(scanner.Open(seg->base_seq, is_last ? &torn_header : nullptr));
  if (torn_header) {
    // A crash between creating the segment and writing its header: nothing in it was ever valid.
    KVO_LOG_WARN("{}: segment header is torn (crash while creating it); {}", AtOffset(seg->path, 0),
                 options_.read_only ? "ignoring it" : "removing it");
    *remove = true;
    return Status::Ok();
  }
  while (true) {
    ParsedRecord r;
    KVO_ASSIGN_OR_RETURN(SegmentScanner::Outcome outcome, scanner.Next(&r));
    if (outcome == SegmentScanner::Outcome::kEnd) break;
    if (outcome == SegmentScanner::Outcome::kRecord) {
      uint64_t at = scanner.offset() - r.bytes;
      if (r.seq < seg->base_seq || (last_seq_.has_value() && r.seq <= *last_seq_)) {
        return Status::Corruption(AtOffset(seg->path, at) + ": record seq " +
                                  std::to_string(r.seq) + " is out of order (segment starts at " +
                                  std::to_string(seg->base_seq) + ", previous seq " +
                                  (last_seq_ ? std::to_string(*last_seq_) : "none") + ")");
      }
      if (seg->records++ == 0) seg->first_seq = r.seq;
      seg->last_seq = r.seq;
      last_seq_ = r.seq;
      continue;
    }
    // A bad record. Only the tail of the last segment may be torn, and only when nothing valid
    // follows the bad bytes; anything else would silently drop good data.
    uint64_t bad_at = scanner.offset();
    std::string where = AtOffset(seg->path, bad_at) + ": " + scanner.bad_reason();
    if (!is_last) return Status::Corruption(where + " (not the last segment)");
    KVO_ASSIGN_OR_RETURN(std::string tail, ReadRange(seg->path, bad_at, file_size));
    // A record after the damage has a seq above every seq before it, and at least the segment's.
    journal_internal::TailScan scan;
    if (!last_seq_.has_value() || *last_seq_ != std::numeric_limits<uint64_t>::max()) {
      scan = journal_internal::ScanTornTail(tail, last_seq_ ? *last_seq_ + 1 : seg->base_seq);
    }
    if (scan.verdict == journal_internal::TailVerdict::kValidRecordFollows) {
      return Status::Corruption(where + ", followed by valid records (seq " +
                                std::to_string(scan.found_seq) + " at offset " +
                                std::to_string(bad_at + scan.found_at) + ")");
    }
    if (scan.verdict == journal_internal::TailVerdict::kUndecided) {
      return Status::Corruption(
          where + ": the " + std::to_string(file_size - bad_at) +
          " bytes after it hold too many record-like headers to tell a torn tail from damaged "
          "records within bounded work; not truncated (move the segment away, or truncate it at "
          "offset " +
          std::to_string(bad_at) + " if nothing after it matters)");
    }
    seg->size = bad_at;
    if (seg->records == 0) {
      // Nothing valid in it: the segment goes, as an empty last segment does.
      KVO_LOG_WARN("{}; {} the segment (no complete record)", where,
                   options_.read_only ? "ignoring" : "removing");
      *remove = true;
    } else if (options_.read_only) {
      KVO_LOG_WARN("{}; torn tail of {} bytes not read (read-only)", where, file_size - bad_at);
    } else {
      KVO_LOG_WARN("{}; truncating a torn tail of {} bytes", where, file_size - bad_at);
      KVO_RETURN_IF_ERROR(fs_->Truncate(seg->path, bad_at));
    }
    return Status::Ok();
  }
  seg->size = scanner.offset();
  if (seg->records == 0 && is_last) *remove = true;  // crash right after a roll: header only
  return Status::Ok();
}

Result<std::string> JournalImpl::ReadRange(const std::string& path, uint64_t from, uint64_t to) {
  std::string out;
  if (from >= to) return out;
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, fs_->NewSequentialFile(path));
  KVO_RETURN_IF_ERROR(file->Skip(from));
  KVO_RETURN_IF_ERROR(file->Read(static_cast<size_t>(to - from), &out));
  return out;
}

Status JournalImpl::PrepareFloorFile(const std::vector<std::string>& stale) {
  for (const std::string& path : stale) {
    if (Status s = fs_->Remove(path); !s.ok()) {
      KVO_LOG_WARN("journal '{}': cannot remove an older sequence-floor file: {}", options_.dir,
                   s.ToString());
    }
  }
  if (!floor_path_.empty()) return Status::Ok();
  // Created empty now, while there may be room, so that raising the floor later is a rename. A
  // failure is not fatal: the journal works, and RaiseSeqFloor tries to create it then.
  const std::string path = JoinPath(options_.dir, JournalSeqFloorName(0));
  Status s = CreateEmptyFile(path);
  if (s.ok()) {
    floor_path_ = path;
  } else {
    KVO_LOG_WARN("journal '{}': cannot create the sequence-floor file: {}", options_.dir,
                 s.ToString());
  }
  return Status::Ok();
}

Status JournalImpl::OpenWriterOnLast() {
  Segment& seg = segments_.back();
  KVO_ASSIGN_OR_RETURN(writer_, fs_->NewAppendableFile(seg.path, FileOptions{}));
  if (writer_->Size() != seg.size) {
    writer_.reset();
    return Status::Internal("journal segment '" + seg.path + "' changed size while opening");
  }
  return Status::Ok();
}

Status JournalImpl::Load() {
  MutexLock lock(&mu_);
  if (options_.dir.empty()) return Status::InvalidArgument("journal: empty directory path");
  if (options_.segment_bytes == 0) {
    return Status::InvalidArgument("journal: segment_bytes must be positive");
  }
  if (options_.fsync == FsyncPolicy::kInterval && options_.fsync_interval_ms < 0) {
    return Status::InvalidArgument("journal: fsync_interval_ms must not be negative, got " +
                                   std::to_string(options_.fsync_interval_ms));
  }
  if (!options_.read_only) KVO_RETURN_IF_ERROR(fs_->CreateDirs(options_.dir, FileOptions{}));
  KVO_ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(options_.dir));
  std::vector<Segment> found;
  std::vector<std::string> floor_files;  // older floor files (a crash between create and rename)
  for (const std::string& name : names) {
    if (std::optional<uint64_t> floor = journal_internal::ParseSeqFloorName(name)) {
      std::string path = JoinPath(options_.dir, name);
      if (floor_path_.empty() || *floor > floor_) {
        if (!floor_path_.empty()) floor_files.push_back(std::move(floor_path_));
        floor_ = *floor;
        floor_path_ = std::move(path);
      } else {
        floor_files.push_back(std::move(path));
      }
      continue;
    }
    std::optional<uint64_t> base = journal_internal::ParseSegmentName(name);
    if (!base.has_value()) continue;  // not ours (e.g. a lock or notes file)
    Segment seg;
    seg.base_seq = *base;
    seg.path = JoinPath(options_.dir, name);
    found.push_back(std::move(seg));
  }
  std::sort(found.begin(), found.end(),
            [](const Segment& a, const Segment& b) { return a.base_seq < b.base_seq; });

  bool removed_any = false;
  for (size_t i = 0; i < found.size(); ++i) {
    Segment& seg = found[i];
    bool is_last = i + 1 == found.size();
    bool remove = false;
    KVO_RETURN_IF_ERROR(LoadSegment(&seg, is_last, &remove));
    if (!is_last && seg.records > 0 && seg.last_seq >= found[i + 1].base_seq) {
      return Status::Corruption(AtOffset(seg.path, seg.size) + ": last seq " +
                                std::to_string(seg.last_seq) + " overlaps the next segment '" +
                                found[i + 1].path + "'");
    }
    if (remove) {
      if (!options_.read_only) {
        KVO_RETURN_IF_ERROR(fs_->Remove(seg.path));
        removed_any = true;
      }
      continue;
    }
    segments_.push_back(std::move(seg));
  }
  if (removed_any && options_.fsync != FsyncPolicy::kNever) {
    KVO_RETURN_IF_ERROR(fs_->SyncDir(options_.dir));
  }
  if (!options_.read_only && !segments_.empty()) KVO_RETURN_IF_ERROR(OpenWriterOnLast());
  if (!options_.read_only) KVO_RETURN_IF_ERROR(PrepareFloorFile(floor_files));
  last_sync_nanos_ = clock_->MonotonicNanos();
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Journal>> Journal::Open(const JournalOptions& options) {
  auto journal = std::make_unique<JournalImpl>(options);
  KVO_RETURN_IF_ERROR(journal->Load());
  return std::unique_ptr<Journal>(std::move(journal));
}

}  // namespace kvo
