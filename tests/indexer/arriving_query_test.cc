// ParseRouterQuery on a body still arriving (an ArrivingBody, as the HTTP server hands /query to
// its handler): it must answer exactly what the whole-body parse answers, whatever pieces the body
// comes in, and feed the sink the same job. Attacks: random bodies (compact and spaced lists,
// members before and after the list, a second list, lora_id, defects in the list, trailing text,
// item limits) cut into random pieces, from one byte to the whole body, delivered in lockstep
// (each piece only when the parser asks for more, so it works at every boundary; bytes not yet
// delivered are junk that would change the answer if read) or by a thread of their own (TSan
// sees any read past what was announced); bodies that stop arriving midway; and the key helper
// fed while the list arrives gives the keys of the whole prompt; a long list read in chunks by the
// handler and a ListHelper's thread (chunks down to a few bytes, so every boundary comes up)
// answers as the whole-body parse. Seeds printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "http/http_server.h"
#include "indexer/indexer.h"
#include "indexer/service/key_helper.h"
#include "indexer/service/router_api.h"
#include "tests/testing/stall_gate.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

// A body delivered in pieces. Lockstep: each WaitBeyond that finds nothing new copies the next
// piece in itself. Threaded: a thread copies the pieces in as fast as it can. `stop_at`: the
// body stops arriving there (WaitBeyond then returns what it has).
class PiecewiseBody final : public ArrivingBody {
 public:
  PiecewiseBody(const std::string& body, std::vector<size_t> cuts, bool threaded,
                std::optional<size_t> stop_at)
      : text_(body), buf_(body.size(), '\0'), cuts_(std::move(cuts)), stop_at_(stop_at) {
    // Bytes not yet arrived: junk that parses (digits, separators, a closing brace), so a read
    // past what was announced changes the answer.
    static const char kJunk[] = "7,]}1,";
    for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = kJunk[i % 6];
    if (threaded) {
      feeder_ = std::thread([this] {
        while (DeliverNext()) {
        }
      });
    }
  }
  ~PiecewiseBody() override {
    if (feeder_.joinable()) feeder_.join();
  }

  const char* data() const override { return buf_.data(); }
  size_t size() const override { return buf_.size(); }
  size_t WaitBeyond(size_t have) const override {
    ++waits_;
    for (;;) {
      const uint64_t w = word_.load(std::memory_order_acquire);
      if ((w >> 1) > have || (w & 1) != 0) return w >> 1;
      if (!feeder_.joinable()) {
        std::lock_guard<std::mutex> lock(deliver_mu_);  // the handler and a list helper
        DeliverNext();
        continue;
      }
      word_.wait(w, std::memory_order_acquire);
    }
  }
  // How many bytes had arrived when f() ran: the parser's progress seen from the sink.
  size_t arrived() const { return word_.load(std::memory_order_acquire) >> 1; }
  int waits() const { return waits_.load(); }

 private:
  // Copies the next piece in and announces it; false once the body ended (complete or stopped).
  bool DeliverNext() const {
    const uint64_t w = word_.load(std::memory_order_relaxed);
    if ((w & 1) != 0) return false;
    const size_t have = w >> 1;
    size_t next = next_cut_ < cuts_.size() ? cuts_[next_cut_++] : text_.size();
    bool end = next >= text_.size();
    next = std::min(next, text_.size());
    if (stop_at_ && next >= *stop_at_) {
      next = *stop_at_;
      end = true;
    }
    std::memcpy(buf_.data() + have, text_.data() + have, next - have);
    word_.store(static_cast<uint64_t>(next) << 1 | (end ? 1 : 0), std::memory_order_release);
    word_.notify_all();
    return !end;
  }

  const std::string text_;
  mutable std::string buf_;         // written by whoever delivers (one thread at a time)
  const std::vector<size_t> cuts_;  // increasing offsets where pieces end
  mutable size_t next_cut_ = 0;
  const std::optional<size_t> stop_at_;
  mutable std::atomic<uint64_t> word_{0};  // (bytes in place << 1) | ended
  mutable std::atomic<int> waits_{0};
  mutable std::mutex deliver_mu_;
  std::thread feeder_;
};

