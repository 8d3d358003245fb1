#include "events/codec.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "events/block_hash.h"
#include "tests/testing/golden.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

constexpr uint64_t kH1 = 0xb9807785afee48bbULL;
constexpr uint64_t kH2 = 0xcb73eeaed59c009dULL;

using testing::ReadGolden;

std::string Hex(std::string_view s) { return ToHex(s); }

BlockStored GpuStore() {
  BlockStored e;
  e.block_hashes = {BlockHash::Uint(kH1), BlockHash::Uint(kH2)};
  e.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  e.block_size = 4;
  e.medium = kMediumGpu;
  e.extra_keys = std::vector<Value>{Value{}, Value{}};
  e.group_idx = 0;
  e.kv_cache_spec_kind = "full_attention";
  return e;
}

EventBatch Example1() { return EventBatch{1700000000.5, {GpuStore()}, 0}; }

EventBatch Example2() {
  BlockRemoved r;
  r.block_hashes = {BlockHash::Uint(kH1)};
  r.medium = kMediumGpu;
  r.group_idx = 0;
  return EventBatch{1700000001.0, {r, AllBlocksCleared{}}, 0};
}

EventBatch Example4() {
  BlockStored e;
  e.block_hashes = {BlockHash::Uint(kH2)};
  e.block_size = 0;
  e.medium = kMediumCpu;
  e.group_idx = 0;
  return EventBatch{1700000002.25, {e}, 1};
}

std::string Range(int from, int to) {
  std::string s;
  for (int i = from; i < to; ++i) s += static_cast<char>(i);
  return s;
}

EventBatch FullFields() {
  BlockStored s;
  s.block_hashes = {BlockHash::Bytes(Range(0, 32)), BlockHash::Bytes(Range(32, 64))};
  s.parent_block_hash = BlockHash::Bytes(std::string(32, '\xff'));
  s.token_ids = {0, 127, 128, 255, 256, 65535, 65536, 4294967295LL, 4294967296LL};
  s.block_size = 16;
  s.lora_id = 7;
  s.medium = kMediumStorage;
  s.lora_name = "adapter-a";
  s.extra_keys = std::vector<Value>{
      Value{ValueArray{Value{std::string("adapter-a")},
                       Value{ValueArray{Value{std::string("mm-1")}, Value{int64_t{3}}}}}},
      Value{ValueArray{Value{Binary{"\x01\x02"}}}}};
  s.group_idx = 1;
  s.kv_cache_spec_kind = "sliding_window";
  s.kv_cache_spec_sliding_window = 4096;
  s.locality = "REMOTE";
  s.ownership = "SHARED";
  s.session_id = "s-42";
  BlockRemoved r;
  r.block_hashes = {BlockHash::Bytes(Range(0, 32))};
  r.medium = kMediumStorage;
  r.group_idx = 1;
  r.locality = "REMOTE";
  r.ownership = "SHARED";
  return EventBatch{1700000003.125, {s, r}, 3};
}

struct GoldenCase {
  const char* name;
  EventBatch (*make)();
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, EncodesByteForByteAndDecodesBack) {
  const GoldenCase& c = GetParam();
  std::string golden = ReadGolden(c.name);
  ASSERT_FALSE(golden.empty());
  EventBatch batch = c.make();
  EXPECT_EQ(Hex(EncodeBatch(batch)), Hex(golden));
  auto decoded = DecodeBatch(golden);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, batch);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest,
                         ::testing::Values(GoldenCase{"example1_gpu_store", Example1},
                                           GoldenCase{"example2_remove_clear", Example2},
                                           GoldenCase{"example4_cpu_placeholder", Example4},
                                           GoldenCase{"full_fields_bytes_hashes", FullFields}),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(CodecTest, Example1MatchesTheDocumentedSizeAndPrefix) {
  std::string bytes = EncodeBatch(Example1());
  EXPECT_EQ(bytes.size(), 202u);
  EXPECT_EQ(Hex(bytes.substr(0, 12)), "93cb41d954fc40200000918b");
}

TEST(CodecTest, LegacyArrayEncodingMatchesExample3) {
  BlockStored store = GpuStore();
  store.extra_keys.reset();  // example 3 predates per-hash extra keys on GPU stores
  EventBatch batch{1700000000.5, {store, Example2().events[0], AllBlocksCleared{}}, 0};
  std::string golden = ReadGolden("example3_legacy_array");
  EXPECT_EQ(Hex(EncodeBatch(batch, {EventEncoding::kArray})), Hex(golden));
  auto decoded = DecodeBatch(golden);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, batch);
}

