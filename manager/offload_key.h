// OffloadKey: what the offload manager stores a chunk under — vLLM's OffloadKey
// (vllm-compat.md B.4: the chunk's last block hash at tokens_per_hash granularity + group index).
// A compact value type (40 bytes): up to 32 raw hash bytes inline. Thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include "events/block_id.h"
#include "events/event.h"

namespace kvo {

class OffloadKey {
 public:
  static constexpr size_t kMaxHashBytes = 32;

  OffloadKey() = default;
  // A raw digest (sha256: 32 bytes, xxh3-128: 16). REQUIRES: digest.size() <= kMaxHashBytes.
  static OffloadKey FromDigest(std::string_view digest, uint32_t group);
  static OffloadKey FromDigest(const BlockDigest& digest, uint32_t group) {
    return FromDigest(std::string_view(digest.bytes()), group);
  }
  // A 64-bit wire hash (vLLM's default int form; Mooncake trace hash_ids), kept as the 8-byte
  // BlockDigest::FromLow64 so that FromDigest(last 8 bytes) and FromWireHash agree on Wire().
  static OffloadKey FromWireHash(uint64_t hash, uint32_t group) {
    return FromDigest(BlockDigest::FromLow64(hash), group);
  }

  std::string_view digest() const { return {reinterpret_cast<const char*>(bytes_.data()), len_}; }
  // The digest's kMaxHashBytes bytes of storage, zero past digest().size() (every constructor
  // keeps that padding), for fixed-width hashing and comparison.
  const uint8_t* padded_bytes() const { return bytes_.data(); }
  uint32_t group() const { return group_; }
  // The digest as the events module's identity type.
  BlockDigest Digest() const { return BlockDigest(std::string(digest())); }
  // vLLM's maybe_convert_block_hash: BlockDigest::Low64 of digest().
  uint64_t Wire() const { return BlockDigest::Low64(digest()); }
  // The hash as it goes into events: the u64 wire form (vLLM's default).
  BlockHash EventHash() const { return BlockHash::Uint(Wire()); }
  std::string Hex() const { return ToHex(digest()); }  // lowercase

  // vLLM's key bytes: digest + group.to_bytes(4, "big").
  std::string VllmBytes() const;

  friend bool operator==(const OffloadKey& a, const OffloadKey& b) {
    // The digest bytes past len_ are zero in every key, so comparing all 32 bytes (four words,
    // no library call) is the same as comparing the first len_.
    uint64_t diff = (a.len_ ^ b.len_) | (a.group_ ^ b.group_);
    for (size_t i = 0; i < kMaxHashBytes; i += 8) {
      uint64_t x, y;
      std::memcpy(&x, a.bytes_.data() + i, 8);
      std::memcpy(&y, b.bytes_.data() + i, 8);
      diff |= x ^ y;
    }
    return diff == 0;
  }
  size_t Hash() const;  // well mixed; digests are already random

 private:
  std::array<uint8_t, kMaxHashBytes> bytes_{};
  uint32_t group_ = 0;
  uint8_t len_ = 0;
};

struct OffloadKeyHash {
  size_t operator()(const OffloadKey& k) const { return k.Hash(); }
};

}  // namespace kvo
