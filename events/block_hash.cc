// vLLM block hashes. The pickle writer mirrors CPython 3's Modules/_pickle.c (protocol 5):
//   * dump(): PROTO 5 unframed, then framing on; STOP; the last frame is committed.
//   * _Pickler_Write(): the first write while no frame is open reserves a 9-byte FRAME header.
//   * _Pickler_CommitFrame(): a frame of >= 4 payload bytes gets its header, a smaller one has the
//     reserved header removed.
//   * save(): every call (atoms included) first runs _Pickler_OpcodeBoundary(), which commits the
//     open frame once it holds >= 64 KiB. The closing TUPLE/MEMOIZE/STOP are not save() calls.
//   * _Pickler_write_bytes(): a str/bytes payload >= 64 KiB commits the open frame and is written
//     (header and data) outside any frame.
//   * memo: str, bytes and non-empty tuples get MEMOIZE; a repeated object is BINGET/LONG_BINGET;
//     ints, None and () are never memoized.
// Everything is written into one reused buffer, then hashed with OpenSSL's SHA-256 or
// libxxhash's XXH3-128 (seed 0, canonical big-endian digest as Python's xxh3_128_digest).
#include "events/block_hash.h"

// SHA256_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP, kept and supported;
// see BlockHasher::Impl::Sha256 for why they are used here.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>
#include <variant>

#include "common/check.h"
#include "common/json.h"
#include "events/token_encode_internal.h"
#define XXH_INLINE_ALL  // XXH3 compiled here: the chain's 16-token blocks skip a PLT call each
#include "xxhash.h"

namespace kvo {
namespace {

constexpr int kMaxExtraKeyDepth = 64;

// ---------------------------------------------------------------------------------------------
// A growable byte buffer that keeps its capacity across blocks.
class ByteBuffer {
 public:
  void Clear() { size_ = 0; }
  void Reserve(size_t n) {
    if (n > buf_.size()) buf_.resize(std::max(n, buf_.size() * 2));
  }
  uint8_t* Extend(size_t n) {
    if (size_ + n > buf_.size()) Reserve(size_ + n);
    uint8_t* p = buf_.data() + size_;
    size_ += n;
    return p;
  }
  void Append(const void* p, size_t n) {
    if (n != 0) std::memcpy(Extend(n), p, n);
  }
  void Push(uint8_t b) { *Extend(1) = b; }
  uint8_t* Data() { return buf_.data(); }
  size_t Size() const { return size_; }
  void Truncate(size_t n) { size_ = n; }
  std::string_view View() const { return {reinterpret_cast<const char*>(buf_.data()), size_}; }

 private:
  std::vector<uint8_t> buf_;
  size_t size_ = 0;
};

void PutLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutLe64(uint8_t* p, uint64_t v) {
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);  // one store (GCC -O2 kept the byte loop a loop)
}

// Strict UTF-8 (what a Python str can encode to): no overlongs, surrogates or > U+10FFFF.
bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t* end = p + s.size();
  while (p < end) {
    uint8_t c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    p += n + 1;
  }
  return true;
}

std::string Printable(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string out = s.size() > kMax ? std::string(s.substr(0, kMax)) + "..." : std::string(s);
  return out;
}

// ---------------------------------------------------------------------------------------------
// pickle protocol 5, as CPython's C pickler writes it.
namespace op {
constexpr uint8_t kProto = 0x80;
constexpr uint8_t kFrame = 0x95;
constexpr uint8_t kStop = '.';
constexpr uint8_t kMark = '(';
constexpr uint8_t kTuple = 't';
constexpr uint8_t kEmptyTuple = ')';
constexpr uint8_t kTupleN[4] = {kEmptyTuple, 0x85, 0x86, 0x87};  // TUPLE1..TUPLE3
constexpr uint8_t kNone = 'N';
constexpr uint8_t kBinInt = 'J';
constexpr uint8_t kBinInt1 = 'K';
constexpr uint8_t kBinInt2 = 'M';
constexpr uint8_t kLong1 = 0x8a;
constexpr uint8_t kShortBinBytes = 'C';
constexpr uint8_t kBinBytes = 'B';
constexpr uint8_t kBinBytes8 = 0x8e;
constexpr uint8_t kShortBinUnicode = 0x8c;
constexpr uint8_t kBinUnicode = 'X';
constexpr uint8_t kBinUnicode8 = 0x8d;
constexpr uint8_t kMemoize = 0x94;
constexpr uint8_t kBinGet = 'h';
constexpr uint8_t kLongBinGet = 'j';
}  // namespace op

constexpr size_t kFrameHeaderSize = 9;
constexpr size_t kFrameSizeMin = 4;
constexpr size_t kFrameSizeTarget = size_t{64} * 1024;
constexpr size_t kNoFrame = static_cast<size_t>(-1);

constexpr size_t kMaxIntSize = 10;  // LONG1, length, 8 bytes

// save_long() for an int64: BININT1 / BININT2 / BININT (signed 32-bit) / LONG1 with the minimal
// little-endian two's complement (CPython's nbits/8+1 bytes, trimmed once). Returns the length.
inline size_t EncodeInt(int64_t v, uint8_t* b) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    const auto u = static_cast<uint32_t>(v);
    if (u <= 0xFF) {
      b[0] = op::kBinInt1;
      b[1] = static_cast<uint8_t>(u);
      return 2;
    }
    if (u <= 0xFFFF) {
      b[0] = op::kBinInt2;
      b[1] = static_cast<uint8_t>(u);
      b[2] = static_cast<uint8_t>(u >> 8);
      return 3;
    }
    b[0] = op::kBinInt;
    PutLe32(b + 1, u);
    return 5;
  }
  const auto u = static_cast<uint64_t>(v);
  size_t len = 8;
  while (len > 1) {
    const auto top = static_cast<uint8_t>(u >> (8 * (len - 1)));
    const bool next_negative = ((u >> (8 * (len - 1) - 1)) & 1) != 0;
    if ((top == 0x00 && !next_negative) || (top == 0xFF && next_negative)) {
      --len;
    } else {
      break;
    }
  }
  b[0] = op::kLong1;
  b[1] = static_cast<uint8_t>(len);
  PutLe64(b + 2, u);  // only the first `len` bytes count
  return 2 + len;
}