// Hand-assembled msgpack for the older schema generations of A.2.
class Msgpack {
 public:
  Msgpack& Raw(std::initializer_list<int> bytes) {
    for (int b : bytes) s_ += static_cast<char>(b);
    return *this;
  }
  Msgpack& Str(std::string_view v) {
    s_ += static_cast<char>(0xa0 | v.size());
    s_ += v;
    return *this;
  }
  Msgpack& U64(uint64_t v) {
    s_ += '\xcf';
    for (int i = 7; i >= 0; --i) s_ += static_cast<char>(v >> (8 * i));
    return *this;
  }
  Msgpack& F64(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    s_ += '\xcb';
    for (int i = 7; i >= 0; --i) s_ += static_cast<char>(bits >> (8 * i));
    return *this;
  }
  const std::string& bytes() const { return s_; }

 private:
  std::string s_;
};

TEST(CodecTest, DecodesFirstGenerationArraysWithTwoElementBatch) {
  // #16750: EventBatch [ts, events]; BlockStored [tag, hashes, parent, tokens, bs, lora_id];
  // BlockRemoved [tag, hashes].
  Msgpack m;
  m.Raw({0x92}).F64(12.5).Raw({0x92, 0x96}).Str("BlockStored").Raw({0x91}).U64(kH1);
  m.Raw({0xc0, 0x92, 0x01, 0x02, 0x02, 0xc0});
  m.Raw({0x92}).Str("BlockRemoved").Raw({0x91}).U64(kH1);
  auto decoded = DecodeBatch(m.bytes());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->ts, 12.5);
  EXPECT_FALSE(decoded->data_parallel_rank.has_value());
  ASSERT_EQ(decoded->events.size(), 2u);
  const auto& s = std::get<BlockStored>(decoded->events[0]);
  EXPECT_EQ(s.block_hashes, std::vector<BlockHash>{BlockHash::Uint(kH1)});
  EXPECT_EQ(s.token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(s.block_size, 2);
  EXPECT_FALSE(s.medium.has_value());
  EXPECT_FALSE(s.group_idx.has_value());
  EXPECT_FALSE(std::get<BlockRemoved>(decoded->events[1]).medium.has_value());
}

TEST(CodecTest, IgnoresTrailingArrayElementsAndUnknownMapKeys) {
  Msgpack m;  // batch with 4 elements; positional removal with 7 fields; map with extra keys
  m.Raw({0x94}).F64(1).Raw({0x92, 0x98}).Str("BlockRemoved").Raw({0x91, 0x05}).Str("CPU");
  m.Raw({0x02, 0xc0, 0xc0, 0xc0, 0x07});
  m.Raw({0x83}).Str("future").Raw({0x2a}).Str("type").Str("AllBlocksCleared");
  m.Str("more").Raw({0x91, 0x01});
  m.Raw({0x00}).Str("trailing");
  auto decoded = DecodeBatch(m.bytes());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->events.size(), 2u);
  const auto& r = std::get<BlockRemoved>(decoded->events[0]);
  EXPECT_EQ(r.medium, "CPU");
  EXPECT_EQ(r.group_idx, 2);
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(decoded->events[1]));
  EXPECT_EQ(decoded->data_parallel_rank, 0);
}

TEST(CodecTest, AcceptsMixedArrayAndMapEventsAndNegativeIntHashes) {
  BlockRemoved r;
  r.block_hashes = {BlockHash::NegativeInt(-5), BlockHash::Uint(9)};
  r.medium = kMediumGpu;
  EventBatch map_batch{2.0, {r}, 0};
  EventBatch both{2.0, {r, r}, 0};
  std::string a = EncodeBatch(map_batch);
  std::string b = EncodeBatch(map_batch, {EventEncoding::kArray});
  // Splice: [ts, [map_event, array_event], 0].
  std::string header = a.substr(0, 10);
  std::string map_event = a.substr(11, a.size() - 12);
  std::string array_event = b.substr(11, b.size() - 12);
  std::string mixed = header + "\x92" + map_event + array_event;
  mixed.push_back('\0');
  auto decoded = DecodeBatch(mixed);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, both);
}

