// SimServer: the OpenAI-compatible HTTP face of one simulated vLLM engine (sim/DESIGN.md):
// /v1/completions and /v1/chat/completions (streaming or not), /v1/models, /health, /metrics,
// /kv_event_sources, /reset_prefix_cache and /kvo/state, over a SimEngine. Time is modelled:
// a FIFO queue in front of `max_concurrency` running requests; prefill of the uncached tokens at
// `prefill_tps` on one shared GPU timeline (requests prefill one after another); CPU and disk
// hits cost the real time of the real bytes moved (SimEngine); decode at `decode_tps` per request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "http/http_server.h"
#include "sim/engine.h"

namespace kvo::sim {

struct SimTiming {
  double prefill_tps = 8000;  // uncached prompt tokens per second (~8 B model, one GPU)
  double decode_tps = 50;     // generated tokens per second per request
  int max_concurrency = 8;    // running requests; more wait in a FIFO queue
  int max_waiting = 4096;     // queued beyond this: 503
  uint64_t seed = 0;          // the generated words
};

class SimServer {
 public:
  // Serves `engine` on `address` (port 0: any free port). The engine outlives the server.
  static Result<std::unique_ptr<SimServer>> Start(SimEngine* engine, const HttpAddress& address,
                                                  const SimTiming& timing);
  ~SimServer();
  int port() const;
  void Stop();

  struct Impl;

 private:
  explicit SimServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::sim
