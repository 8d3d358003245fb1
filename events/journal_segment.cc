// Journal segment format (schemas/journal_format.md), the buffered segment scanner and the reader.
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "events/journal_internal.h"

namespace kvo {

std::string JournalSegmentName(uint64_t first_seq) {
  char name[32];
  std::snprintf(name, sizeof(name), "%020llu%s", static_cast<unsigned long long>(first_seq),
                kJournalSegmentSuffix);
  return name;
}

std::string JournalSeqFloorName(uint64_t floor) {
  char name[40];
  std::snprintf(name, sizeof(name), "%s%020llu", kJournalSeqFloorPrefix,
                static_cast<unsigned long long>(floor));
  return name;
}

uint64_t JournalRecordChecksum(uint64_t seq, std::string_view payload) {
  std::string framed;
  journal_internal::EncodeRecord(seq, payload, &framed);
  return journal_internal::GetFixed64(framed.data());
}

namespace journal_internal {
namespace {

// Record header fields (offsets inside a record).
constexpr size_t kChecksumOffset = 0;
constexpr size_t kLengthOffset = 8;
constexpr size_t kSeqOffset = 12;
// Segment header fields.
constexpr size_t kVersionOffset = 8;
constexpr size_t kFlagsOffset = 12;
constexpr size_t kBaseSeqOffset = 16;
constexpr size_t kHeaderChecksumOffset = 24;

constexpr size_t kReadChunk = 64 << 10;

}  // namespace

uint64_t Checksum(const char* data, size_t n) { return XXH3_64bits(data, n); }

std::string EncodeSegmentHeader(uint64_t base_seq) {
  std::string h(kJournalSegmentHeaderBytes, '\0');
  std::memcpy(h.data(), kSegmentMagic, sizeof(kSegmentMagic));
  PutFixed32(h.data() + kVersionOffset, kJournalFormatVersion);
  PutFixed32(h.data() + kFlagsOffset, 0);
  PutFixed64(h.data() + kBaseSeqOffset, base_seq);
  PutFixed64(h.data() + kHeaderChecksumOffset, Checksum(h.data(), kHeaderChecksumOffset));
  return h;
}

Status CheckSegmentHeader(std::string_view header, const std::string& path,
                          uint64_t expected_base) {
  auto fail = [&](const std::string& why) {
    return Status::Corruption("journal segment '" + path + "' at offset 0: " + why);
  };
  if (header.size() < kJournalSegmentHeaderBytes) {
    return fail("truncated segment header (" + std::to_string(header.size()) + " of " +
                std::to_string(kJournalSegmentHeaderBytes) + " bytes)");
  }
  if (std::memcmp(header.data(), kSegmentMagic, sizeof(kSegmentMagic)) != 0) {
    return fail("not a kvo journal segment (bad magic)");
  }
  uint32_t version = GetFixed32(header.data() + kVersionOffset);
  if (version != kJournalFormatVersion) {
    return fail("unsupported journal format version " + std::to_string(version) +
                " (this build reads version " + std::to_string(kJournalFormatVersion) + ")");
  }
  if (GetFixed64(header.data() + kHeaderChecksumOffset) !=
      Checksum(header.data(), kHeaderChecksumOffset)) {
    return fail("segment header checksum mismatch");
  }
  uint32_t flags = GetFixed32(header.data() + kFlagsOffset);
  if (flags != 0) return fail("unknown segment flags " + std::to_string(flags));
  uint64_t base = GetFixed64(header.data() + kBaseSeqOffset);
  if (base != expected_base) {
    return fail("header says first seq " + std::to_string(base) + " but the file name says " +
                std::to_string(expected_base));
  }
  return Status::Ok();
}

bool IsHeaderPrefix(std::string_view prefix) {
  size_t n = std::min(prefix.size(), sizeof(kSegmentMagic));
  return prefix.size() < kJournalSegmentHeaderBytes &&
         std::memcmp(prefix.data(), kSegmentMagic, n) == 0;
}

namespace {
constexpr size_t kNameDigits = 20;

// Exactly 20 decimal digits that fit a u64.
std::optional<uint64_t> ParseDigits(std::string_view digits) {
  if (digits.size() != kNameDigits) return std::nullopt;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;  // > u64
  return v;
}
}  // namespace

std::optional<uint64_t> ParseSegmentName(std::string_view name) {
  std::string_view suffix(kJournalSegmentSuffix);
  if (name.size() != kNameDigits + suffix.size() || name.substr(kNameDigits) != suffix) {
    return std::nullopt;
  }
  return ParseDigits(name.substr(0, kNameDigits));
}

std::optional<uint64_t> ParseSeqFloorName(std::string_view name) {
  const std::string_view prefix(kJournalSeqFloorPrefix);
  if (!name.starts_with(prefix)) return std::nullopt;
  return ParseDigits(name.substr(prefix.size()));
}

void EncodeRecord(uint64_t seq, std::string_view payload, std::string* out) {
  out->resize(kJournalRecordHeaderBytes + payload.size());
  char* p = out->data();
  PutFixed32(p + kLengthOffset, static_cast<uint32_t>(payload.size()));
  PutFixed64(p + kSeqOffset, seq);
  if (!payload.empty()) std::memcpy(p + kJournalRecordHeaderBytes, payload.data(), payload.size());
  PutFixed64(p + kChecksumOffset, Checksum(p + kLengthOffset, out->size() - kLengthOffset));
}

ParseStatus ParseRecord(std::string_view data, ParsedRecord* record) {
  if (data.size() < kJournalRecordHeaderBytes) return ParseStatus::kTruncatedHeader;
  const char* p = data.data();
  uint32_t length = GetFixed32(p + kLengthOffset);
  if (length > kJournalMaxPayloadBytes) return ParseStatus::kTooLong;
  size_t total = kJournalRecordHeaderBytes + length;
  if (data.size() < total) return ParseStatus::kTruncatedPayload;
  if (GetFixed64(p + kChecksumOffset) != Checksum(p + kLengthOffset, total - kLengthOffset)) {
    return ParseStatus::kBadChecksum;
  }
  record->seq = GetFixed64(p + kSeqOffset);
  record->payload = data.substr(kJournalRecordHeaderBytes, length);
  record->bytes = total;
  return ParseStatus::kOk;
}

TailScan ScanTornTail(std::string_view tail, uint64_t min_seq) {
  TailScan out;
  const size_t n = tail.size();
  if (n < kJournalRecordHeaderBytes + 1) return out;
  const uint64_t budget = 16 * static_cast<uint64_t>(n) + (uint64_t{1} << 20);
  const char* p = tail.data();
  auto seq_at = [&](size_t o) { return GetFixed64(p + o + kSeqOffset); };
  // Whether the header at `o` could start a record the journal wrote after the damage: its length
  // fits (*end: where it would end) and its seq is in [min_seq, min_seq + kTailSeqWindow].
  auto plausible = [&](size_t o, uint64_t* end) {
    if (o + kJournalRecordHeaderBytes > n) return false;
    const uint32_t length = GetFixed32(p + o + kLengthOffset);
    if (length > kJournalMaxPayloadBytes) return false;
    *end = o + kJournalRecordHeaderBytes + uint64_t{length};
    if (*end > n) return false;
    const uint64_t seq = seq_at(o);
    return seq >= min_seq && seq - min_seq <= kTailSeqWindow;
  };
  // Checksums the candidate at `o`; true when that decided (a valid record, or the budget ran out).
  auto check = [&](size_t o) {
    const uint32_t length = GetFixed32(p + o + kLengthOffset);
    out.bytes_hashed += kJournalRecordHeaderBytes - kLengthOffset + uint64_t{length};
    ++out.candidates;
    if (out.bytes_hashed > budget) {
      out.verdict = TailVerdict::kUndecided;
      return true;
    }
    ParsedRecord r;
    if (ParseRecord(tail.substr(o), &r) != ParseStatus::kOk) return false;
    out.verdict = TailVerdict::kValidRecordFollows;
    out.found_at = o;
    out.found_seq = r.seq;
    return true;
  };
  uint64_t end = 0;
  // 1. Right after the bad record, when its length field is intact (damage in its checksum, seq or
  // payload): the next record the journal wrote starts there.
  {
    const uint32_t length = GetFixed32(p + kLengthOffset);
    const uint64_t next = kJournalRecordHeaderBytes + uint64_t{length};
    if (length <= kJournalMaxPayloadBytes && next < n && plausible(next, &end) && check(next)) {
      return out;
    }
  }
  // 2. Where the records after the damage must end: the end of the file; a torn last record (a
  // partial header, or a header whose seq follows); zero bytes to the end (a file extended by a
  // crash before its data landed). The last good record ends at one of these.
  size_t zeros_from = n;
  while (zeros_from > 0 && p[zeros_from - 1] == '\0') --zeros_from;
  for (size_t o = 1; o + kJournalRecordHeaderBytes <= n; ++o) {
    if (!plausible(o, &end)) continue;
    bool boundary = end == n || n - end < kJournalRecordHeaderBytes || end >= zeros_from;
    if (!boundary) {
      const uint64_t seq = seq_at(o), next_seq = seq_at(end);
      boundary = next_seq > seq && next_seq - seq <= kTailSeqWindow;
    }
    if (boundary && check(o)) return out;
  }
  return out;
}

SegmentScanner::SegmentScanner(FileSystem* fs, std::string path, uint64_t limit)
    : fs_(fs), path_(std::move(path)), limit_(limit) {}

void SegmentScanner::Reset(std::string path, uint64_t limit) {
  path_ = std::move(path);
  limit_ = limit;
  file_.reset();
  buf_.clear();
  pos_ = 0;
  buf_offset_ = 0;
  eof_ = false;
  bad_reason_.clear();
}

Status SegmentScanner::Open(uint64_t expected_base, bool* torn_header) {
  if (torn_header != nullptr) *torn_header = false;
  KVO_ASSIGN_OR_RETURN(file_, fs_->NewSequentialFile(path_));
  KVO_ASSIGN_OR_RETURN(size_t got, Fill(kJournalSegmentHeaderBytes));
  std::string_view header(buf_.data() + pos_, std::min(got, kJournalSegmentHeaderBytes));
  if (header.size() < kJournalSegmentHeaderBytes && torn_header != nullptr &&
      IsHeaderPrefix(header)) {
    *torn_header = true;
    return Status::Ok();
  }
  KVO_RETURN_IF_ERROR(CheckSegmentHeader(header, path_, expected_base));
  pos_ += kJournalSegmentHeaderBytes;
  return Status::Ok();
}

Result<size_t> SegmentScanner::Fill(size_t n) {
  size_t avail = buf_.size() - pos_;
  if (avail >= n || eof_) return avail;
  // Compact: keep only the unread bytes.
  if (pos_ > 0) {
    buf_.erase(0, pos_);
    buf_offset_ += pos_;
    pos_ = 0;
  }
  while (buf_.size() < n && !eof_) {
    uint64_t end = buf_offset_ + buf_.size();
    uint64_t room = limit_ > end ? limit_ - end : 0;
    size_t want = std::max(kReadChunk, n - buf_.size());
    want = static_cast<size_t>(std::min<uint64_t>(want, room));
    if (want == 0) {
      eof_ = true;
      break;
    }
    KVO_RETURN_IF_ERROR(file_->Read(want, &chunk_));
    if (chunk_.empty()) {
      eof_ = true;
      break;
    }
    buf_.append(chunk_);
  }
  return buf_.size();
}

SegmentScanner::Outcome SegmentScanner::Bad(std::string reason) {
  bad_reason_ = std::move(reason);
  return Outcome::kBad;
}

Result<SegmentScanner::Outcome> SegmentScanner::Next(ParsedRecord* record) {
  KVO_ASSIGN_OR_RETURN(size_t avail, Fill(kJournalRecordHeaderBytes));
  if (avail == 0) {
    if (limit_ != kNoLimit && offset() < limit_) {
      return Bad("file ends at offset " + std::to_string(offset()) + ", expected " +
                 std::to_string(limit_) + " bytes");
    }
    return Outcome::kEnd;
  }
  ParseStatus st = ParseRecord(std::string_view(buf_).substr(pos_), record);
  if (st == ParseStatus::kTruncatedPayload) {
    size_t total = kJournalRecordHeaderBytes + GetFixed32(buf_.data() + pos_ + kLengthOffset);
    KVO_ASSIGN_OR_RETURN(avail, Fill(total));
    st = ParseRecord(std::string_view(buf_).substr(pos_), record);
  }
  switch (st) {
    case ParseStatus::kOk:
      pos_ += record->bytes;
      return Outcome::kRecord;
    case ParseStatus::kTruncatedHeader:
      return Bad("truncated record header (" + std::to_string(avail) + " of " +
                 std::to_string(kJournalRecordHeaderBytes) + " bytes)");
    case ParseStatus::kTooLong:
      return Bad("record length " + std::to_string(GetFixed32(buf_.data() + pos_ + kLengthOffset)) +
                 " exceeds the maximum " + std::to_string(kJournalMaxPayloadBytes));
    case ParseStatus::kTruncatedPayload:
      return Bad("truncated record (" +
                 std::to_string(GetFixed32(buf_.data() + pos_ + kLengthOffset)) +
                 "-byte payload, " + std::to_string(avail - kJournalRecordHeaderBytes) +
                 " bytes present)");
    case ParseStatus::kBadChecksum:
      return Bad("record checksum mismatch");
  }
  return Bad("unknown parse status");
}

namespace {

class SnapshotReader final : public JournalReader {
 public:
  SnapshotReader(FileSystem* fs, std::vector<SegmentRef> segments, uint64_t from_seq)
      : segments_(std::move(segments)), from_seq_(from_seq), scanner_(fs, "", 0) {
    // The last segment whose first seq is <= from_seq holds it (or the first one, when older).
    auto it = std::upper_bound(segments_.begin(), segments_.end(), from_seq,
                               [](uint64_t s, const SegmentRef& r) { return s < r.base_seq; });
    index_ = it == segments_.begin() ? 0 : static_cast<size_t>(it - segments_.begin()) - 1;
  }

