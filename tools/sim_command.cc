// `kvo sim`: one simulated vLLM engine as a process (sim/DESIGN.md): OpenAI-compatible HTTP
// server, GPU prefix cache with vLLM's KV events, kvo's offload stack from --kv-transfer-config,
// a journaled ZeroMQ publisher from --kv-events-config, modelled prefill/decode time.
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/file_system.h"
#include "common/logging.h"
#include "events/block_hash.h"
#include "events/kv_events_config.h"
#include "sim/engine.h"
#include "sim/server.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

using json = nlohmann::json;

struct SimArgs {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string instance_id;
  std::string model = "kvo-sim";
  int64_t block_size = 16;
  int64_t gpu_blocks = 2048;
  int64_t cpu_blocks = 0;   // built-in transfer config only; 0: 4 x gpu_blocks
  int64_t disk_blocks = 0;  // built-in transfer config only; 0: 16 x gpu_blocks
  std::string kv_transfer_config;
  std::string kv_events_config;
  double prefill_tps = 8000;
  double decode_tps = 50;
  int max_concurrency = 8;
  std::string workdir;
  int64_t bytes_per_token = 2048;
  int num_layers = 8;
  std::string hash_algo = "sha256";
  std::string hash_seed;
  uint64_t seed = 0;
};

// A free loopback TCP port (the kernel's pick; released again for ZeroMQ to bind).
Result<int> FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::IOError("socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return Status::IOError("cannot pick a free TCP port");
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

// tcp://HOST:0 -> tcp://*:<free port>: port 0 asks for a socket the sim binds (vLLM binds only
// endpoints with "*" or "::"; a plain host would make its publisher connect, to nothing here).
// /kv_event_sources reports it as tcp://127.0.0.1:<port>.
Result<std::string> ResolvePortZero(const std::string& endpoint) {
  if (!endpoint.starts_with("tcp://") || !endpoint.ends_with(":0")) return endpoint;
  KVO_ASSIGN_OR_RETURN(int port, FreePort());
  return "tcp://*:" + std::to_string(port);
}

Result<KvEventsConfig> EventsConfig(const std::string& text, const std::string& instance) {
  json j;
  if (text.empty()) {
    j = {{"enable_kv_cache_events", true},
         {"publisher", "zmq"},
         {"endpoint", "tcp://127.0.0.1:0"},
         {"replay_endpoint", "tcp://127.0.0.1:0"},
         {"topic", "kv-events"}};
  } else {
    j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument("--kv-events-config: not a JSON object");
    }
  }
  for (const char* key : {"endpoint", "replay_endpoint"}) {
    if (j.contains(key) && j[key].is_string()) {
      KVO_ASSIGN_OR_RETURN(std::string e, ResolvePortZero(j[key].get<std::string>()));
      j[key] = e;
    }
  }
  auto c = ParseKvEventsConfig(j.dump());
  if (!c.ok()) return Status::InvalidArgument("--kv-events-config: " + c.status().message());
  (void)instance;
  return c;
}

// The built-in --kv-transfer-config: CPU rows, then a bounded file tier under the workdir.
std::string DefaultTransferConfig(const SimArgs& a, const std::string& workdir) {
  const uint64_t block_bytes = uint64_t(a.bytes_per_token) * uint64_t(a.block_size);
  const uint64_t row = (block_bytes + 4095) / 4096 * 4096;
  const int64_t cpu = a.cpu_blocks > 0 ? a.cpu_blocks : 4 * a.gpu_blocks;
  const int64_t disk = a.disk_blocks > 0 ? a.disk_blocks : 16 * a.gpu_blocks;
  json j = {{"kv_connector", "OffloadingConnector"},
            {"kv_role", "kv_both"},
            {"kv_connector_extra_config",
             {{"spec_name", "TieringOffloadingSpec"},
              {"block_size", a.block_size},
              {"cpu_bytes_to_use", row * uint64_t(cpu)},
              {"eviction_policy", "lru"},
              {"secondary_tiers", json::array({{{"type", "fs"},
                                                {"root_dir", workdir + "/fs"},
                                                {"n_read_threads", 2},
                                                {"n_write_threads", 2},
                                                {"enable_kv_events", true},
                                                // a file per block, page-aligned, plus its
                                                // header page (O_DIRECT)
                                                {"max_bytes", (row + 4096) * uint64_t(disk)}}})}}}};
  return j.dump();
}

