// Internal helpers shared by the ZeroMQ publisher and subscriber (not part of the public API).
#pragma once

#include <zmq.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvo::zmq_util {

// The process-wide context, like pyzmq's zmq.Context.instance(). Never destroyed.
zmq::context_t& GlobalContext();

inline std::string BigEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (56 - 8 * i));
  return out;
}

// int.from_bytes(b, "big") for up to 8 bytes (longer values keep their low 64 bits).
inline uint64_t FromBigEndian(std::string_view b) {
  uint64_t v = 0;
  for (unsigned char c : b) v = (v << 8) | c;
  return v;
}

// A 64-bit digest of a batch's payload bytes (restart detection compares the batch a publisher
// serves for a seq with the one delivered for it). Not cryptographic: a publisher is trusted not
// to forge collisions; it only has to tell two different batches apart.
inline uint64_t PayloadDigest(std::string_view b) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (b.size() * 0xff51afd7ed558ccdULL);
  size_t i = 0;
  for (; i + 8 <= b.size(); i += 8) {
    uint64_t w = 0;
    for (int k = 0; k < 8; ++k)
      w |= static_cast<uint64_t>(static_cast<unsigned char>(b[i + k])) << (8 * k);
    h = (h ^ (w * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
    h ^= h >> 31;
  }
  uint64_t w = 0;
  for (int k = 0; i < b.size(); ++i, ++k) {
    w |= static_cast<uint64_t>(static_cast<unsigned char>(b[i])) << (8 * k);
  }
  h = (h ^ (w * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 32;
  return h;
}

// vLLM's replay end marker: (-1).to_bytes(8, "big", signed=True).
inline constexpr std::string_view kEndSeq{"\xff\xff\xff\xff\xff\xff\xff\xff", 8};

inline Status ZmqError(std::string_view what, const zmq::error_t& e) {
  return Status::IOError(std::string(what) + ": " + e.what());
}

}  // namespace kvo::zmq_util
