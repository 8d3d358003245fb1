// libFuzzer target: the fuzz input becomes a journal segment file; Journal::Open (read-only and
// read-write) and a reader over it must never crash, and whatever they return must be exactly the
// valid prefix of records of that file, each with a correct checksum (checked here with an
// independent parser over the file's bytes). Errors must be Corruption.
//
// The first input byte picks how the file is built, so that the fuzzer reaches deep states
// without having to forge checksums:
//   mode 0: the rest of the input is the whole file, named after the seq in its header bytes;
//   mode 1: a valid header for seq 0, then the rest of the input as raw record bytes;
//   mode 2: a valid header, then records framed here from (len, seq delta, payload) triples with
//           correct checksums (a zero delta makes a non-increasing seq), then the leftover input
//           as a raw tail; an optional bit flip lands inside the file.
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "events/journal.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
void Put64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void Put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// An independent encoder of the documented layout (schemas/journal_format.md).
std::string Header(uint64_t base) {
  std::string h("KVOJRNL", 8);
  Put32(&h, 1);
  Put32(&h, 0);
  Put64(&h, base);
  Put64(&h, XXH3_64bits(h.data(), h.size()));
  return h;
}
void Record(std::string* out, uint64_t seq, std::string_view payload) {
  std::string body;
  Put32(&body, static_cast<uint32_t>(payload.size()));
  Put64(&body, seq);
  body.append(payload);
  Put64(out, XXH3_64bits(body.data(), body.size()));
  out->append(body);
}