void ExpectError(const std::string& bytes, const std::string& fragment) {
  auto decoded = DecodeBatch(bytes);
  ASSERT_FALSE(decoded.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_NE(decoded.status().message().find(fragment), std::string::npos)
      << decoded.status().ToString();
}

TEST(CodecTest, RejectsMalformedInputNamingTheProblem) {
  ExpectError("", "empty payload");
  ExpectError(std::string("\x93\xcb\x41", 3), "truncated");
  ExpectError(std::string("\x81\xa1x\x01", 4), "expected array");
  ExpectError(EncodeBatch(Example2()) + "x", "trailing bytes");
  Msgpack bad_tag;
  bad_tag.Raw({0x93}).F64(1).Raw({0x91, 0x81}).Str("type").Str("BlockMoved").Raw({0x00});
  ExpectError(bad_tag.bytes(), "unknown event type 'BlockMoved'");
  Msgpack bad_hash;
  bad_hash.Raw({0x93}).F64(1).Raw({0x91, 0x83}).Str("type").Str("BlockRemoved");
  bad_hash.Str("block_hashes").Raw({0x91}).Str("oops").Str("medium").Raw({0xc0, 0x00});
  ExpectError(bad_hash.bytes(), "events[0].block_hashes[0]: expected int or bin");
  Msgpack missing;
  missing.Raw({0x93}).F64(1).Raw({0x91, 0x82}).Str("type").Str("BlockStored");
  missing.Str("block_hashes").Raw({0x90, 0x00});
  ExpectError(missing.bytes(), "missing required field 'parent_block_hash'");
  Msgpack bad_ts;
  bad_ts.Raw({0x93}).Str("now").Raw({0x90, 0x00});
  ExpectError(bad_ts.bytes(), "batch.ts: expected float, got str");
  Msgpack short_pos;
  short_pos.Raw({0x93}).F64(1).Raw({0x91, 0x93}).Str("BlockStored").Raw({0x90, 0xc0, 0x00});
  ExpectError(short_pos.bytes(), "positional event has 2 fields");
  Msgpack big_token;
  big_token.Raw({0x93}).F64(1).Raw({0x91, 0x96}).Str("BlockStored").Raw({0x90, 0xc0, 0x91});
  big_token.U64(~0ULL).Raw({0x00, 0xc0, 0x00});
  ExpectError(big_token.bytes(), "events[0][3][0]: integer 18446744073709551615 out of int64");
}

TEST(CodecTest, EnforcesLimitsOnOversizedArrays) {
  // An array header claiming 2^32-1 elements must fail fast, not allocate.
  std::string huge = "\x93\xcb" + std::string(8, '\0') + "\xdd\xff\xff\xff\xff";
  ExpectError(huge, "batch:");
  DecodeLimits tight;
  tight.max_array_elements = 4;
  EventBatch b = Example1();  // 8 token ids
  auto decoded = DecodeBatch(EncodeBatch(b), tight);
  EXPECT_FALSE(decoded.ok());
  tight.max_array_elements = 1 << 20;
  tight.max_payload_bytes = 16;
  EXPECT_FALSE(DecodeBatch(EncodeBatch(b), tight).ok());
}

TEST(CodecTest, EveryTruncationAndByteFlipIsHandled) {
  std::string bytes = EncodeBatch(FullFields());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeBatch(std::string_view(bytes).substr(0, n)).ok()) << "prefix " << n;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      auto r = DecodeBatch(flipped);  // must not crash; either outcome is fine
      if (r.ok()) {
        auto again = DecodeBatch(EncodeBatch(*r));
        ASSERT_TRUE(again.ok());
      }
    }
  }
}

BlockHash RandomHash(std::mt19937_64& rng) {
  switch (rng() % 3) {
    case 0:
      return BlockHash::Uint(rng() >> (rng() % 64));
    case 1: {
      std::string b(32, '\0');
      for (char& c : b) c = static_cast<char>(rng());
      return BlockHash::Bytes(b);
    }
    default:
      return BlockHash::NegativeInt(-1 - static_cast<int64_t>(rng() >> 2));
  }
}

std::optional<std::string> MaybeStr(std::mt19937_64& rng, const char* s) {
  if (rng() % 2) return std::nullopt;
  return std::string(s) + std::to_string(rng() % 1000);
}

