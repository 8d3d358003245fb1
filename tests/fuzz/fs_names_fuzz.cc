// libFuzzer target: the file tier's on-disk names (transfer/fs_namespace.h), what `kvo fs scan`,
// the tier's recovery scan and fs_inspect read back from directory entries: rank directories
// "<ns>_r<rank>", "<hex[0:3]>", "<hex[3:5]>_g<group>" and "<hex>.bin". Never a crash. Whatever a
// parser accepts is canonical (rendering what it parsed gives the same name back) and safe as a
// path component; a key made from the input (hex or raw digest) gives a relative path that the
// parsers read back to the same key, rank and namespace.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "transfer/fs_namespace.h"

namespace {

bool SafeComponent(std::string_view s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         s.find('\0') == std::string_view::npos;
}

bool LowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void CheckName(std::string_view name) {
  std::string ns;
  if (std::optional<uint32_t> rank = kvo::ParseRankDirName(name, &ns)) {
    FUZZ_CHECK(ns + "_r" + std::to_string(*rank) == name, "rank dir '%s' is not canonical",
               kvo_fuzz::Preview(name).c_str());
  }
  if (kvo::ParseDir1Name(name)) {
    FUZZ_CHECK(name.size() == 3 && LowerHex(name), "dir1 '%s'", kvo_fuzz::Preview(name).c_str());
  }
  std::string two;
  if (std::optional<uint32_t> group = kvo::ParseDir2Name(name, &two)) {
    auto key = kvo::MakeFsBlockKey("000" + two + "0", *group);
    FUZZ_CHECK(key.ok(), "dir2 '%s' two hex '%s'", kvo_fuzz::Preview(name).c_str(), two.c_str());
    FUZZ_CHECK(kvo::FsBlockDir2(*key) == name, "dir2 '%s' is not canonical",
               kvo_fuzz::Preview(name).c_str());
  }
  if (std::optional<std::string> hex = kvo::ParseBlockFileName(name)) {
    FUZZ_CHECK(kvo::ValidateBlockHex(*hex).ok() && LowerHex(*hex), "hex '%s'",
               kvo_fuzz::Preview(*hex).c_str());
    auto key = kvo::MakeFsBlockKey(*hex, 0);
    FUZZ_CHECK(key.ok() && kvo::FsBlockFileName(*key) == name, "file '%s' is not canonical",
               kvo_fuzz::Preview(name).c_str());
  }
}

void CheckKey(const kvo::FsBlockKey& key, uint32_t rank) {
  const std::string ns = "model_0123456789ab";
  const std::string path = kvo::FsBlockRelativePath(ns, rank, key);
  std::vector<std::string> parts;
  for (size_t pos = 0;;) {
    size_t slash = path.find('/', pos);
    parts.push_back(path.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos));
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  FUZZ_CHECK(parts.size() == 4, "path '%s' has %zu components", path.c_str(), parts.size());
  for (const std::string& p : parts) FUZZ_CHECK(SafeComponent(p), "component '%s'", p.c_str());
  std::string parsed_ns;
  FUZZ_CHECK(kvo::ParseRankDirName(parts[0], &parsed_ns) == rank && parsed_ns == ns, "rank dir");
  FUZZ_CHECK(kvo::ParseDir1Name(parts[1]), "dir1 '%s'", parts[1].c_str());
  std::string two;
  FUZZ_CHECK(kvo::ParseDir2Name(parts[2], &two) == key.group, "dir2 '%s'", parts[2].c_str());
  FUZZ_CHECK(parts[1] + two == key.hex.substr(0, 5), "dirs do not hold the hash's prefix");
  FUZZ_CHECK(kvo::ParseBlockFileName(parts[3]) == key.hex, "file '%s'", parts[3].c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  CheckName(input);
  // Group and rank from the input's last bytes: any u32.
  uint32_t group = 0;
  for (size_t i = size > 4 ? size - 4 : 0; i < size; ++i) group = (group << 8) | data[i];
  const uint32_t rank = group ^ 0x5a5a5a5a;
  auto from_hex = kvo::MakeFsBlockKey(input, group);
  if (from_hex.ok()) {
    CheckKey(*from_hex, rank);
  } else {
    FUZZ_CHECK_MESSAGE(from_hex.status().message());
  }
  auto from_digest = kvo::FsBlockKeyFromDigest(input, group);
  if (from_digest.ok()) {
    FUZZ_CHECK(size >= 3 && size <= 64, "a %zu-byte digest accepted", size);
    CheckKey(*from_digest, rank);
  } else {
    FUZZ_CHECK_MESSAGE(from_digest.status().message());
  }
  return 0;
}
