// JSON adapter for the Mooncake/Dynamo indexer API: nlohmann_json exceptions stop in this file.
#include "indexer/service/router_api.h"

#include <nlohmann/json.hpp>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/hex.h"
#include "common/json.h"
#include "common/spin.h"
#include "events/kv_events_config.h"
#include "http/http_server.h"
#include "indexer/service/sources_config.h"

namespace kvo {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

constexpr int64_t kMaxBlockSize = 1 << 20;
constexpr int64_t kMaxRank = 1 << 16;
constexpr int64_t kMaxRanksPerRequest = 1024;

Status Bad(const std::string& what) { return Status::InvalidArgument(what); }

// list_key: the field an over-long array most likely is (named in the message).
Result<json> ParseBody(std::string_view body, std::string_view route, int64_t max_items,
                       const char* list_key = nullptr) {
  JsonLimits limits;
  limits.max_array_elements = std::max<int64_t>(max_items, 1);
  Status pre = CheckJsonLimits(body, limits);
  if (!pre.ok()) {
    std::string m = std::string(route) + ": " + pre.message();
    if (list_key != nullptr) {
      m = "'" + std::string(list_key) + "' (or another list) is longer than " +
          std::to_string(max_items) + " items: " + m;
    }
    return Bad(m);
  }
  auto j = ParseJson(body, route, limits);
  if (!j.ok()) return j.status();
  if (!j->is_object()) {
    return Bad(std::string(route) + ": the body must be a JSON object, got " + DescribeJson(*j));
  }
  return std::move(j).value();
}

const json* Find(const json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

// A string field; null counts as absent when nullable.
Result<std::optional<std::string>> OptString(const json& o, const char* key, bool nullable = true,
                                             size_t max_len = 4096) {
  const json* v = Find(o, key);
  if (v == nullptr || (nullable && v->is_null())) return std::optional<std::string>();
  if (!v->is_string()) {
    return Bad(std::string("'") + key + "' must be a string, got " + DescribeJson(*v));
  }
  std::string s = v->get<std::string>();
  if (s.size() > max_len) {
    return Bad(std::string("'") + key + "' is longer than " + std::to_string(max_len) +
               " bytes: '" + CutForMessage(s) + "'");
  }
  return std::optional<std::string>(std::move(s));
}

Result<std::string> ReqString(const json& o, const char* key) {
  KVO_ASSIGN_OR_RETURN(auto s, OptString(o, key, false));
  if (!s) return Bad(std::string("'") + key + "' is required");
  return *s;
}

Result<std::optional<int64_t>> OptInt(const json& o, const char* key, int64_t lo, int64_t hi) {
  const json* v = Find(o, key);
  if (v == nullptr || v->is_null()) return std::optional<int64_t>();
  if (!v->is_number_integer() ||
      (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
      v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
    return Bad(std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "], got " + DescribeJson(*v));
  }
  return std::optional<int64_t>(v->get<int64_t>());
}

Result<int64_t> ReqInt(const json& o, const char* key, int64_t lo, int64_t hi) {
  KVO_ASSIGN_OR_RETURN(auto v, OptInt(o, key, lo, hi));
  if (!v) return Bad(std::string("'") + key + "' is required");
  return *v;
}

// The model key under any of its spellings (exactly one).
Result<std::optional<std::string>> ModelKey(const json& o) {
  std::optional<std::string> out;
  const char* seen = nullptr;
  for (const char* key : {"model", "model_name", "modelname"}) {
    KVO_ASSIGN_OR_RETURN(auto v, OptString(o, key));
    if (!v) continue;
    if (seen != nullptr && *v != *out) {
      return Bad(std::string("'") + seen + "' and '" + key + "' name different models");
    }
    seen = key;
    out = std::move(v);
  }
  if (out && out->empty()) return Bad("'model' is empty");
  return out;
}

Result<std::string> Identity(const json& o, const char* key, std::optional<std::string> dflt) {
  KVO_ASSIGN_OR_RETURN(auto v, OptString(o, key));
  if (!v) {
    if (!dflt) return Bad(std::string("'") + key + "' is required");
    return *dflt;
  }
  if (!ValidSourceIdentity(*v)) {
    return Bad(std::string("'") + key + "' must be 1-100 characters of [A-Za-z0-9_.:-], got '" +
               CutForMessage(*v) + "'");
  }
  return *v;
}

// tcp://HOST:PORT or ipc://PATH; HOST on loopback unless allow_remote.
Status CheckEndpoint(const std::string& ep, const char* key, bool allow_remote) {
  if (!ep.starts_with("tcp://") && !ep.starts_with("ipc://")) {
    return Bad(std::string("'") + key + "' must be a tcp:// or ipc:// endpoint, got '" +
               CutForMessage(ep) + "'");
  }
  Status st = ValidateEndpoint(ep, key);
  if (!st.ok()) return Bad(std::string("'") + key + "': " + st.message());
  if (ep.starts_with("tcp://")) {
    std::string_view hp = std::string_view(ep).substr(6);
    size_t colon = hp.rfind(':');
    std::string_view host = colon == std::string_view::npos ? hp : hp.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    if (host == "*" || host.find('*') != std::string_view::npos) {
      return Bad(std::string("'") + key + "' must name the publisher's host, got '" +
                 CutForMessage(ep) + "'");
    }
    if (hp.substr(colon + 1) == "*" || hp.substr(colon + 1) == "0") {
      return Bad(std::string("'") + key + "' must name the publisher's bound port, got '" +
                 CutForMessage(ep) + "'");
    }
    if (!allow_remote && !IsLoopbackHost(host)) {
      return Bad(std::string("'") + key + "' '" + CutForMessage(ep) +
                 "' is off loopback; start kvo index serve with --allow-remote to subscribe to "
                 "other hosts");
    }
  }
  return Status::Ok();
}

Result<std::vector<uint64_t>> Hashes(const json& v, const char* key) {
  if (!v.is_array()) {
    return Bad(std::string("'") + key + "' must be an array of integers, got " + DescribeJson(v));
  }
  std::vector<uint64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& h = v[i];
    if (h.is_number_unsigned()) {
      out.push_back(h.get<uint64_t>());
    } else if (h.is_number_integer()) {
      out.push_back(static_cast<uint64_t>(h.get<int64_t>()));  // 64-bit pattern
    } else {
      return Bad(std::string("'") + key + "[" + std::to_string(i) + "]' must be an integer, got " +
                 DescribeJson(h));
    }
  }
  return out;
}

// The fast path for the one big list of a query (token_ids / seq_hashes / block_hash): a
// 128k-token prompt is ~0.9 MB of JSON, and building nlohmann's DOM of 131 072 numbers costs
// milliseconds. FindBigList walks the top-level object once and finds the list (from its '[' to
// the first ']' after it); the body with that list replaced by [] goes to the ordinary parser
// (which checks every other field exactly as before), and the list of plain integers is read
// straight into a vector. Anything it does not expect (escapes in keys, the key twice, a
// non-integer element, an integer out of range, more than max_items elements, a list that does
// not end at that ']', malformed text) makes it give up: the ordinary parser then handles the
// whole body and produces the same answer or error as without this path.
struct BigList {
  const char* open = nullptr;   // its '['
  const char* close = nullptr;  // its ']'
  std::string rest;             // the body with the list replaced by []
};

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
[[gnu::always_inline]] inline void SkipWs(const char*& p, const char* end) {
  while (p < end && static_cast<unsigned char>(*p) <= ' ' && IsWs(*p)) ++p;
}
bool IsDigit(char c) { return static_cast<unsigned char>(c - '0') <= 9; }

// Eight ASCII digits (little-endian load) to their value; `chunk` must hold only digits.
inline uint64_t EightDigits(uint64_t chunk) {
  chunk -= 0x3030303030303030ULL;
  chunk = (chunk * 10) + (chunk >> 8);
  return (((chunk & 0x000000FF000000FFULL) * (100 + (1000000ULL << 32))) +
          (((chunk >> 16) & 0x000000FF000000FFULL) * (1 + (10000ULL << 32)))) >>
         32;
}

// The 8 bytes at p are all ASCII digits.
inline bool AllDigits(uint64_t chunk) {
  return ((chunk & 0xF0F0F0F0F0F0F0F0ULL) |
          (((chunk + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4)) ==
         0x3333333333333333ULL;
}

// Reads the run of decimal digits at p (at least one) into *v; false when it passes UINT64_MAX.
// Block hashes are ~20 digits: eight at a time while they last, then one at a time; no overflow
// check before the 20th digit (19 digits stay below 10^19 < 2^64).
[[gnu::always_inline]] inline bool ReadU64(const char*& p, const char* end, uint64_t* v) {
  const char* const start = p;
  uint64_t x = 0;
  if constexpr (std::endian::native == std::endian::little) {
    if (end - p >= 8) {
      // A short number (a token id) in one step, without a branch per digit: the first
      // non-digit byte's position from a mask (a digit byte d ^ '0' is 0..9, so + 0x76 keeps its
      // top bit clear; any other byte sets it; a carry only runs upward, past the first), then
      // the n digits moved up behind (8 - n) leading '0's.
      uint64_t chunk;
      std::memcpy(&chunk, p, 8);
      const uint64_t d = chunk ^ 0x3030303030303030ULL;
      const uint64_t non_digit = ((d + 0x7676767676767676ULL) | d) & 0x8080808080808080ULL;
      if (non_digit != 0) {
        const int n = std::countr_zero(non_digit) >> 3;  // >= 1: the caller saw a digit at p
        *v = EightDigits((chunk << (8 * (8 - n))) | (0x3030303030303030ULL >> (8 * n)));
        p += n;
        return true;
      }
    }
    for (int k = 0; k < 2 && end - p >= 8; ++k) {
      uint64_t chunk;
      std::memcpy(&chunk, p, 8);
      if (!AllDigits(chunk)) break;
      x = x * 100000000ULL + EightDigits(chunk);
      p += 8;
    }
  }
  while (p < end && IsDigit(*p) && p - start < 19) {
    x = x * 10 + static_cast<uint64_t>(*p - '0');
    ++p;
  }
  if (p < end && IsDigit(*p)) {  // the 20th digit
    const uint64_t d = static_cast<uint64_t>(*p - '0');
    if (x > (UINT64_MAX - d) / 10) return false;
    x = x * 10 + d;
    ++p;
    if (p < end && IsDigit(*p)) return false;  // 21 digits
  }
  *v = x;
  return true;
}

// Skips one JSON value starting at p (no validation beyond bracket and string structure).
bool SkipValue(const char*& p, const char* end) {
  int depth = 0;
  while (p < end) {
    const char c = *p;
    if (c == '"') {
      ++p;
      while (p < end && *p != '"') {
        if (*p == '\\') ++p;
        ++p;
      }
      if (p >= end) return false;
      ++p;
      if (depth == 0) return true;
      continue;
    }
    if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (depth == 0) return true;  // the end of the enclosing object: a scalar ended
      if (--depth == 0) {
        ++p;
        return true;
      }
    } else if (depth == 0 && (c == ',' || IsWs(c))) {
      return true;
    }
    ++p;
  }
  return depth == 0;
}

#if defined(__SSE2__)
// The byte classes of the 64 bytes at p (all readable), bit i for p[i].
struct ByteMasks {
  uint64_t non_digit = 0;
  uint64_t comma = 0;
  uint64_t close = 0;  // ']'
  uint64_t zero = 0;   // '0'
  uint64_t space = 0;  // ' ' (filled only for the spaced plan)
};
inline ByteMasks Masks64(const char* p) {
  ByteMasks m;
  for (int k = 0; k < 4; ++k) {
    const __m128i x =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + static_cast<ptrdiff_t>(16 * k)));
    const __m128i d = _mm_sub_epi8(x, _mm_set1_epi8('0'));  // a digit: 0..9, unsigned
    const __m128i digit = _mm_cmpeq_epi8(_mm_subs_epu8(d, _mm_set1_epi8(9)), _mm_setzero_si128());
    const int shift = 16 * k;
    auto bits = [](__m128i v) {
      return static_cast<uint64_t>(static_cast<uint16_t>(_mm_movemask_epi8(v)));
    };
    m.non_digit |= (bits(digit) ^ 0xFFFF) << shift;
    m.comma |= bits(_mm_cmpeq_epi8(x, _mm_set1_epi8(','))) << shift;
    m.close |= bits(_mm_cmpeq_epi8(x, _mm_set1_epi8(']'))) << shift;
    m.zero |= bits(_mm_cmpeq_epi8(d, _mm_setzero_si128())) << shift;
  }
  return m;
}
// The spaces of the 64 bytes at p (only for a window the compact plan refused).
inline uint64_t SpaceMask64(const char* p) {
  uint64_t space = 0;
  for (int k = 0; k < 4; ++k) {
    const __m128i x =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + static_cast<ptrdiff_t>(16 * k)));
    space |= static_cast<uint64_t>(
                 static_cast<uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(' ')))))
             << (16 * k);
  }
  return space;
}

