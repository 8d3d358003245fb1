// vLLM's chained prefix-cache block hashes (vllm-compat.md A.7), so routers and engines agree:
//   H_i = hash_fn((parent_bytes, tuple(token_ids_of_block_i), extra_keys_tuple_or_None))
// with parent_bytes = NONE_HASH for the first block.
//
// hash_fn (vLLM's vllm/utils/hashing.py, --prefix-caching-hash-algo) is a digest over one of two
// byte encodings of that Python object:
//   pickle  pickle.dumps(obj, protocol=5) exactly as CPython 3's C pickler writes it
//           (PROTO, FRAMEs split at 64 KiB opcode boundaries, MEMOIZE/BINGET, BININT*/LONG1);
//   cbor    cbor2.dumps(obj, canonical=True) (shortest-form heads);
// and the digest is SHA-256 (OpenSSL, 32 bytes) or XXH3-128 with seed 0 (libxxhash; Python
// xxhash's xxh3_128_digest, i.e. the canonical big-endian form: high 64 bits first; 16 bytes):
//   sha256 = SHA-256(pickle)   sha256_cbor = SHA-256(cbor)
//   xxhash = XXH3-128(pickle)  xxhash_cbor = XXH3-128(cbor)
//
// NONE_HASH = hash_fn(seed), seed a Python str. Current vLLM (init_none_hash after #51875) takes
// PYTHONHASHSEED when it is set; otherwise the fixed "vllm-none-hash" for the sha256 variants and a
// random per-process string for the xxhash variants (those engines cannot be matched unless
// PYTHONHASHSEED is set). Older vLLM used a random NONE_HASH for every algorithm when it was unset.
// Object identity matters to pickle's memo: as in CPython, '' / one-character latin-1 strs and
// b'' / one-byte bytes are shared singletons (a repeat is a BINGET); every other str, bytes and
// tuple of the extra keys is taken to be a distinct object.
//
// Pure functions; BlockHasher is thread-compatible, everything else thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/hex.h"
#include "common/result.h"
#include "events/block_id.h"
#include "events/event.h"

namespace kvo {

enum class HashAlgo {
  kSha256,      // sha256(pickle.dumps(obj, protocol=5)): vLLM's default
  kSha256Cbor,  // sha256(cbor2.dumps(obj, canonical=True))
  kXxhash,      // xxh3_128_digest(pickle.dumps(obj, protocol=5))
  kXxhashCbor,  // xxh3_128_digest(cbor2.dumps(obj, canonical=True))
};
inline constexpr HashAlgo kAllHashAlgos[] = {HashAlgo::kSha256, HashAlgo::kSha256Cbor,
                                             HashAlgo::kXxhash, HashAlgo::kXxhashCbor};

inline constexpr size_t kSha256DigestSize = 32;
inline constexpr size_t kXxh3DigestSize = 16;
// Raw digest bytes of `algo`: 32 (sha256*) or 16 (xxhash*).
size_t DigestSize(HashAlgo algo);
// True for the CBOR encodings, false for pickle.
bool UsesCbor(HashAlgo algo);
// True for the sha256 variants: collision resistant, so vLLM gives them a fixed default seed.
bool IsCryptographic(HashAlgo algo);

// "sha256" | "sha256_cbor" | "xxhash" | "xxhash_cbor"; anything else is InvalidArgument naming the
// value and the supported names.
Result<HashAlgo> ParseHashAlgo(std::string_view name);
const char* HashAlgoName(HashAlgo algo);

// vLLM's DEFAULT_NONE_HASH_SEED: the seed of the sha256 variants when PYTHONHASHSEED is unset.
inline constexpr std::string_view kDefaultNoneHashSeed = "vllm-none-hash";

// vLLM's resolve_none_hash_seed without the randomness: `seed` (PYTHONHASHSEED) when given; else
// kDefaultNoneHashSeed for the sha256 variants; else (xxhash*, whose engines pick a random seed
// per process) InvalidArgument saying the engine's PYTHONHASHSEED must be given.
Result<std::string> ResolveNoneHashSeed(HashAlgo algo, const std::optional<std::string>& seed);

// NONE_HASH = hash_fn(seed) where seed is the PYTHONHASHSEED *string* (its bytes are taken as the
// UTF-8 of the str). DigestSize(algo) raw bytes.
std::string NoneHash(HashAlgo algo, std::string_view seed);

// Reuses its encoding buffer and digest context across blocks: use one per thread when hashing
// many blocks (HashBlocks does). Thread-compatible.
class BlockHasher {
 public:
  explicit BlockHasher(HashAlgo algo);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  HashAlgo Algo() const { return algo_; }