// Records what the parser tells the sink, with how much of the body had arrived at each call.
class RecordingSink final : public TokenSink {
 public:
  explicit RecordingSink(const PiecewiseBody* body) : body_(body) {}
  void Begin(int64_t bs, std::string_view lora_name, size_t most) override {
    ++begins;
    block_size = bs;
    lora = std::string(lora_name);
    max_tokens = most;
    begun_at = body_->arrived();
  }
  void Tokens(const int64_t* d, size_t n) override {
    EXPECT_EQ(begins, 1);
    EXPECT_GE(n, tokens) << "Tokens went back";
    if (data != nullptr) {
      EXPECT_EQ(d, data) << "the token buffer moved";
    }
    data = d;
    tokens = n;
    if (body_->arrived() < body_->size()) ++tokens_while_arriving;
  }
  void End(bool list_ok) override {
    ++ends;
    ok = list_ok;
  }

  int begins = 0;
  int ends = 0;
  bool ok = false;
  int64_t block_size = 0;
  std::string lora;
  size_t max_tokens = 0;
  size_t begun_at = 0;
  const int64_t* data = nullptr;
  size_t tokens = 0;
  int tokens_while_arriving = 0;

 private:
  const PiecewiseBody* const body_;
};

// A random /query body: its members in a random order, the list compact or spaced, now and then
// a defect in it, more members after it, a second list, lora_id, or text after the object.
std::string RandomBody(std::mt19937& rng, int64_t* max_items) {
  const int n = rng() % 8 == 0 ? static_cast<int>(rng() % 5) : static_cast<int>(rng() % 6000);
  const bool spaced = rng() % 5 == 0;
  std::string list = "[";
  for (int i = 0; i < n; ++i) {
    if (i != 0) list += spaced ? ", " : ",";
    list += std::to_string(rng() % 4 == 0 ? rng() % 200000 : rng() % 100);
  }
  list += "]";
  if (rng() % 6 == 0) {
    static const char* kDefects[] = {"-", " ",  "0",  "12345678", ",", ".5", "x",
                                     "]", "\n", "\"", "1e3",      "",  "00", "-0"};
    list.insert(1 + rng() % (list.size() - 1), kDefects[rng() % 14]);
  }
  *max_items = rng() % 6 == 0 ? static_cast<int64_t>(rng() % (n + 2)) : 1 << 20;
  std::vector<std::string> members = {R"("model": "m")", R"("token_ids": )" + list};
  if (rng() % 8 != 0) members.push_back(R"("block_size": )" + std::to_string(1 + rng() % 64));
  switch (rng() % 6) {
    case 0:
      members.push_back(R"("lora_name": "a)" + std::to_string(rng() % 3) + "\"");
      break;
    case 1:
      members.push_back(R"("lora_id": )" + std::to_string(rng() % 3));
      break;
    case 2:
      members.push_back(R"("note": "a ] } [ { \" \\ string", "nested": {"a": [1, [2]]})");
      break;
    case 3:
      members.push_back(R"("tenant_id": "t", "cache_salt": "s")");
      break;
    default:
      break;
  }
  if (rng() % 15 == 0) members.push_back(R"("token_ids": [1, 2, 3])");
  if (rng() % 20 == 0) members.push_back(R"("block_size": 7)");  // a second one
  std::shuffle(members.begin(), members.end(), rng);
  std::string body = std::string(rng() % 3, ' ') + "{";
  for (size_t i = 0; i < members.size(); ++i) body += (i ? ", " : "") + members[i];
  body += "}";
  if (rng() % 20 == 0) body += "x";
  body += std::string(rng() % 3, '\n');
  return body;
}

