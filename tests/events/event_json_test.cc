#include "events/event_json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "events/block_hash.h"
#include "events/codec.h"
#include "tests/testing/golden.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using testing::ReadGolden;

std::string Hex(std::string_view s) { return ToHex(s); }

std::string HexRange(int from, int to) {
  std::string raw;
  for (int i = from; i < to; ++i) raw += static_cast<char>(i);
  return Hex(raw);
}

EventBatch ParseOk(const std::string& json) {
  Result<EventBatch> r = BatchFromJson(json);
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n  in: " << json;
  return r.ok() ? *r : EventBatch{};
}

// A.3 example 1 in the JSON form (canonical: wire field order, as BatchToJson prints it).
const std::string kExample1 =
    R"({"ts":1700000000.5,"data_parallel_rank":0,"events":[{"type":"BlockStored",)"
    R"("block_hashes":[13366815110101616827,14660323646696587421],"parent_block_hash":null,)"
    R"("token_ids":[1,2,3,4,5,6,7,8],"block_size":4,"lora_id":null,"medium":"GPU",)"
    R"("lora_name":null,"extra_keys":[null,null],"group_idx":0,)"
    R"("kv_cache_spec_kind":"full_attention"}]})";

const std::string kExample2 =
    R"({"ts":1700000001.0,"data_parallel_rank":0,"events":[{"type":"BlockRemoved",)"
    R"("block_hashes":[13366815110101616827],"medium":"GPU","group_idx":0},)"
    R"({"type":"AllBlocksCleared"}]})";

const std::string kExample4 =
    R"({"ts":1700000002.25,"data_parallel_rank":1,"events":[{"type":"BlockStored",)"
    R"("block_hashes":[14660323646696587421],"parent_block_hash":null,"token_ids":[],)"
    R"("block_size":0,"lora_id":null,"medium":"CPU","lora_name":null,"group_idx":0}]})";

// schemas/golden/generate.py's "full_fields_bytes_hashes": every optional field, byte hashes.
std::string FullFieldsJson() {
  return R"({"ts":1700000003.125,"data_parallel_rank":3,"events":[{"type":"BlockStored",)"
         R"("block_hashes":[")" +
         HexRange(0, 32) + R"(",")" + HexRange(32, 64) + R"("],"parent_block_hash":")" +
         std::string(64, 'f') +
         R"(","token_ids":[0,127,128,255,256,65535,65536,4294967295,4294967296],)"
         R"("block_size":16,"lora_id":7,"medium":"STORAGE","lora_name":"adapter-a",)"
         R"("extra_keys":[["adapter-a",["mm-1",3]],[{"bytes":"0102"}]],"group_idx":1,)"
         R"("kv_cache_spec_kind":"sliding_window","kv_cache_spec_sliding_window":4096,)"
         R"("locality":"REMOTE","ownership":"SHARED","session_id":"s-42"},)"
         R"({"type":"BlockRemoved","block_hashes":[")" +
         HexRange(0, 32) +
         R"("],"medium":"STORAGE","group_idx":1,"locality":"REMOTE","ownership":"SHARED"}]})";
}

// ---------------------------------------------------------------------------------------------
// JSON -> EventBatch -> msgpack equals the golden bytes from the independent encoder.

TEST(EventJsonTest, Example1EncodesToGoldenBytes) {
  EventBatch batch = ParseOk(kExample1);
  std::string golden = ReadGolden("example1_gpu_store");
  ASSERT_EQ(golden.size(), 202u);
  EXPECT_EQ(Hex(EncodeBatch(batch)), Hex(golden));
}

TEST(EventJsonTest, OtherExamplesEncodeToGoldenBytes) {
  EXPECT_EQ(Hex(EncodeBatch(ParseOk(kExample2))), Hex(ReadGolden("example2_remove_clear")));
  EXPECT_EQ(Hex(EncodeBatch(ParseOk(kExample4))), Hex(ReadGolden("example4_cpu_placeholder")));
  EXPECT_EQ(Hex(EncodeBatch(ParseOk(FullFieldsJson()))),
            Hex(ReadGolden("full_fields_bytes_hashes")));
}

