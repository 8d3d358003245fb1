// Shared by the indexer service tests (service, router API, discovery): a service configuration
// whose timers are short, so reconnects, replay and silence show up in test time.
#pragma once

#include <string>

#include "indexer/service/service.h"

namespace kvo::service_test {

// An index file under `dir`, HTTP on an OS-chosen loopback port, retries from 20 ms to 200 ms, a
// source silent after 300 ms, replay given 500 ms.
inline IndexerConfig FastConfig(const std::string& dir) {
  IndexerConfig c;
  c.db = dir + "/index.sqlite";
  c.http = "127.0.0.1:0";
  c.idle_probe_ms = 100;
  c.replay_timeout_ms = 500;
  c.retry_initial_ms = 20;
  c.retry_max_ms = 200;
  c.silent_after_ms = 300;
  return c;
}

}  // namespace kvo::service_test
