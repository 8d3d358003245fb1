// ZeroMQ adapter for the publisher: cppzmq exceptions stop in this file.
#include "events/zmq_publisher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <thread>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/repeat_filter.h"
#include "events/zmq_util.h"

#include <zmq_addon.hpp>

namespace kvo {
namespace {

using zmq_util::BigEndian64;

class NullPublisher final : public EventPublisher {
 public:
  Status Publish(EventBatch) override { return Status::Ok(); }
  void Flush() override {}
  void Shutdown() override {}
  std::optional<KvEventsConfig> publisher_config() const override { return std::nullopt; }
  PublisherStats stats() const override { return {}; }
};

struct RingEntry {
  uint64_t seq = 0;
  std::string payload;
};

// One client's replay in progress: batches [next_seq, end_seq] then the end marker. Served a few
// messages at a time so a long replay (from the journal) never stalls live publishing.
struct ReplaySession {
  std::string identity;
  uint64_t next_seq = 0;
  std::optional<uint64_t> end_seq;  // nullopt: nothing was published yet; send only the marker
  std::unique_ptr<JournalReader> reader;
  std::optional<RingEntry> pending;  // read but not yet sent (the client's queue was full)
};

class ZmqPublisher final : public EventPublisher {
 public:
  ZmqPublisher(KvEventsConfig config, int64_t rank, Clock* clock, Journal* journal,
               std::unique_ptr<Journal> owned_journal)
      : config_(std::move(config)),
        rank_(rank),
        clock_(clock),
        journal_(journal != nullptr ? journal : owned_journal.get()),
        owned_journal_(std::move(owned_journal)),
        encode_options_{config_.encoding == "array" ? EventEncoding::kArray : EventEncoding::kMap} {
  }

  ~ZmqPublisher() override {
    Shutdown();
    // Closed here, not in Shutdown: a Publish that enqueued before Shutdown and wakes the consumer
    // after it must write to this eventfd, not to a closed descriptor or one reused meanwhile.
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Status Start() {
    try {
      pub_ = zmq::socket_t(zmq_util::GlobalContext(), zmq::socket_type::pub);
      pub_.set(zmq::sockopt::sndhwm, static_cast<int>(config_.hwm));
      pub_.set(zmq::sockopt::rcvhwm, static_cast<int>(config_.hwm));
      pub_.set(zmq::sockopt::linger, 0);
      if (ShouldBind(config_.endpoint)) {
        pub_.bind(config_.endpoint);
        if (BindsBeyondLoopback(config_.endpoint)) {
          KVO_LOG_WARN(
              "kv-events publisher binds {} beyond loopback: anyone who can reach this "
              "host can read the cache's events",
              config_.endpoint);
        }
      } else {
        pub_.connect(config_.endpoint);
      }
      if (config_.replay_endpoint && !config_.replay_endpoint->empty()) {
        router_ = zmq::socket_t(zmq_util::GlobalContext(), zmq::socket_type::router);
        router_.set(zmq::sockopt::linger, 0);
        // Sends to a peer whose queue is full fail with EAGAIN instead of dropping silently, so
        // a replay resumes where it stopped.
        router_.set(zmq::sockopt::router_mandatory, 1);
        router_.bind(*config_.replay_endpoint);
        if (BindsBeyondLoopback(*config_.replay_endpoint)) {
          KVO_LOG_WARN("kv-events replay socket binds {} beyond loopback",
                       *config_.replay_endpoint);
        }
      }
    } catch (const zmq::error_t& e) {
      return zmq_util::ZmqError("kv-events publisher on '" + config_.endpoint + "'", e);
    }
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status::IOError("eventfd failed");
    if (journal_ != nullptr) {
      // Past every journaled seq, and past every seq a run before published unjournaled.
      MutexLock lock(&mu_);
      next_seq_ = journal_->seq_floor();
    }
    thread_ = std::thread([this] { Run(); });
    pthread_setname_np(thread_.native_handle(), "zmq-publisher");
    return Status::Ok();
  }

  Status Publish(EventBatch batch) override {
    if (!batch.data_parallel_rank) batch.data_parallel_rank = rank_;
    bool wake = false;
    {
      MutexLock lock(&mu_);
      if (closed_) return Status::FailedPrecondition("Publisher is closed");
      while (config_.max_queue_size > 0 &&
             queue_.size() >= static_cast<size_t>(config_.max_queue_size) && !closed_) {
        space_cv_.Wait();
      }
      if (closed_) return Status::FailedPrecondition("Publisher is closed");
      queue_.push_back(std::move(batch));
      ++enqueued_;
      if (consumer_sleeping_) {
        consumer_sleeping_ = false;
        wake = true;
      }
    }
    if (wake) Wake();
    return Status::Ok();
  }

  void Flush() override {
    MutexLock lock(&mu_);
    uint64_t target = enqueued_;
    while (processed_ < target && thread_running_) done_cv_.Wait();
  }

  void Shutdown() override {
    // Two Shutdowns at once (an engine's teardown and the destructor) would both join the thread.
    MutexLock serial(&shutdown_mu_);
    {
      MutexLock lock(&mu_);
      if (closed_ && !thread_.joinable()) return;
      closed_ = true;
    }
    space_cv_.SignalAll();
    Wake();
    if (thread_.joinable()) thread_.join();
    try {
      pub_.close();
      router_.close();
    } catch (const zmq::error_t& e) {
      KVO_LOG_WARN("kv-events publisher close: {}", e.what());
    }
    if (journal_ != nullptr) {
      Status s = journal_->Sync();
      if (!s.ok()) KVO_LOG_ERROR("kv-events journal sync at shutdown: {}", s.ToString());
    }
  }

  std::optional<KvEventsConfig> publisher_config() const override { return config_; }

  PublisherStats stats() const override {
    MutexLock lock(&mu_);
    PublisherStats s = stats_;
    s.next_seq = next_seq_;
    return s;
  }

 private:
  static constexpr int kReplayMessagesPerTurn = 256;
  // Replies in progress at once, per client and in all. Each holds a batch copy and, reading the
  // journal, an open file: a client that sends requests and never reads must not grow them
  // without bound, nor take every slot from the others. A real subscriber asks one at a time; a
  // refused one times out and asks again.
  static constexpr size_t kMaxReplaySessionsPerClient = 8;
  static constexpr size_t kMaxReplaySessions = 256;
  static constexpr auto kShutdownDrain = std::chrono::seconds(1);

  void Wake() {
    if (wake_fd_ < 0) return;
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_, &one, sizeof one);
    (void)n;  // EAGAIN means the counter is already non-zero: the consumer will wake.
  }

