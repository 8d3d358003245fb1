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
        return ChainFixed<16>(parent, tokens, blocks, out);
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
