// ZeroMQ adapter for the subscriber: cppzmq exceptions stop in this file.
#include "events/zmq_subscriber.h"

#include <zmq_addon.hpp>

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "events/kv_events_config.h"
#include "events/zmq_util.h"

namespace kvo {

const char* NoticeKindName(NoticeKind kind) {
  switch (kind) {
    case NoticeKind::kGapFilled:
      return "gap_filled";
    case NoticeKind::kGapUnrecoverable:
      return "gap_unrecoverable";
    case NoticeKind::kPublisherRestart:
      return "publisher_restart";
    case NoticeKind::kDecodeError:
      return "decode_error";
    case NoticeKind::kMalformedMessage:
      return "malformed_message";
    case NoticeKind::kReplayFailed:
      return "replay_failed";
  }
  return "unknown";
}

namespace {

using Frames = std::vector<zmq::message_t>;

std::vector<std::string_view> Views(const Frames& frames) {
  std::vector<std::string_view> views;
  views.reserve(frames.size());
  for (const zmq::message_t& f : frames) views.push_back(f.to_string_view());
  return views;
}

constexpr uint64_t kMaxSeq = ~uint64_t{0};  // the end marker's value: never a batch's seq
// Frames of one reply that do not advance it (malformed, duplicates) before it is abandoned.
constexpr uint64_t kMaxIdleFramesPerReply = 100'000;

// Why a replay was asked for: decides what its answer means.
enum class ReplayPurpose {
  kInitial,  // start_seq on connect
  kGap,      // a live seq jumped; held_live_ waits for the answer
  kProbe,    // nothing arrived live for idle_probe_ms
  kVerify,   // a live message after a silence; held_live_ waits for the answer
  kRestart,  // a restart was detected: the new stream from 0
};

// The longest wait between connection attempts to a publisher that is down.
constexpr int kReconnectMaxMs = 2'000;

class ZmqSubscriber final : public Subscriber {
 public:
  ZmqSubscriber(SubscriberOptions options, Clock* clock)
      : options_(std::move(options)), clock_(clock) {}

  Status Start() {
    try {
      sub_ = zmq::socket_t(zmq_util::GlobalContext(), zmq::socket_type::sub);
      sub_.set(zmq::sockopt::rcvhwm, static_cast<int>(options_.hwm));
      sub_.set(zmq::sockopt::linger, 0);
      sub_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.limits.max_payload_bytes));
      sub_.set(zmq::sockopt::subscribe, options_.topic);
      // A publisher that is down is retried at 100 ms, doubling to kReconnectMaxMs while it
      // stays down (ZeroMQ's default retries every 100 ms forever: 100 registered engines that
      // are down cost the indexer ~1 000 connects a second, in its I/O thread and the kernel).
      sub_.set(zmq::sockopt::reconnect_ivl_max, kReconnectMaxMs);
      if (options_.bind) {
        sub_.bind(options_.endpoint);
      } else {
        sub_.connect(options_.endpoint);
      }
    } catch (const zmq::error_t& e) {
      return zmq_util::ZmqError("subscriber on '" + options_.endpoint + "'", e);
    }
    KVO_RETURN_IF_ERROR(OpenDealer());
    last_live_ns_ = last_message_ns_ = clock_->MonotonicNanos();
    if (options_.start_seq) {
      next_expected_ = *options_.start_seq;
      if (options_.replay_endpoint) {
        KVO_RETURN_IF_ERROR(StartReplay(*options_.start_seq, ReplayPurpose::kInitial));
      }
    }
    return Status::Ok();
  }