  void Run() {
    std::deque<EventBatch> work;
    int64_t drain_deadline = 0;
    while (true) {
      bool stopping;
      {
        MutexLock lock(&mu_);
        work.swap(queue_);
        stopping = closed_;
        if (work.empty() && !stopping) consumer_sleeping_ = true;
      }
      if (!work.empty()) space_cv_.SignalAll();
      if (stopping) {
        if (drain_deadline == 0) {
          drain_deadline =
              clock_->MonotonicNanos() + std::chrono::nanoseconds(kShutdownDrain).count();
        }
        if (clock_->MonotonicNanos() > drain_deadline && !work.empty()) {
          KVO_LOG_WARN("kv-events publisher: dropping {} queued batches at shutdown", work.size());
          work.clear();
        }
      }
      if (!work.empty()) PublishRun(work);
      if (!work.empty()) {
        MutexLock lock(&mu_);
        processed_ += work.size();
        done_cv_.SignalAll();
      }
      work.clear();
      ServeReplay();
      if (stopping) {
        MutexLock lock(&mu_);
        if (queue_.empty()) break;
        continue;
      }
      WaitForWork();
    }
    MutexLock lock(&mu_);
    thread_running_ = false;
    done_cv_.SignalAll();
  }

  // Sleeps until a batch is queued, a replay request arrives, or a blocked replay can continue.
  void WaitForWork() {
    bool sleeping;
    {
      MutexLock lock(&mu_);
      sleeping = consumer_sleeping_;
    }
    bool replay_ready = !sessions_.empty() && !replay_blocked_;
    zmq::pollitem_t items[2] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0},
                                {router_.handle(), 0, ZMQ_POLLIN, 0}};
    int n_items = router_.handle() != nullptr ? 2 : 1;
    // A replay blocked by a full client queue is retried after 1 ms (ROUTER's POLLOUT does not
    // say which peer can take more). The 1 s timeout is only a safety net.
    long timeout_ms = (!sleeping || replay_ready) ? 0 : (replay_blocked_ ? 1 : 1000);
    replay_blocked_ = false;
    try {
      zmq::poll(items, n_items, std::chrono::milliseconds(timeout_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) KVO_LOG_WARN("kv-events publisher poll: {}", e.what());
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t value;
      ssize_t r = ::read(wake_fd_, &value, sizeof value);
      (void)r;
    }
    MutexLock lock(&mu_);
    consumer_sleeping_ = false;
  }

