// KV-cache event values, field for field as vLLM's msgspec structs (vllm-compat.md A.1).
// Plain copyable values; the only thing that crosses a process boundary. Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kvo {

// vLLM's ExternalBlockHash = bytes | int. On the wire an int is normally the low 64 bits of the
// digest (a msgpack uint); very old publishers sent Python's signed hash(), kept as kInt.
struct BlockHash {
  enum class Kind : uint8_t { kUint, kInt, kBytes };

  static BlockHash Uint(uint64_t v) { return BlockHash{Kind::kUint, v, {}}; }
  // REQUIRES: v < 0 (non-negative ints are kUint so that equal values compare equal).
  static BlockHash NegativeInt(int64_t v) {
    return BlockHash{Kind::kInt, static_cast<uint64_t>(v), {}};
  }
  static BlockHash Bytes(std::string raw) { return BlockHash{Kind::kBytes, 0, std::move(raw)}; }

  bool is_bytes() const { return kind == Kind::kBytes; }
  int64_t as_int() const { return static_cast<int64_t>(value); }
  // vLLM's int wire form: the last 8 bytes of a digest as big-endian u64, or the int itself.
  uint64_t Low64() const;
  // Decimal for ints, lowercase hex for bytes.
  std::string ToString() const;

  friend bool operator==(const BlockHash&, const BlockHash&) = default;

  Kind kind = Kind::kUint;
  uint64_t value = 0;  // kUint: the value; kInt: two's complement bits of a negative int64
  std::string bytes;   // kBytes only
};

// A msgpack `bin` payload inside a Value (distinct from a `str`).
struct Binary {
  std::string data;
  friend bool operator==(const Binary&, const Binary&) = default;
};

// A dynamically typed msgpack value, for `extra_keys` (tuples of str, int, bytes, nested tuples).
struct Value;
using ValueArray = std::vector<Value>;
struct Value {
  std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string, Binary, ValueArray> v;

  bool is_nil() const { return std::holds_alternative<std::monostate>(v); }
  friend bool operator==(const Value&, const Value&) = default;
};

inline constexpr char kMediumGpu[] = "GPU";
inline constexpr char kMediumCpu[] = "CPU";
inline constexpr char kMediumStorage[] = "STORAGE";

struct BlockStored {
  // Required fields (always on the wire, nil allowed where optional).
  std::vector<BlockHash> block_hashes;
  std::optional<BlockHash> parent_block_hash;
  std::vector<int64_t> token_ids;
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
  std::optional<std::string> medium;
  std::optional<std::string> lora_name;
  // Defaulted fields (omitted from the map when unset).
  std::optional<std::vector<Value>> extra_keys;  // one entry per hash: nil or an array
  std::optional<int64_t> group_idx;
  std::optional<std::string> kv_cache_spec_kind;
  std::optional<int64_t> kv_cache_spec_sliding_window;
  std::optional<std::string> locality;
  std::optional<std::string> ownership;   // post-snapshot (#52067)
  std::optional<std::string> session_id;  // post-snapshot (#51381)

  friend bool operator==(const BlockStored&, const BlockStored&) = default;
};

struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
  std::optional<std::string> medium;
  std::optional<int64_t> group_idx;
  std::optional<std::string> locality;
  std::optional<std::string> ownership;  // post-snapshot (#52067)
  // kvo extension, written last; vLLM decoders ignore unknown keys:
  // "evicted" | "demoted" | "failed" | "cleared" | "restart".
  std::optional<std::string> reason;

  friend bool operator==(const BlockRemoved&, const BlockRemoved&) = default;
};

struct AllBlocksCleared {
  friend bool operator==(const AllBlocksCleared&, const AllBlocksCleared&) = default;
};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// "BlockStored" | "BlockRemoved" | "AllBlocksCleared": the msgspec tag.
const char* EventTypeName(const KvEvent& e);

struct EventBatch {
  double ts = 0.0;
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;

  friend bool operator==(const EventBatch&, const EventBatch&) = default;
};

// Number of block hashes carried by the batch (a BlockStored/BlockRemoved counts its hashes).
size_t CountBlockEvents(const EventBatch& batch);

}  // namespace kvo