// msgpack -> EventBatch -> JSON prints exactly the keys and values on the wire.
TEST(EventJsonTest, GoldenBytesPrintAsJson) {
  struct Case {
    const char* golden;
    std::string json;
  };
  for (const Case& c :
       {Case{"example1_gpu_store", kExample1}, Case{"example2_remove_clear", kExample2},
        Case{"example4_cpu_placeholder", kExample4},
        Case{"full_fields_bytes_hashes", FullFieldsJson()}}) {
    Result<EventBatch> decoded = DecodeBatch(ReadGolden(c.golden));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(BatchToJson(*decoded, std::nullopt, std::nullopt), c.json) << c.golden;
  }
  // The legacy positional form decodes to the same values (extra_keys nil there: unset).
  Result<EventBatch> legacy = DecodeBatch(ReadGolden("example3_legacy_array"));
  ASSERT_TRUE(legacy.ok()) << legacy.status().ToString();
  EXPECT_EQ(BatchToJson(*legacy, 5, "kv"),
            R"({"seq":5,"topic":"kv","ts":1700000000.5,"data_parallel_rank":0,"events":[)"
            R"({"type":"BlockStored","block_hashes":[13366815110101616827,14660323646696587421],)"
            R"("parent_block_hash":null,"token_ids":[1,2,3,4,5,6,7,8],"block_size":4,)"
            R"("lora_id":null,"medium":"GPU","lora_name":null,"group_idx":0,)"
            R"("kv_cache_spec_kind":"full_attention"},)"
            R"({"type":"BlockRemoved","block_hashes":[13366815110101616827],"medium":"GPU",)"
            R"("group_idx":0},{"type":"AllBlocksCleared"}]})");
}

// ---------------------------------------------------------------------------------------------
// JSON -> EventBatch -> JSON is the identity on canonical JSON, for every field kind.

TEST(EventJsonTest, RoundTripsEveryFieldKind) {
  const std::vector<std::string> cases = {
      kExample1,
      kExample2,
      kExample4,
      FullFieldsJson(),
      // seq and topic first; u64 max, negative int (legacy Python hash()) and empty-bytes hashes;
      // extra keys of every Value kind; the kvo `reason` on BlockRemoved; dp unset.
      R"({"seq":12,"topic":"kv","ts":0.1,"data_parallel_rank":null,"events":[)"
      R"({"type":"BlockStored","block_hashes":[18446744073709551615,-9223372036854775808,)"
      R"(-1,0,""],"parent_block_hash":-42,"token_ids":[-5,0,9223372036854775807],)"
      R"("block_size":1,"lora_id":-1,"medium":null,"lora_name":"lora \"x\"\n\u0001é",)"
      R"("extra_keys":[null,["lora-a",["mm",3]],[{"bytes":""},{"bytes":"00ff"},true,false,)"
      R"(1.5,-2,18446744073709551615,null,[[[]]],"日本"],[]]},)"
      R"({"type":"BlockRemoved","block_hashes":["ab"],"medium":"CPU","reason":"evicted"},)"
      R"({"type":"BlockRemoved","block_hashes":[],"medium":null,"locality":"LOCAL"},)"
      R"({"type":"AllBlocksCleared"}]})",
      // No events; integral and negative ts.
      R"({"ts":-3.0,"data_parallel_rank":7,"events":[]})",
      R"({"seq":0,"topic":"","ts":1e+300,"data_parallel_rank":0,"events":[]})",
  };
  for (const std::string& json : cases) {
    Result<EventBatch> batch = BatchFromJson(json);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString() << "\n  in: " << json;
    // seq/topic are not part of the batch: put them back when the input had them.
    std::optional<uint64_t> seq;
    std::optional<std::string_view> topic;
    if (json.rfind(R"({"seq":12)", 0) == 0) {
      seq = 12;
      topic = "kv";
    } else if (json.rfind(R"({"seq":0)", 0) == 0) {
      seq = 0;
      topic = "";
    }
    EXPECT_EQ(BatchToJson(*batch, seq, topic), json);
    // And the msgpack form carries the same batch.
    Result<EventBatch> wire = DecodeBatch(EncodeBatch(*batch));
    ASSERT_TRUE(wire.ok()) << wire.status().ToString();
    EXPECT_EQ(*wire, *batch) << json;
  }
}