// EncodeInt for a token id, branch-free for the usual 0 <= v <= INT32_MAX (BININT1/BININT2/BININT
// are all the opcode then the little-endian low bytes of v; token ids mix 2- and 3-byte forms at
// random, so a branch per token mispredicts). Needs kMaxIntSize writable bytes at `b`.
inline uint8_t* EncodeToken(int64_t v, uint8_t* b) {
  if (static_cast<uint64_t>(v) > static_cast<uint64_t>(INT32_MAX)) return b + EncodeInt(v, b);
  static constexpr uint8_t kOp[3] = {op::kBinInt1, op::kBinInt2, op::kBinInt};
  static constexpr uint8_t kLen[3] = {2, 3, 5};
  const auto u = static_cast<uint32_t>(v);
  const int cls = static_cast<int>(u > 0xFF) + static_cast<int>(u > 0xFFFF);
  b[0] = kOp[cls];
  PutLe32(b + 1, u);
  return b + kLen[cls];
}

// EncodeToken with one 8-byte store and the opcode and length computed, not looked up (the
// fast paths' token loop: ~30% of a 16-token xxhash block's time went to the table loads and the
// byte-by-byte PutLe32). Little-endian hosts; needs 8 writable bytes at `b` (kMaxIntSize >= 8).
inline uint8_t* EncodeTokenFast(int64_t v, uint8_t* b) {
  static_assert(op::kBinInt2 == op::kBinInt1 + 2 && op::kBinInt == op::kBinInt1 - 1);
  static_assert(kMaxIntSize >= 8);
  if constexpr (std::endian::native != std::endian::little) return EncodeToken(v, b);
  if (static_cast<uint64_t>(v) > static_cast<uint64_t>(INT32_MAX)) return b + EncodeInt(v, b);
  const auto u = static_cast<uint32_t>(v);
  const uint32_t two = u > 0xFF ? 1 : 0;     // BININT2 or wider
  const uint32_t four = u > 0xFFFF ? 1 : 0;  // BININT
  // K (0x4B), M (K + 2), J (K - 1 = K + 2 - 3).
  const uint64_t word = uint64_t{op::kBinInt1 + 2 * two - 3 * four} | (uint64_t{u} << 8);
  std::memcpy(b, &word, 8);
  return b + size_t{2 + two + 2 * four};
}

class Pickler {
 public:
  explicit Pickler(ByteBuffer* out) : out_(out) {}

  void Begin() {
    out_->Clear();
    framing_ = false;
    frame_start_ = kNoFrame;
    memo_size_ = 0;
    shared_.clear();
    const uint8_t proto[2] = {op::kProto, 5};
    Write(proto, 2);
    framing_ = true;
  }

  void Finish() {
    Op(op::kStop);
    CommitFrame();
    framing_ = false;
  }

  void SaveNone() {
    OpcodeBoundary();
    Op(op::kNone);
  }

  void SaveInt(int64_t v) {
    OpcodeBoundary();
    uint8_t b[kMaxIntSize];
    Write(b, EncodeInt(v, b));
  }

  void SaveUint(uint64_t v) {
    if (v <= static_cast<uint64_t>(INT64_MAX)) return SaveInt(static_cast<int64_t>(v));
    OpcodeBoundary();
    uint8_t b[11];
    b[0] = op::kLong1;
    b[1] = 9;  // the sign needs a ninth, zero, byte
    PutLe64(b + 2, v);
    b[10] = 0;
    Write(b, sizeof(b));
  }

  void SaveStr(std::string_view utf8) {
    OpcodeBoundary();
    const int key = SharedStrKey(utf8);
    if (Get(key)) return;
    SaveData(utf8, op::kShortBinUnicode, op::kBinUnicode, op::kBinUnicode8);
    Memoize(key);
  }

  void SaveBytes(std::string_view data) {
    OpcodeBoundary();
    const int key = SharedBytesKey(data);
    if (Get(key)) return;
    SaveData(data, op::kShortBinBytes, op::kBinBytes, op::kBinBytes8);
    Memoize(key);
  }

  // A tuple of n elements: BeginTuple(n), save the n elements, EndTuple(n).
  void BeginTuple(size_t n) {
    OpcodeBoundary();
    if (n > 3) Op(op::kMark);
  }
  void EndTuple(size_t n) {
    if (n == 0) {
      Op(op::kEmptyTuple);  // the () singleton is never memoized
      return;
    }
    Op(n <= 3 ? op::kTupleN[n] : op::kTuple);
    Memoize(-1);
  }

  // tuple(token_ids): the same bytes as BeginTuple + SaveInt each + EndTuple, but the tokens go
  // straight into the buffer in runs that provably cannot reach a frame boundary.
  void SaveTokens(std::span<const int64_t> tokens) {
    KVO_DCHECK(framing_);
    BeginTuple(tokens.size());
    size_t i = 0;
    while (i < tokens.size()) {
      OpcodeBoundary();  // the check save() makes before token i
      if (frame_start_ == kNoFrame) {
        frame_start_ = out_->Size();
        out_->Extend(kFrameHeaderSize);
      }
      // The checks before tokens i+1 .. i+run-1 see a frame shorter than the target, so they are
      // no-ops: frame_len + (run - 1) * kMaxIntSize < kFrameSizeTarget.
      const size_t frame_len = out_->Size() - frame_start_ - kFrameHeaderSize;
      const size_t run =
          std::min(tokens.size() - i, (kFrameSizeTarget - 1 - frame_len) / kMaxIntSize + 1);
      const size_t start = out_->Size();
      uint8_t* const begin = out_->Extend(run * kMaxIntSize);
      uint8_t* p = begin;
      for (size_t end = i + run; i < end; ++i) p = EncodeToken(tokens[i], p);
      out_->Truncate(start + static_cast<size_t>(p - begin));
    }
    EndTuple(tokens.size());
  }

