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

// vLLM's replay end marker: (-1).to_bytes(8, "big", signed=True).
inline constexpr std::string_view kEndSeq{"\xff\xff\xff\xff\xff\xff\xff\xff", 8};

inline Status ZmqError(std::string_view what, const zmq::error_t& e) {
  return Status::IOError(std::string(what) + ": " + e.what());
}

}  // namespace kvo::zmq_util
