// kvo_openai (issue 13): the tokenizer's documented rules and stability, request parsing (every
// accepted prompt shape; bad input named by field), the error shape, SSE framing read back from
// arbitrary splits.
#include "openai/openai.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace kvo::openai {
namespace {

using json = nlohmann::json;

TEST(TokenizerTest, DocumentedRules) {
  EXPECT_TRUE(Tokenize("").empty());
  // Punctuation and lone whitespace: one token each, the byte value.
  EXPECT_EQ(Tokenize(",.\n"), (std::vector<uint32_t>{',', '.', '\n'}));
  // A word: pieces of up to 4 bytes; a single leading space belongs to the word.
  auto hello = Tokenize("hello");  // "hell" "o"
  ASSERT_EQ(hello.size(), 2u);
  auto spaced = Tokenize(" hello");
  ASSERT_EQ(spaced.size(), 2u);
  EXPECT_NE(spaced[0], hello[0]);
  EXPECT_EQ(spaced[1], hello[1]);
  EXPECT_EQ(Tokenize("a  b").size(), 3u);  // 'a', ' ', " b"
  for (uint32_t t : Tokenize("The quick brown fox, naïve café 123!")) EXPECT_LT(t, kVocabSize);
  // Stable across builds and machines: pinned values (FNV-1a 32 of the piece mod 49744, + 256).
  EXPECT_EQ(Tokenize("kvo"), (std::vector<uint32_t>{256 + 0x76363221u % (kVocabSize - 256)}));
}

TEST(TokenizerTest, PrefixOfTextGivesPrefixOfTokensAtWordBoundaries) {
  const std::string a = "You are a helpful assistant.";
  const std::string b = a + " Tell me about caches.";
  auto ta = Tokenize(a), tb = Tokenize(b);
  ASSERT_LE(ta.size(), tb.size());
  EXPECT_TRUE(std::equal(ta.begin(), ta.end(), tb.begin()));
}

TEST(CompletionRequestTest, PromptShapes) {
  auto text = ParseCompletionRequest(R"({"model":"m","prompt":"hi there","max_tokens":3})");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(text->model, "m");
  EXPECT_EQ(text->prompt_tokens, Tokenize("hi there"));
  EXPECT_TRUE(text->prompt_was_text);
  EXPECT_EQ(text->max_tokens, 3);
  EXPECT_FALSE(text->stream);
  auto ids = ParseCompletionRequest(R"({"prompt":[1,2,3],"stream":true})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->prompt_tokens, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_TRUE(ids->stream);
  EXPECT_EQ(ids->max_tokens, 16);
  auto ptids = ParseCompletionRequest(R"({"prompt_token_ids":[7,8]})");
  ASSERT_TRUE(ptids.ok());
  EXPECT_EQ(ptids->prompt_tokens, (std::vector<uint32_t>{7, 8}));
  auto one = ParseCompletionRequest(R"({"prompt":[[4,5]]})");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->prompt_tokens, (std::vector<uint32_t>{4, 5}));
  auto one_text = ParseCompletionRequest(R"({"prompt":["x"]})");
  ASSERT_TRUE(one_text.ok());
  EXPECT_EQ(one_text->prompt_tokens, Tokenize("x"));
}

TEST(CompletionRequestTest, BadInputNamesTheField) {
  struct Case {
    const char* body;
    const char* field;
  };
  for (const Case& c :
       {Case{"", "body"}, Case{"[1]", "body"}, Case{"{", "body"},
        Case{R"({"max_tokens":1})", "prompt"},
        Case{R"({"prompt":"a","prompt_token_ids":[1]})", "prompt"},
        Case{R"({"prompt":["a","b"]})", "prompt"}, Case{R"({"prompt":[1,-2]})", "prompt"},
        Case{R"({"prompt":[1,"x"]})", "prompt"}, Case{R"({"prompt":{}})", "prompt"},
        Case{R"({"prompt_token_ids":"1"})", "prompt_token_ids"},
        Case{R"({"prompt":"a","max_tokens":-1})", "max_tokens"},
        Case{R"({"prompt":"a","max_tokens":"5"})", "max_tokens"},
        Case{R"({"prompt":"a","stream":"yes"})", "stream"}, Case{R"({"prompt":"a","n":2})", "n"},
        Case{R"({"prompt":"a","model":3})", "model"}}) {
    auto r = ParseCompletionRequest(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(r.status().message().starts_with(c.field))
        << c.body << ": " << r.status().message();
  }
}

TEST(ChatRequestTest, MessagesThroughTheTemplate) {
  auto r = ParseChatCompletionRequest(
      R"({"model":"m","messages":[{"role":"system","content":"Be brief."},)"
      R"({"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"!"}]}],)"
      R"("max_completion_tokens":5,"max_tokens":9,"stream":true})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->endpoint, Endpoint::kChatCompletions);
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_TRUE(r->stream);
  EXPECT_EQ(ChatTemplate({{"system", "Be brief."}, {"user", "Hi!"}}),
            "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n");
  EXPECT_EQ(r->prompt_tokens, Tokenize("<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"));
  for (const char* bad : {R"({"messages":[]})", R"({"messages":"x"})", R"({"messages":[1]})",
                          R"({"messages":[{"content":"x"}]})",
                          R"({"messages":[{"role":"user","content":[{"type":"image"}]}]})"}) {
    auto e = ParseChatCompletionRequest(bad);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_TRUE(e.status().message().starts_with("messages")) << e.status().message();
  }
}

TEST(ErrorJsonTest, OpenAIShape) {
  json e = json::parse(ErrorJson(400, "prompt: missing", "prompt"));
  EXPECT_EQ(e["error"]["message"], "prompt: missing");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "prompt");
  EXPECT_EQ(e["error"]["code"], 400);
  json u = json::parse(ErrorJson(503, "no engine \"up\"\n"));
  EXPECT_EQ(u["error"]["type"], "service_unavailable_error");
  EXPECT_TRUE(u["error"]["param"].is_null());
  EXPECT_EQ(u["error"]["message"], "no engine \"up\"\n");
}

// SSE written by SseData, read back by SseReader from every split of the byte stream.
TEST(SseTest, RoundTripAtRandomSplits) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::string stream = ": comment\n\n";
  std::vector<std::string> sent;
  for (int i = 0; i < 50; ++i) {
    sent.push_back(json{{"i", i}, {"text", std::string(rng() % 40, 'x')}}.dump());
    stream += SseData(sent.back());
  }
  stream += "event: x\r\ndata: a\r\ndata: b\r\n\r\n";
  sent.push_back("a\nb");
  stream += kSseDone;
  sent.push_back("[DONE]");
  for (int trial = 0; trial < 50; ++trial) {
    SseReader reader;
    std::vector<std::string> got;
    size_t pos = 0;
    while (pos < stream.size()) {
      size_t n = std::min<size_t>(stream.size() - pos, 1 + rng() % 30);
      ASSERT_TRUE(reader
                      .Feed(std::string_view(stream).substr(pos, n),
                            [&](std::string_view d) { got.emplace_back(d); })
                      .ok());
      pos += n;
    }
    ASSERT_EQ(got, sent) << "seed " << seed << " trial " << trial;
  }
  SseReader small(64);
  EXPECT_FALSE(small.Feed(std::string(100, 'x'), [](std::string_view) {}).ok());
}

}  // namespace
}  // namespace kvo::openai