 private:
  void Write(const void* p, size_t n) {
    if (framing_ && frame_start_ == kNoFrame) {
      frame_start_ = out_->Size();
      out_->Extend(kFrameHeaderSize);
    }
    out_->Append(p, n);
  }
  void Op(uint8_t opcode) { Write(&opcode, 1); }

  void CommitFrame() {
    if (!framing_ || frame_start_ == kNoFrame) return;
    const size_t len = out_->Size() - frame_start_ - kFrameHeaderSize;
    uint8_t* q = out_->Data() + frame_start_;
    if (len >= kFrameSizeMin) {
      q[0] = op::kFrame;
      PutLe64(q + 1, len);
    } else {
      std::memmove(q, q + kFrameHeaderSize, len);
      out_->Truncate(out_->Size() - kFrameHeaderSize);
    }
    frame_start_ = kNoFrame;
  }

  void OpcodeBoundary() {
    if (framing_ && frame_start_ != kNoFrame &&
        out_->Size() - frame_start_ - kFrameHeaderSize >= kFrameSizeTarget) {
      CommitFrame();
    }
  }

  // _save_bytes_data / write_unicode_binary + _Pickler_write_bytes.
  void SaveData(std::string_view data, uint8_t short_op, uint8_t op4, uint8_t op8) {
    uint8_t header[9];
    size_t header_len;
    if (data.size() <= 0xFF) {
      header[0] = short_op;
      header[1] = static_cast<uint8_t>(data.size());
      header_len = 2;
    } else if (data.size() <= 0xFFFFFFFFu) {
      header[0] = op4;
      PutLe32(header + 1, static_cast<uint32_t>(data.size()));
      header_len = 5;
    } else {
      header[0] = op8;
      PutLe64(header + 1, data.size());
      header_len = 9;
    }
    const bool bypass = data.size() >= kFrameSizeTarget;
    const bool framing = framing_;
    if (bypass) {
      CommitFrame();
      framing_ = false;
    }
    Write(header, header_len);
    Write(data.data(), data.size());
    framing_ = framing;
  }

  // CPython's shared singletons: '' and one-character latin-1 strs, b'' and one-byte bytes.
  // Returns a key in [0, 514) or -1 for an ordinary (distinct) object.
  static int SharedBytesKey(std::string_view b) {
    if (b.empty()) return 0;
    if (b.size() == 1) return 1 + static_cast<uint8_t>(b[0]);
    return -1;
  }
  static int SharedStrKey(std::string_view s) {
    constexpr int kBase = 257;
    if (s.empty()) return kBase;
    const auto c0 = static_cast<uint8_t>(s[0]);
    if (s.size() == 1 && c0 < 0x80) return kBase + 1 + c0;
    if (s.size() == 2 && (c0 == 0xC2 || c0 == 0xC3)) {
      return kBase + 1 + (((c0 & 0x1F) << 6) | (static_cast<uint8_t>(s[1]) & 0x3F));
    }
    return -1;
  }

  // Writes a memo GET and returns true when the shared object `key` was already memoized.
  bool Get(int key) {
    if (key < 0) return false;
    for (const auto& [k, idx] : shared_) {
      if (k != key) continue;
      if (idx < 256) {
        const uint8_t b[2] = {op::kBinGet, static_cast<uint8_t>(idx)};
        Write(b, 2);
      } else {
        uint8_t b[5] = {op::kLongBinGet};
        PutLe32(b + 1, idx);
        Write(b, 5);
      }
      return true;
    }
    return false;
  }

  void Memoize(int key) {
    Op(op::kMemoize);
    if (key >= 0) shared_.emplace_back(key, memo_size_);
    ++memo_size_;
  }

  ByteBuffer* out_;
  bool framing_ = false;
  size_t frame_start_ = kNoFrame;
  uint32_t memo_size_ = 0;
  std::vector<std::pair<int, uint32_t>> shared_;  // shared singleton key -> memo index
};

// The common block, (parent, tuple(tokens), None) with a 2..255-byte parent (a digest) and a
// preimage well under 64 KiB, written in one pass: exactly the bytes the Pickler writes for it
// (PROTO 5, one FRAME, SHORT_BINBYTES + MEMOIZE, the token tuple, NONE, TUPLE3 + MEMOIZE, STOP)
// without its per-opcode bookkeeping.
constexpr size_t kFastPickleMaxTokens = 6000;  // 6000 * 10 + 300 bytes < the 64 KiB frame target
static_assert(kFastPickleMaxTokens * kMaxIntSize + 300 < kFrameSizeTarget);

// The fast paths' token tuples: groups of eight through the vector encoder when `vector` (and the
// CPU has it), the rest one by one.
inline uint8_t* PickleTokens(std::span<const int64_t> tokens, uint8_t* p, bool vector) {
  size_t i = vector ? token_encode::PickleGroups(tokens.data(), tokens.size(), &p) : 0;
  for (; i < tokens.size(); ++i) p = EncodeTokenFast(tokens[i], p);
  return p;
}

// A parent digest's bytes at p: the two digest sizes by fixed-size copies (no memmove call).
inline void CopyParent(uint8_t* p, std::string_view parent) {
  if (parent.size() == 16) {
    std::memcpy(p, parent.data(), 16);
  } else if (parent.size() == 32) {
    std::memcpy(p, parent.data(), 32);
  } else {
    std::memcpy(p, parent.data(), parent.size());
  }
}

// The most bytes FastPickleBlockAt writes (and the slack its stores need past them).
constexpr size_t FastPickleBlockBound(size_t parent_size, size_t n) {
  return 2 + kFrameHeaderSize + 2 + parent_size + 2 + n * kMaxIntSize + 8 +
         token_encode::kGroupSlack;
}

