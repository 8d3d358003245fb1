// JsonFields (common/json_fields.h): the table's order is the output's key order, members keep
// nlohmann's conversion of their type, computed rows may be left out (std::nullopt) at their
// place, and a rendering through a table is byte-equal to the key-by-key code it replaces.
#include "common/json_fields.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace kvo {
namespace {

using Json = nlohmann::ordered_json;

struct Row {
  std::string name;
  uint64_t blocks = 0;
  int32_t delta = 0;
  double ratio = 0;
  bool ok = false;
  std::vector<std::string> problems;
  std::string owner;  // empty: no "owner" key
};

const JsonFields<Row>& Fields() {
  static const JsonFields<Row> fields = {
      {"name", &Row::name},
      {"owner",
       [](const Row& r) { return r.owner.empty() ? std::nullopt : std::optional(r.owner); }},
      {"blocks", &Row::blocks},
      {"delta", &Row::delta},
      {"ratio", &Row::ratio},
      {"ok", &Row::ok},
      {"problems", &Row::problems},
      {"twice", [](const Row& r) { return r.blocks * 2; }},
  };
  return fields;
}

// The key-by-key rendering the table stands for.
Json ByHand(const Row& r) {
  Json j;
  j["name"] = r.name;
  if (!r.owner.empty()) j["owner"] = r.owner;
  j["blocks"] = r.blocks;
  j["delta"] = r.delta;
  j["ratio"] = r.ratio;
  j["ok"] = r.ok;
  j["problems"] = r.problems;
  j["twice"] = r.blocks * 2;
  return j;
}

TEST(JsonFieldsTest, ByteEqualToKeyByKeyCodeInTableOrder) {
  const uint64_t seed = 0x5eed14;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  uint64_t x = seed;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 11;
  };
  std::vector<Row> rows;
  for (int i = 0; i < 200; ++i) {
    Row r;
    r.name = "r\"" + std::to_string(next() % 1000) + "\n\x01";
    r.blocks = next() | (uint64_t{1} << 63);  // above int64: stays unsigned
    r.delta = -static_cast<int32_t>(next() % 100000);
    r.ratio = static_cast<double>(next() % 1000) / 7.0;
    r.ok = next() % 2 == 0;
    for (uint64_t k = next() % 3; k > 0; --k) r.problems.push_back("p" + std::to_string(k));
    if (next() % 2 == 0) r.owner = "o" + std::to_string(i);
    EXPECT_EQ(Fields().ToJson(r).dump(), ByHand(r).dump()) << "row " << i;
    rows.push_back(r);
  }
  Json by_hand = Json::array();
  for (const Row& r : rows) by_hand.push_back(ByHand(r));
  EXPECT_EQ(Fields().ArrayOf(rows).dump(), by_hand.dump());
}

TEST(JsonFieldsTest, OptionalRowIsLeftOutAtItsPlace) {
  Row r;
  r.name = "a";
  EXPECT_EQ(Fields().ToJson(r).dump(),
            R"({"name":"a","blocks":0,"delta":0,"ratio":0.0,"ok":false,"problems":[],"twice":0})");
  r.owner = "b";
  const Json j = Fields().ToJson(r);
  ASSERT_TRUE(j.contains("owner"));
  EXPECT_EQ(std::next(j.begin()).key(), "owner");
}

TEST(JsonFieldsTest, AppendToKeepsWhatTheObjectHolds) {
  Json j;
  j["db"] = "x.db";
  Row r;
  r.name = "n";
  Fields().AppendTo(r, &j);
  EXPECT_EQ(j.begin().key(), "db");
  EXPECT_EQ(j.size(), 8u);
}

}  // namespace
}  // namespace kvo
