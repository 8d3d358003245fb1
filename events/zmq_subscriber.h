// Subscriber: the SUB + DEALER replay client used by the indexer and tools. Delivers batches in
// sequence order exactly once: replays from a start sequence on connect, fills gaps by replay,
// reports publisher restarts and replays that could not reach back far enough. Accepts both
// replay reply shapes ([seq, payload] and [topic, seq, payload]).
//
// Restart detection (vLLM's wire has no epoch): a digest of every delivered batch is kept per
// seq (a bounded window). A live or replayed batch whose seq was already delivered is a
// duplicate only when its digest equals the delivered one; otherwise the publisher restarted.
// Every gap replay and idle probe asks from the last delivered seq, so the publisher's answer for
// that seq is compared too: a restarted publisher whose sequence overtook the old one is caught.
// Replies are applied as their frames arrive (never buffered whole) and bounded in time.
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
  // How long a replay may wait for its next frame (or the end marker) before it is abandoned
  // (reported as kReplayFailed).
  int64_t replay_timeout_ms = 2'000;
  // The longest one replay reply may take in total, however steadily it streams (an endless
  // reply is abandoned: kReplayFailed).
  int64_t replay_max_ms = 300'000;
  // With a replay endpoint: when nothing arrives live for this long, ask for anything after the
  // last sequence (catches lost tail messages that no later message would reveal). 0: never.
  int64_t idle_probe_ms = 1'000;
  // With a replay endpoint: a live message after this long without one is checked first (a
  // replay from the last delivered batch, whose content must match): a publisher that restarted
  // during the silence and whose new sequence reached exactly the expected seq is caught. 0: never.
  int64_t verify_after_silence_ms = 200;
  // A live seq this far or further past the expected one is not a loss of that many batches but
  // a broken or restarted publisher: reported as a restart (and counted as absurd); a replay
  // frame that far ahead abandons the replay.
  uint64_t max_seq_jump = 1'000'000;
  // Delivered batches whose digest is kept for duplicate and restart checks (8 bytes each).
  uint64_t digest_window = 262'144;
  DecodeLimits limits;
  // A descriptor (an eventfd) whose readability ends Next's wait early, for live messages or for a
  // replay's reply: Next returns nothing at once, now and on every later call (it is not drained).
  // The owner stops the thread that calls Next without waiting out its timeout. -1: none. Not
  // owned.
  int wake_fd = -1;
};

struct ReceivedBatch {
  uint64_t seq = 0;
  std::string topic;
  EventBatch batch;
  bool replayed = false;  // came from the replay socket rather than live
};

enum class NoticeKind {
  kGapFilled,         // live seq jumped; batches [from, to) were replayed
  kGapUnrecoverable,  // batches [from, to) are lost: replay missing, too short, or failed
  kPublisherRestart,  // seq went back, a seq came back with other content, or an absurd jump
  kReplayFailed,      // a replay asked from `from` timed out or was abandoned (hostile, endless);
                      // by itself nothing is lost: losses follow as kGapUnrecoverable
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
  uint64_t late_dropped = 0;  // live batches of a range already reported lost (a stalled queue)
  uint64_t gaps_filled = 0;
  uint64_t batches_lost = 0;
  uint64_t restarts = 0;
  uint64_t decode_errors = 0;
  uint64_t malformed_messages = 0;
  uint64_t replay_requests = 0;
  uint64_t replay_failures = 0;   // replays timed out or abandoned
  uint64_t absurd_sequences = 0;  // live seqs >= max_seq_jump ahead, or the end-marker value
  std::optional<uint64_t> last_seq;
};

class Subscriber {
 public:
  virtual ~Subscriber() = default;

  // Connects (or binds, with options.bind) and, with start_seq set, asks for a replay from it
  // (answered batch by batch through Next()).
  static Result<std::unique_ptr<Subscriber>> Create(const SubscriberOptions& options,
                                                    Clock* clock = nullptr);

  // The next batch in sequence order, waiting up to `timeout`; nullopt on timeout. Errors only
  // for socket failures; bad messages become notices and are skipped. While a replay is answered,
  // live messages wait in the SUB socket (bounded by its HWM).
  virtual Result<std::optional<ReceivedBatch>> Next(std::chrono::milliseconds timeout) = 0;
  // Notices since the last call, oldest first.
  virtual std::vector<SubscriberNotice> TakeNotices() = 0;
  virtual SubscriberStats stats() const = 0;
};

}  // namespace kvo
