#include "manager/offload_key.h"

#include "common/check.h"

namespace kvo {

OffloadKey OffloadKey::FromDigest(std::string_view digest, uint32_t group) {
  KVO_CHECK(digest.size() <= kMaxHashBytes);
  OffloadKey k;
  std::memcpy(k.bytes_.data(), digest.data(), digest.size());
  k.len_ = static_cast<uint8_t>(digest.size());
  k.group_ = group;
  return k;
}

std::string OffloadKey::VllmBytes() const {
  std::string out(digest());
  for (int i = 3; i >= 0; --i) out += static_cast<char>(group_ >> (8 * i));
  return out;
}

size_t OffloadKey::Hash() const {
  // The last 8 digest bytes are uniformly random for real hashes; mix in length and group so
  // small synthetic ids (traces) spread too.
  uint64_t h = Wire() ^ (uint64_t{group_} << 32) ^ len_;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

}  // namespace kvo
