#include "common/hex.h"

namespace kvo {
namespace {

int Nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// At most 40 characters of `s`, for error messages.
std::string Shown(std::string_view s) {
  constexpr size_t kMax = 40;
  return s.size() > kMax ? std::string(s.substr(0, kMax)) + "..." : std::string(s);
}

}  // namespace

void AppendHex(std::string_view bytes, std::string* out) {
  const size_t at = out->size();
  out->resize(at + bytes.size() * 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    (*out)[at + 2 * i] = kHexDigits[b >> 4];
    (*out)[at + 2 * i + 1] = kHexDigits[b & 0xF];
  }
}

std::string ToHex(std::string_view bytes) {
  std::string out;
  AppendHex(bytes, &out);
  return out;
}

std::string HexU64(uint64_t v) {
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kHexDigits[v & 15];
  return s;
}

Result<std::string> ParseHex(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return Status::InvalidArgument("hex string '" + Shown(hex) + "' has an odd length (" +
                                   std::to_string(hex.size()) + ")");
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = Nibble(hex[2 * i]);
    const int lo = Nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument("hex string '" + Shown(hex) +
                                     "' has a non-hex character at offset " +
                                     std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    }
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

}  // namespace kvo