// The element of 1-7 digits at w[start, pos) as the 8 ASCII digits EightDigits reads ('0's in
// front): the 8 bytes that end at its separator, the bytes before it replaced. REQUIRES: the 8
// bytes before w + pos readable.
inline uint64_t PaddedForm(const char* w, size_t start, size_t pos) {
  const size_t n = pos - start;  // 1..7
  uint64_t chunk;
  std::memcpy(&chunk, w + pos - 8, 8);  // the element in the top n bytes
  const unsigned sh = static_cast<unsigned>(8 * (8 - n));
  return ((chunk >> sh) << sh) | (0x3030303030303030ULL >> (8 * n));
}

// How WholeWindow converts (SetTokenScan): the best the CPU has, checked once at run time.
TokenScan BestTokenScan() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi") &&
      __builtin_cpu_supports("avx512vbmi2")) {
    return TokenScan::kAvx512Stride;
  }
  if (__builtin_cpu_supports("avx2")) return TokenScan::kAvx2;
#endif
  return TokenScan::kPortable;
}
const TokenScan g_best_token_scan = BestTokenScan();
TokenScan g_token_scan = g_best_token_scan;

// EightDigits on four forms at once (k forms, rounded up to four: `forms` has room for the
// rounding and dst for 3 more). A form's bytes hold digit pairs a, b (lane bytes 0 and 4) and
// c, d (bytes 2 and 6) after the first step; the value is 1e6 a + 1e4 c + 100 b + d, each product
// below 2^32: four 32 x 32 -> 64-bit multiplies per lane instead of the scalar code's two 64-bit
// ones and their shifts.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
template <typename T>
__attribute__((target("avx2"))) void ConvertFormsAvx2(uint64_t* forms, size_t k, T* dst) {
  static_assert(sizeof(T) == 8);
  for (size_t i = k; i % 4 != 0; ++i) forms[i] = 0x3030303030303030ULL;
  const __m256i zeros = _mm256_set1_epi64x(0x3030303030303030LL);
  const __m256i pairs = _mm256_set1_epi64x(0x000000FF000000FFLL);
  for (size_t i = 0; i < k; i += 4) {
    __m256i x =
        _mm256_sub_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(forms + i)), zeros);
    // x * 10 + (x >> 8): each byte pair becomes its two-digit value.
    x = _mm256_add_epi64(_mm256_add_epi64(_mm256_slli_epi64(x, 3), _mm256_slli_epi64(x, 1)),
                         _mm256_srli_epi64(x, 8));
    const __m256i t1 = _mm256_and_si256(x, pairs);                         // a | b << 32
    const __m256i t2 = _mm256_and_si256(_mm256_srli_epi64(x, 16), pairs);  // c | d << 32
    __m256i r = _mm256_mul_epu32(t1, _mm256_set1_epi64x(1000000));
    r = _mm256_add_epi64(r, _mm256_mul_epu32(_mm256_srli_epi64(t1, 32), _mm256_set1_epi64x(100)));
    r = _mm256_add_epi64(r, _mm256_mul_epu32(t2, _mm256_set1_epi64x(10000)));
    r = _mm256_add_epi64(r, _mm256_srli_epi64(t2, 32));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), r);
  }
}
#else
template <typename T>
void ConvertFormsAvx2(uint64_t* forms, size_t k, T* dst) {
  for (size_t i = 0; i < k; ++i) dst[i] = static_cast<T>(EightDigits(forms[i]));
}
#endif

// What a 64-byte window holds when it is nothing but compact elements: every element that ends
// in it (up to its last separator, or its first ']') is 1 to kMaxDigits digits (7: token ids; 20:
// 64-bit hashes) without a leading zero, each followed by ',' (or the closing ']'), and a comma
// by at most one space (Python's json.dumps writes ", "). All of that is checked on the masks;
// false for any window that is not so (the per-element loop takes it).
struct WindowPlan {
  uint64_t seps = 0;    // each element's separator, bit per byte
  uint64_t starts = 0;  // each element's first digit
  size_t next = 0;      // the offset past the last separator (and its space)
  bool closed = false;  // the last separator is the list's ']'
};
// Bit i: a run of more than kMaxDigits digits starts at i (`digits`: bit i for a digit at i).
template <int kMaxDigits>
inline uint64_t LongRuns(uint64_t digits) {
  uint64_t r = digits & (digits >> 1);  // bit i: digits at i..i+1
  r &= r >> 2;                          // i..i+3
  r &= r >> 4;                          // i..i+7
  if constexpr (kMaxDigits == 7) {
    return r;
  } else {
    static_assert(kMaxDigits == 20);
    r &= r >> 8;          // i..i+15
    return r & (r >> 5);  // i..i+20
  }
}

// kSpaced: the plan for a window the compact one refused that has spaces (the compact lists'
// plan is unchanged by them: they never pay for the spaces).
template <int kMaxDigits = 7, bool kSpaced = false>
inline bool PlanWindow(const ByteMasks& m, WindowPlan* plan) {
  const uint64_t spaced = kSpaced ? m.space & (m.comma << 1) : 0;
  const uint64_t non_digit = m.non_digit & ~spaced;  // separators, and what refuses the window
  uint64_t range;  // bits [0, the last separator (or the space after it)]
  uint64_t commas_wanted;
  int last;
  if (m.close != 0) {
    last = std::countr_zero(m.close);
    range = last == 63 ? ~uint64_t{0} : (uint64_t{2} << last) - 1;
    commas_wanted = non_digit & range & ~(uint64_t{1} << last);
    plan->closed = true;
  } else {
    if (m.non_digit == 0) return false;
    last = 63 - std::countl_zero(m.non_digit);
    range = last == 63 ? ~uint64_t{0} : (uint64_t{2} << last) - 1;
    commas_wanted = non_digit & range;
    plan->closed = false;
  }
  const uint64_t seps = non_digit & range;
  const uint64_t digits = ~m.non_digit & range;
  const uint64_t starts = ((((seps << 1) | 1) & ~spaced) | (spaced << 1)) & range;
  if ((m.comma & range) != commas_wanted ||      // a non-digit other than ',' (and the final ']')
      (starts & seps) != 0 ||                    // an empty element (or a non-digit at w)
      LongRuns<kMaxDigits>(digits) != 0 ||       // more digits than an element may have
      (starts & m.zero & (digits >> 1)) != 0) {  // a leading zero
    return false;
  }
  plan->seps = seps;
  plan->starts = starts;
  plan->next = static_cast<size_t>(last) + 1;
  return true;
}

// The whole 64-byte window at w at once (PlanWindow), each element read from the 8 bytes that end
// at its separator, independently of the others (no chain from one element's length to the next
// one's position). False (nothing appended, *p unchanged) for any window it cannot take whole.
// REQUIRES: the 7 bytes before w are readable (readable_from <= w - 7).
// `dst`: room for 35 elements (32 and the AVX2 rounding); `limit`: how many more the item limit
// allows; *count: how many were read.
template <typename T, bool kSpaced = false>
bool WholeWindow(const char* w, const ByteMasks& m, T* dst, size_t limit, size_t* count,
                 const char** p, bool* closed) {
  WindowPlan plan;
  if (!PlanWindow<7, kSpaced>(m, &plan) || static_cast<size_t>(std::popcount(plan.seps)) > limit) {
    return false;  // (over the limit: the per-element loop stops at the right element)
  }
  size_t k = 0;
  size_t start = 0;
  uint64_t starts = plan.starts;
  // The next element's first digit: past the separator, or (spaced) the next start bit.
  const auto next_start = [&](size_t pos) -> size_t {
    if constexpr (!kSpaced) return pos + 1;
    starts &= starts - 1;
    return starts == 0 ? 64 : static_cast<size_t>(std::countr_zero(starts));
  };
  if (g_token_scan != TokenScan::kPortable) {
    // The elements' 8-byte forms first (each its own load), then four at a time converted.
    alignas(32) uint64_t forms[32 + 3];
    for (uint64_t s = plan.seps; s != 0; s &= s - 1) {
      const size_t pos = static_cast<size_t>(std::countr_zero(s));
      forms[k++] = PaddedForm(w, start, pos);
      start = next_start(pos);
    }
    ConvertFormsAvx2(forms, k, dst);
  } else {
    for (uint64_t s = plan.seps; s != 0; s &= s - 1) {
      const size_t pos = static_cast<size_t>(std::countr_zero(s));
      dst[k++] = static_cast<T>(EightDigits(PaddedForm(w, start, pos)));
      start = next_start(pos);
    }
  }
  *count = k;
  *p = w + plan.next;
  *closed = plan.closed;
  return true;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVO_AVX512_SCAN 1
// GCC 12's AVX-512 intrinsics start their unmasked forms from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports at every inlined use (a false positive: no lane of it is read).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Why AVX512WholeWindows stopped.
enum class WindowStop { kClosed, kRefused, kFull, kEnd };

#define KVO_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vbmi,avx512vbmi2,popcnt,bmi")))

// Byte i: i (the offsets VPCOMPRESSB packs under a mask).
alignas(64) constexpr uint8_t kByteIndex[64] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
    44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
// From kByteIndex loaded: lane i's bytes hold i (the element each 8-byte lane converts).
KVO_AVX512_TARGET inline __m512i LaneOf(__m512i byte_index) {
  return _mm512_srli_epi16(_mm512_and_si512(byte_index, _mm512_set1_epi8(0x38)), 3);
}

// For 8 elements of the window x (lane i: element `sel` byte 8i; `pos` and `first`: each element's
// separator and first-digit offsets, one byte each): the value of the 8 digits that end `shift`
// bytes before the element's separator, the bytes before its first digit read as 0.
KVO_AVX512_TARGET inline __m512i EightDigitsBefore(__m512i x, __m512i pos, __m512i first,
                                                   __m512i sel, int shift) {
  alignas(64) static constexpr int8_t kBack[64] = {
      -8, -7, -6, -5, -4, -3, -2, -1, -8, -7, -6, -5, -4, -3, -2, -1, -8, -7, -6, -5, -4, -3,
      -2, -1, -8, -7, -6, -5, -4, -3, -2, -1, -8, -7, -6, -5, -4, -3, -2, -1, -8, -7, -6, -5,
      -4, -3, -2, -1, -8, -7, -6, -5, -4, -3, -2, -1, -8, -7, -6, -5, -4, -3, -2, -1};
  const __m512i ascii0 = _mm512_set1_epi8('0');
  // Offsets -8-shift..62 (a lane past the last element: all below 0, dropped).
  const __m512i at = _mm512_add_epi8(
      _mm512_permutexvar_epi8(sel, pos),
      _mm512_sub_epi8(_mm512_load_si512(kBack), _mm512_set1_epi8(static_cast<char>(shift))));
  const __mmask64 keep = _mm512_cmpge_epi8_mask(at, _mm512_permutexvar_epi8(sel, first));
  const __m512i digits = _mm512_maskz_sub_epi8(keep, _mm512_permutexvar_epi8(at, x), ascii0);
  // Digit pairs (10 a + b), quads (100 p + q), then 10^4 hi + lo per 64-bit lane.
  const __m512i pairs = _mm512_maddubs_epi16(digits, _mm512_set1_epi16(0x010A));
  const __m512i quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(0x00010064));
  return _mm512_add_epi64(_mm512_mul_epu32(quads, _mm512_set1_epi64(10000)),
                          _mm512_srli_epi64(quads, 32));
}

