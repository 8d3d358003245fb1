// `kvo sim` and `kvo load` as processes (issue 13): a sim over real HTTP and a real ZeroMQ
// subscriber. Its events follow vLLM's block pool (BlockStored GPU on full blocks with vLLM's
// hashes, BlockRemoved GPU when a block's memory is reused, AllBlocksCleared on reset), the
// offload stack announces CPU and STORAGE blocks, hits after a GPU eviction come back from CPU and
// from the file tier with verified bytes, and /kvo/state equals the set the events describe.
// `kvo load` runs the synthetic workload and a trace against a real sim; bad flags and bad trace
// lines are named.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "events/events.h"
#include "http/http_server.h"
#include "sim/engine.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo {
namespace {

using Json = nlohmann::json;
using testing::ChildProcess;
using testing::RunCommand;
using testing::SteadyClock;

constexpr auto kGuard = std::chrono::seconds(30);
constexpr int kBlock = 4;

struct Sim {
  std::unique_ptr<ChildProcess> child;
  Json ready;
  HttpAddress http;
};

Sim StartSim(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {KVO_BINARY, "sim", "--port", "0", "--hash-seed", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Sim s;
  s.child = std::make_unique<ChildProcess>(argv);
  auto line = s.child->ReadStdoutLine(SteadyClock::now() + kGuard);
  if (!line) {
    s.child->Drain();
    ADD_FAILURE() << "kvo sim printed no ready line; stderr: " << s.child->err();
    return s;
  }
  s.ready = Json::parse(*line);
  EXPECT_EQ(s.ready["event"], "listening");
  s.http = {"127.0.0.1", s.ready["port"].get<int>()};
  return s;
}

Json Call(const Sim& s, const std::string& method, const std::string& path,
          const std::string& body = "", int want = 200) {
  auto r = HttpCall(s.http, method, path, body, 10000);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return Json();
  EXPECT_EQ(r->status, want) << path << ": " << r->body;
  return Json::parse(r->body, nullptr, false);
}

std::vector<int64_t> Tokens(int first, int n) {
  std::vector<int64_t> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

std::vector<uint64_t> Hashes(const std::vector<int64_t>& tokens) {
  BlockHashOptions o;
  o.algo = HashAlgo::kSha256;
  o.none_hash = NoneHash(HashAlgo::kSha256, "0");
  o.block_size = kBlock;
  auto h = HashBlocksWire(tokens, o);
  EXPECT_TRUE(h.ok());
  return h.ok() ? *h : std::vector<uint64_t>{};
}

Json Complete(const Sim& s, const std::vector<int64_t>& tokens) {
  Json body = {{"prompt_token_ids", tokens}, {"max_tokens", 3}};
  return Call(s, "POST", "/v1/completions", body.dump());
}

// What the events say each medium holds (reference-counted per hash, as the indexer folds them).
struct Fold {
  std::map<std::string, std::map<uint64_t, int>> held;
  std::vector<std::pair<std::string, uint64_t>> removed;  // (medium, hash)
  std::vector<BlockStored> gpu_stored;
  int cleared = 0;
  void Apply(const EventBatch& b) {
    for (const KvEvent& e : b.events) {
      if (auto* st = std::get_if<BlockStored>(&e)) {
        const std::string m = st->medium.value_or("GPU");
        for (const BlockHash& h : st->block_hashes) ++held[m][h.Low64()];
        if (m == "GPU") gpu_stored.push_back(*st);
      } else if (auto* rm = std::get_if<BlockRemoved>(&e)) {
        const std::string m = rm->medium.value_or("GPU");
        for (const BlockHash& h : rm->block_hashes) {
          removed.emplace_back(m, h.Low64());
          if (--held[m][h.Low64()] <= 0) held[m].erase(h.Low64());
        }
      } else {
        ++cleared;
        held["GPU"].clear();
      }
    }
  }
  std::set<std::string> Set(const std::string& m) const {
    std::set<std::string> out;
    if (auto it = held.find(m); it != held.end()) {
      for (const auto& [h, n] : it->second) out.insert(sim::HashHex(h));
    }
    return out;
  }
};

// Reads batches until the subscriber has everything up to the sim's state (bounded).
void CatchUp(Subscriber& sub, Fold& fold, uint64_t* next_seq, const Sim& s) {
  Json st = Call(s, "GET", "/kvo/state");  // flushes the publisher first
  (void)st;
  for (int idle = 0; idle < 3;) {
    auto b = sub.Next(std::chrono::milliseconds(300));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!b->has_value()) {
      ++idle;
      continue;
    }
    ASSERT_EQ((*b)->seq, *next_seq) << "events arrive in order without gaps";
    ++*next_seq;
    fold.Apply((*b)->batch);
  }
}

std::set<std::string> StateSet(const Json& state, const std::string& m) {
  std::set<std::string> out;
  for (const auto& h : state["blocks"][m]) out.insert(h.get<std::string>());
  return out;
}

TEST(SimCommandTest, EventsTiersAndVerifiedHitsOverHttpAndZmq) {
  testing::TempDir dir;
  Sim s = StartSim(
      {"--block-size",  "4",       "--gpu-blocks",      "8",    "--cpu-blocks", "12",
       "--disk-blocks", "64",      "--bytes-per-token", "256",  "--num-layers", "4",
       "--prefill-tps", "1000000", "--decode-tps",      "5000", "--workdir",    dir.path() + "/sim",
       "--instance-id", "sim-a"});
  ASSERT_TRUE(s.child && s.child->started() && s.http.port > 0);
  EXPECT_EQ(Call(s, "GET", "/health").is_object(), true);
  Json models = Call(s, "GET", "/v1/models");
  EXPECT_EQ(models["data"][0]["id"], "kvo-sim");
  Json sources = Call(s, "GET", "/kv_event_sources");
  ASSERT_EQ(sources["sources"].size(), 1u);
  SubscriberOptions so;
  so.endpoint = sources["sources"][0]["endpoint"];
  so.replay_endpoint = sources["sources"][0]["replay_endpoint"].get<std::string>();
  so.topic = sources["sources"][0]["topic"];
  so.start_seq = 0;
  auto sub = Subscriber::Create(so);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  Fold fold;
  uint64_t seq = 0;

  // A: 4 full blocks + 2 tokens. BlockStored GPU with vLLM's hashes and the block's tokens.
  const auto a = Tokens(1000, 4 * kBlock + 2);
  const auto ha = Hashes(a);
  Json ra = Complete(s, a);
  EXPECT_EQ(ra["usage"]["prompt_tokens"], a.size());
  EXPECT_EQ(ra["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ra["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(ra["kvo"]["instance_id"], "sim-a");
  EXPECT_EQ(ra["choices"][0]["text"].get<std::string>().empty(), false);
  CatchUp(**sub, fold, &seq, s);
  ASSERT_EQ(fold.gpu_stored.size(), 1u)
      << "batches " << seq << " notices " << (*sub)->TakeNotices().size();
  const BlockStored& st = fold.gpu_stored[0];
  ASSERT_EQ(st.block_hashes.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(st.block_hashes[i].Low64(), ha[i]);
  EXPECT_FALSE(st.parent_block_hash.has_value());
  EXPECT_EQ(st.token_ids, std::vector<int64_t>(a.begin(), a.begin() + 16));
  EXPECT_EQ(st.block_size, kBlock);
  EXPECT_EQ(fold.Set("CPU").size(), 4u) << "A's computed blocks offloaded to CPU";

  // A again: a GPU hit of 4 blocks (at most prompt_len - 1 tokens come from the cache).
  Json ra2 = Complete(s, a);
  EXPECT_EQ(ra2["kvo"]["hit_tokens"]["GPU"], 16);
  EXPECT_EQ(ra2["usage"]["prompt_tokens_details"]["cached_tokens"], 16);

  // B (8 blocks): the GPU cache (8 blocks) reuses A's blocks: BlockRemoved GPU for each.
  const auto b = Tokens(5000, 8 * kBlock + 1);
  Complete(s, b);
  CatchUp(**sub, fold, &seq, s);
  std::set<uint64_t> removed_gpu;
  for (const auto& [m, h] : fold.removed) {
    if (m == "GPU") removed_gpu.insert(h);
  }
  for (uint64_t h : ha) EXPECT_TRUE(removed_gpu.count(h)) << "A's block evicted from the GPU";

  // A once more: served from CPU, every byte checked.
  Json ra3 = Complete(s, a);
  EXPECT_EQ(ra3["kvo"]["hit_tokens"]["GPU"], 0);
  EXPECT_EQ(
      ra3["kvo"]["hit_tokens"]["CPU"].get<int>() + ra3["kvo"]["hit_tokens"]["DISK"].get<int>(), 16);
  EXPECT_EQ(ra3["kvo"]["hit_tokens"]["CPU"], 16) << ra3.dump();
  Json state = Call(s, "GET", "/kvo/state");
  EXPECT_GE(state["counters"]["blocks_verified"].get<int>(), 4);
  EXPECT_EQ(state["counters"]["mismatches"], 0);
  EXPECT_EQ(state["counters"]["bytes_loaded"]["CPU"], 4 * 4 * 256);

  // C, D, E (8 blocks each) push A and B out of the 12-block CPU tier; the file tier keeps them.
  for (int base : {20000, 30000, 40000}) Complete(s, Tokens(base, 8 * kBlock + 1));
  // The file tier writes in the background (as a real engine's does): ask for B once the tier
  // has announced B's first block stored, as a router would see it.
  const uint64_t b0 = Hashes(b).front();
  EXPECT_TRUE(testing::Eventually([&] {
    CatchUp(**sub, fold, &seq, s);
    auto it = fold.held.find("STORAGE");
    return it != fold.held.end() && it->second.count(b0) > 0;
  })) << "B's first block never reached the file tier";
  Json rb = Complete(s, b);  // B: not on GPU, not on CPU: from the file tier
  EXPECT_GT(rb["kvo"]["hit_tokens"]["DISK"].get<int>(), 0) << rb.dump();
  CatchUp(**sub, fold, &seq, s);
  state = Call(s, "GET", "/kvo/state");
  EXPECT_GT(state["counters"]["bytes_loaded"]["DISK"].get<int>(), 0);
  EXPECT_GT(state["counters"]["bytes_stored"]["DISK"].get<int>(), 0);
  EXPECT_EQ(state["counters"]["mismatches"], 0);
  EXPECT_FALSE(fold.Set("STORAGE").empty()) << "the file tier announces its blocks";

  // /kvo/state equals what the events describe, per medium, and the digest is of that set.
  EXPECT_EQ(StateSet(state, "GPU"), fold.Set("GPU"));
  EXPECT_EQ(StateSet(state, "CPU"), fold.Set("CPU"));
  EXPECT_EQ(StateSet(state, "DISK"), fold.Set("STORAGE"));
  std::vector<uint64_t> gpu;
  for (const auto& h : state["blocks"]["GPU"])
    gpu.push_back(std::stoull(h.get<std::string>(), nullptr, 16));
  EXPECT_EQ(state["digest"]["GPU"], sim::SetDigest(gpu));

  // Reset: AllBlocksCleared, the GPU set empty.
  Call(s, "POST", "/reset_prefix_cache", "{}");
  CatchUp(**sub, fold, &seq, s);
  EXPECT_EQ(fold.cleared, 1);
  state = Call(s, "GET", "/kvo/state");
  EXPECT_TRUE(state["blocks"]["GPU"].empty());

  // Metrics in Prometheus text.
  auto metrics = HttpCall(s.http, "GET", "/metrics", "", 5000);
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->body.find("vllm:num_requests_running"), std::string::npos);
  EXPECT_NE(metrics->body.find("kvo_sim_hit_tokens_total{engine=\"sim-a\",medium=\"CPU\"} 16"),
            std::string::npos)
      << metrics->body;

  s.child->Signal(SIGTERM);
  EXPECT_EQ(s.child->Wait(SteadyClock::now() + kGuard), 0) << s.child->err();
}

TEST(SimCommandTest, StreamingChatAndErrorsInOpenAIShape) {
  Sim s = StartSim({"--gpu-blocks", "64", "--bytes-per-token", "64", "--prefill-tps", "1000000",
                    "--decode-tps", "2000"});
  ASSERT_TRUE(s.child && s.http.port > 0);
  Json body = {{"model", "kvo-sim"},
               {"messages", {{{"role", "user"}, {"content", "Hello there, cache."}}}},
               {"max_tokens", 4},
               {"stream", true}};
  std::string got;
  auto r = HttpStreamCall(s.http, "POST", "/v1/chat/completions", body.dump(), 5000,
                          [&](std::string_view c) {
                            got += c;
                            return true;
                          });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  ASSERT_TRUE(got.ends_with("data: [DONE]\n\n")) << got;
  size_t events = 0;
  Json last;
  for (size_t p = 0; (p = got.find("data: ", p)) != std::string::npos; p += 6) {
    const size_t end = got.find("\n\n", p);
    const std::string data = got.substr(p + 6, end - p - 6);
    if (data != "[DONE]") last = Json::parse(data), ++events;
  }
  EXPECT_EQ(events, 5u) << "4 tokens, then the final chunk";
  EXPECT_EQ(last["object"], "chat.completion.chunk");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["usage"]["completion_tokens"], 4);
  EXPECT_TRUE(last["kvo"].contains("queue_ms"));

  Json e = Call(s, "POST", "/v1/completions", R"({"prompt":[1,-1]})", 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "prompt");
  e = Call(s, "POST", "/v1/completions", R"({"prompt":"x","model":"other"})", 404);
  EXPECT_EQ(e["error"]["param"], "model");
  Json big = {{"prompt_token_ids", std::vector<int>(65 * 16, 7)}};
  e = Call(s, "POST", "/v1/completions", big.dump(), 400);
  EXPECT_EQ(e["error"]["param"], "prompt") << "a prompt larger than the GPU cache";
  e = Call(s, "GET", "/v1/completions", "", 405);
  EXPECT_TRUE(e["error"].is_object());

  // Port in use: a second sim on the same port exits non-zero naming the port.
  const std::string port = std::to_string(s.http.port);
  auto dup = RunCommand({KVO_BINARY, "sim", "--port", port}, std::chrono::seconds(30));
  EXPECT_NE(dup.code, 0);
  EXPECT_NE(dup.err.find(port), std::string::npos) << dup.err;
}

TEST(SimCommandTest, BadFlagsAreNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  for (const Case& c :
       std::vector<Case>{{{"--bogus"}, "--bogus"},
                         {{"--gpu-blocks", "0"}, "--gpu-blocks"},
                         {{"--prefill-tps", "-1"}, "--prefill-tps"},
                         {{"--kv-transfer-config", "{"}, "--kv-transfer-config"},
                         {{"--kv-events-config", "{\"endpoint\": 5}"}, "--kv-events-config"},
                         {{"--hash-algo", "md5"}, "--hash-algo"},
                         {{"--hash-algo", "xxhash"}, "--hash-seed"}}) {
    std::vector<std::string> argv = {KVO_BINARY, "sim", "--port", "0"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = RunCommand(argv, std::chrono::seconds(30));
    EXPECT_NE(r.code, 0) << c.args[0];
    EXPECT_NE(r.err.find(c.names), std::string::npos) << c.args[0] << ": " << r.err;
  }
  auto r = RunCommand({KVO_BINARY, "load"}, std::chrono::seconds(30));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--target"), std::string::npos) << r.err;
  r = RunCommand({KVO_BINARY, "load", "--target", "http://127.0.0.1:1", "--speedup", "0"},
                 std::chrono::seconds(30));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--speedup"), std::string::npos) << r.err;
}

TEST(LoadCommandTest, SyntheticAndTraceAgainstARealSim) {
  testing::TempDir dir;
  Sim s = StartSim({"--gpu-blocks", "1024", "--bytes-per-token", "16", "--prefill-tps", "200000",
                    "--decode-tps", "2000", "--instance-id", "sim-load"});
  ASSERT_TRUE(s.child && s.http.port > 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(s.http.port);
  auto r = RunCommand({KVO_BINARY, "load", "--target", url, "--conversations", "3", "--turns", "3",
                       "--system-tokens", "256", "--turn-tokens", "64", "--output-tokens", "4",
                       "--speedup", "20", "--json", "--records", dir.path() + "/rec.jsonl"},
                      std::chrono::seconds(60));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["requests"], 9);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_GT(j["hit_tokens"]["GPU"].get<int>(), 0) << "turns share their conversation's prefix";
  EXPECT_GT(j["ttft_ms"]["p50"].get<double>(), 0);
  EXPECT_GE(j["e2e_ms"]["p50"].get<double>(), j["ttft_ms"]["p50"].get<double>());
  EXPECT_EQ(j["instances"]["sim-load"], 9);
  std::ifstream rec(dir.path() + "/rec.jsonl");
  int lines = 0;
  for (std::string l; std::getline(rec, l);) ++lines;
  EXPECT_EQ(lines, 9);

  // A trace: two requests sharing hash_id 7 (512 tokens), then a bad line.
  const std::string trace = dir.path() + "/t.jsonl";
  {
    std::ofstream t(trace);
    t << R"({"timestamp": 0, "input_length": 600, "output_length": 9, "hash_ids": [7, 8]})"
      << "\n"
      << R"({"timestamp": 50, "input_length": 700, "output_length": 9, "hash_ids": [7, 9]})"
      << "\n";
  }
  r = RunCommand({KVO_BINARY, "load", "--target", url, "--trace", trace, "--speedup", "10",
                  "--max-output-tokens", "2", "--no-stream", "--json"},
                 std::chrono::seconds(60));
  ASSERT_EQ(r.code, 0) << r.err;
  j = Json::parse(r.out);
  EXPECT_EQ(j["requests"], 2);
  EXPECT_EQ(j["prompt_tokens"], 1300);
  EXPECT_GE(j["hit_tokens"]["GPU"].get<int>(), 512) << "hash_id 7's tokens are the same";
  {
    std::ofstream t(trace, std::ios::app);
    t << R"({"timestamp": 60, "input_length": "x", "output_length": 9, "hash_ids": [1]})"
      << "\n";
  }
  r = RunCommand({KVO_BINARY, "load", "--target", url, "--trace", trace}, std::chrono::seconds(30));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(trace + ":3"), std::string::npos) << r.err;
  s.child->Signal(SIGINT);
  EXPECT_EQ(s.child->Wait(SteadyClock::now() + kGuard), 0) << s.child->err();
}

}  // namespace
}  // namespace kvo
