// `kvo load`: a load generator for OpenAI-compatible engines and routers (issue 13). Replays a
// Mooncake trace (timestamps scaled by --speedup; each hash_id a block of 512 deterministic tokens)
// or a built-in multi-turn workload, sends real HTTP requests (prompt_token_ids to
// /v1/completions), and measures TTFT (first streamed chunk) and end-to-end latency per request.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http/http_server.h"
#include "openai/openai.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int64_t kTraceBlockTokens = 512;  // Mooncake: one hash_id per 512 tokens

struct LoadArgs {
  std::string target;
  std::string trace;
  std::string workload = "synthetic";
  int conversations = 8;
  int turns = 4;
  int system_tokens = 1024;
  int turn_tokens = 256;
  int output_tokens = 16;  // synthetic; trace: --max-output-tokens caps the trace's lengths
  int max_output_tokens = 0;
  uint64_t seed = 1;
  double speedup = 1.0;
  int64_t max_requests = 0;
  int concurrency_limit = 64;
  bool stream = true;
  bool json_out = false;
  std::string records;
  bool progress = false;
  std::string model;
  int timeout_ms = 120000;
};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Token j of a block derived from `key`: ids 256..49999 (the tokenizer's word range).
uint32_t TokenOf(uint64_t key, uint64_t j) {
  return 256 + static_cast<uint32_t>(SplitMix64(key * 1000003ULL + j) % (50000 - 256));
}

struct Request {
  size_t index = 0;
  double at_s = 0;  // send time from the start, already scaled
  std::vector<uint32_t> tokens;
  int max_tokens = 16;
  int conversation = -1, turn = 0;  // synthetic: the next turn follows this one
};

struct Record {
  size_t index = 0;
  bool ok = false;
  int status = 0;
  std::string error;
  double sent_s = 0, ttft_ms = 0, e2e_ms = 0;
  size_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::map<std::string, uint64_t> hit_tokens;
  std::string instance;
};

// Reads a Mooncake JSONL trace: stops at the first bad line, naming file and line.
Result<std::vector<Request>> ReadTrace(const LoadArgs& a) {
  std::ifstream in(a.trace);
  if (!in) return Status::InvalidArgument("--trace: cannot open '" + a.trace + "'");
  std::vector<Request> out;
  std::string line;
  double first_ts = -1;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (a.max_requests > 0 && int64_t(out.size()) >= a.max_requests) break;
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(a.trace + ":" + std::to_string(lineno) + ": " + why);
    };
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    auto num = [&](const char* k) -> std::optional<double> {
      auto it = j.find(k);
      if (it == j.end() || !it->is_number() || it->get<double>() < 0) return std::nullopt;
      return it->get<double>();
    };
    auto ts = num("timestamp");
    auto input = num("input_length");
    auto output = num("output_length");
    if (!ts) return bad("'timestamp' must be a non-negative number (ms)");
    if (!input || *input < 1) return bad("'input_length' must be a positive number");
    if (!output) return bad("'output_length' must be a non-negative number");
    auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array() || ids->empty()) {
      return bad("'hash_ids' must be a non-empty array");
    }
    const auto len = static_cast<int64_t>(*input);
    if (len > kTraceBlockTokens * int64_t(ids->size())) {
      return bad("input_length " + std::to_string(len) + " is more than 512 tokens per hash_id (" +
                 std::to_string(ids->size()) + " ids)");
    }
    Request r;
    r.index = out.size();
    if (first_ts < 0) first_ts = *ts;
    r.at_s = (*ts - first_ts) / 1000.0 / a.speedup;
    r.tokens.reserve(size_t(len));
    for (size_t b = 0; b < ids->size() && int64_t(r.tokens.size()) < len; ++b) {
      if (!(*ids)[b].is_number_integer() || (*ids)[b].get<int64_t>() < 0) {
        return bad("hash_ids[" + std::to_string(b) + "] must be a non-negative integer");
      }
      const auto h = (*ids)[b].get<uint64_t>();
      for (int64_t t = 0; t < kTraceBlockTokens && int64_t(r.tokens.size()) < len; ++t) {
        r.tokens.push_back(TokenOf(h, uint64_t(t)));
      }
    }
    r.max_tokens = static_cast<int>(*output);
    if (a.max_output_tokens > 0) r.max_tokens = std::min(r.max_tokens, a.max_output_tokens);
    out.push_back(std::move(r));
  }
  if (out.empty()) return Status::InvalidArgument("--trace '" + a.trace + "': no requests");
  return out;
}