// Random piece ends: one byte now and then, a few bytes, a few kilobytes, or the whole body.
std::vector<size_t> RandomCuts(std::mt19937& rng, size_t size) {
  std::vector<size_t> cuts;
  const size_t scale = std::vector<size_t>{1, 8, 64, 700, 4096, size + 1}[rng() % 6];
  for (size_t at = 0; at < size;) {
    at += 1 + rng() % scale;
    cuts.push_back(at);
  }
  return cuts;
}

void ExpectSameQuery(const Result<RouterQuery>& got, const Result<RouterQuery>& want,
                     const std::string& body) {
  const std::string shown = body.substr(0, 300);
  ASSERT_EQ(got.ok(), want.ok()) << shown << " -> " << got.status().ToString() << " / "
                                 << want.status().ToString();
  if (!got.ok()) {
    ASSERT_EQ(got.status().message(), want.status().message()) << shown;
    return;
  }
  EXPECT_EQ(got->model, want->model) << shown;
  EXPECT_EQ(got->lora_name, want->lora_name) << shown;
  EXPECT_EQ(got->tenant_id, want->tenant_id) << shown;
  EXPECT_EQ(got->block_size, want->block_size) << shown;
  EXPECT_EQ(got->cache_salt, want->cache_salt) << shown;
  ASSERT_EQ(got->token_ids, want->token_ids) << shown;
}

// The job the sink was given is the answer's: every token, from one buffer that never moved.
// (After End(true) the answer's token_ids are the very storage the sink was given: a key helper
// that gave its job up still reads it until the query's state goes.)
void ExpectSinkHeldTheAnswer(const RecordingSink& sink, const Result<RouterQuery>& got) {
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(sink.tokens, got->token_ids.size());
  ASSERT_TRUE(got->token_ids.empty() || got->token_ids.data() == sink.data)
      << "the answer's tokens are not in the storage the sink was given";
}

// A compact (or spaced) /query body of `tokens`, and the pieces the server reads it in (its first
// read 64 KiB, then 128 KiB at a time).
std::string PromptBody(const std::vector<int64_t>& tokens, int64_t block_size, bool spaced) {
  std::string body =
      R"({"model":"m","block_size":)" + std::to_string(block_size) + R"(,"token_ids":[)";
  for (size_t i = 0; i < tokens.size(); ++i) {
    body += (i ? (spaced ? ", " : ",") : "") + std::to_string(tokens[i]);
  }
  return body + "]}";
}
std::vector<size_t> ServerCuts(size_t size) {
  std::vector<size_t> cuts;
  for (size_t at = 64u << 10; at < size; at += 128u << 10) cuts.push_back(at);
  return cuts;
}

TEST(ArrivingQueryTest, PiecesInLockstepAnswerAsTheWholeBody) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  int accepted = 0;
  int fed_while_arriving = 0;
  int begun_early = 0;
  for (int round = 0; round < 1500; ++round) {
    int64_t max_items = 0;
    const std::string body = RandomBody(rng, &max_items);
    const Result<RouterQuery> want = ParseRouterQuery(body, false, max_items);
    PiecewiseBody arriving(body, RandomCuts(rng, body.size()), /*threaded=*/false, std::nullopt);
    RecordingSink sink(&arriving);
    const Result<RouterQuery> got = ParseRouterQuery(arriving, max_items, &sink);
    SCOPED_TRACE("round " + std::to_string(round));
    ExpectSameQuery(got, want, body);
    ASSERT_LE(sink.begins, 1);
    ASSERT_EQ(sink.ends, sink.begins) << "Begin without End";
    if (sink.ends == 1 && sink.ok) {
      // The job the sink was given is the answer's: its block size, LoRA and every token.
      ASSERT_NO_FATAL_FAILURE(ExpectSinkHeldTheAnswer(sink, got));
      EXPECT_EQ(sink.block_size, got->block_size);
      EXPECT_EQ(sink.lora, got->lora_name);
      EXPECT_GE(sink.max_tokens, got->token_ids.size());
      fed_while_arriving += sink.tokens_while_arriving > 0 ? 1 : 0;
      begun_early += sink.begun_at < body.size() ? 1 : 0;
    }
    accepted += got.ok() ? 1 : 0;
  }
  std::printf(
      "accepted %d of 1500; sink begun before the body was complete %d, fed tokens "
      "while it arrived %d\n",
      accepted, begun_early, fed_while_arriving);
  EXPECT_GT(accepted, 500);
  // The point of it: the parse runs while the body arrives.
  EXPECT_GT(begun_early, 80);
  EXPECT_GT(fed_while_arriving, 50);
}

