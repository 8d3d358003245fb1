// Journal benchmarks: append throughput with fsync off, in block events per second, against a plain
// buffered write() of the same number of bytes (no framing, no checksum, no lock) in the same run;
// and replay (read) throughput against a plain read() of the same files.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "bench/bench.h"
#include "common/file_system.h"
#include "events/codec.h"
#include "events/journal.h"

namespace kvo::bench {
namespace {

constexpr uint64_t kSegmentBytes = 64ull << 20;
constexpr int kAppendsPerOp = 1024;

// One BlockStored batch of `blocks` blocks of 16 tokens. With `with_tokens` false it is the
// CPU-offload placeholder shape (vllm-compat.md A.3 example 4: no token ids), about 100 bytes for
// one block; with tokens, 16 blocks take about 1 KiB.
std::string MakePayload(int blocks, bool with_tokens) {
  EventBatch batch;
  batch.ts = 1700000000.25;
  batch.data_parallel_rank = 0;
  BlockStored stored;
  for (int b = 0; b < blocks; ++b) {
    stored.block_hashes.push_back(BlockHash::Uint(0x9e3779b97f4a7c15ull * (b + 1)));
    for (int t = 0; with_tokens && t < 16; ++t) {
      stored.token_ids.push_back(1000 + (b * 16 + t) * 37 % 60000);
    }
  }
  stored.parent_block_hash = BlockHash::Uint(0x0123'4567'89ab'cdefull);
  stored.block_size = with_tokens ? 16 : 0;
  stored.group_idx = 0;
  stored.medium = kMediumCpu;
  batch.events.emplace_back(std::move(stored));
  return EncodeBatch(batch);
}

// The baseline: the same bytes through a 64 KiB user-space buffer and write(), rolling to a new
// file every kSegmentBytes (and deleting the old one, as the journal bench compacts).
class PlainWriter {
 public:
  explicit PlainWriter(std::string dir) : dir_(std::move(dir)) { buf_.reserve(kBuffer); }
  ~PlainWriter() {
    FlushBuffer();
    if (fd_ >= 0) ::close(fd_);
  }

  bool Write(const char* data, size_t n) {
    if (fd_ < 0 || file_bytes_ >= kSegmentBytes) {
      if (!Roll()) return false;
    }
    file_bytes_ += n;
    if (buf_.size() + n > kBuffer && !FlushBuffer()) return false;
    buf_.append(data, n);
    return true;
  }

 private:
  static constexpr size_t kBuffer = 64 << 10;

  bool FlushBuffer() {
    size_t done = 0;
    while (done < buf_.size()) {
      ssize_t w = ::write(fd_, buf_.data() + done, buf_.size() - done);
      if (w < 0) return false;
      done += static_cast<size_t>(w);
    }
    buf_.clear();
    return true;
  }

  bool Roll() {
    if (fd_ >= 0) {
      FlushBuffer();
      ::close(fd_);
      std::remove(path_.c_str());
    }
    path_ = dir_ + "/plain." + std::to_string(files_++);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    file_bytes_ = 0;
    return fd_ >= 0;
  }

  std::string dir_;
  std::string path_;
  std::string buf_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  uint64_t files_ = 0;
};

int RunAppendCase(const BenchOptions& options, int blocks) {
  const std::string payload = MakePayload(blocks, /*with_tokens=*/blocks > 1);
  const std::string name = "journal_append_" + std::to_string(blocks) + "_block" +
                           (blocks == 1 ? "" : "s") + "_fsync_never";
  ScopedTempDir scratch("journal-bench");
  if (scratch.path().empty()) {
    std::fprintf(stderr, "%s: cannot create a directory under /tmp\n", name.c_str());
    return 1;
  }
  double seconds = options.seconds_per_case;

  JournalOptions jo;
  jo.dir = scratch.path() + "/journal";
  jo.segment_bytes = kSegmentBytes;
  jo.fsync = FsyncPolicy::kNever;
  auto opened = Journal::Open(jo);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), opened.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Journal> journal = std::move(opened).value();
  uint64_t seq = 0;
  bool failed = false;
  double journal_rate = MeasureRate(
      [&] {
        for (int i = 0; i < kAppendsPerOp; ++i) {
          if (!journal->Append(seq++, payload).ok()) failed = true;
        }
        // Compaction keeps the disk footprint at about two segments.
        if (seq % (64 * kAppendsPerOp) == 0 && seq > 1) {
          if (!journal->DropSegmentsBefore(seq - 1).ok()) failed = true;
        }
      },
      static_cast<double>(kAppendsPerOp) * blocks, seconds);
  if (!journal->Flush().ok()) failed = true;
  uint64_t journal_bytes = journal->total_bytes();
  journal.reset();
  if (failed) {
    std::fprintf(stderr, "%s: an append failed\n", name.c_str());
    return 1;
  }

  // Baseline: the same byte count per record (framing included), unframed, no checksum.
  const std::string same_bytes(payload.size() + kJournalRecordHeaderBytes, 'x');
  double plain_rate = 0;
  {
    PlainWriter plain(scratch.path());
    plain_rate = MeasureRate(
        [&] {
          for (int i = 0; i < kAppendsPerOp; ++i) {
            if (!plain.Write(same_bytes.data(), same_bytes.size())) failed = true;
          }
        },
        static_cast<double>(kAppendsPerOp) * blocks, seconds);
  }
  if (failed) {
    std::fprintf(stderr, "%s: a plain write failed\n", name.c_str());
    return 1;
  }

  BenchResult r;
  r.area = "journal";
  r.name = name;
  r.unit = "block_events/s";
  r.value = journal_rate;
  r.baseline_name = "buffered write() of the same bytes";
  r.baseline = plain_rate;
  r.target = 1e6;
  char notes[256];
  std::snprintf(notes, sizeof(notes),
                "%zu-byte payload, %zu bytes per record; %.2f M appends/s (%.0f ns each); "
                "%llu MiB kept after compaction",
                payload.size(), payload.size() + kJournalRecordHeaderBytes,
                journal_rate / blocks / 1e6, 1e9 * blocks / journal_rate,
                static_cast<unsigned long long>(journal_bytes >> 20));
  r.notes = notes;
  PrintResult(r, options);
  return 0;
}

int RunReplayCase(const BenchOptions& options) {
  const int blocks = 16;
  const std::string payload = MakePayload(blocks, /*with_tokens=*/true);
  const std::string name = "journal_replay_16_blocks";
  ScopedTempDir scratch("journal-bench");
  if (scratch.path().empty()) return 1;
  JournalOptions jo;
  jo.dir = scratch.path() + "/journal";
  jo.segment_bytes = 8ull << 20;
  auto opened = Journal::Open(jo);
  if (!opened.ok()) return 1;
  std::unique_ptr<Journal> journal = std::move(opened).value();
  const uint64_t records = options.quick ? 4096 : 32768;
  for (uint64_t s = 0; s < records; ++s) {
    if (!journal->Append(s, payload).ok()) return 1;
  }
  double seconds = options.seconds_per_case;
  bool failed = false;
  double replay_rate = MeasureRate(
      [&] {
        auto reader = journal->NewReader(0);
        if (!reader.ok()) {
          failed = true;
          return;
        }
        JournalRecord rec;
        uint64_t n = 0;
        while (true) {
          auto more = (*reader)->Next(&rec);
          if (!more.ok()) failed = true;
          if (!more.ok() || !*more) break;
          ++n;
        }
        if (n != records) failed = true;
      },
      static_cast<double>(records) * blocks, seconds);

  // Baseline: read() the same files front to back in 256 KiB chunks.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(jo.dir)) files.push_back(e.path());
  std::string buf(256 << 10, '\0');
  double read_rate = MeasureRate(
      [&] {
        for (const std::string& f : files) {
          int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
          if (fd < 0) {
            failed = true;
            return;
          }
          while (::read(fd, buf.data(), buf.size()) > 0) {
          }
          ::close(fd);
        }
      },
      static_cast<double>(records) * blocks, seconds);
  if (failed) {
    std::fprintf(stderr, "%s: replay failed\n", name.c_str());
    return 1;
  }
  BenchResult r;
  r.area = "journal";
  r.name = name;
  r.unit = "block_events/s";
  r.value = replay_rate;
  r.baseline_name = "read() of the same files";
  r.baseline = read_rate;
  r.notes = std::to_string(records) + " records of " + std::to_string(payload.size()) +
            " bytes, from the page cache, checksums verified";
  PrintResult(r, options);
  return 0;
}

}  // namespace

int RunJournalBench(const BenchOptions& options) {
  int rc = 0;
  rc |= RunAppendCase(options, 1);
  rc |= RunAppendCase(options, 16);
  rc |= RunReplayCase(options);
  return rc;
}

}  // namespace kvo::bench
