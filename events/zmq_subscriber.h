// Subscriber: the SUB + DEALER replay client used by the indexer and tools. Delivers batches in
// sequence order exactly once: replays from a start sequence on connect, fills gaps by replay,
// reports publisher restarts (sequence going backwards) and replays that could not reach back far
// enough. Accepts both replay reply shapes ([seq, payload] and [topic, seq, payload]).
//
// Thread-compatible: one thread calls Next(); stats() may be read from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "events/codec.h"
#include "events/event.h"

namespace kvo {

struct SubscriberOptions {
  std::string endpoint;                        // the publisher's PUB endpoint
  std::optional<std::string> replay_endpoint;  // its ROUTER endpoint; no gap filling without it
  std::string topic;                           // ZMQ prefix filter
  // Bind the SUB socket instead of connecting: for publishers configured to connect (an
  // endpoint without "*", "::", ipc:// or inproc://). Default: connect.
  bool bind = false;
  // Replay from this sequence when connecting (0: everything the publisher still has).
  // Unset: start with whatever arrives live.
  std::optional<uint64_t> start_seq;
  int64_t hwm = 100'000;
  // How long to wait for a replay's end marker before giving up (and reporting it).
  int64_t replay_timeout_ms = 2'000;
  // With a replay endpoint: when nothing arrives live for this long, ask for anything after the
  // last sequence (catches lost tail messages that no later message would reveal). 0: never.
  int64_t idle_probe_ms = 1'000;
  DecodeLimits limits;
};

struct ReceivedBatch {
  uint64_t seq = 0;
  std::string topic;
  EventBatch batch;
  bool replayed = false;  // came from the replay socket rather than live
};

enum class NoticeKind {
  kGapFilled,         // live seq jumped; the missing batches were replayed
  kGapUnrecoverable,  // batches [from, to) are lost: replay missing, too short, or timed out
  kPublisherRestart,  // seq went backwards: the publisher restarted
  kDecodeError,       // a payload failed to decode; its seq is skipped (counted)
  kMalformedMessage,  // wrong frame count or seq frame length; dropped
};

const char* NoticeKindName(NoticeKind kind);

struct SubscriberNotice {
  NoticeKind kind;
  uint64_t from_seq = 0;  // first affected seq (restart: the new seq)
  uint64_t to_seq = 0;    // one past the last affected seq (restart: the old last seq + 1)
  std::string detail;
};

struct SubscriberStats {
  uint64_t batches_delivered = 0;
  uint64_t live_received = 0;
  uint64_t replayed_received = 0;
  uint64_t duplicates_dropped = 0;
  uint64_t gaps_filled = 0;
  uint64_t batches_lost = 0;
  uint64_t restarts = 0;
  uint64_t decode_errors = 0;
  uint64_t malformed_messages = 0;
  uint64_t replay_requests = 0;
  std::optional<uint64_t> last_seq;
};

class Subscriber {
 public:
  virtual ~Subscriber() = default;

  // Connects (or binds, with options.bind) and, with start_seq set, replays from it (waiting up
  // to replay_timeout_ms for the publisher's answer).
  static Result<std::unique_ptr<Subscriber>> Create(const SubscriberOptions& options,
                                                    Clock* clock = nullptr);

  // The next batch in sequence order, waiting up to `timeout`; nullopt on timeout. Errors only
  // for socket failures; bad messages become notices and are skipped. A replay started inside
  // (gap, probe) is waited for up to replay_timeout_ms, which may exceed `timeout`.
  virtual Result<std::optional<ReceivedBatch>> Next(std::chrono::milliseconds timeout) = 0;
  // Notices since the last call, oldest first.
  virtual std::vector<SubscriberNotice> TakeNotices() = 0;
  virtual SubscriberStats stats() const = 0;
};

}  // namespace kvo