TEST(ArrivingQueryTest, AFeederThreadAnswersAsTheWholeBody) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int round = 0; round < 300; ++round) {
    int64_t max_items = 0;
    const std::string body = RandomBody(rng, &max_items);
    const Result<RouterQuery> want = ParseRouterQuery(body, false, max_items);
    PiecewiseBody arriving(body, RandomCuts(rng, body.size()), /*threaded=*/true, std::nullopt);
    RecordingSink sink(&arriving);
    const Result<RouterQuery> got = ParseRouterQuery(arriving, max_items, &sink);
    SCOPED_TRACE("round " + std::to_string(round));
    ExpectSameQuery(got, want, body);
    ASSERT_EQ(sink.ends, sink.begins);
  }
}

// The client goes away midway: an error (the server drops it), the sink ended, never an answer
// made of what arrived.
TEST(ArrivingQueryTest, ABodyThatStopsArrivingIsAnErrorAndEndsTheSink) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int round = 0; round < 400; ++round) {
    int64_t max_items = 0;
    const std::string body = RandomBody(rng, &max_items);
    const size_t stop_at = rng() % body.size();
    PiecewiseBody arriving(body, RandomCuts(rng, body.size()), rng() % 2 == 0, stop_at);
    RecordingSink sink(&arriving);
    const Result<RouterQuery> got = ParseRouterQuery(arriving, max_items, &sink);
    SCOPED_TRACE("round " + std::to_string(round) + " stop at " + std::to_string(stop_at));
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().message(), "the body ended before its Content-Length");
    ASSERT_EQ(sink.ends, sink.begins);
    if (sink.ends == 1) {
      EXPECT_FALSE(sink.ok);
    }
  }
}

// A sender of one byte at a time before a long head (a 60 KiB member before the list) costs a
// few scans of the head, not one per byte (that was 60 000 scans of up to 60 KiB: seconds).
TEST(ArrivingQueryTest, OneByteAtATimeDoesNotRescanTheHeadPerByte) {
  std::string body = R"({"model": "m", "note": ")" + std::string(60000, 'n') +
                     R"(", "block_size": 16, "token_ids": [)";
  for (int i = 0; i < 20000; ++i) body += (i ? "," : "") + std::to_string(i % 1000);
  body += "]}";
  std::vector<size_t> cuts;
  for (size_t at = 1; at < 70000; ++at) cuts.push_back(at);
  PiecewiseBody arriving(body, cuts, /*threaded=*/false, std::nullopt);
  const auto start = std::chrono::steady_clock::now();
  const Result<RouterQuery> got = ParseRouterQuery(arriving, 1 << 20);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectSameQuery(got, ParseRouterQuery(body, false, 1 << 20), body);
  EXPECT_GE(arriving.waits(), 60000);  // it did wait byte by byte
  EXPECT_LT(seconds, 1.0) << "the head was rescanned per byte";
}

// The key helper fed while a 128k-token list arrives in 128 KiB pieces (the server's) gives the
// whole prompt's keys.
TEST(ArrivingQueryTest, TheKeyHelperFedWhileTheListArrivesGivesThePromptsKeys) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  KeyHelper helper;
  int with_keys = 0;
  for (int round = 0; round < 20; ++round) {
    const int64_t bs = std::vector<int64_t>{1, 16, 64}[rng() % 3];
    std::vector<int64_t> tokens(rng() % 2 == 0 ? 131072 : rng() % 5000);
    for (auto& t : tokens) t = static_cast<int64_t>(rng() % 150000);
    const std::string body = PromptBody(tokens, bs, /*spaced=*/false);
    PiecewiseBody arriving(body, ServerCuts(body.size()), rng() % 2 == 0, std::nullopt);
    auto lease = helper.TryLease();
    ASSERT_NE(lease, nullptr);
    auto q = ParseRouterQuery(arriving, 1 << 20, lease.get());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_EQ(q->token_ids, tokens);
    const std::vector<uint64_t> keys = lease->TakeKeys();
    if (keys.empty() && tokens.size() / static_cast<size_t>(bs) > 0) continue;  // woke too late
    ++with_keys;
    ASSERT_EQ(keys, *ContentKeys(tokens, bs, "")) << "round " << round;
  }
  EXPECT_GT(with_keys, 0);
}