  // Encodes a run of queued batches, journals them and hands the journal's bytes to the OS (one
  // write for the run), then sends them: a batch is never on the wire before it is in the journal,
  // so a restart cannot reuse a sequence number a subscriber has seen. When the journal cannot be
  // written (a full or failing disk) the run is still sent, as vLLM (which has no journal) would,
  // but only after the journal's sequence floor is raised past it: a restart then resumes past
  // these seqs, and a subscriber sees them as lost, never as batches it already applied.
  void PublishRun(std::deque<EventBatch>& work) {
    uint64_t first_seq;
    {
      MutexLock lock(&mu_);
      first_seq = next_seq_;
      next_seq_ += work.size();
    }
    payloads_.resize(work.size());
    for (size_t i = 0; i < work.size(); ++i) {
      payloads_[i].clear();
      EncodeBatchTo(work[i], &payloads_[i], encode_options_);
    }
    if (journal_ != nullptr) {
      Status s;
      for (size_t i = 0; i < work.size() && s.ok(); ++i)
        s = journal_->Append(first_seq + i, payloads_[i]);
      if (s.ok()) s = journal_->Flush();
      if (!s.ok()) {
        const uint64_t end = first_seq + work.size();
        Status floor = journal_->RaiseSeqFloor(end);
        {
          MutexLock lock(&mu_);
          ++stats_.journal_errors;
          if (!floor.ok()) ++stats_.journal_floor_errors;
        }
        // One line per distinct failure, then the 2nd, 4th, ... of a run: a full disk fails
        // every run until the process restarts.
        std::string why = s.ToString();
        if (!floor.ok()) {
          why +=
              "; the sequence floor could not be raised either, so a restart may reuse these "
              "seqs: " +
              floor.ToString();
        }
        if (RepeatFilter::Decision d = journal_log_.Note(why); d.log) {
          KVO_LOG_ERROR(
              "kv-events journal append of seqs {}..{} failed; published unjournaled: {}{}",
              first_seq, end - 1, why, d.Describe());
        }
      }
    }
    for (size_t i = 0; i < work.size(); ++i) {
      SendBatch(work[i], first_seq + i, std::move(payloads_[i]));
    }
  }

  void SendBatch(const EventBatch& batch, uint64_t seq, std::string payload) {
    std::string seq_bytes = BigEndian64(seq);
    bool sent = false;
    try {
      pub_.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore);
      pub_.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      pub_.send(zmq::buffer(payload), zmq::send_flags::none);
      sent = true;
    } catch (const zmq::error_t& e) {
      KVO_LOG_ERROR("kv-events publisher send of seq {} failed: {}", seq, e.what());
    }
    MutexLock lock(&mu_);
    if (!sent) {
      ++stats_.send_errors;  // as vLLM: the sequence number is consumed, the batch not buffered
      return;
    }
    ++stats_.batches_published;
    stats_.block_events_published += CountBlockEvents(batch);
    if (config_.buffer_steps > 0) {
      if (ring_.size() >= static_cast<size_t>(config_.buffer_steps)) ring_.pop_front();
      ring_.push_back(RingEntry{seq, std::move(payload)});
    }
  }