// The pickled block at `b` (FastPickleBlockBound bytes writable) in three steps, so that
// HashBlocksWire's chain writes the prefix its blocks share once: FastPicklePrefix writes
// everything before the tokens (the FRAME's length left for the finish) and returns the tokens'
// offset; FastPickleFinish closes the tuples and sets the FRAME length, returns the length. The
// parent sits at offset kFastPickleParentAt.
constexpr size_t kFastPickleParentAt = 2 + kFrameHeaderSize + 2;
size_t FastPicklePrefix(uint8_t* const b, std::string_view parent, size_t n) {
  uint8_t* p = b;
  *p++ = op::kProto;
  *p++ = 5;
  *p = op::kFrame;
  p += kFrameHeaderSize;
  *p++ = op::kShortBinBytes;
  *p++ = static_cast<uint8_t>(parent.size());
  CopyParent(p, parent);
  p += parent.size();
  *p++ = op::kMemoize;
  if (n > 3) *p++ = op::kMark;
  return static_cast<size_t>(p - b);
}

size_t FastPickleFinish(uint8_t* const b, uint8_t* p, size_t n) {
  if (n == 0) {
    *p++ = op::kEmptyTuple;
  } else {
    *p++ = n <= 3 ? op::kTupleN[n] : op::kTuple;
    *p++ = op::kMemoize;
  }
  static constexpr uint8_t kEnd[4] = {op::kNone, op::kTupleN[3], op::kMemoize, op::kStop};
  std::memcpy(p, kEnd, 4);
  p += 4;
  PutLe64(b + 3, static_cast<uint64_t>(p - b) - 2 - kFrameHeaderSize);
  return static_cast<size_t>(p - b);
}

size_t FastPickleBlockAt(uint8_t* const b, std::string_view parent, std::span<const int64_t> tokens,
                         bool vector) {
  uint8_t* const p = PickleTokens(tokens, b + FastPicklePrefix(b, parent, tokens.size()), vector);
  return FastPickleFinish(b, p, tokens.size());
}

void FastPickleBlock(ByteBuffer* out, std::string_view parent, std::span<const int64_t> tokens,
                     bool vector) {
  const size_t start = out->Size();
  uint8_t* const b = out->Extend(FastPickleBlockBound(parent.size(), tokens.size()));
  out->Truncate(start + FastPickleBlockAt(b, parent, tokens, vector));
}

// ---------------------------------------------------------------------------------------------
// Canonical CBOR (cbor2.dumps(obj, canonical=True)) for the same objects.
class CborWriter {
 public:
  explicit CborWriter(ByteBuffer* out) : out_(out) {}

  void Head(uint8_t major, uint64_t arg) {
    uint8_t b[9];
    out_->Append(b, HeadTo(b, major, arg));
  }
  // Writes a head (at most 9 bytes) at `b`; returns its length.
  static size_t HeadTo(uint8_t* b, uint8_t major, uint64_t arg) {
    const auto m = static_cast<uint8_t>(major << 5);
    size_t n;
    if (arg < 24) {
      b[0] = static_cast<uint8_t>(m | arg);
      n = 1;
    } else if (arg <= 0xFF) {
      b[0] = m | 24;
      b[1] = static_cast<uint8_t>(arg);
      n = 2;
    } else if (arg <= 0xFFFF) {
      b[0] = m | 25;
      b[1] = static_cast<uint8_t>(arg >> 8);
      b[2] = static_cast<uint8_t>(arg);
      n = 3;
    } else if (arg <= 0xFFFFFFFFu) {
      b[0] = m | 26;
      for (int i = 0; i < 4; ++i) b[1 + i] = static_cast<uint8_t>(arg >> (8 * (3 - i)));
      n = 5;
    } else {
      b[0] = m | 27;
      for (int i = 0; i < 8; ++i) b[1 + i] = static_cast<uint8_t>(arg >> (8 * (7 - i)));
      n = 9;
    }
    return n;
  }
  void Int(int64_t v) {
    if (v >= 0) {
      Head(0, static_cast<uint64_t>(v));
    } else {
      Head(1, ~static_cast<uint64_t>(v));  // -1 - v
    }
  }
  void Uint(uint64_t v) { Head(0, v); }
  void Bytes(std::string_view b) {
    Head(2, b.size());
    out_->Append(b.data(), b.size());
  }
  void Str(std::string_view s) {
    Head(3, s.size());
    out_->Append(s.data(), s.size());
  }
  void Array(size_t n) { Head(4, n); }
  void Null() { out_->Push(0xF6); }
  // Array(n) then Int(t) each (CborTokenFast).
  void Tokens(std::span<const int64_t> tokens) {
    Array(tokens.size());
    const size_t start = out_->Size();
    uint8_t* const begin = out_->Extend(tokens.size() * kCborMaxHead);
    uint8_t* p = begin;
    for (int64_t t : tokens) p = CborTokenFast(t, p);
    out_->Truncate(start + static_cast<size_t>(p - begin));
  }
  static constexpr size_t kCborMaxHead = 9;

  // Int(t) at `p` (kCborMaxHead writable bytes); returns the end. Branch-free for
  // 0 <= t <= UINT32_MAX (heads of 1, 2, 3 or 5 bytes, the argument big-endian).
  static uint8_t* CborTokenFast(int64_t t, uint8_t* p) {
    if (static_cast<uint64_t>(t) > 0xFFFFFFFFu) {
      return p + (t >= 0 ? HeadTo(p, 0, static_cast<uint64_t>(t))
                         : HeadTo(p, 1, ~static_cast<uint64_t>(t)));
    }
    static constexpr uint8_t kHead[4] = {0, 24, 25, 26};
    static constexpr uint8_t kLen[4] = {0, 1, 2, 4};
    const auto u = static_cast<uint32_t>(t);
    const int cls =
        static_cast<int>(u >= 24) + static_cast<int>(u > 0xFF) + static_cast<int>(u > 0xFFFF);
    const uint64_t shifted = static_cast<uint64_t>(u) << (8 * (4 - kLen[cls]));
    p[0] = cls == 0 ? static_cast<uint8_t>(u) : kHead[cls];
    p[1] = static_cast<uint8_t>(shifted >> 24);
    p[2] = static_cast<uint8_t>(shifted >> 16);
    p[3] = static_cast<uint8_t>(shifted >> 8);
    p[4] = static_cast<uint8_t>(shifted);
    return p + 1 + kLen[cls];
  }