// A list read in chunks by the handler and a ListHelper's threads (ParseRouterQuery's `lists`):
// the whole-body parse's answer and sink job whatever the chunks' size (from 9 bytes: most cut an
// element, many hold none, some start inside a member after the list), the pieces the body comes
// in, the defects in the list, the item limit or the helper's threads (1-3); and a body that stops
// arriving is an error with the sink ended, the helper's threads out of the job.
TEST(ArrivingQueryTest, ChunksReadWithTheListHelperAnswerAsTheWholeBody) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<ListHelper>> helpers;
  for (const size_t chunk : {9, 24, 64, 200, 2000}) {
    // Each size twice: a handler that waits for the helper's chunks, and one that takes over any
    // chunk the helper has not finished when it is the next to join (patience 0).
    for (const int64_t patience : {std::numeric_limits<int64_t>::max(), int64_t{0}}) {
      ListHelper::Options o;
      o.chunk_bytes = chunk;
      o.max_chunks = 4096;
      o.min_list_bytes = 0;
      o.takeover_after_ns = patience;
      o.threads = 1 + helpers.size() % 3;  // one to three threads beside the handler
      helpers.push_back(std::make_unique<ListHelper>(o));
    }
  }
  size_t takeovers = 0;
  size_t joined_from_helper = 0;  // of the helpers' chunks, those joined into an answer
  int accepted = 0;
  int fed = 0;
  for (int round = 0; round < 1200; ++round) {
    int64_t max_items = 0;
    const std::string body = RandomBody(rng, &max_items);
    const Result<RouterQuery> want = ParseRouterQuery(body, false, max_items);
    const bool stops = rng() % 8 == 0;
    const std::optional<size_t> stop_at =
        stops ? std::optional<size_t>(rng() % body.size()) : std::nullopt;
    PiecewiseBody arriving(body, RandomCuts(rng, body.size()), rng() % 2 == 0, stop_at);
    RecordingSink sink(&arriving);
    ListHelper& lists = *helpers[rng() % helpers.size()];
    auto lease = lists.TryLease();
    ASSERT_NE(lease, nullptr);
    const Result<RouterQuery> got = ParseRouterQuery(arriving, max_items, &sink, lease.get());
    takeovers += lease->takeovers();
    joined_from_helper += lease->joined_from_helper();
    SCOPED_TRACE("round " + std::to_string(round) + " chunk bytes " +
                 std::to_string(lists.options().chunk_bytes));
    ASSERT_EQ(sink.ends, sink.begins) << "Begin without End";
    if (stops) {
      ASSERT_FALSE(got.ok()) << body.substr(0, 300);
      EXPECT_EQ(got.status().message(), "the body ended before its Content-Length");
      continue;
    }
    ExpectSameQuery(got, want, body);
    if (sink.ends == 1 && sink.ok) {
      ASSERT_NO_FATAL_FAILURE(ExpectSinkHeldTheAnswer(sink, got));
      ++fed;
    }
    accepted += got.ok() ? 1 : 0;
  }
  uint64_t by_helper = 0;
  for (const auto& h : helpers) by_helper += h->chunks_by_helper();
  std::printf(
      "accepted %d of 1200, sink fed the whole list %d; chunks read by the helpers %llu, taken "
      "over by the handler %zu\n",
      accepted, fed, static_cast<unsigned long long>(by_helper), takeovers);
  EXPECT_GT(accepted, 300);
  EXPECT_GT(by_helper, 500u);  // the helpers' thread did take chunks
  EXPECT_GT(joined_from_helper, 0u);
  EXPECT_LE(joined_from_helper, by_helper);
}

