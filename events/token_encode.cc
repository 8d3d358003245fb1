// Eight tokens per step: each token's byte length from two or three compares of the 8 int64s, the
// opcode/head put in byte 4 of each, one VPERMB laying every token out as [head, 4 value bytes],
// and one VPCOMPRESSB keeping the head and the value bytes each token needs (the keep mask built
// with PDEP from the compare masks). ~8 ns for a 16-token block against ~20 ns one token at a time
// (the scalar loop is throughput-bound at ~12 instructions a token), this VM (bench/RESULTS.md).
#include "events/token_encode_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12's AVX-512 intrinsics start their unmasked forms from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports at every inlined use (a false positive: no lane of it is read).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvo::token_encode {

#if defined(__x86_64__)
namespace {

#define KVO_VBMI2 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,bmi2,popcnt")))

// Bit 5i + offset for i = 0..7: one bit per token's 5-byte slot.
constexpr uint64_t SlotBits(int offset) {
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r |= uint64_t{1} << (5 * i + offset);
  return r;
}

// VPERMB indexes: slot i = [byte 4 of qword i (the head), bytes 0-3 of qword i (the value)]
// little-endian (pickle) or big-endian (CBOR).
constexpr auto SlotIndex(bool big_endian) {
  struct Idx {
    alignas(64) uint8_t v[64];
  } idx{};
  for (size_t i = 0; i < 8; ++i) {
    idx.v[5 * i] = static_cast<uint8_t>(8 * i + 4);
    for (size_t k = 0; k < 4; ++k) {
      idx.v[5 * i + 1 + k] = static_cast<uint8_t>(8 * i + (big_endian ? 3 - k : k));
    }
  }
  return idx;
}
constexpr auto kPickleIndex = SlotIndex(false);
constexpr auto kCborIndex = SlotIndex(true);

// Eight tokens as qwords; *ok when none is above `max`.
KVO_VBMI2 inline __m512i Load8(const int64_t* t, uint64_t max, bool* ok) {
  const __m512i z = _mm512_loadu_si512(t);
  *ok = _mm512_cmpgt_epu64_mask(z, _mm512_set1_epi64(static_cast<int64_t>(max))) == 0;
  return z;
}

KVO_VBMI2 inline __m512i Set8(uint64_t v) { return _mm512_set1_epi64(static_cast<int64_t>(v)); }

// The slots of `values | heads` (each value below 2^32, each head in byte 4 of its qword) laid out
// by `index`, the `keep` bytes stored at p (64 bytes written); returns the end of the kept bytes.
KVO_VBMI2 inline uint8_t* Keep(__m512i values, __m512i heads, const uint8_t* index, uint64_t keep,
                               uint8_t* p) {
  const __m512i slots =
      _mm512_permutexvar_epi8(_mm512_load_si512(index), _mm512_or_si512(values, heads));
  _mm512_storeu_si512(p, _mm512_maskz_compress_epi8(keep, slots));
  return p + _mm_popcnt_u64(keep);
}

// Groups of eight while whole groups are left and every token is at most `max`; `group` writes
// one group's bytes (PickleGroup, CborGroup).
template <class Group>
KVO_VBMI2 size_t Groups(const int64_t* tokens, size_t n, uint64_t max, Group group, uint8_t** p) {
  uint8_t* out = *p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    bool ok;
    const __m512i u = Load8(tokens + i, max, &ok);
    if (!ok) break;
    out = group(u, out);
  }
  *p = out;
  return i;
}

// Pickle: K + 1 byte below 256, M + 2 bytes below 65536, J + 4 bytes (signed 32-bit) up to
// INT32_MAX; slot bytes kept: the opcode and byte 0 always, byte 1 from 256, bytes 2-3 from 65536.
struct PickleGroup {
  KVO_VBMI2 uint8_t* operator()(__m512i u, uint8_t* out) const {
    const __mmask8 two = _mm512_cmpgt_epu64_mask(u, Set8(0xFF));
    const __mmask8 four = _mm512_cmpgt_epu64_mask(u, Set8(0xFFFF));
    __m512i op = Set8(uint64_t{'K'} << 32);
    op = _mm512_mask_mov_epi64(op, two, Set8(uint64_t{'M'} << 32));
    op = _mm512_mask_mov_epi64(op, four, Set8(uint64_t{'J'} << 32));
    const uint64_t f = _pdep_u64(four, SlotBits(3));
    const uint64_t keep = SlotBits(0) | SlotBits(1) | _pdep_u64(two, SlotBits(2)) | f | (f << 1);
    return Keep(u, op, kPickleIndex.v, keep, out);
  }
};

// CBOR (major type 0): the value itself below 24, 0x18 + 1 byte to 255, 0x19 + 2 bytes to 65535,
// 0x1A + 4 bytes to UINT32_MAX, big-endian; slot bytes kept: the head always, then the last 1, 2
// or 4 value bytes.
struct CborGroup {
  KVO_VBMI2 uint8_t* operator()(__m512i u, uint8_t* out) const {
    const __mmask8 one = _mm512_cmpgt_epu64_mask(u, Set8(23));
    const __mmask8 two = _mm512_cmpgt_epu64_mask(u, Set8(0xFF));
    const __mmask8 four = _mm512_cmpgt_epu64_mask(u, Set8(0xFFFF));
    __m512i head = _mm512_slli_epi64(u, 32);  // below 24 the head is the value
    head = _mm512_mask_mov_epi64(head, one, Set8(uint64_t{0x18} << 32));
    head = _mm512_mask_mov_epi64(head, two, Set8(uint64_t{0x19} << 32));
    head = _mm512_mask_mov_epi64(head, four, Set8(uint64_t{0x1A} << 32));
    const uint64_t f = _pdep_u64(four, SlotBits(1));
    const uint64_t keep =
        SlotBits(0) | _pdep_u64(one, SlotBits(4)) | _pdep_u64(two, SlotBits(3)) | f | (f << 1);
    return Keep(u, head, kCborIndex.v, keep, out);
  }
};

}  // namespace

bool VectorAvailable() {
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("bmi2");
  }();
  return available;
}

size_t PickleGroups(const int64_t* tokens, size_t n, uint8_t** p) {
  return Groups(tokens, n, 0x7FFFFFFF, PickleGroup{}, p);
}

size_t CborGroups(const int64_t* tokens, size_t n, uint8_t** p) {
  return Groups(tokens, n, 0xFFFFFFFF, CborGroup{}, p);
}

#undef KVO_VBMI2

#else  // not x86-64: the scalar encoders write every token.

bool VectorAvailable() { return false; }
size_t PickleGroups(const int64_t*, size_t, uint8_t**) { return 0; }
size_t CborGroups(const int64_t*, size_t, uint8_t**) { return 0; }

#endif

}  // namespace kvo::token_encode
