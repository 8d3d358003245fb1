// ZeroMQ adapter for the subscriber: cppzmq exceptions stop in this file.
#include "events/zmq_subscriber.h"

#include <zmq_addon.hpp>

#include <atomic>
#include <deque>
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
  }
  return "unknown";
}

namespace {

using Frames = std::vector<zmq::message_t>;

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
      if (options_.bind) {
        sub_.bind(options_.endpoint);
      } else {
        sub_.connect(options_.endpoint);
      }
    } catch (const zmq::error_t& e) {
      return zmq_util::ZmqError("subscriber on '" + options_.endpoint + "'", e);
    }
    KVO_RETURN_IF_ERROR(OpenDealer());
    last_live_ns_ = clock_->MonotonicNanos();
    if (options_.start_seq) {
      next_expected_ = *options_.start_seq;
      if (options_.replay_endpoint) KVO_RETURN_IF_ERROR(Replay(*options_.start_seq));
    }
    return Status::Ok();
  }

  Result<std::optional<ReceivedBatch>> Next(std::chrono::milliseconds timeout) override {
    const int64_t deadline = clock_->MonotonicNanos() + timeout.count() * 1'000'000;
    while (ready_.empty()) {
      // Fast path: take a message that is already queued, without a poll() per message.
      try {
        Frames queued;
        if (zmq::recv_multipart(sub_, std::back_inserter(queued), zmq::recv_flags::dontwait)) {
          last_live_ns_ = clock_->MonotonicNanos();
          KVO_RETURN_IF_ERROR(HandleLive(queued));
          continue;
        }
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return zmq_util::ZmqError("subscriber receive", e);
      }
      int64_t now = clock_->MonotonicNanos();
      if (now >= deadline && timeout.count() >= 0) return std::optional<ReceivedBatch>();
      int64_t wait_ns = deadline - now;
      bool probe = dealer_.handle() != nullptr && options_.idle_probe_ms > 0 && next_expected_;
      int64_t probe_at = last_live_ns_ + options_.idle_probe_ms * 1'000'000;
      if (probe) wait_ns = std::min(wait_ns, std::max<int64_t>(0, probe_at - now));
      Frames frames;
      try {
        zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds((wait_ns + 999'999) / 1'000'000));
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
        last_live_ns_ = clock_->MonotonicNanos();
        KVO_RETURN_IF_ERROR(HandleLive(frames));
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
  Status OpenDealer() {
    if (!options_.replay_endpoint) return Status::Ok();
    try {
      if (dealer_.handle() != nullptr) dealer_.close();
      dealer_ = zmq::socket_t(zmq_util::GlobalContext(), zmq::socket_type::dealer);
      dealer_.set(zmq::sockopt::linger, 0);
      dealer_.set(zmq::sockopt::rcvhwm, 0);
      dealer_.set(zmq::sockopt::maxmsgsize,
                  static_cast<int64_t>(options_.limits.max_payload_bytes));
      dealer_.connect(*options_.replay_endpoint);
    } catch (const zmq::error_t& e) {
      return zmq_util::ZmqError("replay client on '" + *options_.replay_endpoint + "'", e);
    }
    return Status::Ok();
  }

  void Notice(NoticeKind kind, uint64_t from, uint64_t to, std::string detail) {
    KVO_LOG_WARN("kv-events subscriber {}: {} [{}, {}) {}", options_.endpoint, NoticeKindName(kind),
                 from, to, detail);
    notices_.push_back(SubscriberNotice{kind, from, to, std::move(detail)});
  }

  void Lost(uint64_t from, uint64_t to, std::string why) {
    {
      MutexLock lock(&mu_);
      stats_.batches_lost += to - from;
    }
    Notice(NoticeKind::kGapUnrecoverable, from, to, std::move(why));
  }

  // Decodes and queues one batch in order. A payload that does not decode is skipped, counted
  // and reported; its seq still counts as seen.
  void Deliver(uint64_t seq, std::string_view topic, std::string_view payload, bool replayed) {
    next_expected_ = seq + 1;
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

  Status HandleLive(const Frames& frames) {
    std::vector<std::string_view> views;
    for (const zmq::message_t& f : frames) views.push_back(f.to_string_view());
    const std::optional<uint64_t> live_seq = zmq_util::ParseLiveSeq(views);
    if (!live_seq) {
      {
        MutexLock lock(&mu_);
        ++stats_.malformed_messages;
      }
      Notice(
          NoticeKind::kMalformedMessage, 0, 0,
          "live message with " + std::to_string(frames.size()) + " frames" +
              (frames.size() >= 2 ? ", seq frame of " + std::to_string(frames[1].size()) + " bytes"
                                  : std::string()));
      return Status::Ok();
    }
    const uint64_t seq = *live_seq;
    {
      MutexLock lock(&mu_);
      ++stats_.live_received;
    }
    // Live messages queued while a replay delivered the same batches are duplicates.
    if (dup_window_end_ && seq <= *dup_window_end_ && next_expected_ && seq < *next_expected_) {
      MutexLock lock(&mu_);
      ++stats_.duplicates_dropped;
      return Status::Ok();
    }
    dup_window_end_.reset();
    if (next_expected_ && seq < *next_expected_) {
      {
        MutexLock lock(&mu_);
        ++stats_.restarts;
      }
      Notice(NoticeKind::kPublisherRestart, seq, *next_expected_,
             "sequence went back from " + std::to_string(*next_expected_ - 1) + " to " +
                 std::to_string(seq));
      next_expected_ = 0;
    }
    if (next_expected_ && seq > *next_expected_) {
      uint64_t from = *next_expected_;
      if (dealer_.handle() != nullptr) {
        KVO_RETURN_IF_ERROR(Replay(from));
        if (*next_expected_ > from) {
          MutexLock lock(&mu_);
          ++stats_.gaps_filled;
        }
        if (*next_expected_ > seq) return Status::Ok();  // the replay covered this message
        if (*next_expected_ > from) {
          notices_.push_back(SubscriberNotice{NoticeKind::kGapFilled, from, *next_expected_, ""});
        }
      }
      if (seq > *next_expected_) {
        Lost(*next_expected_, seq,
             dealer_.handle() == nullptr ? "no replay endpoint" : "replay did not cover it");
      }
    }
    Deliver(seq, frames[0].to_string_view(), frames[2].to_string_view(), false);
    return Status::Ok();
  }

  // Nothing arrived live for a while. Ask for everything from the last batch we hold: a lost tail
  // comes back; and when even that batch is gone while nothing newer exists (an empty reply), the
  // publisher restarted and lost its buffer: replay its new stream from 0. (Needs buffer_steps >=
  // 1, as every vLLM default has.)
  Status Probe() {
    if (*next_expected_ == 0) return Replay(0);
    uint64_t before = replayed_batches_;
    uint64_t last = *next_expected_ - 1;
    KVO_RETURN_IF_ERROR(Replay(last));
    if (replayed_batches_ == before && last_replay_completed_) {
      {
        MutexLock lock(&mu_);
        ++stats_.restarts;
      }
      Notice(
          NoticeKind::kPublisherRestart, 0, last + 1,
          "the publisher no longer holds seq " + std::to_string(last) + " and has nothing newer");
      next_expected_ = 0;
      return Replay(0);
    }
    return Status::Ok();
  }

  // Asks the ROUTER for every batch >= from and delivers those after next_expected_, until the end
  // marker. Accepts [seq, payload] (vLLM <= 0.25) and [topic, seq, payload] replies.
  Status Replay(uint64_t from) {
    {
      MutexLock lock(&mu_);
      ++stats_.replay_requests;
    }
    last_replay_completed_ = false;
    try {
      std::string start = zmq_util::BigEndian64(from);
      dealer_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
      dealer_.send(zmq::buffer(start), zmq::send_flags::none);
      bool first = true;
      while (true) {
        zmq::pollitem_t item{dealer_.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(options_.replay_timeout_ms));
        if (!(item.revents & ZMQ_POLLIN)) {
          // Stale replies to this request must not confuse the next one: start a fresh socket.
          KVO_RETURN_IF_ERROR(OpenDealer());
          Notice(NoticeKind::kGapUnrecoverable, from, from,
                 "replay timed out after " + std::to_string(options_.replay_timeout_ms) + " ms");
          break;
        }
        Frames frames;
        if (!zmq::recv_multipart(dealer_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          continue;
        }
        std::vector<std::string_view> views;
        for (const zmq::message_t& f : frames) views.push_back(f.to_string_view());
        const zmq_util::ReplayReply reply = zmq_util::ParseReplayReply(views);
        if (reply.kind == zmq_util::ReplayReply::Kind::kEnd) {
          last_replay_completed_ = true;
          break;
        }
        if (reply.kind == zmq_util::ReplayReply::Kind::kMalformed) {
          MutexLock lock(&mu_);
          ++stats_.malformed_messages;
          continue;
        }
        const bool with_topic = reply.with_topic;
        std::string_view topic = reply.topic;
        const std::string_view payload = reply.payload;
        const uint64_t seq = reply.seq;
        if (with_topic && !topic.starts_with(options_.topic)) continue;  // as SUB filtering does
        ++replayed_batches_;
        {
          MutexLock lock(&mu_);
          ++stats_.replayed_received;
        }
        bool was_first = first;
        first = false;
        if (next_expected_ && seq < *next_expected_) {
          MutexLock lock(&mu_);
          ++stats_.duplicates_dropped;
          continue;
        }
        uint64_t expected = next_expected_ ? *next_expected_ : from;
        if (seq > expected) {
          // vLLM sends no signal when the publisher no longer holds what was asked for.
          Lost(expected, seq,
               was_first ? "replay could not reach back far enough"
                         : "hole in the publisher's replay buffer");
        }
        if (!with_topic) topic = options_.topic;
        Deliver(seq, topic, payload, true);
      }
    } catch (const zmq::error_t& e) {
      return zmq_util::ZmqError("replay request to '" + *options_.replay_endpoint + "'", e);
    }
    if (next_expected_) dup_window_end_ = *next_expected_ - 1;
    return Status::Ok();
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
  std::optional<uint64_t> dup_window_end_;
  uint64_t replayed_batches_ = 0;       // batches received from replay replies, ever
  bool last_replay_completed_ = false;  // the last replay ended with the end marker
  int64_t last_live_ns_ = 0;

  mutable Mutex mu_;
  SubscriberStats stats_ GUARDED_BY(mu_);
};

}  // namespace

Result<std::unique_ptr<Subscriber>> Subscriber::Create(const SubscriberOptions& options,
                                                       Clock* clock) {
  if (options.endpoint.empty()) return Status::InvalidArgument("subscriber: empty endpoint");
  auto sub = std::make_unique<ZmqSubscriber>(options, clock != nullptr ? clock : SystemClock());
  KVO_RETURN_IF_ERROR(sub->Start());
  return std::unique_ptr<Subscriber>(std::move(sub));
}

}  // namespace kvo
