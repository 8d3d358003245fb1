// EventPublisher: vLLM's ZmqEventPublisher (vllm-compat.md A.4) in C++. A PUB socket sends
// 3-frame messages [topic, seq u64 big-endian, msgpack EventBatch]; a ROUTER socket answers replay
// requests [id, "", start_seq] with [id, "", topic, seq, payload]... and the end marker
// [id, "", "", ff*8, ""]. Beyond vLLM: with a Journal attached, each batch is journaled before it
// is sent, replay older than the in-memory ring is served from the journal, and sequence numbers
// continue across restarts.
//
// Thread-safety: Publish/Flush/Shutdown/stats may be called from any thread. One internal thread
// owns the sockets.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "common/clock.h"
#include "common/result.h"
#include "events/codec.h"
#include "events/event.h"
#include "events/journal.h"
#include "events/kv_events_config.h"

namespace kvo {

struct PublisherStats {
  uint64_t batches_published = 0;
  uint64_t block_events_published = 0;
  uint64_t send_errors = 0;
  uint64_t journal_errors =
      0;  // runs of batches sent unjournaled (the journal could not take them)
  // Of those, runs whose seqs the journal's sequence floor could not be raised past either: a
  // restart may reuse them.
  uint64_t journal_floor_errors = 0;
  uint64_t replay_requests = 0;
  uint64_t replay_batches_sent = 0;
  uint64_t replay_from_journal = 0;
  uint64_t invalid_replay_requests = 0;
  // Refused because kMaxReplaySessions replies were in progress (no reply, as an invalid one).
  uint64_t replay_requests_refused = 0;
  std::optional<uint64_t> next_seq;  // the seq the next batch will get (zmq publishers)
};

class EventPublisher {
 public:
  virtual ~EventPublisher() = default;

  // Queues `batch`; fills data_parallel_rank when unset. Blocks while the queue holds
  // max_queue_size batches (back-pressure, as vLLM). FailedPrecondition after Shutdown.
  virtual Status Publish(EventBatch batch) = 0;
  // Blocks until every batch queued so far has been journaled and handed to ZeroMQ.
  virtual void Flush() = 0;
  // Drains the queue (up to ~1 s), stops the thread and closes the sockets (linger 0).
  // Idempotent.
  virtual void Shutdown() = 0;
  // The resolved configuration (DP-offset endpoints); nullopt for the null publisher.
  virtual std::optional<KvEventsConfig> publisher_config() const = 0;
  virtual PublisherStats stats() const = 0;
};

struct PublisherOptions {
  Clock* clock = nullptr;      // Default: SystemClock()
  Journal* journal = nullptr;  // not owned; Default: none (or opened from config.journal_dir)
};

// vLLM's EventPublisherFactory: a null publisher when the config is disabled or "null"; else a
// ZeroMQ publisher for `data_parallel_rank` (ports offset by the rank). When config.journal_dir is
// set and options.journal is null, the publisher opens and owns a journal there.
Result<std::unique_ptr<EventPublisher>> CreateEventPublisher(const KvEventsConfig& config,
                                                             int64_t data_parallel_rank,
                                                             const PublisherOptions& options = {});

}  // namespace kvo