std::string g_root;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Reads every record through a reader from `from`; checks each against the file bytes at the
// position it must come from. Returns the records.
std::vector<kvo::JournalRecord> ReadAndVerify(kvo::Journal* journal, const std::string& file,
                                              uint64_t from) {
  std::vector<kvo::JournalRecord> out;
  auto reader = journal->NewReader(from);
  FUZZ_CHECK(reader.ok(), "%s", reader.status().ToString().c_str());
  size_t off = kvo::kJournalSegmentHeaderBytes;
  kvo::JournalRecord r;
  while (true) {
    auto more = (*reader)->Next(&r);
    FUZZ_CHECK(more.ok(), "%s", more.status().ToString().c_str());
    if (!*more) break;
    // Skip the records of the file below `from`, as the reader did.
    while (true) {
      FUZZ_CHECK(off + kvo::kJournalRecordHeaderBytes <= file.size(), "record past end of file");
      uint32_t len = Get32(file.data() + off + 8);
      FUZZ_CHECK(off + kvo::kJournalRecordHeaderBytes + len <= file.size(), "payload past end");
      uint64_t sum = XXH3_64bits(file.data() + off + 8, 12 + len);
      FUZZ_CHECK(sum == Get64(file.data() + off), "returned a record with a bad checksum");
      uint64_t seq = Get64(file.data() + off + 12);
      off += kvo::kJournalRecordHeaderBytes + len;
      if (seq < from) continue;
      FUZZ_CHECK(seq == r.seq, "seq %llu returned, file has %llu",
                 static_cast<unsigned long long>(r.seq), static_cast<unsigned long long>(seq));
      FUZZ_CHECK(std::string_view(file).substr(off - len, len) == r.payload, "payload differs");
      break;
    }
    FUZZ_CHECK(out.empty() || out.back().seq < r.seq, "seqs not increasing");
    out.push_back(r);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // torn tails are logged as warnings: expected here
  g_root = kvo_fuzz::MakeScratchRoot("journal");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const unsigned mode = static_cast<unsigned char>(in[0]) % 3;
  in.remove_prefix(1);

  std::string file;
  uint64_t base = 0;
  if (mode == 0) {
    file.assign(in);
    if (file.size() >= 24) base = Get64(file.data() + 16);
  } else if (mode == 1) {
    file = Header(0);
    file.append(in);
  } else {
    // [flip offset u16][flip mask u8] then (len u8, seq delta u8, payload) triples.
    if (in.size() < 3) return 0;
    size_t flip_at = static_cast<unsigned char>(in[0]) | (static_cast<unsigned char>(in[1]) << 8);
    unsigned char mask = static_cast<unsigned char>(in[2]);
    in.remove_prefix(3);
    base = 5;
    file = Header(base);
    uint64_t seq = base;
    while (in.size() >= 2) {
      size_t len = static_cast<unsigned char>(in[0]) % 64;
      uint64_t delta = static_cast<unsigned char>(in[1]);
      if (in.size() < 2 + len) break;
      Record(&file, seq, in.substr(2, len));
      seq += delta;
      in.remove_prefix(2 + len);
    }
    file.append(in);  // a raw (usually torn) tail
    if (mask != 0 && flip_at < file.size()) file[flip_at] ^= static_cast<char>(mask);
  }

  const std::string dir = g_root + "/j";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + kvo::JournalSegmentName(base);
  WriteFile(path, file);

  kvo::JournalOptions options;
  options.dir = dir;
  options.read_only = true;
  auto ro = kvo::Journal::Open(options);
  std::vector<kvo::JournalRecord> ro_records;
  if (ro.ok()) {
    ro_records = ReadAndVerify(ro->get(), file, 0);
    FUZZ_CHECK((*ro)->empty() == ro_records.empty(), "empty() disagrees with the reader");
    if (!ro_records.empty()) {
      FUZZ_CHECK((*ro)->first_seq() == ro_records.front().seq, "first_seq");
      FUZZ_CHECK((*ro)->last_seq() == ro_records.back().seq, "last_seq");
      // A seek to any seq returns the matching suffix.
      uint64_t from = ro_records[ro_records.size() / 2].seq - (ro_records.size() % 2);
      auto tail = ReadAndVerify(ro->get(), file, from);
      size_t skipped = ro_records.size() - tail.size();
      for (size_t i = 0; i < tail.size(); ++i) {
        FUZZ_CHECK(tail[i].seq == ro_records[skipped + i].seq, "seek returned other records");
      }
      FUZZ_CHECK(skipped == 0 || ro_records[skipped - 1].seq < from, "seek skipped too much");
    }
    FUZZ_CHECK(!(*ro)->Append(~uint64_t{0}, "x").ok(), "read-only append succeeded");
  } else {
    FUZZ_CHECK(ro.status().code() == kvo::StatusCode::kCorruption, "%s",
               ro.status().ToString().c_str());
  }
  std::string after_ro;
  {
    std::ifstream f(path, std::ios::binary);
    after_ro.assign(std::istreambuf_iterator<char>(f), {});
  }
  FUZZ_CHECK(after_ro == file, "a read-only open changed the file");

  options.read_only = false;
  auto rw = kvo::Journal::Open(options);
  FUZZ_CHECK(rw.ok() == ro.ok(), "read-only %s but read-write %s", ro.status().ToString().c_str(),
             rw.status().ToString().c_str());
  if (rw.ok()) {
    // Whatever Open truncated, the records kept are those a read-only open returned.
    std::string now;
    if (std::filesystem::exists(path)) {
      std::ifstream f(path, std::ios::binary);
      now.assign(std::istreambuf_iterator<char>(f), {});
    }
    auto rw_records = ReadAndVerify(rw->get(), now, 0);
    FUZZ_CHECK(rw_records.size() == ro_records.size(), "rw kept %zu records, ro read %zu",
               rw_records.size(), ro_records.size());
    uint64_t next = ro_records.empty() ? 0 : ro_records.back().seq + 1;
    if (next != 0) {  // a full u64 seq space leaves nothing to append
      kvo::Status s = (*rw)->Append(next, "appended");
      FUZZ_CHECK(s.ok(), "%s", s.ToString().c_str());
      auto reader = (*rw)->NewReader(next);
      FUZZ_CHECK(reader.ok(), "%s", reader.status().ToString().c_str());
      kvo::JournalRecord r;
      auto more = (*reader)->Next(&r);
      FUZZ_CHECK(more.ok() && *more && r.seq == next && r.payload == "appended",
                 "appended record not read back");
    }
    rw->reset();
    // And the repaired journal opens cleanly again.
    auto again = kvo::Journal::Open(options);
    FUZZ_CHECK(again.ok(), "%s", again.status().ToString().c_str());
  }
  return 0;
}