  Result<std::optional<ReceivedBatch>> Next(std::chrono::milliseconds timeout) override {
    const int64_t deadline = timeout.count() < 0
                                 ? std::numeric_limits<int64_t>::max()
                                 : clock_->MonotonicNanos() + timeout.count() * 1'000'000;
    while (ready_.empty()) {
      if (replay_) {
        bool woken = false;
        KVO_RETURN_IF_ERROR(PumpReplay(deadline, &woken));
        if (!ready_.empty()) break;
        if (woken) return std::optional<ReceivedBatch>();
        if (replay_ && clock_->MonotonicNanos() >= deadline) return std::optional<ReceivedBatch>();
        continue;
      }
      // Fast path: take a message that is already queued, without a poll() per message.
      try {
        Frames queued;
        if (zmq::recv_multipart(sub_, std::back_inserter(queued), zmq::recv_flags::dontwait)) {
          KVO_RETURN_IF_ERROR(HandleLive(std::move(queued), false, LiveArrived()));
          continue;
        }
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return zmq_util::ZmqError("subscriber receive", e);
      }
      int64_t now = clock_->MonotonicNanos();
      if (now >= deadline) return std::optional<ReceivedBatch>();
      int64_t wait_ns = deadline - now;
      bool probe = dealer_.handle() != nullptr && options_.idle_probe_ms > 0 && next_expected_;
      int64_t probe_at = last_live_ns_ + options_.idle_probe_ms * 1'000'000;
      if (probe) wait_ns = std::min(wait_ns, std::max<int64_t>(0, probe_at - now));
      Frames frames;
      try {
        zmq::pollitem_t items[2] = {{sub_.handle(), 0, ZMQ_POLLIN, 0},
                                    {nullptr, options_.wake_fd, ZMQ_POLLIN, 0}};
        const zmq::pollitem_t& item = items[0];
        zmq::poll(items, options_.wake_fd >= 0 ? 2 : 1, std::chrono::milliseconds(PollMs(wait_ns)));
        if (items[1].revents & ZMQ_POLLIN) return std::optional<ReceivedBatch>();  // woken
        if (item.revents & ZMQ_POLLIN) {
          if (!zmq::recv_multipart(sub_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
            continue;
          }
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        return zmq_util::ZmqError("subscriber receive", e);
      }
      if (!frames.empty()) {
        KVO_RETURN_IF_ERROR(HandleLive(std::move(frames), false, LiveArrived()));
      } else if (probe && clock_->MonotonicNanos() >= probe_at) {
        last_live_ns_ = clock_->MonotonicNanos();
        KVO_RETURN_IF_ERROR(Probe());
      }
    }
    ReceivedBatch out = std::move(ready_.front());
    ready_.pop_front();
    MutexLock lock(&mu_);
    ++stats_.batches_delivered;
    return std::optional<ReceivedBatch>(std::move(out));
  }

  std::vector<SubscriberNotice> TakeNotices() override {
    std::vector<SubscriberNotice> out;
    out.swap(notices_);
    return out;
  }

  SubscriberStats stats() const override {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // One replay in flight: its request, progress and bounds.
  struct ReplayState {
    uint64_t asked = 0;              // the start_seq sent
    uint64_t expected_at_start = 0;  // next_expected_ when it was asked (gap: what to fill)
    uint64_t filled_from = 0;        // where the run the reply is supplying now began
    bool filled_any = false;         // a gap_filled notice was given for this reply
    ReplayPurpose purpose = ReplayPurpose::kInitial;
    int64_t started_ns = 0;
    int64_t last_frame_ns = 0;
    uint64_t batches = 0;      // batch frames received
    uint64_t idle_frames = 0;  // frames that did not advance the stream
    bool yielded = false;      // PumpReplay returned a batch: the consumer's time is not waiting
  };

  // Records a live arrival; true when it ends a silence of verify_after_silence_ms.
  bool LiveArrived() {
    int64_t now = clock_->MonotonicNanos();
    bool after_silence = options_.verify_after_silence_ms > 0 &&
                         now - last_message_ns_ >= options_.verify_after_silence_ms * 1'000'000;
    last_live_ns_ = last_message_ns_ = now;
    return after_silence;
  }

  static int64_t PollMs(int64_t ns) {
    return std::clamp<int64_t>((ns + 999'999) / 1'000'000, 0, 3'600'000);
  }

  Status OpenDealer() {
    if (!options_.replay_endpoint) return Status::Ok();
    try {
      if (dealer_.handle() != nullptr) dealer_.close();
      dealer_ = zmq::socket_t(zmq_util::GlobalContext(), zmq::socket_type::dealer);
      dealer_.set(zmq::sockopt::linger, 0);
      // Replies are read as they arrive; the bound keeps a fast replier from queuing a whole
      // reply here (the publisher keeps the rest, as ROUTER_MANDATORY back-pressure).
      dealer_.set(zmq::sockopt::rcvhwm, 1000);
      dealer_.set(zmq::sockopt::reconnect_ivl_max, kReconnectMaxMs);
      dealer_.set(zmq::sockopt::maxmsgsize,
                  static_cast<int64_t>(options_.limits.max_payload_bytes));
      dealer_.connect(*options_.replay_endpoint);
    } catch (const zmq::error_t& e) {
      return zmq_util::ZmqError("replay client on '" + *options_.replay_endpoint + "'", e);
    }
    return Status::Ok();
  }

  void Notice(NoticeKind kind, uint64_t from, uint64_t to, std::string detail) {
    if (kind == NoticeKind::kGapFilled) {
      KVO_LOG_INFO("kv-events subscriber {}: {} [{}, {}) {}", options_.endpoint,
                   NoticeKindName(kind), from, to, detail);
    } else {
      KVO_LOG_WARN("kv-events subscriber {}: {} [{}, {}) {}", options_.endpoint,
                   NoticeKindName(kind), from, to, detail);
    }
    notices_.push_back(SubscriberNotice{kind, from, to, std::move(detail)});
  }

  // Reports [from, to) lost. A range of max_seq_jump or more (only possible where a stream not yet
  // anchored begins: a replay from 0 or from a checkpoint, a live seq without a replay endpoint)
  // is reported but not added to batches_lost: the seq may be garbage, and a count of 10^19
  // says nothing.
  void Lost(uint64_t from, uint64_t to, std::string why) {
    if (to - from < options_.max_seq_jump) {
      MutexLock lock(&mu_);
      stats_.batches_lost += to - from;
    }
    lost_ranges_.push_back({from, to, clock_->MonotonicNanos()});
    if (lost_ranges_.size() > kMaxLostRanges) lost_ranges_.pop_front();
    Notice(NoticeKind::kGapUnrecoverable, from, to, std::move(why));
  }

  // Whether `seq` lies in a range this stream reported lost within the last kLateWindowNs: what a
  // stalled consumer's SUB queue still holds when a replay has moved the stream past it. Older
  // ranges do not count, so a publisher that restarts later (its seq back inside an old lost
  // range) is still a restart.
  bool LateInLostRange(uint64_t seq) const {
    const int64_t now = clock_->MonotonicNanos();
    for (const LostRange& r : lost_ranges_) {
      if (seq >= r.from && seq < r.to && now - r.reported_ns < kLateWindowNs) return true;
    }
    return false;
  }

  // The publisher restarted: everything delivered belongs to the old stream.
  void Restart(uint64_t from, uint64_t to, std::string why) {
    lost_ranges_.clear();
    {
      MutexLock lock(&mu_);
      ++stats_.restarts;
    }
    Notice(NoticeKind::kPublisherRestart, from, to, std::move(why));
    digests_.clear();
    anchored_ = false;
  }

  // --- the digest window: seq -> digest of the batch delivered for it -------------------------

  void Remember(uint64_t seq, uint64_t digest) {
    if (digests_.empty() || seq != digest_base_ + digests_.size()) {
      digests_.clear();
      digest_base_ = seq;
    }
    digests_.push_back(digest);
    if (digests_.size() > options_.digest_window) {
      digests_.pop_front();
      ++digest_base_;
    }
  }

  std::optional<uint64_t> DigestOf(uint64_t seq) const {
    if (digests_.empty() || seq < digest_base_ || seq - digest_base_ >= digests_.size()) {
      return std::nullopt;
    }
    return digests_[seq - digest_base_];
  }

  // Decodes and queues one batch in order. A payload that does not decode is skipped, counted
  // and reported; its seq still counts as seen.
  void Deliver(uint64_t seq, std::string_view topic, std::string_view payload, bool replayed) {
    next_expected_ = seq + 1;
    anchored_ = true;
    if (options_.digest_window > 0) Remember(seq, zmq_util::PayloadDigest(payload));
    {
      MutexLock lock(&mu_);
      stats_.last_seq = seq;
    }
    auto batch = DecodeBatch(payload, options_.limits);
    if (!batch.ok()) {
      {
        MutexLock lock(&mu_);
        ++stats_.decode_errors;
      }
      Notice(NoticeKind::kDecodeError, seq, seq + 1, batch.status().ToString());
      return;
    }
    ready_.push_back(ReceivedBatch{seq, std::string(topic), std::move(batch).value(), replayed});
  }

  void Malformed(std::string detail) {
    {
      MutexLock lock(&mu_);
      ++stats_.malformed_messages;
    }
    Notice(NoticeKind::kMalformedMessage, 0, 0, std::move(detail));
  }

  // One live message. `after_replay`: it waited for a gap replay that has ended; what that
  // replay did not supply is lost (no second replay for it).
  Status HandleLive(Frames frames, bool after_replay, bool after_silence = false) {
    const std::optional<uint64_t> live_seq = zmq_util::ParseLiveSeq(Views(frames));
    if (!live_seq) {
      Malformed("live message with " + std::to_string(frames.size()) + " frames" +
                (frames.size() >= 2
                     ? ", seq frame of " + std::to_string(frames[1].size()) + " bytes"
                     : std::string()));
      return Status::Ok();
    }
    const uint64_t seq = *live_seq;
    if (!after_replay) {
      MutexLock lock(&mu_);
      ++stats_.live_received;
    }
    if (seq == kMaxSeq) {
      {
        MutexLock lock(&mu_);
        ++stats_.absurd_sequences;
      }
      Malformed("live message with the end-marker sequence number");
      return Status::Ok();
    }
    std::string_view payload = frames[2].to_string_view();
    bool restarted = false;
    if (next_expected_ && seq < *next_expected_) {
      // A duplicate only if this exact batch was delivered for this seq (a replay raced it).
      std::optional<uint64_t> known = DigestOf(seq);
      if (known && *known == zmq_util::PayloadDigest(payload)) {
        MutexLock lock(&mu_);
        ++stats_.duplicates_dropped;
        return Status::Ok();
      }
      if (!known && LateInLostRange(seq)) {
        // A batch of a range already reported lost, arriving late from the SUB queue of a
        // stalled consumer after a replay moved the stream past it: not a restart (a restarted
        // publisher is still seen by a seq outside those ranges, or by a verify replay).
        MutexLock lock(&mu_);
        ++stats_.late_dropped;
        return Status::Ok();
      }
      Restart(seq, *next_expected_,
              "sequence went back from " + std::to_string(*next_expected_ - 1) + " to " +
                  std::to_string(seq) +
                  (known ? " with a different batch" : " (not a batch replay delivered)"));
      next_expected_ = 0;
      restarted = true;
    }
    // An absurd jump is measured from a stream this subscriber has followed (anchored_): before
    // its first batch, or right after a restart, the stream may begin anywhere.
    if (anchored_ && next_expected_ && seq - *next_expected_ >= options_.max_seq_jump &&
        seq > *next_expected_) {
      {
        MutexLock lock(&mu_);
        ++stats_.absurd_sequences;
      }
      Restart(seq, *next_expected_,
              "sequence jumped from " + std::to_string(*next_expected_) + " to " +
                  std::to_string(seq) + " (>= max_seq_jump " +
                  std::to_string(options_.max_seq_jump) + "): treated as a new stream");
      next_expected_ = seq;
    }
    if (after_silence && !after_replay && !restarted && next_expected_ && *next_expected_ > 0 &&
        seq == *next_expected_ && dealer_.handle() != nullptr && DigestOf(seq - 1)) {
      // The publisher may have restarted during the silence: check the last batch first.
      held_live_ = std::move(frames);
      return StartReplay(*next_expected_, ReplayPurpose::kVerify);
    }
    if (next_expected_ && seq > *next_expected_) {
      if (dealer_.handle() != nullptr && (!after_replay || restarted)) {
        held_live_ = std::move(frames);
        return StartReplay(*next_expected_, ReplayPurpose::kGap);
      }
      Lost(*next_expected_, seq,
           dealer_.handle() == nullptr ? "no replay endpoint"
           : last_replay_failed_       ? "the replay failed"
                                       : "replay did not cover it");
    }
    Deliver(seq, frames[0].to_string_view(), payload, false);
    return Status::Ok();
  }

  // Nothing arrived live for a while: ask from the last delivered batch. A lost tail comes back;
  // the answer for that batch is checked against what was delivered (a restarted publisher that
  // overtook the old sequence serves another batch there); no answer at all means the publisher
  // lost its buffer (restart without journal). Needs buffer_steps >= 1, as every vLLM default.
  Status Probe() { return StartReplay(*next_expected_, ReplayPurpose::kProbe); }

  // Asks for a replay that continues the stream at `from`.
  Status StartReplay(uint64_t from, ReplayPurpose purpose) {
    {
      MutexLock lock(&mu_);
      ++stats_.replay_requests;
    }
    // Gap and probe replays ask from the last delivered batch: its answer is checked.
    uint64_t ask = from;
    if ((purpose == ReplayPurpose::kGap || purpose == ReplayPurpose::kProbe ||
         purpose == ReplayPurpose::kVerify) &&
        from > 0) {
      ask = from - 1;
    }
    try {
      std::string start = zmq_util::BigEndian64(ask);
      dealer_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
      dealer_.send(zmq::buffer(start), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      return zmq_util::ZmqError("replay request to '" + *options_.replay_endpoint + "'", e);
    }
    ReplayState r;
    r.asked = ask;
    r.expected_at_start = from;
    r.filled_from = from;
    r.purpose = purpose;
    r.started_ns = r.last_frame_ns = clock_->MonotonicNanos();
    replay_ = r;
    return Status::Ok();
  }

  // Reads the current reply until a batch is ready, the reply ends, or `deadline`.
  // *woken: the wake descriptor (SubscriberOptions::wake_fd) became readable while it waited: it
  // returns at once (a stop does not wait out the replay's timeout).
  Status PumpReplay(int64_t deadline, bool* woken) {
    if (replay_->yielded) {
      replay_->yielded = false;
      replay_->last_frame_ns = clock_->MonotonicNanos();
    }
    while (replay_ && ready_.empty()) {
      Frames frames;
      try {
        if (zmq::recv_multipart(dealer_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          replay_->last_frame_ns = clock_->MonotonicNanos();
          if (replay_->last_frame_ns - replay_->started_ns >= options_.replay_max_ms * 1'000'000) {
            return AbandonReplay("the reply took longer than " +
                                 std::to_string(options_.replay_max_ms) + " ms");
          }
          KVO_RETURN_IF_ERROR(HandleReplayFrames(frames));
          continue;
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        return zmq_util::ZmqError("replay request to '" + *options_.replay_endpoint + "'", e);
      }
      int64_t now = clock_->MonotonicNanos();
      int64_t frame_deadline = replay_->last_frame_ns + options_.replay_timeout_ms * 1'000'000;
      int64_t total_deadline = replay_->started_ns + options_.replay_max_ms * 1'000'000;
      if (now >= total_deadline) {
        return AbandonReplay("the reply took longer than " +
                             std::to_string(options_.replay_max_ms) + " ms");
      }
      if (now >= frame_deadline) {
        return AbandonReplay("replay timed out after " +
                             std::to_string(options_.replay_timeout_ms) + " ms");
      }
      if (now >= deadline) return Status::Ok();
      try {
        zmq::pollitem_t items[2] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                                    {nullptr, options_.wake_fd, ZMQ_POLLIN, 0}};
        int64_t wait = std::min({deadline, frame_deadline, total_deadline}) - now;
        zmq::poll(items, options_.wake_fd >= 0 ? 2 : 1, std::chrono::milliseconds(PollMs(wait)));
        if (items[1].revents & ZMQ_POLLIN) {
          *woken = true;
          return Status::Ok();
        }
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) {
          return zmq_util::ZmqError("replay request to '" + *options_.replay_endpoint + "'", e);
        }
      }
    }
    if (replay_ && !ready_.empty()) replay_->yielded = true;
    return Status::Ok();
  }

  // A frame that does not advance the reply; too many of them end it.
  Status IdleFrame() {
    if (++replay_->idle_frames > kMaxIdleFramesPerReply) {
      return AbandonReplay("more than " + std::to_string(kMaxIdleFramesPerReply) +
                           " frames that do not advance the stream");
    }
    return Status::Ok();
  }

  Status HandleReplayFrames(const Frames& frames) {
    const zmq_util::ReplayReply reply = zmq_util::ParseReplayReply(Views(frames));
    if (reply.kind == zmq_util::ReplayReply::Kind::kEnd) return FinishReplay();
    if (reply.kind == zmq_util::ReplayReply::Kind::kMalformed) {
      {
        MutexLock lock(&mu_);
        ++stats_.malformed_messages;
      }
      return IdleFrame();
    }
    const bool with_topic = reply.with_topic;
    std::string_view topic = reply.topic;
    const std::string_view payload = reply.payload;
    const uint64_t seq = reply.seq;
    if (with_topic && !topic.starts_with(options_.topic)) return IdleFrame();  // as SUB does
    const bool first = replay_->batches == 0;
    ++replay_->batches;
    {
      MutexLock lock(&mu_);
      ++stats_.replayed_received;
    }
    if (next_expected_ && seq < *next_expected_) {
      std::optional<uint64_t> known = DigestOf(seq);
      if (known && *known != zmq_util::PayloadDigest(payload)) {
        // The publisher serves another batch under a seq already delivered: it restarted.
        uint64_t old_next = *next_expected_;
        KVO_RETURN_IF_ERROR(DropReply());
        Restart(seq, old_next,
                "replay serves a different batch for seq " + std::to_string(seq) +
                    " than the one delivered");
        next_expected_ = 0;
        // The live message this replay ran for was received before the restart replay is asked
        // for: from the old stream, or from the new one and then covered by that replay.
        held_live_.reset();
        return StartReplay(0, ReplayPurpose::kRestart);
      }
      if (!(first && seq == replay_->asked)) {  // the asked-for overlap is expected
        MutexLock lock(&mu_);
        ++stats_.duplicates_dropped;
      }
      return IdleFrame();
    }
    uint64_t expected = next_expected_ ? *next_expected_ : replay_->asked;
    // Not for a stream not yet anchored: a replay from 0 or from a checkpoint begins where the
    // publisher's buffer begins, which after 10^6 batches is that far ahead (vLLM keeps the last
    // 10 000); what lies before is reported lost below.
    if (anchored_ && seq - expected >= options_.max_seq_jump && seq > expected) {
      {
        MutexLock lock(&mu_);
        ++stats_.absurd_sequences;
      }
      return AbandonReplay("the reply jumped from seq " + std::to_string(expected) + " to " +
                           std::to_string(seq));
    }
    if (seq > expected) {
      // The run supplied so far is filled; the hole is not (gap_filled and gap_unrecoverable
      // never overlap: a consumer may sum them).
      ReportFilled(expected);
      replay_->filled_from = seq;
      // vLLM sends no signal when the publisher no longer holds what was asked for.
      Lost(expected, seq,
           first ? "replay could not reach back far enough"
                 : "hole in the publisher's replay buffer");
    }
    if (!with_topic) topic = options_.topic;
    Deliver(seq, topic, payload, true);
    return Status::Ok();
  }

  // Stale replies to an abandoned request must not confuse the next one: a fresh socket.
  Status DropReply() {
    replay_.reset();
    return OpenDealer();
  }

  Status AbandonReplay(std::string why) {
    uint64_t asked = replay_->asked;
    {
      MutexLock lock(&mu_);
      ++stats_.replay_failures;
    }
    KVO_RETURN_IF_ERROR(DropReply());
    Notice(NoticeKind::kReplayFailed, asked, asked, std::move(why));
    last_replay_failed_ = true;
    return AfterReplay();
  }

  Status FinishReplay() {
    ReplayState r = *replay_;
    replay_.reset();
    last_replay_failed_ = false;
    if (r.purpose == ReplayPurpose::kProbe && r.batches == 0 && next_expected_ &&
        *next_expected_ > 0) {
      uint64_t last = *next_expected_ - 1;
      Restart(0, last + 1,
              "the publisher no longer holds seq " + std::to_string(r.asked) +
                  " and has nothing newer");
      next_expected_ = 0;
      return StartReplay(0, ReplayPurpose::kRestart);
    }
    if (next_expected_) ReportFilled(*next_expected_, &r);
    return AfterReplay();
  }

  // A gap replay supplied [filled_from, to): reported as filled (the gap counted once per reply).
  void ReportFilled(uint64_t to, ReplayState* r = nullptr) {
    if (r == nullptr) r = &*replay_;
    if (r->purpose != ReplayPurpose::kGap || to <= r->filled_from) return;
    if (!r->filled_any) {
      MutexLock lock(&mu_);
      ++stats_.gaps_filled;
    }
    r->filled_any = true;
    Notice(NoticeKind::kGapFilled, r->filled_from, to, "replayed");
  }

  // The live message that waited for the replay, if any, now goes through.
  Status AfterReplay() {
    if (!held_live_) return Status::Ok();
    Frames held = std::move(*held_live_);
    held_live_.reset();
    return HandleLive(std::move(held), true);
  }

  // Immutable after construction.
  const SubscriberOptions options_;
  Clock* const clock_;

  // Owned by the thread calling Next().
  zmq::socket_t sub_;
  zmq::socket_t dealer_;
  std::deque<ReceivedBatch> ready_;
  std::vector<SubscriberNotice> notices_;
  std::optional<uint64_t> next_expected_;  // the seq that continues the stream
  // A batch was delivered since the start or the last restart: next_expected_ comes from the
  // stream itself, not from start_seq or a restart's 0.
  bool anchored_ = false;
  // Ranges reported lost since the last restart, newest last (bounded).
  struct LostRange {
    uint64_t from = 0, to = 0;
    int64_t reported_ns = 0;
  };
  static constexpr size_t kMaxLostRanges = 64;
  static constexpr int64_t kLateWindowNs = 1'000'000'000;
  std::deque<LostRange> lost_ranges_;
  std::optional<ReplayState> replay_;  // the replay being answered
  std::optional<Frames> held_live_;    // the live message a gap replay runs for
  bool last_replay_failed_ = false;
  std::deque<uint64_t> digests_;  // digests_[i]: the batch delivered for seq digest_base_ + i
  uint64_t digest_base_ = 0;
  int64_t last_live_ns_ = 0;     // last live message or probe
  int64_t last_message_ns_ = 0;  // last live message

  mutable Mutex mu_;
  SubscriberStats stats_ GUARDED_BY(mu_);
};

}  // namespace

Result<std::unique_ptr<Subscriber>> Subscriber::Create(const SubscriberOptions& options,
                                                       Clock* clock) {
  KVO_RETURN_IF_ERROR(ValidateEndpoint(options.endpoint, "subscriber endpoint"));
  if (options.replay_endpoint) {
    KVO_RETURN_IF_ERROR(ValidateEndpoint(*options.replay_endpoint, "subscriber replay endpoint"));
  }
  auto sub = std::make_unique<ZmqSubscriber>(options, clock != nullptr ? clock : SystemClock());
  KVO_RETURN_IF_ERROR(sub->Start());
  return std::unique_ptr<Subscriber>(std::move(sub));
}

}  // namespace kvo