// The synthetic workload: conversations share a system prompt; turn t of conversation c is the
// system prompt, then t user turns and replies, then turn t's user text.
std::vector<uint32_t> SyntheticPrompt(const LoadArgs& a, int c, int t) {
  std::vector<uint32_t> tokens;
  for (int i = 0; i < a.system_tokens; ++i) tokens.push_back(TokenOf(a.seed, uint64_t(i)));
  for (int turn = 0; turn <= t; ++turn) {
    const uint64_t key = SplitMix64(a.seed ^ (uint64_t(c + 1) << 32) ^ uint64_t(turn + 1));
    for (int i = 0; i < a.turn_tokens; ++i) tokens.push_back(TokenOf(key, uint64_t(i)));
    if (turn < t) {  // the reply the client keeps in its history
      for (int i = 0; i < a.output_tokens; ++i) tokens.push_back(TokenOf(key + 1, uint64_t(i)));
    }
  }
  return tokens;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(rank);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

Record Send(const HttpAddress& target, const LoadArgs& a, const Request& r, Clock::time_point t0) {
  Record rec;
  rec.index = r.index;
  rec.prompt_tokens = r.tokens.size();
  json body = {{"prompt_token_ids", r.tokens}, {"max_tokens", r.max_tokens}, {"stream", a.stream}};
  if (!a.model.empty()) body["model"] = a.model;
  const auto start = Clock::now();
  rec.sent_s = std::chrono::duration<double>(start - t0).count();
  auto ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  json last;
  std::string whole;
  openai::SseReader sse;
  bool first = true;
  Status parse_error;
  auto result = HttpStreamCall(target, "POST", "/v1/completions", body.dump(), a.timeout_ms,
                               [&](std::string_view chunk) {
                                 if (!a.stream) {
                                   whole += chunk;
                                   return true;
                                 }
                                 if (whole.size() < 4096) whole += chunk;  // for error messages
                                 Status s = sse.Feed(chunk, [&](std::string_view data) {
                                   if (first) {
                                     rec.ttft_ms = ms();
                                     first = false;
                                   }
                                   if (data == "[DONE]") return;
                                   json j = json::parse(data, nullptr, false);
                                   if (!j.is_discarded()) last = std::move(j);
                                 });
                                 if (!s.ok()) parse_error = s;
                                 return s.ok();
                               });
  rec.e2e_ms = ms();
  if (!result.ok()) {
    rec.error = parse_error.ok() ? result.status().ToString() : parse_error.ToString();
    return rec;
  }
  rec.status = result->status;
  if (!a.stream) {
    rec.ttft_ms = rec.e2e_ms;
    last = json::parse(whole, nullptr, false);
  }
  if (rec.status != 200) {
    rec.error = "HTTP " + std::to_string(rec.status) + ": " + whole.substr(0, 300);
    return rec;
  }
  if (last.is_discarded() || !last.is_object()) {
    rec.error = "no JSON in the answer";
    return rec;
  }
  if (last.contains("error")) {
    rec.error = last["error"].dump().substr(0, 300);
    return rec;
  }
  rec.ok = true;
  if (auto u = last.find("usage"); u != last.end() && u->is_object()) {
    rec.completion_tokens = u->value("completion_tokens", 0u);
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      rec.cached_tokens = d->value("cached_tokens", 0u);
    }
  }
  if (auto k = last.find("kvo"); k != last.end() && k->is_object()) {
    rec.instance = k->value("instance_id", "");
    if (auto h = k->find("hit_tokens"); h != k->end() && h->is_object()) {
      for (auto& [m, v] : h->items()) {
        if (v.is_number_unsigned()) rec.hit_tokens[m] = v.get<uint64_t>();
      }
    }
  }
  return rec;
}