Status RunSim(SimArgs a) {
  if (a.port < 0 || a.port > 65535) return Status::InvalidArgument("--port must be 0-65535");
  if (a.gpu_blocks < 1) return Status::InvalidArgument("--gpu-blocks must be positive");
  if (a.block_size < 1) return Status::InvalidArgument("--block-size must be positive");
  if (a.bytes_per_token < 1) return Status::InvalidArgument("--bytes-per-token must be positive");
  auto algo = ParseHashAlgo(a.hash_algo);
  if (!algo.ok()) return Status::InvalidArgument("--hash-algo: " + algo.status().message());
  std::optional<std::string> seed_flag;
  if (!a.hash_seed.empty()) seed_flag = a.hash_seed;
  auto seed = ResolveNoneHashSeed(*algo, seed_flag);
  if (!seed.ok()) return Status::InvalidArgument("--hash-seed: " + seed.status().message());

  std::string workdir = a.workdir;
  bool own_workdir = false;
  if (workdir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvo-sim-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Status::IOError("cannot create a temp workdir");
    workdir = tmpl;
    own_workdir = true;
  } else {
    KVO_RETURN_IF_ERROR(DefaultFileSystem()->CreateDirs(workdir, FileOptions{}));
  }
  sim::SimEngineOptions eo;
  eo.model = a.model;
  eo.workdir = workdir;
  eo.block_size = a.block_size;
  eo.gpu_blocks = size_t(a.gpu_blocks);
  eo.bytes_per_token = uint64_t(a.bytes_per_token);
  eo.num_layers = a.num_layers;
  eo.hash_algo = *algo;
  eo.hash_seed = *seed;
  if (a.kv_transfer_config.empty()) {
    // The built-in config's file tier lives under the workdir (private, as the tier's own dirs).
    FileOptions fo;
    KVO_RETURN_IF_ERROR(DefaultFileSystem()->CreateDirs(workdir + "/fs", fo));
    ::chmod((workdir + "/fs").c_str(), 0700);
    eo.kv_transfer_config = DefaultTransferConfig(a, workdir);
  } else {
    eo.kv_transfer_config = a.kv_transfer_config;
  }
  KVO_ASSIGN_OR_RETURN(eo.events, EventsConfig(a.kv_events_config, a.instance_id));

  sigset_t signals = BlockTerminationSignals();
  // The HTTP port first (its number names the instance by default), then the engine.
  sim::SimTiming timing;
  timing.prefill_tps = a.prefill_tps;
  timing.decode_tps = a.decode_tps;
  timing.max_concurrency = a.max_concurrency;
  timing.seed = a.seed;
  eo.instance_id = a.instance_id;
  if (eo.instance_id.empty()) {
    if (a.port == 0) {
      KVO_ASSIGN_OR_RETURN(int p, FreePort());
      eo.instance_id = "sim-" + std::to_string(p);
      a.port = p;
    } else {
      eo.instance_id = "sim-" + std::to_string(a.port);
    }
  }
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<sim::SimEngine> engine, sim::SimEngine::Open(eo));
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<sim::SimServer> server,
                       sim::SimServer::Start(engine.get(), HttpAddress{a.host, a.port}, timing));
  const KvEventsConfig& ev = engine->events_config();
  auto client = [](std::string e) {
    if (e.starts_with("tcp://*:")) e = "tcp://127.0.0.1:" + e.substr(8);
    return e;
  };
  json ready = {
      {"event", "listening"},
      {"http", "http://" + a.host + ":" + std::to_string(server->port())},
      {"port", server->port()},
      {"instance_id", eo.instance_id},
      {"model", eo.model},
      {"kv_events_endpoint", client(ev.endpoint)},
      {"replay_endpoint", ev.replay_endpoint ? json(client(*ev.replay_endpoint)) : json(nullptr)},
      {"workdir", workdir}};
  std::printf("%s\n", ready.dump().c_str());
  std::fflush(stdout);
  KVO_LOG_INFO("kvo sim {}: listening on port {}", eo.instance_id, server->port());
  const int sig = WaitForTerminationSignal(signals);
  KVO_LOG_INFO("kvo sim: signal {}, shutting down", sig);
  server->Stop();
  engine.reset();
  if (own_workdir) {
    std::error_code ec;
    std::filesystem::remove_all(workdir, ec);
  }
  return Status::Ok();
}

}  // namespace