TEST(EventJsonTest, HashKindsMapToValues) {
  EventBatch b = ParseOk(
      R"({"ts":1,"events":[{"type":"BlockRemoved","block_hashes":[5,-5,"0A0b"],"medium":"GPU"}]})");
  EXPECT_FALSE(b.data_parallel_rank.has_value());  // missing = unset
  ASSERT_EQ(b.events.size(), 1u);
  const auto& r = std::get<BlockRemoved>(b.events[0]);
  ASSERT_EQ(r.block_hashes.size(), 3u);
  EXPECT_EQ(r.block_hashes[0], BlockHash::Uint(5));
  EXPECT_EQ(r.block_hashes[1], BlockHash::NegativeInt(-5));
  EXPECT_EQ(r.block_hashes[2], BlockHash::Bytes(std::string("\x0a\x0b", 2)));
  // Hex comes back lowercase; an integer ts prints as a float.
  EXPECT_EQ(BatchToJson(b, 1, "t"),
            R"({"seq":1,"topic":"t","ts":1.0,"data_parallel_rank":null,"events":[)"
            R"({"type":"BlockRemoved","block_hashes":[5,-5,"0a0b"],"medium":"GPU"}]})");
}

TEST(EventJsonTest, NullDefaultedFieldsMeanUnset) {
  EventBatch b = ParseOk(
      R"({"ts":1.5,"events":[{"type":"BlockStored","block_hashes":[1],"parent_block_hash":2,)"
      R"("token_ids":[],"block_size":0,"lora_id":null,"medium":null,"lora_name":null,)"
      R"("extra_keys":null,"group_idx":null,"kv_cache_spec_kind":null,)"
      R"("kv_cache_spec_sliding_window":null,"locality":null,"ownership":null,"session_id":null}]})");
  const auto& s = std::get<BlockStored>(b.events.at(0));
  EXPECT_FALSE(s.extra_keys || s.group_idx || s.kv_cache_spec_kind ||
               s.kv_cache_spec_sliding_window || s.locality || s.ownership || s.session_id);
  EXPECT_EQ(s.parent_block_hash, BlockHash::Uint(2));
}

TEST(EventJsonTest, ExtraKeysValueTypes) {
  EventBatch b = ParseOk(
      R"({"ts":1.5,"events":[{"type":"BlockStored","block_hashes":[1],"parent_block_hash":null,)"
      R"("token_ids":[],"block_size":0,"lora_id":null,"medium":"GPU","lora_name":null,)"
      R"("extra_keys":[null,["lora-a",["mm",3]],[{"bytes":"01ff"},-7,18446744073709551615,2.5,true]]}]})");
  const auto& keys = *std::get<BlockStored>(b.events.at(0)).extra_keys;
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_TRUE(keys[0].is_nil());
  EXPECT_EQ(keys[1],
            (Value{ValueArray{Value{std::string("lora-a")},
                              Value{ValueArray{Value{std::string("mm")}, Value{int64_t{3}}}}}}));
  EXPECT_EQ(keys[2],
            (Value{ValueArray{Value{Binary{std::string("\x01\xff", 2)}}, Value{int64_t{-7}},
                              Value{~uint64_t{0}}, Value{2.5}, Value{true}}}));
}