  // Reads every pending replay request, then sends up to kReplayMessagesPerTurn per session.
  void ServeReplay() {
    if (router_.handle() == nullptr) return;
    try {
      while (true) {
        std::vector<zmq::message_t> frames;
        auto got =
            zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait);
        if (!got) break;
        StartSession(frames);
      }
    } catch (const zmq::error_t& e) {
      KVO_LOG_WARN("kv-events replay receive: {}", e.what());
    }
    // A client whose queue is full blocks only its own session: the others carry on (one slow
    // or stalled client must not starve every other replay). replay_blocked_ ends up true only
    // when every session is blocked.
    bool all_blocked = !sessions_.empty();
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      replay_blocked_ = false;
      if (ContinueSession(*it)) {
        it = sessions_.erase(it);
        all_blocked = false;
      } else {
        if (!replay_blocked_) all_blocked = false;
        ++it;
      }
    }
    replay_blocked_ = all_blocked;
  }

  void StartSession(std::vector<zmq::message_t>& frames) {
    MutexLock lock(&mu_);
    ++stats_.replay_requests;
    if (frames.size() != 3 || !frames[1].empty()) {
      ++stats_.invalid_replay_requests;
      const std::string why = std::to_string(frames.size()) + " frames";
      if (RepeatFilter::Decision d = invalid_log_.Note(why); d.log) {
        KVO_LOG_WARN("Invalid replay request: {}{}", why, d.Describe());
      }
      return;  // as vLLM: no reply at all
    }
    ReplaySession session;
    session.identity = frames[0].to_string();
    const size_t mine = static_cast<size_t>(
        std::count_if(sessions_.begin(), sessions_.end(),
                      [&](const ReplaySession& s) { return s.identity == session.identity; }));
    if (mine >= kMaxReplaySessionsPerClient || sessions_.size() >= kMaxReplaySessions) {
      ++stats_.replay_requests_refused;
      const std::string why = mine >= kMaxReplaySessionsPerClient
                                  ? "its client has " + std::to_string(mine) + " in progress"
                                  : std::to_string(sessions_.size()) + " in progress in all";
      if (RepeatFilter::Decision d = refused_log_.Note(why); d.log) {
        KVO_LOG_WARN("kv-events replay request refused: {}{}", why, d.Describe());
      }
      return;  // no reply, as for an invalid request
    }
    session.next_seq = zmq_util::FromBigEndian(frames[2].to_string_view());
    if (next_seq_ > 0) session.end_seq = next_seq_ - 1;
    sessions_.push_back(std::move(session));
  }

  // Sends the next messages of `s`. Returns true when the session is finished (or abandoned).
  bool ContinueSession(ReplaySession& s) {
    for (int sent = 0; sent < kReplayMessagesPerTurn; ++sent) {
      if (!s.end_seq || s.next_seq > *s.end_seq) {
        return SendReplayFrames(s, "", zmq_util::kEndSeq, "") != SendResult::kBlocked;
      }
      if (!s.pending) {
        RingEntry next;
        if (!NextReplayBatch(s, &next.seq, &next.payload)) {
          s.end_seq.reset();  // nothing left in ring or journal up to end_seq
          continue;
        }
        s.pending = std::move(next);
      }
      uint64_t seq = s.pending->seq;
      SendResult r = SendReplayFrames(s, config_.topic, BigEndian64(seq), s.pending->payload);
      if (r == SendResult::kBlocked) return false;
      s.pending.reset();
      if (r == SendResult::kGone) return true;
      s.next_seq = seq + 1;
      MutexLock lock(&mu_);
      ++stats_.replay_batches_sent;
    }
    return false;
  }

  // The first batch with seq >= s.next_seq (and <= end_seq): from the ring when it still holds
  // it, else from the journal; without a journal a replay silently starts at the ring's oldest
  // batch, as vLLM does (the client sees the first seq it gets and knows).
  bool NextReplayBatch(ReplaySession& s, uint64_t* seq, std::string* payload) {
    {
      MutexLock lock(&mu_);
      bool in_ring = !ring_.empty() && s.next_seq >= ring_.front().seq;
      if (in_ring || journal_ == nullptr) {
        // Caught up into the ring: the journal reader's position is stale from here on (if the
        // ring rolls past this session later, it reads the journal again from next_seq; the old
        // reader resent what lay between).
        s.reader.reset();
        auto it = std::lower_bound(ring_.begin(), ring_.end(), s.next_seq,
                                   [](const RingEntry& e, uint64_t v) { return e.seq < v; });
        if (it == ring_.end() || it->seq > *s.end_seq) return false;
        *seq = it->seq;
        *payload = it->payload;
        return true;
      }
    }
    // A reader sees the journal as it was when opened; at its end, one fresh reader picks up what
    // was appended since, before falling back to the ring.
    JournalRecord record;
    for (int attempt = 0;; ++attempt) {
      bool fresh = !s.reader;
      if (fresh) {
        auto reader = journal_->NewReader(s.next_seq);
        if (!reader.ok()) {
          KVO_LOG_ERROR("kv-events replay from journal at seq {}: {}", s.next_seq,
                        reader.status().ToString());
          return JumpToRing(s, seq, payload);
        }
        s.reader = std::move(reader).value();
      }
      auto more = s.reader->Next(&record);
      if (!more.ok()) {
        KVO_LOG_ERROR("kv-events journal read: {}", more.status().ToString());
        return JumpToRing(s, seq, payload);
      }
      if (*more) break;
      s.reader.reset();
      if (fresh || attempt > 0) return JumpToRing(s, seq, payload);
    }
    if (record.seq > *s.end_seq) return JumpToRing(s, seq, payload);
    *seq = record.seq;
    *payload = std::move(record.payload);
    MutexLock lock(&mu_);
    ++stats_.replay_from_journal;
    return true;
  }

  // The journal has nothing more at or after s.next_seq: continue from the ring.
  bool JumpToRing(ReplaySession& s, uint64_t* seq, std::string* payload) {
    s.reader.reset();
    MutexLock lock(&mu_);
    auto it = std::lower_bound(ring_.begin(), ring_.end(), s.next_seq,
                               [](const RingEntry& e, uint64_t v) { return e.seq < v; });
    if (it == ring_.end() || it->seq > *s.end_seq) return false;
    *seq = it->seq;
    *payload = it->payload;
    return true;
  }

  enum class SendResult { kSent, kBlocked, kGone };

  SendResult SendReplayFrames(const ReplaySession& s, std::string_view topic, std::string_view seq,
                              std::string_view payload) {
    try {
      auto first = router_.send(zmq::buffer(s.identity),
                                zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      if (!first) {
        replay_blocked_ = true;
        return SendResult::kBlocked;
      }
      router_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
      router_.send(zmq::buffer(topic), zmq::send_flags::sndmore);
      router_.send(zmq::buffer(seq), zmq::send_flags::sndmore);
      router_.send(zmq::buffer(payload), zmq::send_flags::none);
      return SendResult::kSent;
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return SendResult::kGone;  // the client went away
      KVO_LOG_WARN("kv-events replay send: {}", e.what());
      return SendResult::kGone;
    }
  }

  // Immutable after construction.
  const KvEventsConfig config_;
  const int64_t rank_;
  Clock* const clock_;
  Journal* const journal_;
  const std::unique_ptr<Journal> owned_journal_;
  const EncodeOptions encode_options_;

  // Owned by the publisher thread (after Start).
  zmq::socket_t pub_;
  zmq::socket_t router_;
  int wake_fd_ = -1;
  std::vector<ReplaySession> sessions_;
  // A client sending bad or too many requests in a loop logs O(log n) lines.
  RepeatFilter invalid_log_;
  RepeatFilter refused_log_;
  RepeatFilter journal_log_;           // journal append failures (the publishing thread's)
  std::vector<std::string> payloads_;  // encoded batches of the run being published
  bool replay_blocked_ = false;
  std::thread thread_;

  Mutex shutdown_mu_;  // held for the whole of Shutdown
  mutable Mutex mu_;
  CondVar space_cv_{&mu_};
  CondVar done_cv_{&mu_};
  std::deque<EventBatch> queue_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  bool consumer_sleeping_ GUARDED_BY(mu_) = false;
  bool thread_running_ GUARDED_BY(mu_) = true;
  uint64_t enqueued_ GUARDED_BY(mu_) = 0;
  uint64_t processed_ GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  std::deque<RingEntry> ring_ GUARDED_BY(mu_);
  PublisherStats stats_ GUARDED_BY(mu_);
};

}  // namespace