// Exit status 1 when a request failed.
ExitCode RunLoad(const LoadArgs& a) {
  if (a.target.empty())
    return Status::InvalidArgument("--target is required (e.g. http://127.0.0.1:8000)");
  KVO_ASSIGN_OR_RETURN(HttpAddress target, ParseHttpUrl(a.target));
  if (!(a.speedup > 0)) return Status::InvalidArgument("--speedup must be positive");
  if (a.concurrency_limit < 1)
    return Status::InvalidArgument("--concurrency-limit must be positive");
  std::vector<Request> initial;
  const bool synthetic = a.trace.empty();
  if (!synthetic && a.workload != "synthetic" && a.workload != "trace") {
    return Status::InvalidArgument("--workload must be 'synthetic' (or give --trace)");
  }
  if (synthetic) {
    if (a.workload != "synthetic") {
      return Status::InvalidArgument("--workload '" + a.workload +
                                     "': only 'synthetic' is built in");
    }
    if (a.conversations < 1 || a.turns < 1) {
      return Status::InvalidArgument("--conversations and --turns must be positive");
    }
    for (int c = 0; c < a.conversations; ++c) {
      Request r;
      r.at_s = 0.25 * c / a.speedup;
      r.tokens = SyntheticPrompt(a, c, 0);
      r.max_tokens = a.output_tokens;
      r.conversation = c;
      initial.push_back(std::move(r));
    }
  } else {
    KVO_ASSIGN_OR_RETURN(initial, ReadTrace(a));
  }
  int64_t total = synthetic ? int64_t(a.conversations) * a.turns : int64_t(initial.size());
  if (a.max_requests > 0) total = std::min(total, a.max_requests);

  // Workers take requests whose time has come; the synthetic workload's next turn is queued when
  // its previous turn ends.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Request> queue(initial.begin(), initial.end());
  std::vector<Record> records;
  size_t issued = 0;
  int64_t done = 0;
  const auto t0 = Clock::now();
  const bool show_progress = a.progress || ::isatty(2);
  auto progress = [&](bool final_line) {
    if (!show_progress) return;
    const int width = 30;
    const int filled = total > 0 ? int(width * done / total) : width;
    size_t errors = 0;
    for (const Record& r : records) errors += r.ok ? 0 : 1;
    std::fprintf(stderr, "\r[%s%s] %lld/%lld requests, %zu errors, %.1f s",
                 std::string(size_t(filled), '#').c_str(),
                 std::string(size_t(width - filled), '-').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total), errors,
                 std::chrono::duration<double>(Clock::now() - t0).count());
    if (final_line) std::fputc('\n', stderr);
  };
  auto worker = [&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (done >= total || (queue.empty() && int64_t(issued) >= total)) return;
      if (queue.empty()) {
        cv.wait(lock);
        continue;
      }
      // The earliest request.
      auto it =
          std::min_element(queue.begin(), queue.end(),
                           [](const Request& x, const Request& y) { return x.at_s < y.at_s; });
      const auto when =
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(it->at_s));
      if (Clock::now() < when) {
        cv.wait_until(lock, when);
        continue;
      }
      if (int64_t(issued) >= total) {
        queue.clear();
        continue;
      }
      Request r = std::move(*it);
      queue.erase(it);
      r.index = issued++;
      lock.unlock();
      Record rec = Send(target, a, r, t0);
      lock.lock();
      records.push_back(std::move(rec));
      ++done;
      if (r.conversation >= 0 && r.turn + 1 < a.turns) {
        Request next;
        next.at_s = std::chrono::duration<double>(Clock::now() - t0).count();
        next.conversation = r.conversation;
        next.turn = r.turn + 1;
        next.tokens = SyntheticPrompt(a, r.conversation, next.turn);
        next.max_tokens = a.output_tokens;
        queue.push_back(std::move(next));
      }
      progress(false);
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < a.concurrency_limit; ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  progress(true);
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  std::sort(records.begin(), records.end(),
            [](const Record& x, const Record& y) { return x.index < y.index; });
  std::vector<double> ttft, e2e;
  uint64_t prompt = 0, completion = 0, cached = 0, errors = 0;
  std::map<std::string, uint64_t> hits = {{"GPU", 0}, {"CPU", 0}, {"DISK", 0}};
  std::map<std::string, uint64_t> per_instance;
  std::string first_error;
  for (const Record& r : records) {
    if (!r.ok) {
      ++errors;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    prompt += r.prompt_tokens;
    completion += r.completion_tokens;
    cached += r.cached_tokens;
    for (const auto& [m, v] : r.hit_tokens) hits[m] += v;
    if (!r.instance.empty()) ++per_instance[r.instance];
  }
  auto dist = [](const std::vector<double>& v) {
    return ojson{
        {"p50", Percentile(v, 50)},
        {"p90", Percentile(v, 90)},
        {"p99", Percentile(v, 99)},
        {"mean", v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size())}};
  };
  uint64_t hit_total = 0;
  for (const auto& [m, v] : hits) hit_total += v;
  ojson summary = {{"target", a.target},
                   {"workload", synthetic ? "synthetic" : a.trace},
                   {"requests", records.size()},
                   {"errors", errors},
                   {"prompt_tokens", prompt},
                   {"completion_tokens", completion},
                   {"cached_tokens", cached},
                   {"hit_tokens", hits},
                   {"hit_rate", prompt ? double(hit_total) / double(prompt) : 0.0},
                   {"ttft_ms", dist(ttft)},
                   {"e2e_ms", dist(e2e)},
                   {"wall_s", wall_s},
                   {"instances", per_instance}};
  if (!first_error.empty()) summary["first_error"] = first_error;
  if (!a.records.empty()) {
    std::ofstream out(a.records);
    if (!out) return Status::IOError("--records: cannot write '" + a.records + "'");
    for (const Record& r : records) {
      ojson j = {{"index", r.index},
                 {"ok", r.ok},
                 {"status", r.status},
                 {"sent_s", r.sent_s},
                 {"ttft_ms", r.ttft_ms},
                 {"e2e_ms", r.e2e_ms},
                 {"prompt_tokens", r.prompt_tokens},
                 {"completion_tokens", r.completion_tokens},
                 {"cached_tokens", r.cached_tokens},
                 {"hit_tokens", r.hit_tokens},
                 {"instance", r.instance}};
      if (!r.ok) j["error"] = r.error;
      out << j.dump() << "\n";
    }
  }
  if (a.json_out) {
    std::printf("%s\n", summary.dump().c_str());
  } else {
    std::printf("%zu requests (%llu errors) in %.2f s against %s\n", records.size(),
                static_cast<unsigned long long>(errors), wall_s, a.target.c_str());
    std::printf("prompt tokens %llu, hit %llu (%.1f%%: GPU %llu, CPU %llu, DISK %llu)\n",
                static_cast<unsigned long long>(prompt), static_cast<unsigned long long>(hit_total),
                prompt ? 100.0 * double(hit_total) / double(prompt) : 0.0,
                static_cast<unsigned long long>(hits["GPU"]),
                static_cast<unsigned long long>(hits["CPU"]),
                static_cast<unsigned long long>(hits["DISK"]));
    std::printf("TTFT ms p50 %.1f p90 %.1f p99 %.1f; end-to-end ms p50 %.1f p90 %.1f p99 %.1f\n",
                Percentile(ttft, 50), Percentile(ttft, 90), Percentile(ttft, 99),
                Percentile(e2e, 50), Percentile(e2e, 90), Percentile(e2e, 99));
    if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
  }
  std::fflush(stdout);
  if (errors > 0) {
    // On stderr too: a supervisor (kvo demo) quotes a failed child's log, not its JSON.
    std::fprintf(stderr, "kvo load: %llu of %zu requests failed; first: %s\n",
                 static_cast<unsigned long long>(errors), records.size(),
                 first_error.substr(0, 400).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

void AddLoadCommand(CLI::App& app, CommandTable& commands) {
  auto a = std::make_shared<LoadArgs>();
  CLI::App* load = app.add_subcommand(
      "load",
      "Load generator: replay a Mooncake trace or a synthetic multi-turn workload against an "
      "OpenAI-compatible URL (kvo sim, kvo route, vLLM); TTFT and end-to-end latency");
  load->add_option("--target", a->target, "base URL, e.g. http://127.0.0.1:8000")->required();
  load->add_option("--trace", a->trace,
                   "Mooncake JSONL trace (timestamp, input_length, "
                   "output_length, hash_ids; 512 tokens per hash_id)");
  load->add_option("--workload", a->workload, "built-in workload: synthetic")
      ->capture_default_str();
  load->add_option("--conversations", a->conversations, "synthetic: conversations")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  load->add_option("--turns", a->turns, "synthetic: turns per conversation")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  load->add_option("--system-tokens", a->system_tokens, "synthetic: shared system prompt tokens")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  load->add_option("--turn-tokens", a->turn_tokens, "synthetic: user tokens per turn")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  load->add_option("--output-tokens", a->output_tokens, "synthetic: tokens generated per turn")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  load->add_option("--max-output-tokens", a->max_output_tokens,
                   "trace: cap on each request's output_length (0: as the trace)")
      ->check(CLI::Range(0, 1 << 20));
  load->add_option("--seed", a->seed, "synthetic: token seed")->capture_default_str();
  load->add_option("--speedup", a->speedup, "arrival times divided by this")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  load->add_option("--max-requests", a->max_requests, "stop after this many requests (0: all)")
      ->check(CLI::NonNegativeNumber);
  load->add_option("--concurrency-limit", a->concurrency_limit, "requests in flight at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  load->add_flag("--stream,!--no-stream", a->stream, "stream answers (TTFT = first chunk)")
      ->capture_default_str();
  load->add_flag("--json", a->json_out, "print the summary as one JSON object");
  load->add_option("--records", a->records, "write one JSON line per request to this file");
  load->add_flag("--progress", a->progress, "progress bar on stderr even when not a TTY");
  load->add_option("--model", a->model, "model field of each request (default: none)");
  load->add_option("--timeout-ms", a->timeout_ms, "connect and per-read timeout")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  commands.Add(load, [a] { return RunLoad(*a); });
}

}  // namespace kvo::cli