 private:
  ByteBuffer* out_;
};

// The common block in canonical CBOR, [parent, [tokens], null], written in one pass: the bytes
// CborWriter writes for it (Array(3), Bytes(parent), Tokens, Null).
constexpr size_t FastCborBlockBound(size_t parent_size, size_t n) {
  return 1 + CborWriter::kCborMaxHead + parent_size + CborWriter::kCborMaxHead +
         n * CborWriter::kCborMaxHead + 1 + token_encode::kGroupSlack;
}

// The parent's offset in FastCborBlockAt's bytes: after the array head and the bytes head.
constexpr size_t FastCborParentAt(size_t parent_size) { return parent_size < 24 ? 2 : 3; }

// Before the tokens (their offset returned), the tokens, and after them (the length returned).
size_t FastCborPrefix(uint8_t* const b, std::string_view parent, size_t n) {
  uint8_t* p = b;
  *p++ = 0x83;  // array of 3
  p += CborWriter::HeadTo(p, 2, parent.size());
  CopyParent(p, parent);
  p += parent.size();
  p += CborWriter::HeadTo(p, 4, n);
  return static_cast<size_t>(p - b);
}

inline uint8_t* CborTokens(std::span<const int64_t> tokens, uint8_t* p, bool vector) {
  size_t i = vector ? token_encode::CborGroups(tokens.data(), tokens.size(), &p) : 0;
  for (; i < tokens.size(); ++i) p = CborWriter::CborTokenFast(tokens[i], p);
  return p;
}

size_t FastCborFinish(uint8_t* const b, uint8_t* p) {
  *p++ = 0xF6;  // null
  return static_cast<size_t>(p - b);
}

size_t FastCborBlockAt(uint8_t* const b, std::string_view parent, std::span<const int64_t> tokens,
                       bool vector) {
  return FastCborFinish(b,
                        CborTokens(tokens, b + FastCborPrefix(b, parent, tokens.size()), vector));
}

void FastCborBlock(ByteBuffer* out, std::string_view parent, std::span<const int64_t> tokens,
                   bool vector) {
  const size_t start = out->Size();
  uint8_t* const b = out->Extend(FastCborBlockBound(parent.size(), tokens.size()));
  out->Truncate(start + FastCborBlockAt(b, parent, tokens, vector));
}

// ---------------------------------------------------------------------------------------------
// Extra keys: str, int, bytes and tuples of them.
std::string TypeName(const Value& v) {
  if (std::holds_alternative<std::string>(v.v)) return "a str";
  if (std::holds_alternative<Binary>(v.v)) return "a bytes";
  if (std::holds_alternative<int64_t>(v.v) || std::holds_alternative<uint64_t>(v.v)) {
    return "an int";
  }
  if (std::holds_alternative<ValueArray>(v.v)) return "a tuple";
  if (std::holds_alternative<bool>(v.v)) return "a bool";
  if (std::holds_alternative<double>(v.v)) return "a float";
  return "None";
}

std::string DescribeUnsupported(const Value& v) {
  char buf[64];
  if (const bool* b = std::get_if<bool>(&v.v)) {
    return std::string("bool (") + (*b ? "true" : "false") + ")";
  }
  if (const double* d = std::get_if<double>(&v.v)) {
    std::snprintf(buf, sizeof(buf), "float (%.17g)", *d);
    return buf;
  }
  if (v.is_nil()) return "None (nil)";
  return "unknown";
}

Status UnsupportedExtraKey(const Value& v) {
  return Status::InvalidArgument("unsupported extra key type " + DescribeUnsupported(v) +
                                 ": vLLM extra keys are str, int, bytes or tuples of them");
}

Status CheckStr(const std::string& s) {
  if (IsValidUtf8(s)) return Status::Ok();
  return Status::InvalidArgument("extra key str '" + Printable(s) +
                                 "' is not valid UTF-8 (use bytes for binary data)");
}

Status TooDeep() {
  return Status::InvalidArgument("extra keys nested deeper than " +
                                 std::to_string(kMaxExtraKeyDepth) + " tuples");
}

Status CheckValue(const Value& value, int depth) {
  if (depth > kMaxExtraKeyDepth) return TooDeep();
  if (const auto* s = std::get_if<std::string>(&value.v)) return CheckStr(*s);
  if (const auto* a = std::get_if<ValueArray>(&value.v)) {
    for (const Value& item : *a) KVO_RETURN_IF_ERROR(CheckValue(item, depth + 1));
    return Status::Ok();
  }
  if (std::holds_alternative<int64_t>(value.v) || std::holds_alternative<uint64_t>(value.v) ||
      std::holds_alternative<Binary>(value.v)) {
    return Status::Ok();
  }
  return UnsupportedExtraKey(value);
}

Status PickleValue(Pickler& p, const Value& value, int depth) {
  if (depth > kMaxExtraKeyDepth) return TooDeep();
  if (const auto* i = std::get_if<int64_t>(&value.v)) {
    p.SaveInt(*i);
  } else if (const auto* u = std::get_if<uint64_t>(&value.v)) {
    p.SaveUint(*u);
  } else if (const auto* s = std::get_if<std::string>(&value.v)) {
    KVO_RETURN_IF_ERROR(CheckStr(*s));
    p.SaveStr(*s);
  } else if (const auto* b = std::get_if<Binary>(&value.v)) {
    p.SaveBytes(b->data);
  } else if (const auto* a = std::get_if<ValueArray>(&value.v)) {
    p.BeginTuple(a->size());
    for (const Value& e : *a) KVO_RETURN_IF_ERROR(PickleValue(p, e, depth + 1));
    p.EndTuple(a->size());
  } else {
    return UnsupportedExtraKey(value);
  }
  return Status::Ok();
}