// WholeWindow for consecutive windows with AVX-512 VBMI/VBMI2, all in registers: the masks from
// one 64-byte load; each element's separator and first-digit offsets packed into bytes
// (VPCOMPRESSB of 0..63 under the masks); for eight elements at a time, each 8-byte lane gathers
// the 8 bytes that end at its element's separator (VPERMB), the bytes before the element's first
// digit become 0, and the lanes convert together (pairs, quads, then 64-bit). No store and reload
// per element (the AVX2 path's forms stall on store forwarding). Needs no byte before w.
// kMaxDigits 7: token ids (T int64_t); 20: hashes (T uint64_t), three such lanes per element (the
// 8 digits before the separator, the 8 before those, the 4 before those) and a window with a value
// past UINT64_MAX refused.
// Appends to dst (room for `room` elements) while windows are whole; stops at the ']' (kClosed,
// past it), at a window it cannot take whole (kRefused, *p at that window: the caller's
// per-element loop takes it), when fewer than 32 places are left (kFull) or fewer than 64
// bytes (kEnd). `limit`: how many more the item limit allows.
template <typename T, int kMaxDigits = 7>
KVO_AVX512_TARGET WindowStop AVX512WholeWindows(const char** p, const char* end, T* dst,
                                                size_t room, size_t limit, size_t* count) {
  static_assert(sizeof(T) == 8);
  const __m512i iota = _mm512_load_si512(kByteIndex);
  const __m512i lane_of = LaneOf(iota);
  const __m512i ascii0 = _mm512_set1_epi8('0');
  size_t n = 0;
  const char* w = *p;
  WindowStop stop = WindowStop::kEnd;
  bool spaced_list = false;
  while (end - w >= 64) {
    if (room - n < 32) {
      stop = WindowStop::kFull;
      break;
    }
    const __m512i x = _mm512_loadu_si512(w);
    const __m512i d = _mm512_sub_epi8(x, ascii0);
    ByteMasks m;
    m.non_digit = ~static_cast<uint64_t>(_mm512_cmple_epu8_mask(d, _mm512_set1_epi8(9)));
    m.comma = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(','));
    m.close = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(']'));
    m.zero = _mm512_cmpeq_epi8_mask(d, _mm512_setzero_si512());
    // The compact plan, and the spaced one for a window it refuses that has spaces; once a
    // window was spaced, the spaced plan first (it takes compact windows too).
    WindowPlan plan;
    bool planned = !spaced_list && PlanWindow<kMaxDigits>(m, &plan);
    if (!planned) {
      m.space = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(' '));
      planned = (spaced_list || m.space != 0) && PlanWindow<kMaxDigits, true>(m, &plan);
      spaced_list = planned;
    }
    if (!planned || static_cast<size_t>(std::popcount(plan.seps)) > limit - n) {
      stop = WindowStop::kRefused;
      break;
    }
    const size_t elements = static_cast<size_t>(std::popcount(plan.seps));
    const __m512i pos = _mm512_maskz_compress_epi8(plan.seps, iota);
    const __m512i first = _mm512_maskz_compress_epi8(plan.starts, iota);
    bool overflow = false;
    for (size_t g = 0; g < elements; g += 8) {
      const __m512i sel = _mm512_add_epi8(lane_of, _mm512_set1_epi8(static_cast<char>(g)));
      if constexpr (kMaxDigits == 7) {
        _mm512_storeu_si512(dst + n + g, EightDigitsBefore(x, pos, first, sel, 0));
      } else {
        // Up to 20 digits: hi (4) * 10^16 + mid (8) * 10^8 + lo (8); past UINT64_MAX
        // (18446744073709551615) when hi > 1844, or hi == 1844 and the rest > 6744073709551615:
        // the window is refused (the per-element code names the element).
        const __m512i lo = EightDigitsBefore(x, pos, first, sel, 0);
        const __m512i mid = EightDigitsBefore(x, pos, first, sel, 8);
        const __m512i hi = EightDigitsBefore(x, pos, first, sel, 16);
        const __m512i rest =
            _mm512_add_epi64(_mm512_mul_epu32(mid, _mm512_set1_epi64(100000000)), lo);
        const __mmask8 over =
            _mm512_cmpgt_epu64_mask(hi, _mm512_set1_epi64(1844)) |
            (_mm512_cmpeq_epi64_mask(hi, _mm512_set1_epi64(1844)) &
             _mm512_cmpgt_epu64_mask(rest, _mm512_set1_epi64(6744073709551615LL)));
        overflow = overflow || over != 0;
        _mm512_storeu_si512(
            dst + n + g,
            _mm512_add_epi64(_mm512_mullo_epi64(hi, _mm512_set1_epi64(10000000000000000LL)), rest));
      }
    }
    if (overflow) {
      stop = WindowStop::kRefused;
      break;
    }
    n += elements;
    w += plan.next;
    if (plan.closed) {
      stop = WindowStop::kClosed;
      break;
    }
  }
  *p = w;
  *count = n;
  return stop;
}

// AVX512WholeWindows for compact token ids (TokenScan::kAvx512Stride), at a fixed stride: each
// step loads the 64 bytes from 8 before `b` and takes the elements whose separator is in its last
// 56 (an element of 1-7 digits starts at most 7 bytes before its separator, so all of it is in
// the register), then b += 56. The next load's address does not wait on this window's masks (the
// element-aligned windows above start at the last separator found: a chain of load, compare,
// mask, leading-zero count per window), so consecutive windows overlap in the core. Each element's
// checks are those of PlanWindow<7>: digits only, no leading zero, 1-7 digits, ',' after each, the
// first ']' ends the list. Stops as AVX512WholeWindows does, *p at an element's first digit
// (kRefused: the first element of the window it cannot take; no spaced form: those windows go to
// AVX512WholeWindows). REQUIRES: *p at an element's first byte, the 8 bytes before it readable.
template <typename T>
KVO_AVX512_TARGET WindowStop AVX512StrideWindows(const char** p, const char* end, T* dst,
                                                 size_t room, size_t limit, size_t* count) {
  static_assert(sizeof(T) == 8);
  constexpr size_t kStride = 56;
  constexpr uint64_t kOwn = ~uint64_t{0xFF};  // the bytes whose separators a step takes
  const __m512i iota = _mm512_load_si512(kByteIndex);
  const __m512i lane_of = LaneOf(iota);
  const __m512i ascii0 = _mm512_set1_epi8('0');
  size_t n = 0;
  const char* elem = *p;  // the first element not yet taken
  const char* b = *p;     // the first byte of this step's 56
  WindowStop stop = WindowStop::kEnd;
  while (end - (b - 8) >= 64) {
    if (room - n < 32) {
      stop = WindowStop::kFull;
      break;
    }
    const char* const r = b - 8;  // the register's first byte
    const __m512i x = _mm512_loadu_si512(r);
    const __m512i d = _mm512_sub_epi8(x, ascii0);
    const uint64_t digit = _mm512_cmple_epu8_mask(d, _mm512_set1_epi8(9));
    const uint64_t comma = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(','));
    const uint64_t close = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(']')) & kOwn;
    const uint64_t zero = _mm512_cmpeq_epi8_mask(d, _mm512_setzero_si512());
    // [the first element's first digit, the first ']' (or the register's end)]
    // (elem: just past the last separator taken, 0-8 bytes into the register after a step taken
    // whole; before it when that step's last 8+ bytes were digits, refused below.)
    const size_t from = static_cast<size_t>(elem - r);
    const uint64_t at_elem = from < 64 ? uint64_t{1} << from : 0;
    const uint64_t first_close = close & (~close + 1);
    const uint64_t upto = close != 0 ? (first_close << 1) - 1 : ~uint64_t{0};
    const uint64_t range = upto & ~(at_elem - 1);
    const uint64_t seps = ~digit & range & kOwn;
    // Each element's first digit (elem's is one: a separator, or what precedes the list, is
    // before it, perhaps in the byte before the register).
    const uint64_t starts = ((~digit << 1) | at_elem) & digit & range;
    const uint64_t last_sep = seps == 0 ? 0 : uint64_t{1} << (63 - std::countl_zero(seps));
    const uint64_t taken = starts & (last_sep - 1);  // the first digits of the elements taken
    const size_t elements = static_cast<size_t>(std::popcount(seps));
    if (seps == 0 ||                                // no separator in 56 bytes
        (starts & at_elem) == 0 ||                  // elem not at a digit (or before the register)
        (seps & ~comma & ~first_close) != 0 ||      // a non-digit other than ',' or the ']'
        ((LongRuns<7>(digit) << 8) & seps) != 0 ||  // 8 digits before a separator
        (taken & zero & (digit >> 1)) != 0 ||       // a leading zero
        // an empty element: fewer first digits than separators (between two separators all
        // bytes are digits, so each element has one first digit or is empty)
        static_cast<size_t>(std::popcount(taken)) != elements || elements > limit - n) {
      stop = WindowStop::kRefused;
      break;
    }
    const __m512i pos = _mm512_maskz_compress_epi8(seps, iota);
    const __m512i first = _mm512_maskz_compress_epi8(taken, iota);
    for (size_t g = 0; g < elements; g += 8) {
      const __m512i sel = _mm512_add_epi8(lane_of, _mm512_set1_epi8(static_cast<char>(g)));
      _mm512_storeu_si512(dst + n + g, EightDigitsBefore(x, pos, first, sel, 0));
    }
    n += elements;
    elem = r + (63 - std::countl_zero(seps)) + 1;
    if ((seps & first_close) != 0) {
      stop = WindowStop::kClosed;
      break;
    }
    b += kStride;
  }
  *p = elem;
  *count = n;
  return stop;
}
#endif

