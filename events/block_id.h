// A block's identity: the raw digest vLLM's hash chain produces (sha256: 32 bytes, xxh3-128: 16),
// with the one implementation of its 64-bit wire form (Low64) and of its hex form. Every other
// representation of a block hash in the tree (BlockHash, OffloadKey, the file tier's key, the
// indexer's u64) is built from or converted through these. Value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common/hex.h"
#include "common/result.h"

namespace kvo {

class BlockDigest {
 public:
  BlockDigest() = default;
  explicit BlockDigest(std::string bytes) : bytes_(std::move(bytes)) {}

  // vLLM's maybe_convert_block_hash (the int wire form, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1):
  // the last 8 bytes of `digest` as a big-endian u64 (fewer bytes, e.g. a short test digest, are
  // taken as they are; an empty digest is 0). The only implementation of the low-64 form.
  static uint64_t Low64(std::string_view digest) {
    const size_t n = digest.size() < 8 ? digest.size() : 8;
    uint64_t v = 0;
    for (size_t i = digest.size() - n; i < digest.size(); ++i) {
      v = (v << 8) | static_cast<uint8_t>(digest[i]);
    }
    return v;
  }
  // The 8-byte digest whose Low64() is `wire` (a wire hash or a trace's hash id used as a key).
  static BlockDigest FromLow64(uint64_t wire) {
    std::string b(8, '\0');
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<char>(wire >> (56 - 8 * i));
    return BlockDigest(std::move(b));
  }
  // From hex digits (either case); odd length or a non-hex character is InvalidArgument.
  static Result<BlockDigest> FromHex(std::string_view hex) {
    KVO_ASSIGN_OR_RETURN(std::string raw, ParseHex(hex));
    return BlockDigest(std::move(raw));
  }

  uint64_t Low64() const { return Low64(bytes_); }
  std::string ToHex() const { return ::kvo::ToHex(bytes_); }  // lowercase
  const std::string& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  bool empty() const { return bytes_.empty(); }

  friend bool operator==(const BlockDigest&, const BlockDigest&) = default;

 private:
  std::string bytes_;
};

}  // namespace kvo