TEST(EventJsonTest, TsRoundTripsExactly) {
  std::mt19937_64 rng(kvo::testing::TestSeed());
  std::uniform_real_distribution<double> dist(0.0, 4e9);
  std::vector<double> values = {1700000000.5, 0.1, 1.0 / 3.0, 5e-324, 1.7976931348623157e308, -0.0};
  for (int i = 0; i < 1000; ++i) values.push_back(dist(rng));
  for (double ts : values) {
    EventBatch b{ts, {}, 0};
    Result<EventBatch> back = BatchFromJson(BatchToJson(b, std::nullopt, std::nullopt));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(std::memcmp(&back->ts, &ts, sizeof ts), 0)
        << std::hexfloat << ts << " came back as " << back->ts;
  }
}

TEST(EventJsonTest, InvalidUtf8FromTheWireDoesNotThrow) {
  BlockRemoved r;
  r.block_hashes = {BlockHash::Uint(1)};
  r.medium = std::string("G\xff\xfe", 3);
  std::string json = BatchToJson(EventBatch{1.0, {r}, 0}, 0, std::string_view("\xc3", 1));
  EXPECT_NE(json.find("BlockRemoved"), std::string::npos);
  EXPECT_TRUE(BatchFromJson(json).ok()) << json;
}

// ---------------------------------------------------------------------------------------------
// Errors name the path.

void ExpectError(const std::string& json, const std::string& fragment) {
  Result<EventBatch> r = BatchFromJson(json);
  ASSERT_FALSE(r.ok()) << "accepted: " << json;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos)
      << "message '" << r.status().message() << "' lacks '" << fragment << "'";
}

std::string Stored(const std::string& fields) {
  return R"({"ts":1.0,"events":[{"type":"AllBlocksCleared"},{"type":"BlockStored",)" + fields +
         "}]}";
}
const std::string kStoredFields =
    R"("block_hashes":[1],"parent_block_hash":null,"token_ids":[1],"block_size":1,)"
    R"("lora_id":null,"medium":"GPU","lora_name":null)";