// Token ids in the compact form nlohmann and Python's json.dumps(separators) write, "12,345,6":
// appends the run of elements at p that are 1-7 digits (no sign, no leading zero) each followed
// by ',' or ']'. A window of 64 bytes is taken whole when it can be (WholeWindow); otherwise
// element by element, the positions of the non-digits from the window's mask. Returns true after
// consuming a closing ']'; false with p at the first byte of an element it leaves to the caller's
// loop (a sign, whitespace, a longer number, a leading zero, the item limit, the last 64 bytes of
// the body). REQUIRES: readable_from <= p (the body's first byte).
template <typename T>
bool FastIntRun(const char*& p, const char* end, const char* readable_from, size_t max_n,
                std::vector<T>* out, TokenSink* sink) {
  // Whole windows are read into `buf` and appended a few hundred elements at a time (an append
  // per window cost a `rep movs` or a resize call each: a third of the scan).
  constexpr size_t kBuf = 1024;
  T buf[kBuf + 3];  // + the AVX2 conversion's rounding to four
  size_t k = 0;
  bool spaced_list = false;  // the last window was spaced (", ")
  const auto flush = [&] {
    out->insert(out->end(), buf, buf + k);
    k = 0;
    if constexpr (std::is_same_v<T, int64_t>) {
      if (sink != nullptr) sink->Tokens(out->data(), out->size());
    }
  };
  while (end - p >= 64) {
#if defined(KVO_AVX512_SCAN)
    if (g_token_scan >= TokenScan::kAvx512) {
      // How many more elements the item limit allows.
      const auto allowed = [&] {
        const size_t used = out->size() + k;
        return max_n > used ? max_n - used : 0;
      };
      size_t count = 0;
      WindowStop stop = WindowStop::kRefused;
      if (g_token_scan == TokenScan::kAvx512Stride && p - readable_from >= 8) {
        stop = AVX512StrideWindows(&p, end, buf + k, kBuf - k, allowed(), &count);
        k += count;
      }
      // What the stride leaves (a spaced window, a defect, the body's last bytes): the
      // element-aligned windows.
      if (stop == WindowStop::kRefused || stop == WindowStop::kEnd) {
        stop = AVX512WholeWindows(&p, end, buf + k, kBuf - k, allowed(), &count);
        k += count;
      }
      if (stop == WindowStop::kClosed) {
        flush();
        return true;
      }
      if (stop == WindowStop::kFull) {
        flush();
        continue;
      }
      if (stop == WindowStop::kEnd) break;
    }
#endif
    const char* const w = p;
    const ByteMasks masks = Masks64(w);
    if (g_token_scan < TokenScan::kAvx512) {
      bool closed = false;
      size_t count = 0;
      const size_t used = out->size() + k;
      // The compact plan, and the spaced one for a window it refuses that has spaces; once a
      // window was spaced, the spaced plan first (it takes compact windows too).
      const size_t room = max_n > used ? max_n - used : 0;
      const bool readable = w - readable_from >= 7;
      bool whole =
          readable && !spaced_list && WholeWindow(w, masks, buf + k, room, &count, &p, &closed);
      if (!whole && readable) {
        ByteMasks with_spaces = masks;
        with_spaces.space = SpaceMask64(w);
        whole = (spaced_list || with_spaces.space != 0) &&
                WholeWindow<T, true>(w, with_spaces, buf + k, room, &count, &p, &closed);
        spaced_list = whole;
      }
      if (whole) {
        k += count;
        if (closed) {
          flush();
          return true;
        }
        if (k > kBuf - 32) flush();
        continue;
      }
    }
    flush();
    const uint64_t m = masks.non_digit;
    size_t o = 0;
    while (o < 48) {  // the 8-byte load of a number starting below 48 stays in the 64 bytes
      const char* const q = w + o;
      const uint64_t rest = m >> o;
      const int n = rest == 0 ? 64 : std::countr_zero(rest);
      if (n == 0 || n > 7 || (*q == '0' && n > 1) || out->size() >= max_n) {
        p = q;
        return false;
      }
      const char c = q[n];
      if (c != ',' && c != ']') {
        p = q;
        return false;
      }
      uint64_t chunk;
      std::memcpy(&chunk, q, 8);
      out->push_back(static_cast<T>(
          EightDigits((chunk << (8 * (8 - n))) | (0x3030303030303030ULL >> (8 * n)))));
      o += static_cast<size_t>(n) + 1;
      if (c == ']') {
        p = w + o;
        return true;
      }
      o += w[o] == ' ' ? 1 : 0;  // Python's json.dumps writes ", " (o <= 57: in the window)
    }
    p = w + o;
  }
  flush();
  return false;
}
#endif

#if defined(KVO_AVX512_SCAN)
// The hashes' counterpart of FastIntRun, with AVX-512 only (TokenScan::kAvx512): whole windows of
// compact 1-20-digit elements (AVX512WholeWindows<uint64_t, 20>) while there are; true after the
// closing ']'; false with p at the first element of a window it cannot take whole (a sign,
// whitespace, a leading zero, 21 digits, a value past UINT64_MAX, the item limit, the body's last
// 64 bytes): the caller's per-element loop takes it.
bool FastHashRun(const char*& p, const char* end, size_t max_n, std::vector<uint64_t>* out) {
  constexpr size_t kBuf = 1024;
  uint64_t buf[kBuf];
  for (;;) {
    const size_t used = out->size();
    size_t count = 0;
    const WindowStop stop = AVX512WholeWindows<uint64_t, 20>(
        &p, end, buf, kBuf, max_n > used ? max_n - used : 0, &count);
    out->insert(out->end(), buf, buf + count);
    if (stop == WindowStop::kClosed) return true;
    if (stop != WindowStop::kFull) return false;
  }
}
#endif

// Reads the elements of a list of integers, p just past its '[', into *out; returns the position
// past its ']', or nullptr for anything else (then the caller falls back to the DOM). kSigned:
// token ids (int64); else u64 or int64 bit patterns (hashes). The cursor is a local of this one
// loop (no lambda holds it by reference), so it stays in a register: 131 072 token ids in
// ~2.5 ns each instead of ~6.
template <bool kSigned, typename T>
const char* ReadIntElements(const char* p, const char* end, const char* readable_from,
                            int64_t max_items, std::vector<T>* out, TokenSink* sink);

template <bool kSigned, typename T>
const char* ReadIntList(const char* p, const char* end, const char* readable_from,
                        int64_t max_items, std::vector<T>* out, TokenSink* sink) {
  SkipWs(p, end);
  if (p < end && *p == ']') return p + 1;
  return ReadIntElements<kSigned>(p, end, readable_from, max_items, out, sink);
}

// ReadIntList from an element (the list's first, or one after a ',', whitespace before it).
template <bool kSigned, typename T>
const char* ReadIntElements(const char* p, const char* end, const char* readable_from,
                            int64_t max_items, std::vector<T>* out, TokenSink* sink) {
  SkipWs(p, end);
  const size_t max_n = static_cast<size_t>(std::max<int64_t>(max_items, 0));
  // Hashes: after a window the vector code refused, the next elements one by one (a list of
  // negative or spaced hashes does not pay a refused window per element).
  int one_by_one = 0;
  for (;;) {
#if defined(__SSE2__)
    if constexpr (kSigned && std::endian::native == std::endian::little) {
      if (FastIntRun(p, end, readable_from, max_n, out, sink)) return p;
    }
#endif
#if defined(KVO_AVX512_SCAN)
    if constexpr (!kSigned && std::is_same_v<T, uint64_t> &&
                  std::endian::native == std::endian::little) {
      if (g_token_scan >= TokenScan::kAvx512 && one_by_one-- <= 0) {
        if (FastHashRun(p, end, max_n, out)) return p;
        one_by_one = 8;
      }
    }
#endif
    // Whitespace before an element (Python's json.dumps writes ", "): the windows stop there.
    if (p < end && static_cast<unsigned char>(*p) <= ' ') SkipWs(p, end);
    bool neg = false;
    if (p < end && *p == '-') {
      neg = true;
      ++p;
    }
    if (p >= end || !IsDigit(*p)) return nullptr;
    if (*p == '0' && p + 1 < end && IsDigit(p[1])) return nullptr;
    uint64_t v = 0;
    if (!ReadU64(p, end, &v)) return nullptr;
    if (p >= end) return nullptr;
    char c = *p;
    if (c == '.' || c == 'e' || c == 'E') return nullptr;
    if (neg) {
      if (v > uint64_t{1} << 63) return nullptr;
      v = ~v + 1;  // the int64's two's complement pattern
    } else if (kSigned && v > static_cast<uint64_t>(INT64_MAX)) {
      return nullptr;
    }
    if (out->size() >= max_n) return nullptr;
    out->push_back(static_cast<T>(v));
    if (c != ',' && c != ']') {  // whitespace before the separator (the compact form has none)
      SkipWs(p, end);
      if (p >= end) return nullptr;
      c = *p;
    }
    ++p;
    if (c == ']') return p;
    if (c != ',') return nullptr;
    if (p < end && static_cast<unsigned char>(*p) <= ' ') SkipWs(p, end);
  }
}

enum class Members { kList, kClosed, kFail };