Result<std::unique_ptr<EventPublisher>> CreateEventPublisher(const KvEventsConfig& config,
                                                             int64_t data_parallel_rank,
                                                             const PublisherOptions& options) {
  if (!config.enable_kv_cache_events || config.publisher == "null") {
    return std::unique_ptr<EventPublisher>(new NullPublisher());
  }
  if (config.publisher != "zmq") {
    return Status::InvalidArgument("Unknown event publisher '" + config.publisher + "'");
  }
  KvEventsConfig resolved = config;
  KVO_ASSIGN_OR_RETURN(resolved.endpoint, OffsetEndpointPort(config.endpoint, data_parallel_rank));
  if (config.replay_endpoint) {
    KVO_ASSIGN_OR_RETURN(resolved.replay_endpoint,
                         OffsetEndpointPort(*config.replay_endpoint, data_parallel_rank));
  }
  std::unique_ptr<Journal> owned;
  if (options.journal == nullptr && config.journal_dir) {
    JournalOptions jo;
    jo.dir = *config.journal_dir;
    if (data_parallel_rank != 0)
      jo.dir = JoinPath(jo.dir, "dp" + std::to_string(data_parallel_rank));
    KVO_ASSIGN_OR_RETURN(jo.fsync, ParseFsyncPolicy(config.journal_fsync));
    KVO_ASSIGN_OR_RETURN(owned, Journal::Open(jo));
  }
  Clock* clock = options.clock != nullptr ? options.clock : SystemClock();
  auto publisher = std::make_unique<ZmqPublisher>(std::move(resolved), data_parallel_rank, clock,
                                                  options.journal, std::move(owned));
  KVO_RETURN_IF_ERROR(publisher->Start());
  return std::unique_ptr<EventPublisher>(std::move(publisher));
}

}  // namespace kvo
