// `kvo route`: the KV-aware OpenAI-compatible router (route/). This file only wires flags.
#include <signal.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"
#include "http/http_server.h"
#include "route/route.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

struct RouteArgs {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string indexer;
  std::vector<std::string> engines;
  bool no_register = false;
  std::string policy = "kv";
  std::string tier_weights = "GPU=1,CPU=0.8,DISK=0.5";
  double load_penalty = 1.0;
  uint64_t seed = 0;
  int64_t block_size = 16;
  std::string model = "kvo-sim";
  int workers = 64;
  int timeout_ms = 600000;
};

Status RunRoute(const RouteArgs& a) {
  route::RouterOptions options;
  KVO_ASSIGN_OR_RETURN(options.policy.policy, route::ParsePolicy(a.policy));
  KVO_ASSIGN_OR_RETURN(options.policy.weights, route::ParseTierWeights(a.tier_weights));
  options.policy.load_penalty = a.load_penalty;
  options.policy.block_size = a.block_size;
  options.model = a.model;
  options.seed = a.seed;
  options.engine_timeout_ms = a.timeout_ms;
  if (!a.indexer.empty()) {
    auto addr = ParseHttpUrl(a.indexer);
    if (!addr.ok()) return Status::InvalidArgument("--indexer: " + addr.status().message());
    options.indexer = *addr;
  }
  std::optional<HttpAddress> register_with;
  if (!a.no_register && options.indexer) register_with = options.indexer;
  KVO_ASSIGN_OR_RETURN(
      auto engines, route::DiscoverEngines(a.engines, register_with, a.model, a.block_size, 5000));
  KVO_ASSIGN_OR_RETURN(auto router, route::Router::Create(options, engines));

  const sigset_t signals = BlockTerminationSignals();  // threads started from here inherit it
  HttpServerOptions http;
  http.address = HttpAddress{a.host, a.port};
  http.worker_threads = a.workers;
  http.max_pending_requests = std::max(256, a.workers * 4);
  http.priority_paths = {"/health", "/metrics", "/route/stats"};
  http.write_timeout_ms = a.timeout_ms;
  route::Router* r = router.get();
  auto server =
      HttpServer::Start(http, [r](const HttpRequest& request) { return r->Handle(request); });
  if (!server.ok()) {
    return Status(server.status().code(),
                  "--port " + std::to_string(a.port) + ": " + server.status().message());
  }
  nlohmann::ordered_json ready;
  ready["event"] = "listening";
  ready["http"] = "http://" + a.host + ":" + std::to_string((*server)->port());
  ready["port"] = (*server)->port();
  ready["policy"] = a.policy;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& e : engines) list.push_back({{"instance_id", e.instance_id}, {"url", e.url}});
  ready["engines"] = std::move(list);
  std::printf("%s\n", ready.dump().c_str());
  std::fflush(stdout);
  KVO_LOG_INFO("kvo route: listening on port {}, {} engines, policy {}", (*server)->port(),
               engines.size(), a.policy);
  const int sig = WaitForTerminationSignal(signals);
  KVO_LOG_INFO("kvo route: signal {}, shutting down", sig);
  (*server)->Stop();
  return Status::Ok();
}

}  // namespace

void AddRouteCommand(CLI::App& app, CommandTable& commands) {
  auto args = std::make_shared<RouteArgs>();
  CLI::App* cmd = app.add_subcommand(
      "route",
      "KV-aware OpenAI-compatible router in front of N engines (POST /v1/completions, "
      "/v1/chat/completions; GET /v1/models, /health, /metrics, /route/stats).\n"
      "--policy kv asks the indexer's POST /query with the request's token ids and picks the "
      "engine with the highest\n"
      "  score = (w_GPU*gpu_tokens + w_CPU*cpu_tokens + w_DISK*disk_tokens) / block_size"
      " - load_penalty * in_flight\n"
      "(tokens of the matched prefix each medium contributes; ties: fewer in flight, then "
      "rotation). An engine that cannot be reached is retried on another and counted; when none "
      "can take a request: 503 in OpenAI's error shape. See route/DESIGN.md.");
  cmd->add_option("--host", args->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--indexer", args->indexer,
                  "kvo index serve base URL, e.g. http://127.0.0.1:8080 (required by --policy kv)");
  cmd->add_option("--engine", args->engines, "engine base URL (repeatable)")->required();
  cmd->add_flag("--no-register", args->no_register,
                "do not register the engines' event sources with the indexer (already registered)");
  cmd->add_option("--policy", args->policy, "kv|round-robin|random|least-loaded")
      ->capture_default_str()
      ->check(CLI::IsMember({"kv", "round-robin", "random", "least-loaded"}));
  cmd->add_option("--tier-weights", args->tier_weights,
                  "worth of a matched token by medium (kv policy)")
      ->capture_default_str();
  cmd->add_option("--load-penalty", args->load_penalty,
                  "score (in blocks) taken off per request in flight on the engine (kv policy)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", args->seed, "seed of the random policy")->capture_default_str();
  cmd->add_option("--block-size", args->block_size, "the engines' KV block size in tokens")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--model", args->model, "model name the engines serve (registration, /query)")
      ->capture_default_str();
  cmd->add_option("--workers", args->workers,
                  "HTTP worker threads (a request holds one until answered: the concurrency limit)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--timeout-ms", args->timeout_ms, "timeout of a forwarded request")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400000));
  commands.AddStatus(cmd, [args] { return RunRoute(*args); });
}

}  // namespace kvo::cli
