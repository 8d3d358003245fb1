#include "events/event.h"

#include <type_traits>

namespace kvo {

uint64_t BlockHash::Low64() const {
  if (kind != Kind::kBytes) return value;
  uint64_t v = 0;
  size_t n = bytes.size() < 8 ? bytes.size() : 8;
  for (size_t i = bytes.size() - n; i < bytes.size(); ++i) {
    v = (v << 8) | static_cast<uint8_t>(bytes[i]);
  }
  return v;
}

std::string BlockHash::ToString() const {
  switch (kind) {
    case Kind::kUint:
      return std::to_string(value);
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kBytes: {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string out;
      out.reserve(bytes.size() * 2);
      for (unsigned char c : bytes) {
        out += kHex[c >> 4];
        out += kHex[c & 15];
      }
      return out;
    }
  }
  return {};
}

const char* EventTypeName(const KvEvent& e) {
  return std::visit(
      [](const auto& ev) -> const char* {
        using T = std::decay_t<decltype(ev)>;
        if constexpr (std::is_same_v<T, BlockStored>) return "BlockStored";
        if constexpr (std::is_same_v<T, BlockRemoved>) return "BlockRemoved";
        return "AllBlocksCleared";
      },
      e);
}

size_t CountBlockEvents(const EventBatch& batch) {
  size_t n = 0;
  for (const KvEvent& e : batch.events) {
    if (const auto* s = std::get_if<BlockStored>(&e)) n += s->block_hashes.size();
    if (const auto* r = std::get_if<BlockRemoved>(&e)) n += r->block_hashes.size();
  }
  return n;
}

}  // namespace kvo
