// kvo demo's orchestration: processes, workload, quiescence, consistency check, figures.
#include "demo/demo.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/json.h"
#include "events/block_id.h"
#include "http/http_server.h"
#include "indexer/instance_blocks.h"
#include "supervisor/supervisor.h"

namespace kvo::demo {
namespace {

using Json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

void Progress(const DemoOptions& o, const std::string& line) {
  if (o.progress == nullptr) return;
  std::fprintf(o.progress, "kvo demo: %s\n", line.c_str());
  std::fflush(o.progress);
}

// A number at a path of keys; 0 when absent or not a number.
double Num(const Json& j, std::initializer_list<const char*> path) {
  const Json* cur = &j;
  for (const char* k : path) {
    if (!cur->is_object()) return 0;
    auto it = cur->find(k);
    if (it == cur->end()) return 0;
    cur = &*it;
  }
  return cur->is_number() ? cur->get<double>() : 0;
}
int64_t Int(const Json& j, std::initializer_list<const char*> path) {
  return static_cast<int64_t>(std::llround(Num(j, path)));
}

// The first of several spellings that is present.
int64_t IntAny(const Json& j, std::initializer_list<std::initializer_list<const char*>> paths) {
  for (auto p : paths) {
    const Json* cur = &j;
    bool found = true;
    for (const char* k : p) {
      if (!cur->is_object() || !cur->contains(k)) {
        found = false;
        break;
      }
      cur = &(*cur)[k];
    }
    if (found && cur->is_number()) return static_cast<int64_t>(std::llround(cur->get<double>()));
  }
  return 0;
}

// A server: its name and base URL ("http://127.0.0.1:PORT").
struct Server {
  std::string name;
  std::string url;
  HttpAddress address;
};

Result<Server> ServerFromListening(const std::string& name, const std::string& line) {
  KVO_ASSIGN_OR_RETURN(Json j, ParseJson(line, name + "'s listening line"));
  int64_t port = Int(j, {"port"});
  std::string url = j.contains("http") && j["http"].is_string() ? j["http"].get<std::string>() : "";
  if (url.empty() && port > 0) url = "http://127.0.0.1:" + std::to_string(port);
  if (url.rfind("http://", 0) != 0) {
    return Status::Internal(name + "'s listening line has no \"http\" URL: " + CutForMessage(line));
  }
  std::string host_port = url.substr(7);
  if (size_t slash = host_port.find('/'); slash != std::string::npos) host_port.resize(slash);
  KVO_ASSIGN_OR_RETURN(HttpAddress a, ParseHttpUrl(url));
  return Server{name, "http://" + host_port, a};
}

Result<Json> GetJson(const Server& s, const std::string& path, int timeout_ms = 10000) {
  KVO_ASSIGN_OR_RETURN(HttpClientResult r, HttpCall(s.address, "GET", path, "", timeout_ms));
  if (r.status != 200) {
    return Status::Unavailable("GET " + s.url + path + " (" + s.name + ") answered " +
                               std::to_string(r.status) + ": " + CutForMessage(r.body, 300));
  }
  return ParseJson(r.body, "GET " + s.url + path);
}

Result<std::string> GetText(const Server& s, const std::string& path) {
  KVO_ASSIGN_OR_RETURN(HttpClientResult r, HttpCall(s.address, "GET", path, "", 10000));
  if (r.status != 200) {
    return Status::Unavailable("GET " + s.url + path + " answered " + std::to_string(r.status));
  }
  return r.body;
}

// A block hash as the engines and the indexer write it: hex (with or without 0x) or a number.
std::optional<uint64_t> ParseHash(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return static_cast<uint64_t>(v.get<int64_t>());
  if (!v.is_string()) return std::nullopt;
  std::string s = v.get<std::string>();
  if (s.rfind("0x", 0) == 0) s = s.substr(2);
  if (s.empty()) return std::nullopt;
  // An odd digit count reads as if it had a leading 0. A longer digest (raw-bytes hash) counts by
  // its low 64 bits, as the indexer does.
  if (s.size() % 2 != 0) s.insert(0, 1, '0');
  Result<BlockDigest> digest = BlockDigest::FromHex(s);
  if (!digest.ok()) return std::nullopt;
  return digest->Low64();
}

std::string MediumKey(std::string m) {
  std::transform(m.begin(), m.end(), m.begin(), ::toupper);
  if (m == "STORAGE" || m == "FILE" || m == "FS") return "DISK";
  return m;
}

using BlockSets = std::map<std::string, std::set<uint64_t>>;  // medium -> hashes

Result<BlockSets> ReadBlocks(const Json& j, const std::string& what) {
  BlockSets out = {{"GPU", {}}, {"CPU", {}}, {"DISK", {}}};
  if (!j.contains("blocks") || !j["blocks"].is_object()) {
    return Status::Internal(what + " has no \"blocks\" object");
  }
  for (const auto& [medium, list] : j["blocks"].items()) {
    if (!list.is_array()) return Status::Internal(what + ": blocks." + medium + " is not a list");
    auto& set = out[MediumKey(medium)];
    for (const Json& h : list) {
      auto v = ParseHash(h);
      if (!v) return Status::Internal(what + ": blocks." + medium + " holds " + DescribeJson(h));
      set.insert(*v);
    }
  }
  return out;
}

// Prometheus text: the sum of every sample of a metric family (any labels).
double SumMetric(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    try {
      sum += std::stod(line.substr(sp + 1));
    } catch (...) {
    }
  }
  return sum;
}

std::string EventsConfig(const std::string& dir) {
  Json c = {{"enable_kv_cache_events", true},
            {"publisher", "zmq"},
            {"endpoint", "tcp://127.0.0.1:0"},
            {"replay_endpoint", "tcp://127.0.0.1:0"},
            {"topic", "kv-events"},
            {"journal_dir", dir + "/journal"}};
  return c.dump();
}

class Run {
 public:
  Run(const DemoOptions& o, std::string policy, std::string dir)
      : o_(o), policy_(std::move(policy)), dir_(std::move(dir)) {}

