// common/json.h: documents nested too deep are refused before any value is built, long arrays
// when asked, and a value of any shape is described in a bounded message without recursion.
#include "common/json.h"

#include <gtest/gtest.h>

#include <string>

namespace kvo {
namespace {

std::string Deep(size_t depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(JsonTest, RefusesDeepDocumentsBeforeParsing) {
  auto deep = ParseJson("{\"a\": " + Deep(100000) + "}", "--config");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(deep.status().message().find("--config: JSON nested deeper than 64 levels"),
            std::string::npos)
      << deep.status().message();
  EXPECT_LT(deep.status().message().size(), 200u);
  // Exactly at the limit is accepted; one more level is not.
  EXPECT_TRUE(ParseJson(Deep(kJsonMaxDepth)).ok());
  EXPECT_FALSE(ParseJson(Deep(kJsonMaxDepth + 1)).ok());
  EXPECT_FALSE(ParseOrderedJson("[" + Deep(kJsonMaxDepth, '{', '}') + "]").ok());
  // Brackets inside strings (escaped quotes included) are not nesting.
  auto strings = ParseJson("{\"a\": \"" + Deep(1000) + "\\\"" + Deep(1000) + "\"}");
  ASSERT_TRUE(strings.ok()) << strings.status().ToString();
  EXPECT_EQ((*strings)["a"].get<std::string>().size(), 4001u);
}

TEST(JsonTest, LimitsArrayLength) {
  JsonLimits limits;
  limits.max_array_elements = 3;
  EXPECT_TRUE(ParseJson("[1,2,3]", {}, limits).ok());
  EXPECT_TRUE(ParseJson("{\"a\":[1,2,3],\"b\":[[1,2,3],[\"x,y,z,w\"]]}", {}, limits).ok());
  auto long_array = ParseJson("{\"a\":[1,2,3,4]}", {}, limits);
  ASSERT_FALSE(long_array.ok());
  EXPECT_NE(long_array.status().message().find("array longer than 3 elements"), std::string::npos);
}

TEST(JsonTest, InvalidJsonMessagesAreBounded) {
  // nlohmann quotes the last token read: here a 1 MB string with a raw control byte at its end.
  std::string text = "\"" + std::string(1 << 16, 'a') + "\x01\"";
  auto r = ParseJson(text, "body");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("body: invalid JSON"), std::string::npos);
  EXPECT_LT(r.status().message().size(), 400u);
}

TEST(JsonTest, DescribesAnyValueInBoundedSpace) {
  // A value built in memory (not parsed) 100 000 levels deep: dump() would overflow the stack.
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) {
    nlohmann::json next = nlohmann::json::array();
    next.push_back(std::move(deep));
    deep = std::move(next);
  }
  EXPECT_EQ(DescribeJson(deep), "an array of 1 element");
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  object["k"] = nlohmann::ordered_json::array({1, 2});
  for (int i = 0; i < 20; ++i) object["k" + std::to_string(i)] = i;
  EXPECT_EQ(DescribeJson(object), "an object of 21 keys");

  EXPECT_EQ(DescribeJson(nlohmann::json(42)), "42");
  EXPECT_EQ(DescribeJson(nlohmann::json(nullptr)), "null");
  EXPECT_EQ(DescribeJson(nlohmann::json::parse(R"([1,"x",{"a":true}])")), R"([1,"x",{"a":true}])");
  EXPECT_EQ(DescribeJson(nlohmann::json(std::vector<int>(100000, 7))),
            "an array of 100000 elements");
  const std::string huge = DescribeJson(nlohmann::json(std::string(1 << 20, 'z')));
  EXPECT_LT(huge.size(), 120u);
  EXPECT_NE(huge.find("(a string of 1048576 bytes)"), std::string::npos) << huge;
  EXPECT_EQ(CutForMessage("abcdef", 3), "abc... (6 bytes)");
  EXPECT_EQ(CutForMessage("abc", 3), "abc");
}

}  // namespace
}  // namespace kvo
