// Per-request limits (vLLM's scheduler tests): max_offload_tokens validation (None, "24", 24.5,
// -1 and True mean no cap; 0 means nothing; 24 with 12-token chunks means two chunks),
// offload_prompt_only, and kv_load_tiers parsing.
#include "manager/request_params.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kvo {
namespace {

using nlohmann::json;

int64_t Chunks(const json& params, int64_t tokens_after_batch = 100, bool prompt_only = false,
               int64_t prompt = 100) {
  StorableChunksInput in;
  in.num_tokens_after_batch = tokens_after_batch;
  in.num_tokens = 100;
  in.num_prompt_tokens = prompt;
  in.offload_prompt_only = prompt_only;
  in.max_offload_tokens = ParseMaxOffloadTokens(params);
  in.tokens_per_chunk = 12;
  return NumStorableChunks(in);
}

TEST(RequestParamsTest, MaxOffloadTokensCapsOnlyForNonNegativeInts) {
  EXPECT_EQ(Chunks(json::object()), 8);  // absent: no cap (100 / 12)
  EXPECT_EQ(Chunks({{"max_offload_tokens", nullptr}}), 8);
  EXPECT_EQ(Chunks({{"max_offload_tokens", "24"}}), 8);
  EXPECT_EQ(Chunks({{"max_offload_tokens", 24.5}}), 8);
  EXPECT_EQ(Chunks({{"max_offload_tokens", -1}}), 8);
  EXPECT_EQ(Chunks({{"max_offload_tokens", true}}), 8);
  EXPECT_EQ(Chunks({{"max_offload_tokens", 0}}), 0);   // disables
  EXPECT_EQ(Chunks({{"max_offload_tokens", 24}}), 2);  // chunks 0-1
  EXPECT_EQ(Chunks({{"max_offload_tokens", 35}}), 2);
  EXPECT_EQ(Chunks({{"max_offload_tokens", 36}}), 3);
  EXPECT_EQ(Chunks({{"max_offload_tokens", 1000}}), 8);
}

TEST(RequestParamsTest, BadMaxOffloadTokensWarnsNamingTheValue) {
  std::string warning;
  EXPECT_EQ(ParseMaxOffloadTokens({{"max_offload_tokens", 24.5}}, &warning), std::nullopt);
  EXPECT_EQ(warning, "max_offload_tokens must be a non-negative int, got 24.5; ignoring");
  warning.clear();
  EXPECT_EQ(ParseMaxOffloadTokens({{"max_offload_tokens", true}}, &warning), std::nullopt);
  EXPECT_NE(warning.find("got true"), std::string::npos);
  warning.clear();
  EXPECT_EQ(ParseMaxOffloadTokens(json::object(), &warning), std::nullopt);
  EXPECT_TRUE(warning.empty());  // absent: no warning
  EXPECT_EQ(ParseMaxOffloadTokens({{"max_offload_tokens", 7}}), 7);
  EXPECT_EQ(ParseMaxOffloadTokens(json(nullptr)), std::nullopt);  // no params at all
}

TEST(RequestParamsTest, OffloadPromptOnlyCapsAtThePrompt) {
  EXPECT_EQ(Chunks(json::object(), 100, /*prompt_only=*/true, /*prompt=*/30), 2);
  EXPECT_EQ(Chunks(json::object(), 100, /*prompt_only=*/false, /*prompt=*/30), 8);
  // The batch boundary, the prompt and the cap: the smallest wins.
  EXPECT_EQ(Chunks({{"max_offload_tokens", 60}}, 40, true, 50), 3);
  EXPECT_EQ(Chunks(json::object(), 11, false), 0);  // a partial chunk is never stored
}

TEST(RequestParamsTest, LoadTierFilter) {
  EXPECT_EQ(ParseLoadTierFilter(json::object()), std::nullopt);  // absent: ALL
  std::vector<std::string> warnings;
  EXPECT_EQ(ParseLoadTierFilter({{"kv_load_tiers", "storage"}}, &warnings), std::nullopt);
  EXPECT_EQ(warnings.size(), 1u);  // not a list: warning, ALL
  auto none = ParseLoadTierFilter({{"kv_load_tiers", json::array()}});
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());  // []: no secondary tier

  auto f = ParseLoadTierFilter(
      {{"kv_load_tiers", json::array({{{"medium", "Storage"}, {"locality", "local"}},
                                      {{"medium", "tape"}},
                                      {{"locality", "REMOTE"}}})}});
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->size(), 2u);  // the bad entry is skipped
  EXPECT_EQ((*f)[0].medium, Medium::kStorage);
  EXPECT_EQ((*f)[0].locality, "LOCAL");
  EXPECT_EQ((*f)[1].medium, std::nullopt);
  EXPECT_EQ((*f)[1].locality, "REMOTE");

  warnings.clear();
  EXPECT_EQ(ParseLoadTierFilter({{"kv_load_tiers", json::array({{{"medium", 3}}})}}, &warnings),
            std::nullopt);  // every entry bad: ALL
  EXPECT_EQ(warnings.size(), 2u);
}

// Issue 10 item 1: request params arrive as values built elsewhere; a warning about a 10^5-deep
// value dump()ed it (stack overflow). Now it is described in bounded space.
TEST(RequestParamsTest, DeepValuesAreDescribedNotDumped) {
  auto deep = [] {  // built by moves: a copy would recurse per level too
    json v = json::array();
    for (int i = 0; i < 100000; ++i) {
      json next = json::array();
      next.push_back(std::move(v));
      v = std::move(next);
    }
    return v;
  };
  json params = json::object();
  params["max_offload_tokens"] = deep();
  params["kv_load_tiers"] = json::array({json::object()});
  params["kv_load_tiers"][0]["medium"] = deep();
  std::string warning;
  EXPECT_EQ(ParseMaxOffloadTokens(params, &warning), std::nullopt);
  EXPECT_NE(warning.find("got an array of 1 element"), std::string::npos) << warning;
  std::vector<std::string> warnings;
  auto filter = ParseLoadTierFilter(params, &warnings);
  (void)filter;
  ASSERT_FALSE(warnings.empty());
  EXPECT_LT(warnings.front().size(), 200u) << warnings.front();
}

}  // namespace
}  // namespace kvo