  Result<PolicyRun> Go() {
    const auto t0 = SteadyClock::now();
    std::error_code ec;
    std::filesystem::create_directories(dir_ + "/logs", ec);
    if (ec) return Status::IOError("cannot create " + dir_ + "/logs: " + ec.message());
    SupervisorOptions so;
    so.log_dir = dir_ + "/logs";
    KVO_ASSIGN_OR_RETURN(sup_, Supervisor::Create(so));
    Result<PolicyRun> r = Drive();
    sup_->StopAll();
    if (r.ok()) r->wall_s = Seconds(SteadyClock::now() - t0);
    return r;
  }

 private:
  std::string Tag() const { return "[" + policy_ + "] "; }

  Result<Server> StartServer(const std::string& name, std::vector<std::string> argv) {
    argv.insert(argv.begin(), o_.kvo_binary);
    KVO_RETURN_IF_ERROR(sup_->Start(ChildSpec{name, argv, {}, ChildRole::kServer}));
    return Server{name, "", {}};
  }

  Result<Server> AwaitServer(const std::string& name) {
    KVO_ASSIGN_OR_RETURN(std::string line, sup_->WaitListening(name, o_.start_timeout));
    KVO_ASSIGN_OR_RETURN(Server s, ServerFromListening(name, line));
    Progress(o_, Tag() + name + " (pid " + std::to_string(sup_->Pid(name)) + ") listening on " +
                     s.url + " (log " + sup_->LogPath(name) + ")");
    return s;
  }