  Result<bool> Next(JournalRecord* out) override {
    while (true) {
      if (!open_) {
        if (index_ >= segments_.size()) return false;
        const SegmentRef& seg = segments_[index_];
        scanner_.Reset(seg.path, seg.size);
        Status s = scanner_.Open(seg.base_seq);
        if (!s.ok()) {
          if (s.code() == StatusCode::kNotFound) {
            return Status::NotFound("journal segment '" + seg.path +
                                    "' was dropped before this reader reached it: " + s.message());
          }
          return s;
        }
        open_ = true;
      }
      ParsedRecord r;
      KVO_ASSIGN_OR_RETURN(SegmentScanner::Outcome outcome, scanner_.Next(&r));
      switch (outcome) {
        case SegmentScanner::Outcome::kRecord:
          if (r.seq < from_seq_) continue;
          out->seq = r.seq;
          out->payload.assign(r.payload.data(), r.payload.size());
          return true;
        case SegmentScanner::Outcome::kEnd:
          open_ = false;
          ++index_;
          continue;
        case SegmentScanner::Outcome::kBad:
          return Status::Corruption("journal segment '" + scanner_.path() + "' at offset " +
                                    std::to_string(scanner_.offset()) + ": " +
                                    scanner_.bad_reason());
      }
    }
  }

 private:
  std::vector<SegmentRef> segments_;
  uint64_t from_seq_;
  size_t index_ = 0;
  bool open_ = false;  // scanner_ is positioned inside segments_[index_]
  SegmentScanner scanner_;
};

}  // namespace

std::unique_ptr<JournalReader> NewSnapshotReader(FileSystem* fs, std::vector<SegmentRef> segments,
                                                 uint64_t from_seq) {
  return std::make_unique<SnapshotReader>(fs, std::move(segments), from_seq);
}

}  // namespace journal_internal
}  // namespace kvo
