// kvo's content key (schemas/index.md): chained XXH3-64 over little-endian token ids.
#include <bit>
#include <cstring>
#include <string>

#include "indexer/indexer.h"
#include "indexer/internal/memory_index.h"
// Inlined (the header carries the implementation): a token query hashes one key per block in a
// chain, each waiting for the last, and the library call kept the compiler from overlapping a
// block's token lanes with the previous block's finish.
#define XXH_INLINE_ALL
#include "xxhash.h"

namespace kvo {
namespace {

// 0 means "no content key" everywhere in the index; a real key of 0 is mapped to 1.
inline uint64_t NonZero(uint64_t k) { return k == 0 ? 1 : k; }

}  // namespace

uint64_t ContentKeyRoot(std::string_view lora_name) {
  static constexpr char kTag[] = "kvo-content-v1";
  std::string buf(kTag, sizeof(kTag));  // includes the terminating 0x00
  buf.append(lora_name.data(), lora_name.size());
  return NonZero(XXH3_64bits(buf.data(), buf.size()));
}

uint64_t ContentKey(uint64_t parent, std::span<const int64_t> block_tokens) {
  unsigned char stack[8 + 8 * 64];
  std::string heap;
  unsigned char* p = stack;
  const size_t n = 8 + 8 * block_tokens.size();
  if (n > sizeof(stack)) {
    heap.resize(n);
    p = reinterpret_cast<unsigned char*>(heap.data());
  }
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &parent, 8);
    if (!block_tokens.empty()) std::memcpy(p + 8, block_tokens.data(), 8 * block_tokens.size());
  } else {
    uint64_t v = __builtin_bswap64(parent);
    std::memcpy(p, &v, 8);
    for (size_t i = 0; i < block_tokens.size(); ++i) {
      v = __builtin_bswap64(static_cast<uint64_t>(block_tokens[i]));
      std::memcpy(p + 8 + 8 * i, &v, 8);
    }
  }
  return NonZero(XXH3_64bits(p, n));
}

namespace {

// ContentKey for blocks of kBlock tokens: the buffer's length is a constant, so XXH3's length
// dispatch folds away and the whole key is inlined into the chain's loop.
template <size_t kBlock>
uint64_t ChainFixed(uint64_t parent, const int64_t* tokens, size_t blocks, uint64_t* out) {
  unsigned char buf[8 + 8 * kBlock];
  for (size_t b = 0; b < blocks; ++b) {
    std::memcpy(buf, &parent, 8);
    std::memcpy(buf + 8, tokens + b * kBlock, 8 * kBlock);
    parent = NonZero(XXH3_64bits(buf, sizeof buf));
    out[b] = parent;
  }
  return parent;
}

// Blocks of 16 tokens (vLLM's default): XXH3_64bits over the 136 bytes parent || tokens is
// XXH3's 129-240-byte path, a sum of 16-byte mixes avalanched twice. Only the first mix reads the
// parent, so the others and the last-bytes mix are summed first (they depend on the tokens alone
// and overlap the previous block's finish), and the chain from one key to the next is that mix,
// two avalanches and an add or two: the buffer (a store and its reload on the chain) and XXH3's
// running sum (eight dependent adds after the parent's mix) are gone. Bit for bit XXH3_64bits
// (ContentKeyTest.ChainEqualsKeyByKeyForEveryBlockSize, GoldenKeys).
uint64_t Chain16(uint64_t parent, const int64_t* tokens, size_t blocks, uint64_t* out) {
  constexpr size_t kLen = 8 + 8 * 16;
  static_assert(kLen > 128 && kLen <= XXH3_MIDSIZE_MAX);
  const xxh_u8* const secret = XXH3_kSecret;
  const uint64_t s0 = XXH_readLE64(secret);
  const uint64_t s1 = XXH_readLE64(secret + 8);
  for (size_t b = 0; b < blocks; ++b) {
    // input[k] = t[k - 8] for k >= 8: the tokens' bytes.
    const xxh_u8* const t = reinterpret_cast<const xxh_u8*>(tokens + b * 16);
    uint64_t rest = kLen * XXH_PRIME64_1;
    for (size_t i = 1; i < 8; ++i) rest += XXH3_mix16B(t + 16 * i - 8, secret + 16 * i, 0);
    const uint64_t last =
        XXH3_mix16B(t + kLen - 16 - 8, secret + XXH3_SECRET_SIZE_MIN - XXH3_MIDSIZE_LASTOFFSET, 0);
    const uint64_t first = XXH3_mul128_fold64(parent ^ s0, XXH_readLE64(t) ^ s1);
    parent = NonZero(XXH3_avalanche(XXH3_avalanche(rest + first) + last));
    out[b] = parent;
  }
  return parent;
}

}  // namespace

uint64_t ChainContentKeys(uint64_t parent, const int64_t* tokens, size_t block_size, size_t blocks,
                          uint64_t* out) {
  if constexpr (std::endian::native == std::endian::little) {
    switch (block_size) {
      case 1:
        return ChainFixed<1>(parent, tokens, blocks, out);
      case 2:
        return ChainFixed<2>(parent, tokens, blocks, out);
      case 4:
        return ChainFixed<4>(parent, tokens, blocks, out);
      case 8:
        return ChainFixed<8>(parent, tokens, blocks, out);
      case 16:
        return Chain16(parent, tokens, blocks, out);
      case 32:
        return ChainFixed<32>(parent, tokens, blocks, out);
      case 64:
        return ChainFixed<64>(parent, tokens, blocks, out);
      case 128:
        return ChainFixed<128>(parent, tokens, blocks, out);
      default:
        break;
    }
  }
  for (size_t b = 0; b < blocks; ++b) {
    parent = ContentKey(parent, std::span<const int64_t>(tokens + b * block_size, block_size));
    out[b] = parent;
  }
  return parent;
}

Result<std::vector<uint64_t>> ContentKeys(std::span<const int64_t> token_ids, int64_t block_size,
                                          std::string_view lora_name) {
  if (block_size <= 0) {
    return Status::InvalidArgument("block_size must be positive, got " +
                                   std::to_string(block_size));
  }
  return indexer_internal::BlockKeys::FromTokens(token_ids, static_cast<size_t>(block_size),
                                                 ContentKeyRoot(lora_name))
      .All();
}

namespace indexer_internal {

BlockKeys BlockKeys::FromTokens(std::span<const int64_t> tokens, size_t block_size, uint64_t root) {
  BlockKeys k;
  k.from_tokens_ = true;
  k.tokens_ = tokens;
  k.block_size_ = block_size;
  k.size_ = tokens.size() / block_size;
  k.computed_.reserve(k.size_);
  k.parent_ = root;
  return k;
}

void BlockKeys::Extend(size_t n) {
  const size_t from = computed_.size();
  if (n <= from) return;
  const uint64_t parent = computed_.empty() ? parent_ : computed_.back();
  computed_.resize(n);
  ChainContentKeys(parent, tokens_.data() + from * block_size_, block_size_, n - from,
                   computed_.data() + from);
}

std::vector<uint64_t> BlockKeys::All() {
  if (!from_tokens_) return {given_.begin(), given_.end()};
  if (size_ > 0) Extend(size_);
  return computed_;
}

}  // namespace indexer_internal

}  // namespace kvo