  Result<PolicyRun> Drive() {
    PolicyRun run;
    run.policy = policy_;
    run.dir = dir_;
    // 1. The indexer, and the engines (started together: they do not depend on each other).
    KVO_RETURN_IF_ERROR(StartServer("indexer", {"index", "serve", "--db", dir_ + "/index.sqlite",
                                                "--http", "127.0.0.1:0"})
                            .status());
    for (int i = 0; i < o_.instances; ++i) {
      const std::string id = "sim-" + std::to_string(i);
      const std::string sdir = dir_ + "/" + id;
      std::filesystem::create_directories(sdir);
      std::vector<std::string> argv = {"sim",
                                       "--port",
                                       "0",
                                       "--instance-id",
                                       id,
                                       "--workdir",
                                       sdir,
                                       "--kv-events-config",
                                       EventsConfig(sdir),
                                       "--seed",
                                       std::to_string(o_.seed + static_cast<uint64_t>(i))};
      if (o_.gpu_blocks > 0)
        argv.insert(argv.end(), {"--gpu-blocks", std::to_string(o_.gpu_blocks)});
      if (o_.cpu_blocks > 0)
        argv.insert(argv.end(), {"--cpu-blocks", std::to_string(o_.cpu_blocks)});
      argv.insert(argv.end(), o_.sim_args.begin(), o_.sim_args.end());
      KVO_RETURN_IF_ERROR(StartServer(id, argv).status());
    }
    KVO_ASSIGN_OR_RETURN(indexer_, AwaitServer("indexer"));
    for (int i = 0; i < o_.instances; ++i) {
      KVO_ASSIGN_OR_RETURN(Server s, AwaitServer("sim-" + std::to_string(i)));
      sims_.push_back(s);
    }
    // 2. The router: registers every engine with the indexer (their event sources).
    std::vector<std::string> rargv = {"route",     "--port",     "0",
                                      "--indexer", indexer_.url, "--policy",
                                      policy_,     "--seed",     std::to_string(o_.seed)};
    for (const Server& s : sims_) {
      rargv.push_back("--engine");
      rargv.push_back(s.url);
    }
    if (o_.load_penalty >= 0) {
      std::ostringstream lp;
      lp << o_.load_penalty;
      rargv.insert(rargv.end(), {"--load-penalty", lp.str()});
    }
    rargv.insert(rargv.end(), o_.route_args.begin(), o_.route_args.end());
    KVO_RETURN_IF_ERROR(StartServer("router", rargv).status());
    KVO_ASSIGN_OR_RETURN(router_, AwaitServer("router"));
    KVO_RETURN_IF_ERROR(WaitSourcesConnected());

    // 3. The workload through the router.
    const std::string records = dir_ + "/records.jsonl";
    std::vector<std::string> largv = {o_.kvo_binary, "load",      "--target", router_.url,
                                      "--json",      "--records", records};
    if (!o_.trace.empty()) {
      largv.insert(largv.end(), {"--trace", o_.trace});
    } else {
      largv.insert(largv.end(), {"--workload", "synthetic", "--seed", std::to_string(o_.seed)});
      if (o_.conversations > 0) {
        largv.insert(largv.end(), {"--conversations", std::to_string(o_.conversations)});
      }
      if (o_.turns > 0) largv.insert(largv.end(), {"--turns", std::to_string(o_.turns)});
    }
    if (o_.max_requests > 0) {
      largv.insert(largv.end(), {"--max-requests", std::to_string(o_.max_requests)});
    }
    if (o_.speedup > 0) {
      std::ostringstream sp;
      sp << o_.speedup;
      largv.insert(largv.end(), {"--speedup", sp.str()});
    }
    largv.insert(largv.end(), o_.load_args.begin(), o_.load_args.end());
    KVO_RETURN_IF_ERROR(sup_->Start(ChildSpec{"load", largv, {}, ChildRole::kTask}));
    Progress(o_, Tag() + "load (pid " + std::to_string(sup_->Pid("load")) +
                     ") running: kvo load --target " + router_.url + " (log " +
                     sup_->LogPath("load") + ")");
    KVO_ASSIGN_OR_RETURN(ChildExit le, sup_->WaitExit("load", o_.load_timeout));
    if (!le.ok()) {
      return Status::Unavailable("kvo load (" + policy_ + ") failed: " + le.Describe() +
                                 "; last lines of " + sup_->LogPath("load") + ":\n" +
                                 sup_->LogTail("load", 12));
    }
    KVO_ASSIGN_OR_RETURN(std::string out, sup_->Stdout("load"));
    KVO_RETURN_IF_ERROR(ReadLoad(out, records, &run));
    Progress(o_, Tag() + "load done: " + std::to_string(run.requests) + " requests, " +
                     std::to_string(run.errors) + " errors");

    // 4. Quiesce, then the verdict and the figures.
    KVO_RETURN_IF_ERROR(WaitEnginesIdle());
    KVO_RETURN_IF_ERROR(CheckConsistency(&run));
    KVO_RETURN_IF_ERROR(ReadFigures(&run));
    return run;
  }

