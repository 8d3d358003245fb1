// libFuzzer target: the file tier's integrity record (transfer/fs_file.h: "kvo2" | u32 flags 0 |
// u64 length | u64 XXH3-64 | u64 block identity, little-endian; version 1 "kvo1" without the
// identity is still read), from the bytes and from disk. Input: [mode][record bytes][body]; mode
// picks the record's length (0..31 or 32 bytes, or none) and whether it starts as
// the body's true record (then XORed with the fuzz bytes). The block and its sidecar are written
// to a temp directory and read back through VerifyFile and ReadFileVerified (the tier's read
// path). Checks: DecodeRecord accepts exactly the documented layout and EncodeRecord gives the
// same bytes back; both readers agree with an independent check of the record (no record: ok
// unverified, or corrupt when required; valid and matching, identity included: ok verified, a
// version-1 record only when not required; anything else: corrupt); a corrupt file is removed when
// asked; WriteFileAtomic's own output reads back verified (mode bits 0x18 set).
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/hex.h"
#include "tests/fuzz/fuzz_check.h"
#include "transfer/fs_file.h"

namespace fsi = kvo::fs_internal;

namespace {

std::string g_root;
// The identity the reader expects for the block name used below (any fixed value will do: the
// reader compares, it does not recompute).
constexpr uint64_t kIdentity = 0x6b766f2e626c6b31ULL;

uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void WriteRaw(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_root = kvo_fuzz::MakeScratchRoot("fsrecord");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 16)) return 0;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const unsigned char mode = static_cast<unsigned char>(in[0]);
  in.remove_prefix(1);

  // The record parser alone, on the whole input: version 2 (32 bytes, "kvo2") or version 1 (24
  // bytes, "kvo1"), zero flags, and nothing else.
  if (std::optional<fsi::IntegrityRecord> r = fsi::DecodeRecord(in)) {
    const bool v2 = in.size() == fsi::kRecordBytes && in.substr(0, 4) == "kvo2";
    const bool v1 = in.size() == fsi::kRecordBytesV1 && in.substr(0, 4) == "kvo1";
    FUZZ_CHECK((v1 || v2) && in.substr(4, 4) == std::string_view("\0\0\0\0", 4),
               "DecodeRecord accepted %zu bytes", in.size());
    FUZZ_CHECK(r->version == (v2 ? 2u : 1u), "version");
    FUZZ_CHECK(r->length == Get64(in.data() + 8) && r->xxh3 == Get64(in.data() + 16), "fields");
    FUZZ_CHECK(!v2 || r->identity == Get64(in.data() + 24), "identity");
    FUZZ_CHECK(fsi::EncodeRecord(*r) == in, "EncodeRecord(DecodeRecord(x)) != x");
  }

  const bool has_record = (mode & 0x40) == 0;
  const size_t record_len = (mode & 0x20) ? fsi::kRecordBytes : (mode & 0x1f);
  if (in.size() < record_len) return 0;
  std::string record(in.substr(0, has_record ? record_len : 0));
  std::string_view body = in.substr(has_record ? record_len : 0);
  const uint64_t sum = XXH3_64bits(body.data(), body.size());
  if (has_record && (mode & 0x80)) {  // start from the true record: near-valid
    std::string truth = fsi::EncodeRecord({2, body.size(), sum, kIdentity});
    for (size_t i = 0; i < record.size() && i < truth.size(); ++i) truth[i] ^= record[i];
    record = truth;
  }
  // The independent verdict.
  const bool v2 = record.size() == 32 && record.compare(0, 8, std::string("kvo2\0\0\0\0", 8)) == 0;
  const bool v1 = record.size() == 24 && record.compare(0, 8, std::string("kvo1\0\0\0\0", 8)) == 0;
  const bool matches = (v1 || v2) && Get64(record.data() + 8) == body.size() &&
                       Get64(record.data() + 16) == sum &&
                       (!v2 || Get64(record.data() + 24) == kIdentity);

  const std::string dir_path = g_root + "/d";
  std::error_code ec;
  std::filesystem::remove_all(dir_path, ec);
  std::filesystem::create_directories(dir_path);
  auto dir = fsi::OpenRootDir(dir_path);
  FUZZ_CHECK(dir.ok(), "%s", dir.status().ToString().c_str());
  const std::string name = std::string(kvo::kHexDigits) + ".bin";
  auto place = [&] {
    WriteRaw(dir_path + "/" + name, body);
    if (has_record) WriteRaw(dir_path + "/" + name + fsi::kSidecarSuffix, record);
  };

  place();
  fsi::VerifyOptions vo;
  vo.checksum = fsi::ChecksumStore::kSidecar;
  vo.identity = kIdentity;
  auto v = fsi::VerifyFile(*dir, name, vo);
  FUZZ_CHECK(v.ok(), "%s", v.status().ToString().c_str());
  if (!has_record) {
    FUZZ_CHECK(v->outcome == fsi::ReadOutcome::kOk && !v->verified, "no record: %s",
               v->detail.c_str());
  } else if (matches) {
    FUZZ_CHECK(v->outcome == fsi::ReadOutcome::kOk && v->verified, "a matching record refused: %s",
               v->detail.c_str());
  } else {
    FUZZ_CHECK(v->outcome == fsi::ReadOutcome::kCorrupt, "a bad record accepted");
    FUZZ_CHECK_MESSAGE(v->detail);
  }

  for (bool require : {false, true}) {
    place();
    std::vector<char> buf(body.size() + 1);
    fsi::ReadOptions opts;
    opts.checksum = fsi::ChecksumStore::kSidecar;
    opts.require_checksum = require;
    opts.remove_corrupt = true;
    opts.identity = kIdentity;
    auto r = fsi::ReadFileVerified(*dir, name, buf.data(), body.size(), opts);
    FUZZ_CHECK(r.ok(), "%s", r.status().ToString().c_str());
    // require_checksum: only a version-2 record (one that names the block) is enough.
    const bool ok = has_record ? matches && (v2 || !require) : !require;
    FUZZ_CHECK((r->outcome == fsi::ReadOutcome::kOk) == ok, "outcome %d, expected ok=%d (%s)",
               static_cast<int>(r->outcome), ok, r->detail.c_str());
    if (ok) {
      FUZZ_CHECK(std::memcmp(buf.data(), body.data(), body.size()) == 0, "read other bytes");
      FUZZ_CHECK(r->verified == has_record, "verified");
    } else {
      FUZZ_CHECK_MESSAGE(r->detail);
      FUZZ_CHECK(!std::filesystem::exists(dir_path + "/" + name), "a corrupt file was kept");
    }
  }

  // The writer's own output reads back verified (for a quarter of the inputs: it syncs).
  if ((mode & 0x18) != 0x18) return 0;
  std::filesystem::remove_all(dir_path, ec);
  std::filesystem::create_directories(dir_path);
  auto dir2 = fsi::OpenRootDir(dir_path);
  FUZZ_CHECK(dir2.ok(), "%s", dir2.status().ToString().c_str());
  fsi::WriteOptions wo;
  wo.checksum = fsi::ChecksumStore::kSidecar;
  wo.identity = kIdentity;
  auto w = fsi::WriteFileAtomic(*dir2, name, body.data(), body.size(), wo);
  FUZZ_CHECK(w.ok() && *w == fsi::WriteOutcome::kWritten, "%s", w.status().ToString().c_str());
  std::vector<char> buf(body.size() + 1);
  fsi::ReadOptions ro;
  ro.checksum = fsi::ChecksumStore::kSidecar;
  ro.require_checksum = true;
  ro.identity = kIdentity;
  auto r = fsi::ReadFileVerified(*dir2, name, buf.data(), body.size(), ro);
  FUZZ_CHECK(r.ok() && r->outcome == fsi::ReadOutcome::kOk && r->verified,
             "the writer's file does not verify");
  return 0;
}