  // hash_fn((parent, tuple(token_ids), extra_keys)). `extra_keys` is nullptr or a nil Value for
  // None, else an array Value (a tuple) whose elements are str (std::string, valid UTF-8),
  // int (int64_t / uint64_t), bytes (Binary) or nested arrays (tuples), at most 64 deep.
  // Anything else (bool, double, nil inside the tuple, invalid UTF-8) is InvalidArgument naming
  // the type or value. Token ids may be any int64 (negative ones included).
  Result<std::string> Hash(std::string_view parent, std::span<const int64_t> token_ids,
                           const Value* extra_keys);

  // Hash() into *out, reusing its capacity (no allocation per block once it holds a digest).
  Status HashTo(std::string_view parent, std::span<const int64_t> token_ids,
                const Value* extra_keys, std::string* out);

  // The encoded preimage of the last Hash() or HashString() call (for tests and diagnostics).
  std::string_view LastPreimage() const;

  // hash_fn(str): NONE_HASH when `s` is the seed.
  std::string HashString(std::string_view s);

  // For tests: every block through the general pickler (the one-pass writer of the common
  // block shape off), the reference the fast paths must equal byte for byte.
  void set_general_path_only(bool on) { general_only_ = on; }
  // For tests: the fast paths encode tokens one by one even where the CPU has the vector encoder
  // (events/token_encode_internal.h), so both are checked against the general writers.
  void set_vector_encoder(bool on) { vector_encoder_ = on; }

 private:
  struct Impl;
  HashAlgo algo_;
  bool general_only_ = false;
  bool vector_encoder_ = true;
  std::unique_ptr<Impl> impl_;
};

// One block's digest (DigestSize(algo) raw bytes); see BlockHasher::Hash.
Result<std::string> HashBlock(HashAlgo algo, std::string_view parent,
                              std::span<const int64_t> token_ids, const Value* extra_keys);

struct BlockHashOptions {
  HashAlgo algo = HashAlgo::kSha256;
  std::string none_hash;  // from NoneHash(); DigestSize(algo) bytes
  size_t block_size = 16;
  // Optional extra keys per block (index i applies to block i); missing or nil means None.
  // Entries past the last full block are ignored.
  std::vector<Value> extra_keys;
  // For tests: no fast path (BlockHasher::set_general_path_only, and no chain loop of its own).
  bool general_path_only = false;
  // For tests: the fast paths' tokens one by one (BlockHasher::set_vector_encoder).
  bool vector_encoder = true;
};

// Digests of every *full* block of `token_ids`, chained from options.none_hash. A block_size of 0
// is InvalidArgument.
Result<std::vector<std::string>> HashBlocks(std::span<const int64_t> token_ids,
                                            const BlockHashOptions& options);

// HashBlocks' chain as wire hashes (BlockDigest::Low64 of each digest), without keeping the
// digests: what a router or the indexer needs for a prompt. Same errors as HashBlocks.
Result<std::vector<uint64_t>> HashBlocksWire(std::span<const int64_t> token_ids,
                                             const BlockHashOptions& options);

// Ok when `extra_keys` is nil or a tuple that HashBlock can hash (str, int, bytes, nested tuples);
// else InvalidArgument naming the offending value.
Status CheckExtraKeys(const Value& extra_keys);

}  // namespace kvo
