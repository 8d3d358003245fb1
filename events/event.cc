#include "events/event.h"

#include <type_traits>

#include "events/block_id.h"

namespace kvo {

uint64_t BlockHash::Low64() const {
  return kind == Kind::kBytes ? BlockDigest::Low64(bytes) : value;
}

std::string BlockHash::ToString() const {
  switch (kind) {
    case Kind::kUint:
      return std::to_string(value);
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kBytes:
      return ToHex(bytes);
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
