// vLLM's chained prefix-cache block hashes (vllm-compat.md A.7), so routers and engines agree:
//   H_i = hash_fn((parent_bytes, tuple(token_ids_of_block_i), extra_keys_tuple_or_None))
// with parent_bytes = NONE_HASH for the first block. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "events/event.h"

namespace kvo {

enum class HashAlgo {
  kSha256,      // sha256(pickle.dumps(obj, protocol=5)): vLLM's default
  kSha256Cbor,  // sha256(cbor2.dumps(obj, canonical=True))
};

// "sha256" | "sha256_cbor"; anything else is InvalidArgument naming the value.
Result<HashAlgo> ParseHashAlgo(std::string_view name);
const char* HashAlgoName(HashAlgo algo);

// NONE_HASH = hash_fn(seed) where seed is the PYTHONHASHSEED *string*. 32 raw bytes.
std::string NoneHash(HashAlgo algo, std::string_view seed);

// One block's digest (32 raw bytes). `extra_keys` is nullptr for None, else an array Value
// (a tuple) of str / int / bytes / nested arrays.
// REQUIRES: extra_keys == nullptr or holds a ValueArray.
Result<std::string> HashBlock(HashAlgo algo, std::string_view parent,
                              std::span<const int64_t> token_ids, const Value* extra_keys);

struct BlockHashOptions {
  HashAlgo algo = HashAlgo::kSha256;
  std::string none_hash;  // from NoneHash(); 32 bytes
  size_t block_size = 16;
  // Optional extra keys per block (index i applies to block i); missing or nil means None.
  std::vector<Value> extra_keys;
};

// Digests of every *full* block of `token_ids`, chained from options.none_hash.
Result<std::vector<std::string>> HashBlocks(std::span<const int64_t> token_ids,
                                            const BlockHashOptions& options);

// The default wire form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): last 8 digest bytes, big-endian.
uint64_t WireHash(std::string_view digest);

std::string ToHex(std::string_view bytes);

}  // namespace kvo