// From p at an object's member (just past its '{' or a ','), or at its '}': skips members up to
// the value of one named by `keys` (kList, p at its '[') or past the object's '}' (kClosed). kFail
// for what the list scanner leaves to the DOM (a key with an escape, such a member whose value is
// not a list) and for text that ends first (a body still arriving: read on).
Members ScanMembers(const char*& p, const char* end, std::initializer_list<const char*> keys) {
  for (;;) {
    SkipWs(p, end);
    if (p < end && *p == '}') {
      ++p;
      return Members::kClosed;
    }
    if (p >= end || *p != '"') return Members::kFail;
    const char* k = ++p;
    while (p < end && *p != '"' && *p != '\\') ++p;
    if (p >= end || *p != '"') return Members::kFail;  // an escape in a key: the slow path
    const std::string_view key(k, static_cast<size_t>(p - k));
    ++p;
    SkipWs(p, end);
    if (p >= end || *p != ':') return Members::kFail;
    ++p;
    SkipWs(p, end);
    bool wanted = false;
    for (const char* w : keys) wanted = wanted || key == w;
    if (wanted) return p < end && *p == '[' ? Members::kList : Members::kFail;
    if (!SkipValue(p, end)) return Members::kFail;
    SkipWs(p, end);
    if (p < end && *p == ',') {
      ++p;
      continue;
    }
    if (p < end && *p == '}') {
      ++p;
      return Members::kClosed;
    }
    return Members::kFail;
  }
}

// From p just past the list's ']': true when the object's other members name none of `keys` (a
// second list, or both spellings, go to the DOM).
bool NoSecondList(const char* p, const char* end, std::initializer_list<const char*> keys) {
  SkipWs(p, end);
  if (p < end && *p == ',') return ScanMembers(++p, end, keys) == Members::kClosed;
  return p < end && *p == '}';
}

std::optional<BigList> FindBigList(std::string_view body, std::initializer_list<const char*> keys) {
  const char* const begin = body.data();
  const char* const end = begin + body.size();
  const char* p = begin;
  SkipWs(p, end);
  if (p >= end || *p != '{' || ScanMembers(++p, end, keys) != Members::kList) return std::nullopt;
  BigList out;
  out.open = p;
  out.close = static_cast<const char*>(std::memchr(p, ']', static_cast<size_t>(end - p)));
  if (out.close == nullptr || !NoSecondList(out.close + 1, end, keys)) return std::nullopt;
  out.rest.reserve(body.size() - static_cast<size_t>(out.close + 1 - out.open) + 2);
  out.rest.append(begin, out.open);
  out.rest.append("[]");
  out.rest.append(out.close + 1, end);
  return out;
}

// Reads the list FindBigList found into *values; false unless it is plain integers that end at
// its ']'. Room for the whole list is reserved first (an element takes 2 bytes of text at
// least), so the vector never moves while it is read (TokenSink's promise).
template <bool kSigned, typename T>
bool ReadBigList(std::string_view body, const BigList& list, int64_t max_items,
                 std::vector<T>* values, TokenSink* sink) {
  const char* const end = body.data() + body.size();
  values->reserve(std::min<size_t>(static_cast<size_t>(list.close + 1 - list.open) / 2 + 1,
                                   static_cast<size_t>(std::max<int64_t>(max_items, 0)) + 1));
  const T* const data = values->data();
  const char* p = ReadIntList<kSigned>(list.open + 1, end, body.data(), max_items, values, sink);
  if (values->data() != data) std::abort();  // the reservation above makes this impossible
  return p == list.close + 1;
}

}  // namespace

std::string_view EngineTypeName(EngineType t) {
  switch (t) {
    case EngineType::kVllm:
      return "vLLM";
    case EngineType::kSglang:
      return "SGLang";
  }
  return "vLLM";
}

RouterTier RouterTierOf(std::string_view medium) {
  if (medium == "GPU") return RouterTier::kGpu;
  if (medium == "CPU") return RouterTier::kCpu;
  if (medium == "STORAGE" || medium == "DISK") return RouterTier::kDisk;
  return RouterTier::kOther;
}

std::string Registration::SourceName() const {
  return instance_id + "@" + tenant_id + "@" + std::to_string(dp_rank);
}

std::string Registration::Key() const {
  return instance_id + "|" + tenant_id + "|" + std::to_string(dp_rank);
}

namespace {

Result<Registration> ParseRegistration(std::string_view body, bool allow_remote, bool stored) {
  KVO_ASSIGN_OR_RETURN(json o, ParseBody(body, "/register", 64));
  Registration r;
  if (stored) {
    KVO_ASSIGN_OR_RETURN(auto from, OptString(o, "discovered_from"));
    r.discovered_from = from.value_or("");
    // A discovered registration names the host the operator's --discover named.
    if (!r.discovered_from.empty()) allow_remote = true;
  }
  KVO_ASSIGN_OR_RETURN(r.endpoint, ReqString(o, "endpoint"));
  KVO_RETURN_IF_ERROR(CheckEndpoint(r.endpoint, "endpoint", allow_remote));
  KVO_ASSIGN_OR_RETURN(r.replay_endpoint, OptString(o, "replay_endpoint"));
  if (r.replay_endpoint && r.replay_endpoint->empty()) r.replay_endpoint.reset();
  if (r.replay_endpoint) {
    KVO_RETURN_IF_ERROR(CheckEndpoint(*r.replay_endpoint, "replay_endpoint", allow_remote));
    if (*r.replay_endpoint == r.endpoint) {
      return Bad("'replay_endpoint' must differ from 'endpoint'");
    }
  }
  KVO_ASSIGN_OR_RETURN(std::string type, ReqString(o, "type"));
  if (type == "vLLM" || type == "vllm") {
    r.type = EngineType::kVllm;
  } else if (type == "SGLang" || type == "sglang") {
    r.type = EngineType::kSglang;
  } else if (type == "Mooncake") {
    return Bad(
        "'type' 'Mooncake' is not supported: kvo decodes vLLM's event format (vLLM, SGLang)");
  } else {
    return Bad("'type' must be \"vLLM\", \"SGLang\" or \"Mooncake\", got '" + CutForMessage(type) +
               "'");
  }
  KVO_ASSIGN_OR_RETURN(auto model, ModelKey(o));
  if (!model) return Bad("'modelname' is required");
  r.model = *model;
  KVO_ASSIGN_OR_RETURN(auto lora, OptString(o, "lora_name"));
  r.lora_name = lora.value_or("");
  KVO_ASSIGN_OR_RETURN(r.tenant_id, Identity(o, "tenant_id", "default"));
  KVO_ASSIGN_OR_RETURN(r.instance_id, Identity(o, "instance_id", std::nullopt));
  KVO_ASSIGN_OR_RETURN(r.block_size, ReqInt(o, "block_size", 1, kMaxBlockSize));
  KVO_ASSIGN_OR_RETURN(r.dp_rank, ReqInt(o, "dp_rank", 0, kMaxRank));
  KVO_ASSIGN_OR_RETURN(auto salt, OptString(o, "additionalsalt"));
  if (!salt) {
    KVO_ASSIGN_OR_RETURN(salt, OptString(o, "additional_salt"));
  }
  r.additional_salt = salt.value_or("");
  KVO_ASSIGN_OR_RETURN(auto topic, OptString(o, "topic"));
  r.topic = topic.value_or("");
  KVO_ASSIGN_OR_RETURN(auto ranks, OptInt(o, "dp_ranks", 1, kMaxRanksPerRequest));
  r.dp_ranks = ranks.value_or(1);
  if (stored && r.dp_ranks != 1) return Bad("a stored registration has 'dp_ranks' != 1");
  if (r.dp_rank + r.dp_ranks - 1 > kMaxRank) {
    return Bad("'dp_rank' + 'dp_ranks' - 1 must be at most " + std::to_string(kMaxRank));
  }
  // Each rank's source name, "<instance_id>@<tenant_id>@<dp_rank>", must fit: refused here,
  // naming the fields the client sent, before anything is stored.
  const size_t name = r.instance_id.size() + r.tenant_id.size() + 2 +
                      std::to_string(r.dp_rank + r.dp_ranks - 1).size();
  if (name > kMaxSourceName) {
    return Bad("'instance_id' and 'tenant_id' are too long together (" +
               std::to_string(r.instance_id.size()) + " + " + std::to_string(r.tenant_id.size()) +
               " characters): '<instance_id>@<tenant_id>@<dp_rank>' must be at most " +
               std::to_string(kMaxSourceName) + " characters");
  }
  return r;
}

}  // namespace

Result<Registration> ParseRegisterRequest(std::string_view body, bool allow_remote) {
  return ParseRegistration(body, allow_remote, false);
}

Result<Registration> ParseStoredRegistration(std::string_view body, bool allow_remote) {
  return ParseRegistration(body, allow_remote, true);
}

Result<std::vector<Registration>> ExpandRanks(const Registration& r) {
  std::vector<Registration> out;
  for (int64_t i = 0; i < r.dp_ranks; ++i) {
    Registration one = r;
    one.dp_ranks = 1;
    one.dp_rank = r.dp_rank + i;
    if (i > 0) {
      auto ep = OffsetEndpointPort(r.endpoint, i);
      if (!ep.ok())
        return Bad("'endpoint' for rank " + std::to_string(one.dp_rank) + ": " +
                   ep.status().message());
      one.endpoint = *ep;
      if (r.replay_endpoint) {
        auto rep = OffsetEndpointPort(*r.replay_endpoint, i);
        if (!rep.ok())
          return Bad("'replay_endpoint' for rank " + std::to_string(one.dp_rank) + ": " +
                     rep.status().message());
        one.replay_endpoint = *rep;
      }
    }
    out.push_back(std::move(one));
  }
  // No endpoint twice among the ranks (a rank's PUB port on another's replay port: vLLM could not
  // bind them both, and the SUB would dial a ROUTER and hear nothing).
  std::map<std::string, std::string> seen;  // endpoint -> which
  for (const Registration& one : out) {
    const std::string rank = "rank " + std::to_string(one.dp_rank) + "'s ";
    for (const auto& [ep, which] :
         {std::pair{std::optional<std::string>(one.endpoint), rank + "'endpoint'"},
          std::pair{one.replay_endpoint, rank + "'replay_endpoint'"}}) {
      if (!ep) continue;
      auto [it, fresh] = seen.emplace(*ep, which);
      if (!fresh) {
        return Bad(which + " '" + CutForMessage(*ep) + "' is also " + it->second +
                   " (the ranks' ports are the given ones + rank offset)");
      }
    }
  }
  return out;
}

std::string RenderRegistration(const Registration& r) {
  OJson j;
  j["endpoint"] = r.endpoint;
  if (r.replay_endpoint) j["replay_endpoint"] = *r.replay_endpoint;
  j["type"] = std::string(EngineTypeName(r.type));
  j["modelname"] = r.model;
  j["lora_name"] = r.lora_name;
  j["tenant_id"] = r.tenant_id;
  j["instance_id"] = r.instance_id;
  j["block_size"] = r.block_size;
  j["dp_rank"] = r.dp_rank;
  j["additionalsalt"] = r.additional_salt;
  if (!r.topic.empty()) j["topic"] = r.topic;
  if (!r.discovered_from.empty()) j["discovered_from"] = r.discovered_from;
  return j.dump();
}

std::string FirstDifference(const Registration& a, const Registration& b) {
  // discovered_from is provenance, not part of the subscription: not compared.
  if (a.endpoint != b.endpoint) return "endpoint";
  if (a.replay_endpoint != b.replay_endpoint) return "replay_endpoint";
  if (a.type != b.type) return "type";
  if (a.model != b.model) return "modelname";
  if (a.lora_name != b.lora_name) return "lora_name";
  if (a.block_size != b.block_size) return "block_size";
  if (a.additional_salt != b.additional_salt) return "additionalsalt";
  if (a.topic != b.topic) return "topic";
  return "";
}

