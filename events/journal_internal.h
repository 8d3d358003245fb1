// Internals of the journal shared by the writer (journal.cc) and the reader
// (journal_segment.cc): byte layout helpers and a buffered segment scanner. Not part of the public
// API; see schemas/journal_format.md for the layout.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/file_system.h"
#include "common/result.h"
#include "events/journal.h"

namespace kvo::journal_internal {

inline constexpr char kSegmentMagic[8] = {'K', 'V', 'O', 'J', 'R', 'N', 'L', '\0'};
inline constexpr uint64_t kNoLimit = ~uint64_t{0};

inline void PutFixed32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void PutFixed64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline uint32_t GetFixed32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
inline uint64_t GetFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// XXH3-64 of `n` bytes.
uint64_t Checksum(const char* data, size_t n);

// The 32-byte header of the segment whose first record is `base_seq`.
std::string EncodeSegmentHeader(uint64_t base_seq);
// Validates a complete segment header read from `path`; Corruption naming the file otherwise.
Status CheckSegmentHeader(std::string_view header, const std::string& path, uint64_t expected_base);
// True when `prefix` (shorter than a header) could be the start of a segment header: a crash
// between creating a segment and writing its header leaves such a file.
bool IsHeaderPrefix(std::string_view prefix);
// Parses "<20 digits>.kvj"; nullopt for any other name.
std::optional<uint64_t> ParseSegmentName(std::string_view name);
// Parses "seq-floor-<20 digits>"; nullopt for any other name.
std::optional<uint64_t> ParseSeqFloorName(std::string_view name);

// Frames one record (header + payload) into *out, replacing its contents and reusing capacity.
void EncodeRecord(uint64_t seq, std::string_view payload, std::string* out);

enum class ParseStatus { kOk, kTruncatedHeader, kTooLong, kTruncatedPayload, kBadChecksum };
struct ParsedRecord {
  uint64_t seq = 0;
  std::string_view payload;
  size_t bytes = 0;  // header + payload
};
// Parses the record at the start of `data`.
ParseStatus ParseRecord(std::string_view data, ParsedRecord* record);
// Deciding whether bytes that fail to parse as a record are a torn tail (garbage to the end of the
// file, truncated) or corruption in the middle (valid records follow them, so truncating would drop
// good data). `tail` holds the bytes from the bad record's first byte to the end of the file.
//
// Linear in tail.size(): a candidate record (a header at any offset > 0 whose length fits and
// whose seq is in [min_seq, min_seq + kTailSeqWindow]) is checksummed only where a record written
// by the journal could sit: right after the bad record (its length field intact), or where the
// records after the damage must end -- the end of the file, the start of a torn last record (a
// partial header, or a header whose seq follows the candidate's by at most kTailSeqWindow), or
// zero bytes to the end. Random junk almost never offers such a candidate; junk that offers many
// is refused once the checksummed bytes exceed 16 per tail byte + 1 MiB (kUndecided: never
// truncated).
enum class TailVerdict {
  kTorn,                // nothing valid follows: truncate at the bad record
  kValidRecordFollows,  // corruption in the middle
  kUndecided,           // the work budget ran out: treat as corruption, never truncate
};
inline constexpr uint64_t kTailSeqWindow = uint64_t{1} << 32;
struct TailScan {
  TailVerdict verdict = TailVerdict::kTorn;
  uint64_t found_at = 0;      // offset in `tail` of the valid record (kValidRecordFollows)
  uint64_t found_seq = 0;     // its seq
  uint64_t bytes_hashed = 0;  // bytes checksummed while deciding (the work; tests bound it)
  uint64_t candidates = 0;    // records checksummed
};
TailScan ScanTornTail(std::string_view tail, uint64_t min_seq);

// Reads the records of one segment file front to back through a buffer, never past `limit` bytes.
class SegmentScanner {
 public:
  enum class Outcome { kRecord, kEnd, kBad };

  SegmentScanner(FileSystem* fs, std::string path, uint64_t limit = kNoLimit);

  // Points the scanner at another file (call Open next), keeping its buffers' capacity.
  void Reset(std::string path, uint64_t limit);

  // Opens the file and reads its header. Sets *torn_header (when given) and returns Ok when the
  // file is shorter than a header but a prefix of one; otherwise a short or wrong header is
  // Corruption naming the file.
  Status Open(uint64_t expected_base, bool* torn_header = nullptr);

  // kRecord: *record is filled (its payload view lives until the next call) and offset() is past
  // it. kEnd: the file (or limit) ends exactly after the previous record. kBad: the bytes at
  // offset() are not a valid record; bad_reason() says why. I/O errors are returned as Status.
  Result<Outcome> Next(ParsedRecord* record);

  uint64_t offset() const { return buf_offset_ + pos_; }
  const std::string& bad_reason() const { return bad_reason_; }
  const std::string& path() const { return path_; }

 private:
  // Makes at least `n` bytes available at pos_ unless the file or the limit ends first; returns
  // how many are available (<= n is not guaranteed; >= n when possible).
  Result<size_t> Fill(size_t n);
  Outcome Bad(std::string reason);

  FileSystem* fs_;
  std::string path_;
  uint64_t limit_;
  std::unique_ptr<SequentialFile> file_;
  std::string buf_;
  std::string chunk_;
  size_t pos_ = 0;           // next unread byte in buf_
  uint64_t buf_offset_ = 0;  // file offset of buf_[0]
  bool eof_ = false;
  std::string bad_reason_;
};

// One segment as seen by a reader: its file, first seq (= name) and readable size.
struct SegmentRef {
  uint64_t base_seq = 0;
  std::string path;
  uint64_t size = 0;
};

// A reader over a snapshot of segments; positioned at the first record with seq >= from_seq.
std::unique_ptr<JournalReader> NewSnapshotReader(FileSystem* fs, std::vector<SegmentRef> segments,
                                                 uint64_t from_seq);

}  // namespace kvo::journal_internal
