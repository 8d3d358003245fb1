// Internal helpers shared by the ZeroMQ publisher and subscriber (not part of the public API).
#pragma once

#include <zmq.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// One reply message of a replay ROUTER, as the subscriber's DEALER receives it: an empty delimiter
// frame, then [seq, payload] (vLLM <= 0.25) or [topic, seq, payload]. Pure, so that it is fuzzed
// (tests/fuzz/replay_frames_fuzz.cc).
struct ReplayReply {
  enum class Kind : uint8_t {
    kMalformed,  // wrong frame count, non-empty delimiter, or a seq frame that is not 8 bytes
    kEnd,        // vLLM's end marker (seq -1, empty payload): the reply is complete
    kBatch,      // one batch: seq, topic (when with_topic), payload (not decoded here)
  };
  Kind kind = Kind::kMalformed;
  bool with_topic = false;
  std::string_view topic;  // empty without a topic frame
  uint64_t seq = 0;
  std::string_view payload;
};
// The views point into `frames`.
inline ReplayReply ParseReplayReply(const std::vector<std::string_view>& frames) {
  ReplayReply r;
  if (frames.size() < 3 || frames.size() > 4 || !frames[0].empty()) return r;
  r.with_topic = frames.size() == 4;
  if (r.with_topic) r.topic = frames[1];
  std::string_view seq_bytes = frames[r.with_topic ? 2 : 1];
  r.payload = frames[r.with_topic ? 3 : 2];
  if (seq_bytes == kEndSeq && r.payload.empty()) {
    r.kind = ReplayReply::Kind::kEnd;
    return r;
  }
  // The end marker's seq with a payload is no batch (2^64-1 is never a real sequence number).
  if (seq_bytes.size() != 8 || seq_bytes == kEndSeq) return r;
  r.seq = FromBigEndian(seq_bytes);
  r.kind = ReplayReply::Kind::kBatch;
  return r;
}

// A live PUB message: [topic, seq (8 bytes big-endian), payload]. nullopt when malformed.
inline std::optional<uint64_t> ParseLiveSeq(const std::vector<std::string_view>& frames) {
  if (frames.size() != 3 || frames[1].size() != 8) return std::nullopt;
  return FromBigEndian(frames[1]);
}

// IOError "what: ZeroMQ's message"; a refused descriptor (EMFILE, ENFILE) also names the
// open-file limit and ZeroMQ's socket limit (FdLimitNote).
Status ZmqError(std::string_view what, const zmq::error_t& e);

// The global context's socket limit (ZMQ_MAX_SOCKETS).
int MaxSockets();

}  // namespace kvo::zmq_util