Result<UnregisterRequest> ParseUnregisterRequest(std::string_view body) {
  KVO_ASSIGN_OR_RETURN(json o, ParseBody(body, "/unregister", 64));
  UnregisterRequest u;
  KVO_ASSIGN_OR_RETURN(u.instance_id, Identity(o, "instance_id", std::nullopt));
  KVO_ASSIGN_OR_RETURN(u.tenant_id, Identity(o, "tenant_id", "default"));
  KVO_ASSIGN_OR_RETURN(u.dp_rank, OptInt(o, "dp_rank", 0, kMaxRank));
  return u;
}

namespace {

// The whole body through nlohmann's DOM.
Result<RouterQuery> ParseRouterQueryDom(std::string_view body, bool by_hash, int64_t max_items) {
  const char* route = by_hash ? "/query_by_hash" : "/query";
  KVO_ASSIGN_OR_RETURN(json o,
                       ParseBody(body, route, max_items, by_hash ? "seq_hashes" : "token_ids"));
  RouterQuery q;
  KVO_ASSIGN_OR_RETURN(auto model, ModelKey(o));
  if (!model) return Bad("'model' is required");
  q.model = *model;
  KVO_ASSIGN_OR_RETURN(auto lora, OptString(o, "lora_name"));
  const json* lora_id = Find(o, "lora_id");
  if (lora_id != nullptr && !lora_id->is_null()) {
    if (lora) return Bad("'lora_name' and 'lora_id' are both given; send one");
    if (lora_id->is_string()) {
      lora = lora_id->get<std::string>();
    } else if (lora_id->is_number_integer()) {
      lora = lora_id->dump();
    } else {
      return Bad("'lora_id' must be a string or an integer, got " + DescribeJson(*lora_id));
    }
  }
  q.lora_name = lora.value_or("");
  KVO_ASSIGN_OR_RETURN(q.tenant_id, Identity(o, "tenant_id", "default"));
  KVO_ASSIGN_OR_RETURN(auto instance, OptString(o, "instance_id"));
  if (instance) {
    KVO_ASSIGN_OR_RETURN(q.instance_id, Identity(o, "instance_id", std::nullopt));
  }
  KVO_ASSIGN_OR_RETURN(q.block_size, ReqInt(o, "block_size", 1, kMaxBlockSize));
  KVO_ASSIGN_OR_RETURN(auto salt, OptString(o, "cache_salt"));
  q.cache_salt = salt.value_or("");
  if (by_hash) {
    const json* seq = Find(o, "seq_hashes");
    const json* old = Find(o, "block_hash");
    if (seq != nullptr && old != nullptr) {
      return Bad("'seq_hashes' and 'block_hash' are both given; send one");
    }
    if (seq == nullptr && old == nullptr) return Bad("'seq_hashes' is required");
    KVO_ASSIGN_OR_RETURN(q.hashes, Hashes(seq != nullptr ? *seq : *old,
                                          seq != nullptr ? "seq_hashes" : "block_hash"));
  } else {
    const json* v = Find(o, "token_ids");
    if (v == nullptr) return Bad("'token_ids' is required");
    if (!v->is_array())
      return Bad("'token_ids' must be an array of integers, got " + DescribeJson(*v));
    q.token_ids.reserve(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      if (!t.is_number_integer() ||
          (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
        return Bad("'token_ids[" + std::to_string(i) + "]' must be an integer, got " +
                   DescribeJson(t));
      }
      q.token_ids.push_back(t.get<int64_t>());
    }
  }
  return q;
}

#if defined(__SSE2__)
// ListHelper's chunks. A chunk holds the elements whose first digit lies in its bytes [a, b);
// it stops at the first element at or past b (kNext), past the list's ']' (kClosed), or at an
// element the compact scanner would leave to the per-element reader (kRefused): the handler
// reads on sequentially from `stop`.
enum class ChunkEnd { kNext, kClosed, kRefused };

struct ListChunk {
  std::vector<int64_t>* tokens = nullptr;  // the helper's buffer for this chunk
  const char* start = nullptr;  // its first element; nullptr: none found, or the body failed
  const char* stop = nullptr;
  ChunkEnd end = ChunkEnd::kRefused;
  bool by_helper = false;         // read by the helper's thread
  std::atomic<uint32_t> done{0};  // 1 once the fields above are final (release)
};

// The first byte of an element: a digit after ',' or ", " (inside the list, where the chunk's
// join checks it is).
inline bool ElementStart(const char* p) {
  return IsDigit(*p) && (p[-1] == ',' || (p[-1] == ' ' && p[-2] == ','));
}

inline void SkipSpaceAfterComma(const char*& p, const char* end) {
  if (p < end && *p == ' ' && p[-1] == ',') ++p;
}

}  // namespace

struct ListHelper::Job {
  const ArrivingBody* body = nullptr;
  const char* data = nullptr;
  size_t size = 0;
  const char* first = nullptr;  // the list's first element
  size_t max_n = 0;             // the item limit
  size_t chunk_bytes = 0;
  size_t chunks = 0;
  std::unique_ptr<ListChunk[]> chunk;
  std::atomic<size_t> next{0};    // the next chunk nobody took
  std::atomic<bool> over{false};  // the handler joined what it will: take no more
  size_t takeovers = 0;           // chunks the handler read after the helper stalled on them
  size_t joined_from_helper = 0;  // chunks the helper read that the handler joined
};

namespace {

// The body bytes chunk i needs in place: its own and the 80 after them (an element that starts
// in it ends past it).
size_t ChunkNeeds(const ListHelper::Job& job, size_t i) {
  const size_t end = i + 1 == job.chunks
                         ? job.size
                         : static_cast<size_t>(job.first - job.data) + (i + 1) * job.chunk_bytes;
  return std::min<size_t>(end + 80, job.size);
}

// Waits until `need` bytes of the body are in place; false when it never completes. `have`: how
// much of the body this thread saw.
bool WaitForBytes(const ListHelper::Job& job, size_t need, size_t& have) {
  while (have < need) {
    const size_t now = job.body->WaitBeyond(have);
    if (now <= have) return false;
    have = now;
  }
  return true;
}

// Reads chunk i of `job` into c (see ListChunk), waiting for the bytes it needs.
void ParseChunk(const ListHelper::Job& job, size_t i, size_t& have, ListChunk& c) {
  const char* const data = job.data;
  const char* const all_end = data + job.size;
  const char* const a = job.first + i * job.chunk_bytes;
  const char* const b = i + 1 == job.chunks ? all_end : a + job.chunk_bytes;
  c.tokens->clear();
  c.start = c.stop = nullptr;
  c.end = ChunkEnd::kRefused;
  if (!WaitForBytes(job, ChunkNeeds(job, i), have)) return;  // the body never completes
  const char* p = a;
  if (i != 0) {
    const char* const scan_end = std::min(a + 64, b);
    while (p < scan_end && !ElementStart(p)) ++p;
    if (p >= scan_end) return;
  }
  c.start = p;
  c.tokens->reserve(static_cast<size_t>(b - a) / 2 + 2);
  for (;;) {
    SkipSpaceAfterComma(p, all_end);
    if (p >= b) {
      c.end = ChunkEnd::kNext;
      break;
    }
    const char* const before = p;
    if (FastIntRun(p, b, data, job.max_n, c.tokens, nullptr)) {
      c.end = ChunkEnd::kClosed;
      break;
    }
    if (p != before) continue;  // it took some: the boundary again
    // One element by FastIntRun's per-element rules: 1-7 digits, no leading zero, ',' or ']'.
    const char* q = p;
    while (q < all_end && q - p < 8 && IsDigit(*q)) ++q;
    const auto n = q - p;
    if (n == 0 || n > 7 || (*p == '0' && n > 1) || q >= all_end || (*q != ',' && *q != ']')) {
      break;  // kRefused at p
    }
    int64_t v = 0;
    for (const char* d = p; d < q; ++d) v = v * 10 + (*d - '0');
    c.tokens->push_back(v);
    p = q + 1;
    if (*q == ']') {
      c.end = ChunkEnd::kClosed;
      break;
    }
  }
  c.stop = p;
}

// The list from `first` (its first element, a digit) in chunks, the handler and the lease's
// thread taking turns (ListHelper); appends the joined chunks' tokens to *tokens (feeding `sink`).
// Returns where the sequential scanner goes on: an element's first byte, or past the list's ']'
// (*closed set). `have`: how much of the body the handler saw.
const char* JoinChunks(ListHelper::Lease& lease, const ArrivingBody& body, const char* first,
                       size_t& have, size_t max_n, std::vector<int64_t>* tokens, TokenSink* sink,
                       bool* closed) {
  ListHelper& helper = *lease.helper();
  const ListHelper::Options& o = helper.options();
  ListHelper::Job* const job_ptr = lease.NewJob();
  if (job_ptr == nullptr) return first;  // the lease was used already: the handler reads alone
  ListHelper::Job& job = *job_ptr;
  job.body = &body;
  job.data = body.data();
  job.size = body.size();
  job.first = first;
  job.max_n = max_n;
  const size_t list_bytes = static_cast<size_t>(job.data + job.size - first);
  job.chunk_bytes = std::max(o.chunk_bytes, (list_bytes + o.max_chunks - 1) / o.max_chunks);
  job.chunks = (list_bytes + job.chunk_bytes - 1) / job.chunk_bytes;
  job.chunk = std::make_unique<ListChunk[]>(job.chunks);
  for (size_t i = 0; i < job.chunks; ++i) job.chunk[i].tokens = helper.Buffer(i);
  helper.Post(&job);
  // A chunk the helper stalled on, read again here (its own buffer: the helper may still write
  // the chunk's).
  std::vector<int64_t> spare;
  ListChunk retaken;
  retaken.tokens = &spare;
  const char* pos = first;
  for (size_t joined = 0; joined < job.chunks;) {
    ListChunk* c = &job.chunk[joined];
    if (c->done.load(std::memory_order_acquire) == 0) {
      // Not read yet: read the next chunk nobody took, or (none left) wait for the helper's.
      const size_t mine = job.next.fetch_add(1, std::memory_order_relaxed);
      if (mine < job.chunks) {
        ParseChunk(job, mine, have, job.chunk[mine]);
        job.chunk[mine].done.store(1, std::memory_order_release);
        continue;
      }
      // The helper has it. Its bytes first (the helper waits for them too), then a bounded wait.
      if (!WaitForBytes(job, ChunkNeeds(job, joined), have)) break;
      const int64_t waiting_since = o.clock->MonotonicNanos();
      bool stalled = false;
      SpinUntil([&] {
        if (c->done.load(std::memory_order_acquire) != 0) return true;
        stalled = o.clock->MonotonicNanos() - waiting_since >= o.takeover_after_ns;
        return stalled;
      });
      if (stalled) {
        ParseChunk(job, joined, have, retaken);
        c = &retaken;
        ++job.takeovers;
      }
    }
    // Joined only where the last chunk stopped, and within the item limit.
    if (c->start != pos || tokens->size() + c->tokens->size() > max_n) break;
    tokens->insert(tokens->end(), c->tokens->begin(), c->tokens->end());
    if (sink != nullptr) sink->Tokens(tokens->data(), tokens->size());
    job.joined_from_helper += c->by_helper ? 1 : 0;
    pos = c->stop;
    ++joined;
    if (c->end == ChunkEnd::kClosed) {
      *closed = true;
      break;
    }
    if (c->end == ChunkEnd::kRefused) break;
  }
  // The helper takes no more; the lease waits for it to leave the chunk it is in.
  job.over.store(true, std::memory_order_release);
  return pos;
}
#endif  // __SSE2__

}  // namespace

ListHelper::ListHelper(Options options)
    : options_(std::move(options)), buffers_(options_.max_chunks) {
  for (size_t t = 0; t < std::max<size_t>(options_.threads, 1); ++t) {
    threads_.emplace_back([this] { Run(); });
    pthread_setname_np(threads_.back().native_handle(), "kvo-list-parse");
  }
}

ListHelper::~ListHelper() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

std::unique_ptr<ListHelper::Lease> ListHelper::TryLease() {
  bool expected = false;
  if (!leased_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return nullptr;
  return std::unique_ptr<Lease>(new Lease(this));
}

ListHelper::Lease::Lease(ListHelper* h) : helper_(h) {}

ListHelper::Job* ListHelper::Lease::NewJob() {
  if (job_ != nullptr) return nullptr;
  job_ = std::make_unique<Job>();
  return job_.get();
}

size_t ListHelper::Lease::takeovers() const { return job_ != nullptr ? job_->takeovers : 0; }

size_t ListHelper::Lease::joined_from_helper() const {
  return job_ != nullptr ? job_->joined_from_helper : 0;
}

ListHelper::Lease::~Lease() {
  if (job_ != nullptr) {
    job_->over.store(true, std::memory_order_release);
    helper_->Retire(job_.get());
  }
  // Only buffers of the smallest chunks are kept (a 128k-token list's: 128 kB each, 8 MB for all
  // max_chunks at most); a longer list's longer chunks give theirs back.
  const size_t keep = helper_->options_.chunk_bytes / 2 + 2;
  for (std::vector<int64_t>& b : helper_->buffers_) {
    if (b.capacity() > keep) std::vector<int64_t>().swap(b);
  }
  helper_->leased_.store(false, std::memory_order_release);
}

std::vector<int64_t>* ListHelper::Buffer(size_t i) { return &buffers_[i]; }

void ListHelper::Post(Job* job) {
  {
    MutexLock lock(&mu_);
    posted_ = job;
    ++posted_generation_;
  }
  cv_.SignalAll();
}

void ListHelper::Retire(Job* job) {
  MutexLock lock(&mu_);
  if (posted_ != job) return;  // never posted
  posted_ = nullptr;           // no thread takes it from now on
  while (working_ > 0) cv_.Wait();
}

void ListHelper::Run() {
  uint64_t taken = 0;  // the generation of the last job this thread took
  for (;;) {
    Job* job = nullptr;
    {
      MutexLock lock(&mu_);
      while ((posted_ == nullptr || posted_generation_ == taken) && !stop_) cv_.Wait();
      if (stop_) return;
      job = posted_;
      taken = posted_generation_;
      ++working_;
    }
#if defined(__SSE2__)
    size_t have = 0;
    while (!job->over.load(std::memory_order_acquire)) {
      const size_t i = job->next.fetch_add(1, std::memory_order_relaxed);
      if (i >= job->chunks) break;
      if (options_.before_chunk) options_.before_chunk(i);
      ParseChunk(*job, i, have, job->chunk[i]);
      job->chunk[i].by_helper = true;
      job->chunk[i].done.store(1, std::memory_order_release);
      chunks_by_helper_.fetch_add(1, std::memory_order_relaxed);
    }
#endif
    {
      MutexLock lock(&mu_);
      --working_;
    }
    cv_.SignalAll();
  }
}

Result<RouterQuery> ParseRouterQuery(std::string_view body, bool by_hash, int64_t max_items,
                                     TokenSink* sink) {
  // The big list's place first, the rest of the body through the ordinary parser, then the list
  // by hand (fed to the sink once the rest says the block size and LoRA).
  std::optional<BigList> big =
      FindBigList(body, by_hash ? std::initializer_list<const char*>{"seq_hashes", "block_hash"}
                                : std::initializer_list<const char*>{"token_ids"});
  if (!big) return ParseRouterQueryDom(body, by_hash, max_items);
  Result<RouterQuery> head = ParseRouterQueryDom(big->rest, by_hash, max_items);
  if (by_hash) {
    std::vector<uint64_t> hashes;
    if (!ReadBigList<false>(body, *big, max_items, &hashes, nullptr)) {
      return ParseRouterQueryDom(body, by_hash, max_items);
    }
    if (head.ok()) head->hashes = std::move(hashes);
    return head;
  }
  std::vector<int64_t> tokens;
  const bool feed = sink != nullptr && head.ok() && head->block_size > 0;
  if (feed) {
    // One element per two bytes at most ("1,"), and never more than max_items.
    const size_t fits = static_cast<size_t>(big->close - big->open) / 2 + 1;
    sink->Begin(head->block_size, head->lora_name,
                std::min(fits, static_cast<size_t>(std::max<int64_t>(max_items, 0))));
  }
  const bool read = ReadBigList<true>(body, *big, max_items, &tokens, feed ? sink : nullptr);
  if (feed) {
    if (read) sink->Tokens(tokens.data(), tokens.size());
    sink->End(read);
  }
  if (!read) return ParseRouterQueryDom(body, by_hash, max_items);
  if (head.ok()) head->token_ids = std::move(tokens);
  return head;
}

Result<RouterQuery> ParseRouterQuery(const ArrivingBody& body, int64_t max_items, TokenSink* sink,
                                     ListHelper::Lease* lists) {
  const char* const data = body.data();
  const size_t size = body.size();
  size_t have = 0;
  // More of the body (false: it never comes), or all of it.
  const auto more = [&] {
    const size_t now = body.WaitBeyond(have);
    if (now <= have) return false;
    have = now;
    return true;
  };
  const auto whole = [&] {
    while (have < size) {
      if (!more()) return false;
    }
    return true;
  };
  const auto ended = [] {
    return Result<RouterQuery>(Status::InvalidArgument("the body ended before its Content-Length"));
  };
  if (!more()) return ended();
  // The members before the list, scanned again each time the bytes in place have doubled (a
  // sender of one byte at a time costs no more than two scans of the head). No list in the first
  // kArrivingHead bytes (or a head the scanner leaves to the DOM): the body is read whole first.
  constexpr size_t kArrivingHead = 64u << 10;
  const char* open = nullptr;
  for (size_t scan_at = 0;;) {
    if (have >= scan_at || have == size) {
      const char* p = data;
      const char* const end = data + have;
      SkipWs(p, end);
      if (p < end && *p != '{') break;
      const Members m = p < end ? ScanMembers(++p, end, {"token_ids"}) : Members::kFail;
      if (m == Members::kList) open = p;
      if (m != Members::kFail || have == size || have >= kArrivingHead) break;
      scan_at = 2 * have;
    }
    if (!more()) return ended();
  }
  if (open == nullptr) {
    if (!whole()) return ended();
    return ParseRouterQuery(std::string_view(data, size), false, max_items, sink);
  }
  // The members before the list say the block size and LoRA (the sink begins on them) unless
  // some come after it; the members after it are checked against them at the end.
  std::string rest(data, open);
  const size_t head_bytes = rest.size();
  rest.append("[]}");
  Result<RouterQuery> head = ParseRouterQueryDom(rest, false, max_items);
  const bool feed = sink != nullptr && head.ok() && head->block_size > 0;
  const int64_t begun_block_size = feed ? head->block_size : 0;
  const std::string begun_lora = feed ? head->lora_name : std::string();
  // The list's text is at most the rest of the body: one element per two bytes ("1,").
  const size_t max_n = static_cast<size_t>(std::max<int64_t>(max_items, 0));
  const size_t fits = (size - head_bytes) / 2 + 1;
  if (feed) sink->Begin(begun_block_size, begun_lora, std::min(fits, max_n));
  std::vector<int64_t> tokens;
  tokens.reserve(std::min(fits, max_n + 1));  // it never moves (TokenSink's promise)
  const int64_t* const storage = tokens.data();
  TokenSink* const feed_to = feed ? sink : nullptr;
  // Whole 64-byte windows of compact ids as they arrive; the rest (a list that does not start
  // with a digit, an element the windows leave to the per-element reader, the last bytes) once
  // the body is whole.
  const char* p = open + 1;
  const char* closed = nullptr;  // past the list's ']', once read
  bool started = false;
#if defined(__SSE2__)
  if constexpr (std::endian::native == std::endian::little) {
    started = p < data + have && IsDigit(*p);
    // A long list: in chunks, with the helper's thread (ListHelper).
    const size_t list_bytes = static_cast<size_t>(data + size - p);
    const ListHelper::Options* lo = lists != nullptr ? &lists->helper()->options() : nullptr;
    if (started && lo != nullptr && list_bytes >= lo->min_list_bytes &&
        list_bytes <= lo->max_list_bytes) {
      bool list_closed = false;
      p = JoinChunks(*lists, body, p, have, max_n, &tokens, feed_to, &list_closed);
      if (list_closed) closed = p;
    }
    while (started && closed == nullptr) {
      const char* const end = data + have;
      if (FastIntRun(p, end, data, max_n, &tokens, feed_to)) {
        closed = p;
        break;
      }
      if (end - p >= 64 || have == size) break;
      if (!more()) {
        if (feed) sink->End(false);
        return ended();
      }
    }
  }
#endif
  if (!whole()) {
    if (feed) sink->End(false);
    return ended();
  }
  const char* const end = data + size;
  if (closed == nullptr) {
    closed = started ? ReadIntElements<true>(p, end, data, max_items, &tokens, feed_to)
                     : ReadIntList<true>(p, end, data, max_items, &tokens, feed_to);
  }
  if (tokens.data() != storage) std::abort();  // the reservation above makes this impossible
  bool read = closed != nullptr;
  if (read) {
    // The members after the list: none (the head's parse stands: the same text), or parsed
    // with the head.
    if (end - closed != 1 || *closed != '}') {
      read = NoSecondList(closed, end, {"token_ids"});
      rest.resize(head_bytes);
      rest.append("[]");
      rest.append(closed, end);
      if (read) head = ParseRouterQueryDom(rest, false, max_items);
    }
  }
  if (feed) {
    const bool same =
        read && head.ok() && head->block_size == begun_block_size && head->lora_name == begun_lora;
    if (same) sink->Tokens(tokens.data(), tokens.size());
    sink->End(same);
  }
  if (!read) return ParseRouterQueryDom(std::string_view(data, size), false, max_items);
  if (head.ok()) head->token_ids = std::move(tokens);
  return head;
}

TokenScan SetTokenScan(TokenScan wanted) {
  g_token_scan = std::min(wanted, g_best_token_scan);
  return g_best_token_scan;
}

Result<RouterQuery> ParseRouterQueryReference(std::string_view body, bool by_hash,
                                              int64_t max_items) {
  return ParseRouterQueryDom(body, by_hash, max_items);
}

TierBoundaries MatchTiers(const std::vector<ExplainBlock>& blocks, std::string_view source,
                          int64_t dp_rank) {
  auto mask = [&](const ExplainBlock& b) {
    unsigned m = 0;
    for (const ExplainHolder& h : b.holders) {
      if (h.source != source || h.dp_rank != dp_rank) continue;
      switch (RouterTierOf(h.medium)) {
        case RouterTier::kGpu:
          m |= 1;
          break;
        case RouterTier::kCpu:
          m |= 2;
          break;
        case RouterTier::kDisk:
          m |= 4;
          break;
        case RouterTier::kOther:
          break;
      }
    }
    return m;
  };
  TierBoundaries b;
  size_t i = 0;
  const size_t n = blocks.size();
  while (i < n && (mask(blocks[i]) & 1u) != 0) ++i;
  b.gpu = static_cast<int64_t>(i);
  while (i < n && (mask(blocks[i]) & 3u) != 0) ++i;
  b.cpu = static_cast<int64_t>(i);
  while (i < n && (mask(blocks[i]) & 7u) != 0) ++i;
  b.disk = static_cast<int64_t>(i);
  return b;
}

namespace {

// One rank's boundaries folded into its instance's totals (AddRank's rule); returns the rank's
// longest match in tokens.
int64_t FoldTotals(const TierBoundaries& b, int64_t block_size, InstanceTotals* m) {
  const int64_t gpu = b.gpu * block_size;
  const int64_t cpu = b.cpu > b.gpu ? b.cpu * block_size : 0;
  const int64_t disk = b.disk > b.cpu ? b.disk * block_size : 0;
  const int64_t longest = b.disk * block_size;
  m->gpu = std::max(m->gpu, gpu);
  m->cpu = std::max(m->cpu, cpu);
  m->disk = std::max(m->disk, disk);
  m->longest_matched = std::max(m->longest_matched, longest);
  return longest;
}

}  // namespace

void AddRank(const TierBoundaries& b, int64_t dp_rank, int64_t block_size, InstanceMatch* m) {
  const int64_t longest = FoldTotals(b, block_size, m);
  int64_t& dp = m->dp[dp_rank];
  dp = std::max(dp, longest);
}

RouterAnswerPlan PlanRouterAnswer(std::vector<ScopedStream> streams) {
  RouterAnswerPlan plan;
  // Instances by id, each with its ranks.
  std::sort(streams.begin(), streams.end(), [](const ScopedStream& a, const ScopedStream& b) {
    return std::tie(a.instance_id, a.dp_rank) < std::tie(b.instance_id, b.dp_rank);
  });
  for (const ScopedStream& s : streams) {
    if (plan.instances.empty() || plan.instances.back().id != s.instance_id) {
      plan.instances.push_back({s.instance_id, {}, plan.slots});
    }
    RouterAnswerPlan::Instance& in = plan.instances.back();
    if (in.ranks.empty() || in.ranks.back() != s.dp_rank) {
      in.ranks.push_back(s.dp_rank);
      ++plan.slots;
    }
    plan.streams.push_back({s.source, s.dp_rank, static_cast<uint32_t>(plan.instances.size() - 1),
                            static_cast<uint32_t>(plan.slots - 1)});
  }
  const auto by_stream = [](const RouterAnswerPlan::Stream& a, const RouterAnswerPlan::Stream& b) {
    return std::tie(a.source, a.dp_rank) < std::tie(b.source, b.dp_rank);
  };
  std::stable_sort(plan.streams.begin(), plan.streams.end(), by_stream);
  const auto same = [](const RouterAnswerPlan::Stream& a, const RouterAnswerPlan::Stream& b) {
    return a.source == b.source && a.dp_rank == b.dp_rank;
  };
  plan.streams.erase(std::unique(plan.streams.begin(), plan.streams.end(), same),
                     plan.streams.end());
  return plan;
}

void FoldStream(const RouterAnswerPlan& plan, std::string_view source, int64_t dp_rank,
                const TierBoundaries& b, int64_t block_size, RouterAnswer* answer) {
  const auto it =
      std::lower_bound(plan.streams.begin(), plan.streams.end(), source,
                       [dp_rank](const RouterAnswerPlan::Stream& s, std::string_view x) {
                         const int c = std::string_view(s.source).compare(x);
                         return c < 0 || (c == 0 && s.dp_rank < dp_rank);
                       });
  if (it == plan.streams.end() || it->source != source || it->dp_rank != dp_rank) return;
  const int64_t longest = FoldTotals(b, block_size, &answer->instances[it->instance]);
  int64_t& dp = answer->dp[it->slot];
  dp = std::max(dp, longest);
}

namespace {

// `s` as a JSON string, byte for byte what nlohmann's dump() writes for it; false (nothing
// appended) for a byte >= 0x80, which the caller leaves to nlohmann (it checks the UTF-8).
bool AppendJsonString(std::string* out, std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  out->push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (u < 0x20) {
          out->append("\\u00");
          out->push_back(kHexDigits[u >> 4]);
          out->push_back(kHexDigits[u & 15]);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
  return true;
}

void AppendJsonKey(std::string* out, std::string_view s) {
  if (!AppendJsonString(out, s)) out->append(OJson(std::string(s)).dump());
  out->push_back(':');
}

void AppendInt(std::string* out, int64_t v) {
  char b[24];
  auto [end, ec] = std::to_chars(b, b + sizeof b, v);
  out->append(b, end);
}

// `"id":{"longest_matched":..,"GPU":..,"DP":{"rank":n,..},"CPU":..,"DISK":..}`; `ranks` calls
// its argument with each (rank, tokens) in order.
template <typename Ranks>
void AppendInstance(std::string* out, std::string_view id, const InstanceTotals& m,
                    const Ranks& ranks) {
  AppendJsonKey(out, id);
  out->append("{\"longest_matched\":");
  AppendInt(out, m.longest_matched);
  out->append(",\"GPU\":");
  AppendInt(out, m.gpu);
  out->append(",\"DP\":{");
  bool first_rank = true;
  ranks([&](int64_t rank, int64_t n) {
    if (!first_rank) out->push_back(',');
    first_rank = false;
    out->push_back('"');
    AppendInt(out, rank);
    out->append("\":");
    AppendInt(out, n);
  });
  out->append("},\"CPU\":");
  AppendInt(out, m.cpu);
  out->append(",\"DISK\":");
  AppendInt(out, m.disk);
  out->push_back('}');
}

void OpenResponse(std::string* out, const std::string& tenant, size_t instances) {
  out->reserve(32 + instances * 96);
  out->push_back('{');
  AppendJsonKey(out, tenant);
  out->push_back('{');
}

}  // namespace

// Written directly (the OJson tree of 100 instances cost ~130 us, a fifth of a /query_by_hash
// handler); the same bytes as the tree's dump(): keys in insertion order, no spaces
// (RouterApiTest's RenderedResponseEqualsTheJsonTree).
std::string RenderRouterQueryResponse(const std::string& tenant,
                                      const std::map<std::string, InstanceMatch>& instances) {
  std::string out;
  OpenResponse(&out, tenant, instances.size());
  bool first = true;
  for (const auto& entry : instances) {
    if (!first) out.push_back(',');
    first = false;
    const InstanceMatch& m = entry.second;  // (a structured binding cannot be captured: C++20)
    AppendInstance(&out, entry.first, m, [&m](const auto& each) {
      for (const auto& [rank, n] : m.dp) each(rank, n);
    });
  }
  out.append("}}");
  return out;
}

std::string RenderRouterAnswer(const std::string& tenant, const RouterAnswerPlan& plan,
                               const RouterAnswer& answer) {
  std::string out;
  OpenResponse(&out, tenant, plan.instances.size());
  for (size_t i = 0; i < plan.instances.size(); ++i) {
    if (i > 0) out.push_back(',');
    const RouterAnswerPlan::Instance& in = plan.instances[i];
    AppendInstance(&out, in.id, answer.instances[i], [&](const auto& each) {
      for (size_t r = 0; r < in.ranks.size(); ++r) each(in.ranks[r], answer.dp[in.first_slot + r]);
    });
  }
  out.append("}}");
  return out;
}

std::string RenderRouterQueryResponseTree(const std::string& tenant,
                                          const std::map<std::string, InstanceMatch>& instances) {
  OJson by_instance = OJson::object();
  for (const auto& [id, m] : instances) {
    OJson e;
    e["longest_matched"] = m.longest_matched;
    e["GPU"] = m.gpu;
    OJson dp = OJson::object();
    for (const auto& [rank, n] : m.dp) dp[std::to_string(rank)] = n;
    e["DP"] = std::move(dp);
    e["CPU"] = m.cpu;
    e["DISK"] = m.disk;
    by_instance[id] = std::move(e);
  }
  OJson out;
  out[tenant] = std::move(by_instance);
  return out.dump();
}

std::string RenderRegistered(const std::string& instance_id) {
  OJson j;
  j["status"] = "registered successfully";
  j["instance_id"] = instance_id;
  return j.dump();
}

std::string RenderUnregistered(const std::vector<std::string>& removed) {
  OJson j;
  j["status"] = "unregistered successfully";
  j["removed_instances"] = removed;
  return j.dump();
}

std::string RenderWorkers(const std::vector<WorkerInfo>& workers) {
  OJson list = OJson::array();
  for (const WorkerInfo& w : workers) {
    OJson j;
    j["instance_id"] = w.reg.instance_id;
    j["tenant_id"] = w.reg.tenant_id;
    j["dp_rank"] = w.reg.dp_rank;
    j["endpoint"] = w.reg.endpoint;
    j["replay_endpoint"] = w.reg.replay_endpoint ? OJson(*w.reg.replay_endpoint) : OJson(nullptr);
    if (w.registered) {
      j["type"] = std::string(EngineTypeName(w.reg.type));
      j["model_name"] = w.reg.model;
      j["lora_name"] = w.reg.lora_name;
      j["block_size"] = w.reg.block_size;
    }
    j["source"] = w.source;
    j["registered"] = w.registered;
    j["state"] = StreamPhaseName(w.state);
    j["last_sequence"] = w.last_sequence ? OJson(*w.last_sequence) : OJson(nullptr);
    list.push_back(std::move(j));
  }
  OJson out;
  out["workers"] = std::move(list);
  return out.dump();
}

}  // namespace kvo