Status CborValue(CborWriter& w, const Value& value, int depth) {
  if (depth > kMaxExtraKeyDepth) return TooDeep();
  if (const auto* i = std::get_if<int64_t>(&value.v)) {
    w.Int(*i);
  } else if (const auto* u = std::get_if<uint64_t>(&value.v)) {
    w.Uint(*u);
  } else if (const auto* s = std::get_if<std::string>(&value.v)) {
    KVO_RETURN_IF_ERROR(CheckStr(*s));
    w.Str(*s);
  } else if (const auto* b = std::get_if<Binary>(&value.v)) {
    w.Bytes(b->data);
  } else if (const auto* a = std::get_if<ValueArray>(&value.v)) {
    w.Array(a->size());
    for (const Value& e : *a) KVO_RETURN_IF_ERROR(CborValue(w, e, depth + 1));
  } else {
    return UnsupportedExtraKey(value);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------

}  // namespace

// ---------------------------------------------------------------------------------------------
namespace {
void Sha256Digest(const uint8_t* data, size_t size, unsigned char* out) {
  SHA256_CTX c;
  KVO_CHECK(SHA256_Init(&c) == 1);
  KVO_CHECK(SHA256_Update(&c, data, size) == 1);
  KVO_CHECK(SHA256_Final(out, &c) == 1);
}
}  // namespace

struct BlockHasher::Impl {
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The digest of the buffer into *out (reusing its capacity).
  void Digest(HashAlgo algo, std::string* out) {
    if (!IsCryptographic(algo)) {
      // Python's xxhash.xxh3_128_digest: XXH3_128bits (seed 0) in canonical (big-endian) form.
      XXH128_canonical_t canon;
      XXH128_canonicalFromHash(&canon, XXH3_128bits(buf.Data(), buf.Size()));
      static_assert(sizeof(canon.digest) == kXxh3DigestSize);
      out->assign(reinterpret_cast<const char*>(canon.digest), kXxh3DigestSize);
      return;
    }
    out->resize(kSha256DigestSize);
    Sha256(buf.Data(), buf.Size(), reinterpret_cast<unsigned char*>(out->data()));
  }
  // SHA-256 through OpenSSL's plain SHA256_CTX on the stack: the EVP interface costs an
  // allocation, a free and a cleanse per digest in OpenSSL 3 (~25% of a 16-token block's hash);
  // the same implementation (SHA-NI where the CPU has it) computes the bytes.
  static void Sha256(const uint8_t* data, size_t size, unsigned char* out) {
    Sha256Digest(data, size, out);
  }
  std::string Digest(HashAlgo algo) {
    std::string out;
    Digest(algo, &out);
    return out;
  }

  ByteBuffer buf;
  Pickler pickler{&buf};
  CborWriter cbor{&buf};
};

BlockHasher::BlockHasher(HashAlgo algo) : algo_(algo), impl_(std::make_unique<Impl>()) {}
BlockHasher::~BlockHasher() = default;

std::string_view BlockHasher::LastPreimage() const { return impl_->buf.View(); }

std::string BlockHasher::HashString(std::string_view s) {
  impl_->buf.Clear();
  if (!UsesCbor(algo_)) {
    Pickler& p = impl_->pickler;
    p.Begin();
    p.SaveStr(s);
    p.Finish();
  } else {
    impl_->cbor.Str(s);
  }
  return impl_->Digest(algo_);
}

Result<std::string> BlockHasher::Hash(std::string_view parent, std::span<const int64_t> token_ids,
                                      const Value* extra_keys) {
  std::string out;
  KVO_RETURN_IF_ERROR(HashTo(parent, token_ids, extra_keys, &out));
  return out;
}

Status BlockHasher::HashTo(std::string_view parent, std::span<const int64_t> token_ids,
                           const Value* extra_keys, std::string* out) {
  if (extra_keys != nullptr && extra_keys->is_nil()) extra_keys = nullptr;
  const ValueArray* extra = nullptr;
  if (extra_keys != nullptr) {
    extra = std::get_if<ValueArray>(&extra_keys->v);
    if (extra == nullptr) {
      return Status::InvalidArgument("a block's extra keys must be None or a tuple (array), not " +
                                     TypeName(*extra_keys));
    }
  }
  impl_->buf.Clear();
  const bool fast = !general_only_ && extra == nullptr && token_ids.size() <= kFastPickleMaxTokens;
  const bool vector = vector_encoder_ && token_encode::VectorAvailable();
  if (fast && !UsesCbor(algo_) && parent.size() >= 2 && parent.size() <= 0xFF) {
    FastPickleBlock(&impl_->buf, parent, token_ids, vector);
  } else if (fast && UsesCbor(algo_)) {
    FastCborBlock(&impl_->buf, parent, token_ids, vector);
  } else if (!UsesCbor(algo_)) {
    Pickler& p = impl_->pickler;
    p.Begin();
    p.BeginTuple(3);
    p.SaveBytes(parent);
    p.SaveTokens(token_ids);
    if (extra == nullptr) {
      p.SaveNone();
    } else {
      KVO_RETURN_IF_ERROR(PickleValue(p, *extra_keys, 1));
    }
    p.EndTuple(3);
    p.Finish();
  } else {
    CborWriter& w = impl_->cbor;
    w.Array(3);
    w.Bytes(parent);
    w.Tokens(token_ids);
    if (extra == nullptr) {
      w.Null();
    } else {
      KVO_RETURN_IF_ERROR(CborValue(w, *extra_keys, 1));
    }
  }
  impl_->Digest(algo_, out);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
Result<HashAlgo> ParseHashAlgo(std::string_view name) {
  for (HashAlgo algo : kAllHashAlgos) {
    if (name == HashAlgoName(algo)) return algo;
  }
  return Status::InvalidArgument("unknown block hash algorithm '" + CutForMessage(name) +
                                 "' (supported: sha256, sha256_cbor, xxhash, xxhash_cbor)");
}

const char* HashAlgoName(HashAlgo algo) {
  switch (algo) {
    case HashAlgo::kSha256:
      return "sha256";
    case HashAlgo::kSha256Cbor:
      return "sha256_cbor";
    case HashAlgo::kXxhash:
      return "xxhash";
    case HashAlgo::kXxhashCbor:
      return "xxhash_cbor";
  }
  return "unknown";
}

size_t DigestSize(HashAlgo algo) {
  return IsCryptographic(algo) ? kSha256DigestSize : kXxh3DigestSize;
}

bool UsesCbor(HashAlgo algo) {
  return algo == HashAlgo::kSha256Cbor || algo == HashAlgo::kXxhashCbor;
}

bool IsCryptographic(HashAlgo algo) {
  return algo == HashAlgo::kSha256 || algo == HashAlgo::kSha256Cbor;
}

Result<std::string> ResolveNoneHashSeed(HashAlgo algo, const std::optional<std::string>& seed) {
  if (seed) return *seed;
  if (IsCryptographic(algo)) return std::string(kDefaultNoneHashSeed);
  return Status::InvalidArgument(
      std::string("the hash seed is required with ") + HashAlgoName(algo) +
      ": vLLM has no default seed for the xxhash algorithms (an engine without PYTHONHASHSEED "
      "hashes with a random seed per process, which nothing outside it can reproduce); set "
      "PYTHONHASHSEED on the engine and give the same value here");
}

std::string NoneHash(HashAlgo algo, std::string_view seed) {
  BlockHasher hasher(algo);
  return hasher.HashString(seed);
}

Result<std::string> HashBlock(HashAlgo algo, std::string_view parent,
                              std::span<const int64_t> token_ids, const Value* extra_keys) {
  BlockHasher hasher(algo);
  return hasher.Hash(parent, token_ids, extra_keys);
}

Result<std::vector<std::string>> HashBlocks(std::span<const int64_t> token_ids,
                                            const BlockHashOptions& options) {
  if (options.block_size == 0) return Status::InvalidArgument("block_size must be > 0, got 0");
  if (options.none_hash.empty()) {
    return Status::InvalidArgument("none_hash is empty (compute it with NoneHash(algo, seed))");
  }
  const size_t num_blocks = token_ids.size() / options.block_size;
  std::vector<std::string> out;
  out.reserve(num_blocks);
  BlockHasher hasher(options.algo);
  hasher.set_general_path_only(options.general_path_only);
  hasher.set_vector_encoder(options.vector_encoder);
  for (size_t i = 0; i < num_blocks; ++i) {
    const std::string& parent = i == 0 ? options.none_hash : out.back();
    const Value* extra = i < options.extra_keys.size() ? &options.extra_keys[i] : nullptr;
    auto digest =
        hasher.Hash(parent, token_ids.subspan(i * options.block_size, options.block_size), extra);
    if (!digest.ok()) return digest.status().WithContext("block " + std::to_string(i));
    out.push_back(std::move(digest).value());
  }
  return out;
}

namespace {

// The wire form of a digest: its last 8 bytes, big-endian (BlockDigest::Low64).
inline uint64_t Low64Of(const uint8_t* digest, size_t size) {
  uint64_t v;
  std::memcpy(&v, digest + size - 8, 8);
  if constexpr (std::endian::native == std::endian::little) v = __builtin_bswap64(v);
  return v;
}

// HashBlocksWire's chain for the common shape (no extra keys, blocks within the fast writers'
// bound): the preimages of FastPickleBlock / FastCborBlock. After the first block (whose parent,
// the seed's hash, may be any size) every preimage has the same layout with the parent at one
// offset, so a run of blocks is encoded first (no block's tokens wait for the chain: the encoder
// and the hash overlap) and then hashed in order, each digest copied into the next block's parent
// slot. SHA-256 takes one block at a time: its digest is ~90% of a block and a run only costs it
// cache (measured: 8% slower with runs of 32).
constexpr size_t kChainRun = 32;
constexpr size_t kChainArena = size_t{16} * 1024;
constexpr size_t kChainPrefix = 64;  // >= any prefix of a 16- or 32-byte parent (at most 48)

// The 16 bytes of an XXH3-128 digest (canonical: high64 then low64, big-endian) at b + at, the rest
// of [at & ~7, at + 24) kept: written as whole 8-byte words at multiples of 8 from `b`, the offsets
// at which XXH3 reads a block of up to 128 bytes, so each of its loads takes one stored word (a
// load across two smaller stores waits for both to reach the cache: ~15% of a block's time).
inline void PutXxh3Digest(uint8_t* b, size_t at, XXH128_hash_t h) {
  if constexpr (std::endian::native != std::endian::little) {
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, h);
    std::memcpy(b + at, canon.digest, kXxh3DigestSize);
    return;
  }
  const uint64_t d0 = __builtin_bswap64(h.high64);  // digest bytes 0-7 as a little-endian word
  const uint64_t d1 = __builtin_bswap64(h.low64);   // bytes 8-15
  uint8_t* const w = b + (at & ~size_t{7});
  const unsigned shift = 8 * static_cast<unsigned>(at & 7);
  if (shift == 0) {
    std::memcpy(w, &d0, 8);
    std::memcpy(w + 8, &d1, 8);
    return;
  }
  const uint64_t below = (uint64_t{1} << shift) - 1;  // the bytes of the first word before `at`
  uint64_t first;
  uint64_t last;
  std::memcpy(&first, w, 8);
  std::memcpy(&last, w + 16, 8);
  first = (first & below) | (d0 << shift);
  const uint64_t middle = (d0 >> (64 - shift)) | (d1 << shift);
  last = (d1 >> (64 - shift)) | (last & ~below);
  std::memcpy(w, &first, 8);
  std::memcpy(w + 8, &middle, 8);
  std::memcpy(w + 16, &last, 8);
}

void FastChain(HashAlgo algo, std::span<const int64_t> token_ids, size_t block_size,
               std::string_view none_hash, bool vector, std::vector<uint64_t>* out) {
  const size_t num_blocks = token_ids.size() / block_size;
  if (num_blocks == 0) return;
  const bool cbor = UsesCbor(algo);
  const bool sha = IsCryptographic(algo);
  const size_t ds = DigestSize(algo);
  auto bound = [&](size_t parent_size) {
    return cbor ? FastCborBlockBound(parent_size, block_size)
                : FastPickleBlockBound(parent_size, block_size);
  };
  const size_t parent_at = cbor ? FastCborParentAt(ds) : kFastPickleParentAt;
  // The last digest: SHA-256's bytes, or XXH3's two halves (its wire form is low64 itself).
  std::array<uint8_t, kSha256DigestSize> digest{};
  XXH128_hash_t xxh{};
  // Hashes the preimage at b; `put` first writes the last digest into its parent slot.
  out->resize(num_blocks);
  uint64_t* wire = out->data();
  auto hash = [&](uint8_t* b, size_t len, bool put) {
    if (sha) {
      if (put) std::memcpy(b + parent_at, digest.data(), ds);
      Sha256Digest(b, len, digest.data());
      *wire++ = Low64Of(digest.data(), ds);
    } else {
      if (put) PutXxh3Digest(b, parent_at, xxh);
      xxh = XXH3_128bits(b, len);
      *wire++ = xxh.low64;
    }
  };
  const size_t stride = (bound(ds) + 63) & ~size_t{63};
  const size_t run = sha ? 1 : std::clamp<size_t>(kChainArena / stride, 1, kChainRun);
  std::vector<uint8_t> arena(std::max(bound(none_hash.size()), run * stride));
  const auto block0 = token_ids.first(block_size);  // its parent, the seed's hash, any size
  hash(arena.data(),
       cbor ? FastCborBlockAt(arena.data(), none_hash, block0, vector)
            : FastPickleBlockAt(arena.data(), none_hash, block0, vector),
       false);
  // Later blocks, a run at a time: first each block's bytes (the prefix they share, with a
  // placeholder in the parent slot, copied whole, then its tokens and end), then each parent
  // written over its placeholder and the block hashed.
  std::array<uint8_t, kChainPrefix> prefix{};
  const std::string_view placeholder(reinterpret_cast<const char*>(digest.data()), ds);
  const size_t tokens_at = cbor ? FastCborPrefix(prefix.data(), placeholder, block_size)
                                : FastPicklePrefix(prefix.data(), placeholder, block_size);
  KVO_CHECK(tokens_at <= kChainPrefix && kChainPrefix <= stride);
  std::array<size_t, kChainRun> len{};
  for (size_t first = 1; first < num_blocks; first += run) {
    const size_t m = std::min(run, num_blocks - first);
    for (size_t j = 0; j < m; ++j) {
      uint8_t* const b = arena.data() + j * stride;
      std::memcpy(b, prefix.data(), kChainPrefix);
      const auto block = token_ids.subspan((first + j) * block_size, block_size);
      len[j] = cbor ? FastCborFinish(b, CborTokens(block, b + tokens_at, vector))
                    : FastPickleFinish(b, PickleTokens(block, b + tokens_at, vector), block_size);
    }
    for (size_t j = 0; j < m; ++j) hash(arena.data() + j * stride, len[j], true);
  }
}

}  // namespace

Result<std::vector<uint64_t>> HashBlocksWire(std::span<const int64_t> token_ids,
                                             const BlockHashOptions& options) {
  if (options.block_size == 0) return Status::InvalidArgument("block_size must be > 0, got 0");
  if (options.none_hash.empty()) {
    return Status::InvalidArgument("none_hash is empty (compute it with NoneHash(algo, seed))");
  }
  const size_t num_blocks = token_ids.size() / options.block_size;
  std::vector<uint64_t> out;
  out.reserve(num_blocks);
  const bool pickle_parent_ok = options.none_hash.size() >= 2 && options.none_hash.size() <= 0xFF;
  if (!options.general_path_only && options.extra_keys.empty() &&
      options.block_size <= kFastPickleMaxTokens && (UsesCbor(options.algo) || pickle_parent_ok)) {
    FastChain(options.algo, token_ids, options.block_size, options.none_hash,
              options.vector_encoder && token_encode::VectorAvailable(), &out);
    return out;
  }
  BlockHasher hasher(options.algo);
  hasher.set_general_path_only(options.general_path_only);
  hasher.set_vector_encoder(options.vector_encoder);
  std::string parent = options.none_hash;
  std::string digest;
  for (size_t i = 0; i < num_blocks; ++i) {
    const Value* extra = i < options.extra_keys.size() ? &options.extra_keys[i] : nullptr;
    Status s = hasher.HashTo(parent, token_ids.subspan(i * options.block_size, options.block_size),
                             extra, &digest);
    if (!s.ok()) return s.WithContext("block " + std::to_string(i));
    out.push_back(BlockDigest::Low64(digest));
    parent.swap(digest);
  }
  return out;
}

Status CheckExtraKeys(const Value& extra_keys) {
  if (extra_keys.is_nil()) return Status::Ok();
  if (!std::holds_alternative<ValueArray>(extra_keys.v)) {
    return Status::InvalidArgument("extra keys must be None or a tuple, got " +
                                   DescribeUnsupported(extra_keys));
  }
  return CheckValue(extra_keys, 1);
}

}  // namespace kvo
