// The one hex codec of the tree: lowercase encoding, validating decoding. Every module that shows
// bytes or a 64-bit value as hex uses these (events/block_id.h builds BlockDigest on them).
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

namespace kvo {

// The sixteen lowercase digits, in order (the only copy of the table).
inline constexpr std::string_view kHexDigits = "0123456789abcdef";

// Appends the two lowercase digits of each byte of `bytes` to *out.
void AppendHex(std::string_view bytes, std::string* out);

// Lowercase hex of raw bytes (two digits a byte).
std::string ToHex(std::string_view bytes);

// `v` as exactly 16 lowercase digits, most significant first (printf("%016llx")).
std::string HexU64(uint64_t v);

// Raw bytes from hex digits (either case). An odd length or a non-hex character is
// InvalidArgument naming the string (first 40 characters) and the offset.
Result<std::string> ParseHex(std::string_view hex);

}  // namespace kvo