void AddSimCommand(CLI::App& app, CommandTable& commands) {
  auto a = std::make_shared<SimArgs>();
  CLI::App* sim = app.add_subcommand(
      "sim",
      "A simulated vLLM engine: OpenAI-compatible HTTP API, GPU prefix cache with vLLM's KV "
      "events, kvo's offload stack (CPU rows, file tier) from --kv-transfer-config, modelled "
      "prefill/decode time (sim/DESIGN.md)");
  sim->add_option("--host", a->host, "HTTP host")->capture_default_str();
  sim->add_option("--port", a->port, "HTTP port (0: any free port)")->capture_default_str();
  sim->add_option("--instance-id", a->instance_id, "instance name (default sim-PORT)");
  sim->add_option("--model", a->model, "model name served")->capture_default_str();
  sim->add_option("--block-size", a->block_size, "tokens per KV block")->capture_default_str();
  sim->add_option("--gpu-blocks", a->gpu_blocks, "GPU prefix cache capacity, blocks")
      ->capture_default_str();
  sim->add_option("--cpu-blocks", a->cpu_blocks,
                  "CPU tier blocks of the built-in transfer config (default 4 x --gpu-blocks)");
  sim->add_option("--disk-blocks", a->disk_blocks,
                  "file tier blocks of the built-in transfer config (default 16 x --gpu-blocks)");
  sim->add_option("--kv-transfer-config", a->kv_transfer_config,
                  "vLLM's --kv-transfer-config JSON (OffloadingConnector; default: CPU rows + a "
                  "bounded file tier under --workdir)");
  sim->add_option("--kv-events-config", a->kv_events_config,
                  "vLLM's --kv-events-config JSON; tcp port 0 picks a free port (default: zmq on "
                  "tcp://127.0.0.1:0 with replay, topic kv-events)");
  sim->add_option("--prefill-tps", a->prefill_tps, "uncached prompt tokens per second")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sim->add_option("--decode-tps", a->decode_tps, "generated tokens per second per request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sim->add_option("--max-concurrency", a->max_concurrency,
                  "running requests; more wait in a FIFO queue")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sim->add_option("--workdir", a->workdir, "file tier and journal (default: a temp dir, removed)");
  sim->add_option("--bytes-per-token", a->bytes_per_token, "KV bytes per token (all layers)")
      ->capture_default_str();
  sim->add_option("--num-layers", a->num_layers, "layers a block's bytes are split into")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sim->add_option("--hash-algo", a->hash_algo, "sha256 | sha256_cbor | xxhash | xxhash_cbor")
      ->capture_default_str();
  sim->add_option("--hash-seed", a->hash_seed,
                  "PYTHONHASHSEED (unset: vLLM's default for sha256*, required for xxhash*)");
  sim->add_option("--seed", a->seed, "seed of the generated text")->capture_default_str();
  commands.AddStatus(sim, [a] { return RunSim(*a); });
}

}  // namespace kvo::cli