  // Every engine's event source registered with the indexer by the router (the indexer replays
  // each publisher's journal from sequence 0, so nothing published before is missed).
  Status WaitSourcesConnected() {
    const auto deadline = SteadyClock::now() + o_.start_timeout;
    for (;;) {
      KVO_RETURN_IF_ERROR(sup_->Check());
      KVO_ASSIGN_OR_RETURN(Json src, GetJson(indexer_, "/v1/sources"));
      size_t connected = src.value("sources", Json::array()).size();
      if (connected >= sims_.size()) return Status::Ok();
      if (SteadyClock::now() >= deadline) {
        return Status::Unavailable("the indexer follows " + std::to_string(connected) + " of " +
                                   std::to_string(sims_.size()) +
                                   " engines' event sources after the router started (it "
                                   "registers them): " +
                                   CutForMessage(src.dump(), 400));
      }
      std::this_thread::sleep_for(milliseconds(20));  // bounded poll of another process
    }
  }

  Status ReadLoad(const std::string& out, const std::string& records, PolicyRun* run) {
    // The last line that is a JSON object is the summary.
    std::istringstream in(out);
    Json summary;
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] != '{') continue;
      auto j = ParseJson(line, "kvo load's summary");
      if (j.ok()) summary = std::move(*j);
    }
    if (!summary.is_object()) {
      return Status::Internal("kvo load printed no JSON summary (stdout " +
                              sup_->StdoutPath("load") + ")");
    }
    run->load_summary = summary;
    run->requests = Int(summary, {"requests"});
    run->errors = Int(summary, {"errors"});
    run->load_wall_s = Num(summary, {"wall_s"});
    run->ttft_ms = {Num(summary, {"ttft_ms", "p50"}), Num(summary, {"ttft_ms", "p90"}),
                    Num(summary, {"ttft_ms", "p99"})};
    run->e2e_ms = {Num(summary, {"e2e_ms", "p50"}), Num(summary, {"e2e_ms", "p90"}),
                   Num(summary, {"e2e_ms", "p99"})};
    std::ifstream rf(records);
    for (std::string line; std::getline(rf, line);) {
      auto j = ParseJson(line, "a kvo load record");
      if (!j.ok() || !j->is_object()) continue;
      if (j->value("ok", true) != true) continue;  // a failed request has no TTFT
      const double t = Num(*j, {"ttft_ms"});
      if (t > 0) run->ttft_samples.push_back(t);
    }
    return Status::Ok();
  }

  Status WaitEnginesIdle() {
    const auto deadline = SteadyClock::now() + o_.quiesce_timeout;
    for (;;) {
      KVO_RETURN_IF_ERROR(sup_->Check());
      bool idle = true;
      for (const Server& s : sims_) {
        KVO_ASSIGN_OR_RETURN(Json st, GetJson(s, "/kvo/state"));
        if (Int(st, {"counters", "running"}) != 0 || Int(st, {"counters", "waiting"}) != 0) {
          idle = false;
        }
      }
      if (idle) return Status::Ok();
      if (SteadyClock::now() >= deadline) {
        return Status::Unavailable("engines still busy " +
                                   std::to_string(o_.quiesce_timeout.count()) +
                                   " ms after the load ended");
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  // Engine state, index view, engine state again: consistent when the engine did not change
  // in between and the index equals it, for every instance and medium. Asynchronous work (the
  // file tier's cascade writes, events in flight) settles within the quiesce timeout.
  Status CheckConsistency(PolicyRun* run) {
    const auto deadline = SteadyClock::now() + o_.quiesce_timeout;
    for (int round = 0;; ++round) {
      KVO_RETURN_IF_ERROR(sup_->Check());
      std::vector<MediumCheck> checks;
      bool stable = true;
      std::string diff;
      run->engine_counters.clear();
      for (const Server& s : sims_) {
        KVO_ASSIGN_OR_RETURN(Json before, GetJson(s, "/kvo/state"));
        const std::string id = before.value("instance_id", s.name);
        KVO_ASSIGN_OR_RETURN(Json view, GetJson(indexer_, "/v1/instances/" + id + "/blocks"));
        KVO_ASSIGN_OR_RETURN(Json after, GetJson(s, "/kvo/state"));
        KVO_ASSIGN_OR_RETURN(BlockSets eng, ReadBlocks(before, s.name + "'s /kvo/state"));
        KVO_ASSIGN_OR_RETURN(BlockSets eng2, ReadBlocks(after, s.name + "'s /kvo/state"));
        KVO_ASSIGN_OR_RETURN(BlockSets idx, ReadBlocks(view, "the indexer's view of " + id));
        if (eng != eng2) stable = false;
        run->engine_counters.push_back(after.value("counters", Json::object()));
        std::set<std::string> media;
        for (auto& [m, _] : eng) media.insert(m);
        for (auto& [m, _] : idx) media.insert(m);
        for (const std::string& m : media) {
          const auto& a = eng[m];
          const auto& b = idx[m];
          MediumCheck c;
          c.instance = id;
          c.medium = m;
          c.engine_blocks = a.size();
          c.index_blocks = b.size();
          for (uint64_t h : a) c.only_engine += b.count(h) == 0 ? 1 : 0;
          for (uint64_t h : b) c.only_index += a.count(h) == 0 ? 1 : 0;
          c.engine_digest = BlockSetDigest({a.begin(), a.end()});
          c.index_digest = BlockSetDigest({b.begin(), b.end()});
          if (!c.equal()) {
            diff += (diff.empty() ? "" : "; ") + id + " " + m + ": " +
                    std::to_string(c.only_engine) + " blocks only in the engine, " +
                    std::to_string(c.only_index) + " only in the index";
          }
          checks.push_back(std::move(c));
        }
      }
      const bool equal = diff.empty();
      if ((equal && stable) || SteadyClock::now() >= deadline) {
        run->checks = std::move(checks);
        run->consistent = equal && stable;
        run->inconsistency = equal ? (stable ? "" : "the engines' state kept changing") : diff;
        Progress(o_, Tag() + (run->consistent ? "consistent: the index equals every engine "
                                                "(after " +
                                                    std::to_string(round + 1) + " look(s))"
                                              : "NOT consistent: " + run->inconsistency));
        return Status::Ok();
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
  }

  Status ReadFigures(PolicyRun* run) {
    for (const Json& c : run->engine_counters) {
      run->engine_requests += Int(c, {"requests"});
      run->prompt_tokens += Int(c, {"prompt_tokens"});
      run->prefill_computed += Int(c, {"prefill_tokens_computed"});
      run->hit_tokens.gpu += Int(c, {"hit_tokens", "GPU"});
      run->hit_tokens.cpu += Int(c, {"hit_tokens", "CPU"});
      run->hit_tokens.disk += IntAny(c, {{"hit_tokens", "DISK"}, {"hit_tokens", "STORAGE"}});
      run->bytes_loaded.cpu += Int(c, {"bytes_loaded", "CPU"});
      run->bytes_loaded.disk += IntAny(c, {{"bytes_loaded", "DISK"}, {"bytes_loaded", "STORAGE"}});
      run->bytes_stored.cpu += Int(c, {"bytes_stored", "CPU"});
      run->bytes_stored.disk += IntAny(c, {{"bytes_stored", "DISK"}, {"bytes_stored", "STORAGE"}});
      run->load_seconds += Num(c, {"load_seconds"});
      run->store_seconds += Num(c, {"store_seconds"});
      run->blocks_verified += Int(c, {"blocks_verified"});
      run->mismatches += Int(c, {"mismatches"});
      run->events_published += Int(c, {"events_published"});
    }
    KVO_ASSIGN_OR_RETURN(std::string metrics, GetText(indexer_, "/metrics"));
    run->events_indexed =
        static_cast<int64_t>(SumMetric(metrics, "kvo_indexer_block_events_applied_total"));
    run->batches_indexed =
        static_cast<int64_t>(SumMetric(metrics, "kvo_indexer_batches_applied_total"));
    auto stats = GetJson(router_, "/route/stats");
    if (stats.ok()) {
      run->router_stats = *stats;
      run->predicted_hit_tokens = IntAny(*stats, {{"predicted_hit_tokens"},
                                                  {"totals", "predicted_hit_tokens"},
                                                  {"hit_tokens", "predicted"},
                                                  {"predicted", "hit_tokens"}});
      run->delivered_hit_tokens = IntAny(*stats, {{"delivered_hit_tokens"},
                                                  {"totals", "delivered_hit_tokens"},
                                                  {"hit_tokens", "delivered"},
                                                  {"delivered", "hit_tokens"}});
    } else {
      Progress(o_, Tag() + "router stats unavailable: " + stats.status().ToString());
    }
    return Status::Ok();
  }

  const DemoOptions& o_;
  std::string policy_;
  std::string dir_;
  std::unique_ptr<Supervisor> sup_;
  Server indexer_, router_;
  std::vector<Server> sims_;
};

}  // namespace

double PolicyRun::hit_rate() const {
  return prompt_tokens > 0 ? static_cast<double>(hit_tokens.total()) / prompt_tokens : 0;
}

int64_t DemoReport::mismatches() const {
  int64_t m = 0;
  for (const PolicyRun& r : runs) m += r.mismatches;
  return m;
}

bool DemoReport::consistent() const {
  return !runs.empty() &&
         std::all_of(runs.begin(), runs.end(), [](const PolicyRun& r) { return r.consistent; });
}

double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(samples.size())));
  rank = std::clamp<size_t>(rank, 1, samples.size());
  return samples[rank - 1];
}