std::optional<int64_t> MaybeInt(std::mt19937_64& rng) {
  if (rng() % 2) return std::nullopt;
  return static_cast<int64_t>(rng() >> (rng() % 64)) * (rng() % 4 == 0 ? -1 : 1);
}

EventBatch RandomBatch(std::mt19937_64& rng, bool with_reason) {
  EventBatch batch;
  batch.ts = static_cast<double>(rng() % 2000000000) + 0.25;
  if (rng() % 4) batch.data_parallel_rank = static_cast<int64_t>(rng() % 8);
  size_t n = rng() % 6;
  for (size_t i = 0; i < n; ++i) {
    switch (rng() % 3) {
      case 0: {
        BlockStored s;
        for (size_t k = rng() % 20; k > 0; --k) s.block_hashes.push_back(RandomHash(rng));
        if (rng() % 2) s.parent_block_hash = RandomHash(rng);
        for (size_t k = rng() % 300; k > 0; --k) {
          s.token_ids.push_back(static_cast<int64_t>(rng() >> (rng() % 64)));
        }
        s.block_size = static_cast<int64_t>(rng() % 1024);
        s.lora_id = MaybeInt(rng);
        s.medium = MaybeStr(rng, "M");
        s.lora_name = MaybeStr(rng, "lora");
        if (rng() % 2) {
          std::vector<Value> keys;
          for (size_t k = 0; k < s.block_hashes.size(); ++k) {
            keys.push_back(rng() % 2 ? Value{}
                                     : Value{ValueArray{Value{std::string("x")}, Value{2.0},
                                                        Value{int64_t{-3}}, Value{Binary{"b"}}}});
          }
          s.extra_keys = std::move(keys);
        }
        s.group_idx = MaybeInt(rng);
        s.kv_cache_spec_kind = MaybeStr(rng, "kind");
        s.kv_cache_spec_sliding_window = MaybeInt(rng);
        s.locality = MaybeStr(rng, "LOCAL");
        s.ownership = MaybeStr(rng, "own");
        s.session_id = MaybeStr(rng, "sess");
        batch.events.push_back(std::move(s));
        break;
      }
      case 1: {
        BlockRemoved r;
        for (size_t k = rng() % 20; k > 0; --k) r.block_hashes.push_back(RandomHash(rng));
        r.medium = MaybeStr(rng, "M");
        r.group_idx = MaybeInt(rng);
        r.locality = MaybeStr(rng, "L");
        r.ownership = MaybeStr(rng, "O");
        if (with_reason) r.reason = MaybeStr(rng, "evicted");
        batch.events.push_back(std::move(r));
        break;
      }
      default:
        batch.events.push_back(AllBlocksCleared{});
    }
  }
  return batch;
}

TEST(CodecTest, RandomBatchesRoundTripInBothEncodings) {
  unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    bool map = i % 2 == 0;
    EventBatch batch = RandomBatch(rng, /*with_reason=*/map);
    EncodeOptions opts{map ? EventEncoding::kMap : EventEncoding::kArray};
    auto decoded = DecodeBatch(EncodeBatch(batch, opts));
    ASSERT_TRUE(decoded.ok()) << "seed " << seed << " case " << i << ": "
                              << decoded.status().ToString();
    ASSERT_EQ(*decoded, batch) << "seed " << seed << " case " << i;
  }
}

TEST(CodecTest, UnsetLocalityEncodesAsThePreLocalitySchema) {
  // vLLM's wire-compatibility test: locality=None leaves the bytes unchanged.
  EventBatch with = Example1();
  std::string a = EncodeBatch(with);
  std::get<BlockStored>(with.events[0]).locality = "LOCAL";
  std::string b = EncodeBatch(with);
  EXPECT_GT(b.size(), a.size());
  EXPECT_EQ(a, ReadGolden("example1_gpu_store"));
}

TEST(CodecTest, CountsBlockEvents) {
  EXPECT_EQ(CountBlockEvents(Example1()), 2u);
  EXPECT_EQ(CountBlockEvents(Example2()), 1u);
  EXPECT_EQ(BlockHash::Bytes(Range(0, 32)).Low64(), 0x18191a1b1c1d1e1fULL);
}

}  // namespace
}  // namespace kvo