TEST(EventJsonTest, ErrorsNameThePath) {
  ExpectError("", "invalid JSON");
  ExpectError("{\"ts\":1.0,", "invalid JSON");
  ExpectError(R"({"ts":1.0,"events":[]} trailing)", "invalid JSON");
  ExpectError("[1.0,[],0]", "batch: expected object, got array");
  ExpectError(R"({"events":[]})", "missing required field 'ts'");
  ExpectError(R"({"ts":1.0})", "missing required field 'events'");
  ExpectError(R"({"ts":"1.0","events":[]})", "ts: expected number, got string");
  ExpectError(R"({"ts":1.0,"events":{}})", "events: expected array, got object");
  ExpectError(R"({"ts":1.0,"events":[],"data_parallel_rank":1.5})",
              "data_parallel_rank: expected integer, got float");
  ExpectError(R"({"ts":1.0,"events":[],"dp":0})", "batch: unknown field 'dp'");
  ExpectError(R"({"ts":1.0,"events":[1]})", "events[0]: expected object (event), got integer");
  ExpectError(R"({"ts":1.0,"events":[{}]})", "events[0]: missing required field 'type'");
  ExpectError(R"({"ts":1.0,"events":[{"type":"BlockEvicted"}]})",
              "events[0].type: unknown event type 'BlockEvicted'");
  ExpectError(R"({"ts":1.0,"events":[{"type":"AllBlocksCleared","x":1}]})",
              "events[0]: unknown field 'x'");
  ExpectError(R"({"ts":1.0,"events":[{"type":"BlockRemoved","block_hashes":[]}]})",
              "events[0]: missing required field 'medium'");

  // Each required BlockStored field, removed in turn.
  ASSERT_TRUE(BatchFromJson(Stored(kStoredFields)).ok());
  for (const char* field : {"block_hashes", "parent_block_hash", "token_ids", "block_size",
                            "lora_id", "medium", "lora_name"}) {
    std::string fields = kStoredFields;
    size_t at = fields.find(std::string("\"") + field + "\"");
    size_t end = fields.find(",\"", at + 1);
    fields.erase(at, end == std::string::npos ? std::string::npos : end - at + 1);
    if (!fields.empty() && fields.back() == ',') fields.pop_back();
    ExpectError(Stored(fields), std::string("events[1]: missing required field '") + field + "'");
  }

  ExpectError(Stored(R"("block_hashes":[1.5],"parent_block_hash":null,"token_ids":[],)"
                     R"("block_size":1,"lora_id":null,"medium":"GPU","lora_name":null)"),
              "events[1].block_hashes[0]: expected integer or hex string");
  ExpectError(Stored(R"("block_hashes":[1,"abc"],"parent_block_hash":null,"token_ids":[],)"
                     R"("block_size":1,"lora_id":null,"medium":"GPU","lora_name":null)"),
              "events[1].block_hashes[1]: expected integer or hex string: hex string 'abc' has "
              "an odd length");
  ExpectError(Stored(R"("block_hashes":["zz"],"parent_block_hash":null,"token_ids":[],)"
                     R"("block_size":1,"lora_id":null,"medium":"GPU","lora_name":null)"),
              "events[1].block_hashes[0]: expected integer or hex string: hex string 'zz' has a "
              "non-hex character");
  ExpectError(Stored(R"("block_hashes":1,"parent_block_hash":null,"token_ids":[],)"
                     R"("block_size":1,"lora_id":null,"medium":"GPU","lora_name":null)"),
              "events[1].block_hashes: expected array of block hashes, got integer");
  ExpectError(Stored(R"("block_hashes":[],"parent_block_hash":[],"token_ids":[],)"
                     R"("block_size":1,"lora_id":null,"medium":"GPU","lora_name":null)"),
              "events[1].parent_block_hash: expected integer or hex string, got array");
  ExpectError(Stored(R"("block_hashes":[],"parent_block_hash":null,"token_ids":[1,"2"],)"
                     R"("block_size":1,"lora_id":null,"medium":"GPU","lora_name":null)"),
              "events[1].token_ids[1]: expected integer, got string");
  ExpectError(
      Stored(R"("block_hashes":[],"parent_block_hash":null,"token_ids":[9223372036854775808],)"
             R"("block_size":1,"lora_id":null,"medium":"GPU","lora_name":null)"),
      "events[1].token_ids[0]: integer 9223372036854775808 out of int64 range");
  ExpectError(Stored(R"("block_hashes":[],"parent_block_hash":null,"token_ids":[],)"
                     R"("block_size":null,"lora_id":null,"medium":"GPU","lora_name":null)"),
              "events[1].block_size: expected integer, got null");
  ExpectError(Stored(R"("block_hashes":[],"parent_block_hash":null,"token_ids":[],)"
                     R"("block_size":1,"lora_id":null,"medium":3,"lora_name":null)"),
              "events[1].medium: expected string or null, got integer");
  ExpectError(Stored(kStoredFields + R"(,"group_idx":"0")"),
              "events[1].group_idx: expected integer, got string");
  ExpectError(Stored(kStoredFields + R"(,"blok_size":4)"), "events[1]: unknown field 'blok_size'");
  ExpectError(Stored(kStoredFields + R"(,"extra_keys":"x")"),
              "events[1].extra_keys: expected array or null, got string");
  ExpectError(Stored(kStoredFields + R"(,"extra_keys":[null,"x"])"),
              "events[1].extra_keys[1]: expected array (tuple) or null, got string");
  ExpectError(Stored(kStoredFields + R"(,"extra_keys":[[{"bytes":"0"}]])"),
              "events[1].extra_keys[0][0].bytes: hex string '0' has an odd length");
  ExpectError(Stored(kStoredFields + R"(,"extra_keys":[[{"bin":"00"}]])"),
              "events[1].extra_keys[0][0]: expected {\"bytes\":\"<hex>\"}");
  std::string deep = std::string(40, '[') + std::string(40, ']');
  ExpectError(Stored(kStoredFields + R"(,"extra_keys":[)" + deep + "]"), "nested deeper than");
}