Result<DemoReport> RunDemo(const DemoOptions& options) {
  if (options.instances < 1) return Status::InvalidArgument("--instances must be at least 1");
  if (options.kvo_binary.empty() || options.kvo_binary[0] != '/') {
    return Status::InvalidArgument("kvo binary '" + options.kvo_binary + "' is not absolute");
  }
  const auto t0 = SteadyClock::now();
  DemoReport report;
  report.instances = options.instances;
  if (options.trace.empty()) {
    report.workload = "synthetic multi-turn conversations (kvo load --workload synthetic";
    if (options.conversations > 0) {
      report.workload += " --conversations " + std::to_string(options.conversations);
    }
    if (options.turns > 0) report.workload += " --turns " + std::to_string(options.turns);
    report.workload += ")";
  }
  if (options.gpu_blocks > 0) {
    report.workload += "; engines with " + std::to_string(options.gpu_blocks) + " GPU blocks";
    if (options.cpu_blocks > 0)
      report.workload += ", " + std::to_string(options.cpu_blocks) + " CPU";
  } else {
    report.workload = "trace " + options.trace;
  }
  if (options.max_requests > 0) {
    report.workload += ", first " + std::to_string(options.max_requests) + " requests";
  }
  int i = 0;
  for (const std::string& policy : options.policies) {
    const std::string dir = options.workdir + "/" + std::to_string(++i) + "-" + policy;
    Progress(options, "[" + policy + "] fresh state in " + dir);
    Run run(options, policy, dir);
    KVO_ASSIGN_OR_RETURN(PolicyRun r, run.Go());
    report.runs.push_back(std::move(r));
  }
  report.wall_s = Seconds(SteadyClock::now() - t0);
  return report;
}

}  // namespace kvo::demo