// A helper stalled in a chunk (its thread held in before_chunk, as a host that takes the CPU away
// would hold it): the handler reads that chunk itself after takeover_after_ns and answers as the
// whole-body parse, without waiting for the helper; the lease's destructor then waits for it. A
// watchdog releases the helper after 20 s, so a handler that waits for it fails instead of hanging.
TEST(ArrivingQueryTest, AStalledListHelpersChunkIsReadByTheHandler) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  testing::StallGate gate;  // the helper's thread stops in before_chunk while held
  ListHelper::Options o;
  o.chunk_bytes = 4096;
  o.min_list_bytes = 0;
  o.takeover_after_ns = 200'000;
  o.before_chunk = [&](size_t) { gate.Hook(); };
  ListHelper lists(o);
  KeyHelper keys;
  size_t takeovers = 0;
  for (int round = 0; round < 12; ++round) {
    std::vector<int64_t> tokens(20000 + rng() % 20000);
    for (auto& t : tokens) t = static_cast<int64_t>(rng() % 150000);
    const std::string body = PromptBody(tokens, 16, /*spaced=*/round % 4 == 3);
    PiecewiseBody arriving(body, ServerCuts(body.size()), /*threaded=*/round % 2 == 0,
                           std::nullopt);
    gate.Hold();
    gate.StartWatchdog();
    auto key_lease = keys.TryLease();
    auto lease = lists.TryLease();
    ASSERT_NE(lease, nullptr);
    auto q = ParseRouterQuery(arriving, 1 << 20, key_lease.get(), lease.get());
    EXPECT_FALSE(gate.StopWatchdog())
        << "round " << round << ": the parse waited for the stalled helper";
    EXPECT_LE(gate.Calls(), 1) << "the helper took a second chunk while stopped in the first";
    gate.Release();  // the helper may go on: the lease below waits for it
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_EQ(q->token_ids, tokens) << "round " << round;
    const std::vector<uint64_t> got = key_lease->TakeKeys();
    if (!got.empty()) {
      ASSERT_EQ(got, *ContentKeys(tokens, 16, "")) << "round " << round;
    }
    takeovers += lease->takeovers();
    lease.reset();
  }
  std::printf("chunks the handler read after the helper stalled: %zu in 12 rounds\n", takeovers);
  EXPECT_GE(takeovers, 1u);
}

// A 128k-token list (the bench's) in the default chunks, with the key helper fed from the joined
// chunks: the prompt's tokens and keys.
TEST(ArrivingQueryTest, ALongListInDefaultChunksGivesThePromptsTokensAndKeys) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  KeyHelper keys;
  ListHelper lists(ListHelper::Options{});
  for (int round = 0; round < 6; ++round) {
    std::vector<int64_t> tokens(131072);
    for (auto& t : tokens) t = static_cast<int64_t>(rng() % 150000);
    const std::string body = PromptBody(tokens, 16, /*spaced=*/round % 3 == 2);
    PiecewiseBody arriving(body, ServerCuts(body.size()), rng() % 2 == 0, std::nullopt);
    auto lease = keys.TryLease();
    ASSERT_NE(lease, nullptr);
    auto list_lease = lists.TryLease();
    ASSERT_NE(list_lease, nullptr);
    auto q = ParseRouterQuery(arriving, 1 << 20, lease.get(), list_lease.get());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_EQ(q->token_ids, tokens) << "round " << round;
    const std::vector<uint64_t> got = lease->TakeKeys();
    if (!got.empty()) {
      ASSERT_EQ(got, *ContentKeys(tokens, 16, "")) << "round " << round;
    }
  }
  EXPECT_GT(lists.chunks_by_helper(), 0u);
}

}  // namespace
}  // namespace kvo