// ---------------------------------------------------------------------------------------------
// Text form.

TEST(EventJsonTest, TextFormOneLinePerEvent) {
  EXPECT_EQ(BatchToText(ParseOk(kExample1), 12),
            "seq=12 ts=1700000000.500 dp=0 BlockStored medium=GPU group=0 "
            "hashes=[13366815110101616827,14660323646696587421] parent=- tokens=8 block_size=4 "
            "extra_keys=0/2 kind=full_attention");
  EXPECT_EQ(BatchToText(ParseOk(kExample2), 13),
            "seq=13 ts=1700000001.000 dp=0 BlockRemoved medium=GPU group=0 "
            "hashes=[13366815110101616827]\n"
            "seq=13 ts=1700000001.000 dp=0 AllBlocksCleared");
  EXPECT_EQ(BatchToText(EventBatch{2.0, {}, std::nullopt}, 0), "seq=0 ts=2.000 dp=- (no events)");

  // Many hashes and byte hashes are abbreviated.
  BlockRemoved r;
  for (uint64_t i = 0; i < 10; ++i) r.block_hashes.push_back(BlockHash::Uint(i));
  r.reason = "evicted";
  EXPECT_EQ(BatchToText(EventBatch{1.0, {r}, 0}, 1),
            "seq=1 ts=1.000 dp=0 BlockRemoved medium=- group=- hashes=[0,1,2,..+7] "
            "reason=evicted");
  EventBatch full = ParseOk(FullFieldsJson());
  std::string text = BatchToText(full, 3);
  EXPECT_NE(text.find("hashes=[000102030405..,202122232425..] parent=ffffffffffff.. tokens=9"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("lora_id=7 lora=adapter-a extra_keys=2/2 kind=sliding_window window=4096 "
                      "locality=REMOTE ownership=SHARED session=s-42"),
            std::string::npos)
      << text;
}

// ---------------------------------------------------------------------------------------------
// Random batches: EventBatch -> JSON -> EventBatch is the identity; so is the msgpack path.

class RandomBatches {
 public:
  explicit RandomBatches(unsigned seed) : rng_(seed) {}

  EventBatch Batch() {
    EventBatch b;
    b.ts = std::uniform_real_distribution<double>(-1e10, 1e10)(rng_);
    if (Chance(4)) b.ts = static_cast<double>(Int(-1000, 1000));
    if (!Chance(5)) b.data_parallel_rank = Int(0, 64);
    int n = static_cast<int>(Int(0, 5));
    for (int i = 0; i < n; ++i) {
      switch (Int(0, 2)) {
        case 0:
          b.events.push_back(Stored());
          break;
        case 1:
          b.events.push_back(Removed());
          break;
        default:
          b.events.push_back(AllBlocksCleared{});
      }
    }
    return b;
  }

 private:
  int64_t Int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Chance(int one_in) { return Int(0, one_in - 1) == 0; }

  int64_t AnyInt() {
    switch (Int(0, 3)) {
      case 0:
        return Int(0, 100);
      case 1:
        return Int(std::numeric_limits<int64_t>::min(), -1);
      default:
        return Int(0, std::numeric_limits<int64_t>::max());
    }
  }

  std::string Str() {
    static const std::vector<std::string> kPieces = {"a",  "Z",  "0",    "-", " ",    "\"", "\\",
                                                     "\n", "\t", "\x01", "é", "日本", "💾",  "lora"};
    std::string s;
    int n = static_cast<int>(Int(0, 6));
    for (int i = 0; i < n; ++i) s += kPieces[Int(0, kPieces.size() - 1)];
    return s;
  }

  std::string Raw() {
    std::string s(static_cast<size_t>(Int(0, 40)), '\0');
    for (char& c : s) c = static_cast<char>(Int(0, 255));
    return s;
  }

  BlockHash Hash() {
    switch (Int(0, 3)) {
      case 0:
        return BlockHash::Bytes(Raw());
      case 1:
        return BlockHash::NegativeInt(Int(std::numeric_limits<int64_t>::min(), -1));
      default:
        return BlockHash::Uint(static_cast<uint64_t>(rng_()));
    }
  }

  std::vector<BlockHash> Hashes() {
    std::vector<BlockHash> out(static_cast<size_t>(Int(0, 6)));
    for (BlockHash& h : out) h = Hash();
    return out;
  }

  std::optional<std::string> OptStr() {
    if (Chance(2)) return std::nullopt;
    return Str();
  }
  std::optional<int64_t> OptInt() {
    if (Chance(2)) return std::nullopt;
    return AnyInt();
  }

  // Values as the msgpack decoder produces them: non-negative ints that fit int64 are int64.
  Value AnyValue(int depth) {
    Value v;
    switch (Int(0, depth > 3 ? 7 : 8)) {
      case 0:
        break;
      case 1:
        v.v = Chance(2);
        break;
      case 2:
        v.v = AnyInt();
        break;
      case 3:
        v.v = static_cast<uint64_t>(Int(0, std::numeric_limits<int64_t>::max())) +
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1;
        break;
      case 4:
        v.v = std::uniform_real_distribution<double>(-1e6, 1e6)(rng_);
        break;
      case 5:
        v.v = Str();
        break;
      case 6:
        v.v = Binary{Raw()};
        break;
      default: {
        ValueArray a(static_cast<size_t>(Int(0, 3)));
        for (Value& item : a) item = AnyValue(depth + 1);
        v.v = std::move(a);
      }
    }
    return v;
  }

  BlockStored Stored() {
    BlockStored e;
    e.block_hashes = Hashes();
    if (Chance(2)) e.parent_block_hash = Hash();
    e.token_ids.resize(static_cast<size_t>(Int(0, 20)));
    for (int64_t& t : e.token_ids) t = AnyInt();
    e.block_size = AnyInt();
    e.lora_id = OptInt();
    e.medium = OptStr();
    e.lora_name = OptStr();
    if (Chance(2)) {
      std::vector<Value> keys(e.block_hashes.size());
      for (Value& k : keys) {
        if (!Chance(3)) {
          ValueArray tuple(static_cast<size_t>(Int(0, 3)));
          for (Value& item : tuple) item = AnyValue(1);
          k.v = std::move(tuple);
        }
      }
      e.extra_keys = std::move(keys);
    }
    e.group_idx = OptInt();
    e.kv_cache_spec_kind = OptStr();
    e.kv_cache_spec_sliding_window = OptInt();
    e.locality = OptStr();
    e.ownership = OptStr();
    e.session_id = OptStr();
    return e;
  }

  BlockRemoved Removed() {
    BlockRemoved e;
    e.block_hashes = Hashes();
    e.medium = OptStr();
    e.group_idx = OptInt();
    e.locality = OptStr();
    e.ownership = OptStr();
    e.reason = OptStr();
    return e;
  }

  std::mt19937_64 rng_;
};

TEST(EventJsonTest, RandomBatchesRoundTrip) {
  RandomBatches gen(kvo::testing::TestSeed());
  for (int i = 0; i < 2000; ++i) {
    EventBatch batch = gen.Batch();
    std::string json = BatchToJson(batch, static_cast<uint64_t>(i), "topic");
    Result<EventBatch> back = BatchFromJson(json);
    ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n  json: " << json;
    ASSERT_EQ(*back, batch) << "json: " << json;
    EXPECT_EQ(BatchToJson(*back, static_cast<uint64_t>(i), "topic"), json);
    // JSON -> EventBatch -> msgpack -> EventBatch -> JSON.
    Result<EventBatch> wire = DecodeBatch(EncodeBatch(*back));
    ASSERT_TRUE(wire.ok()) << wire.status().ToString();
    EXPECT_EQ(BatchToJson(*wire, static_cast<uint64_t>(i), "topic"), json);
  }
}

}  // namespace
}  // namespace kvo
