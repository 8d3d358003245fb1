// Bus fault suite (issue 10, "What to build" 3): real `kvo events publish` processes restarted
// and killed at random moments, tiny HWMs, a stalled consumer, a replay window exceeded, absurd
// sequence numbers and hostile replay servers, against kvo's Subscriber. After each trial the
// subscriber's view (what an indexer would hold: delivered batches, emptied on a restart notice)
// must equal the publisher's own state (its replay from 0), compared batch by batch by digest.
// Seeds: kvo::testing::TestSeed() (KVO_TEST_SEED replays a run).
#include <signal.h>

#include <gtest/gtest.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "events/codec.h"
#include "events/event_json.h"
#include "events/events.h"
#include "tests/testing/child_process.h"
#include "tests/testing/fault_report.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::FaultRecord;
using testing::FaultTrials;
using testing::ReportFault;
using testing::SteadyClock;

std::string Be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
  return s;
}

uint64_t FromBe(std::string_view b) {
  uint64_t v = 0;
  for (unsigned char c : b) v = (v << 8) | c;
  return v;
}

// Batch `id` (ids are unique across a test: the publisher generation is in them).
EventBatch Batch(uint64_t id) {
  BlockStored s;
  s.block_hashes.push_back(BlockHash::Uint(id * 7919 + 1));
  s.token_ids = {static_cast<int64_t>(id % 1000)};
  s.block_size = 16;
  s.medium = kMediumGpu;
  return EventBatch{1600000000.0 + static_cast<double>(id), {s}, 0};
}

// seq -> digest of the batch (its re-encoded bytes).
using State = std::map<uint64_t, uint64_t>;

uint64_t Digest(const EventBatch& b) {
  std::string bytes = EncodeBatch(b);
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// What an indexer holds from a subscriber.
struct View {
  State state;
  uint64_t restarts = 0;
  uint64_t lost = 0;
  std::vector<std::pair<uint64_t, uint64_t>> lost_ranges;
};

// Reads for `ms` (or until `until` says stop), folding notices in.
void Follow(Subscriber& sub, View* view, std::chrono::milliseconds ms,
            const std::function<bool(const View&)>& until = nullptr) {
  auto deadline = SteadyClock::now() + ms;
  while (SteadyClock::now() < deadline) {
    auto next = sub.Next(20ms);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    for (const SubscriberNotice& n : sub.TakeNotices()) {
      if (n.kind == NoticeKind::kPublisherRestart) {
        view->state.clear();
        ++view->restarts;
      } else if (n.kind == NoticeKind::kGapUnrecoverable) {
        view->lost += n.to_seq - n.from_seq;
        view->lost_ranges.emplace_back(n.from_seq, n.to_seq);
      }
    }
    if (next->has_value()) view->state[(*next)->seq] = Digest((*next)->batch);
    if (until && until(*view)) return;
  }
}

// The publisher's own state: a raw replay from 0 (vLLM's documented client).
State PublisherState(const std::string& replay_ep) {
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(replay_ep);
  std::string start = Be64(0);
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  State out;
  while (true) {
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, 10s);
    if (!(item.revents & ZMQ_POLLIN)) {
      ADD_FAILURE() << "publisher replay timed out";
      return out;
    }
    std::vector<zmq::message_t> f;
    if (!zmq::recv_multipart(dealer, std::back_inserter(f))) continue;
    if (f.size() != 4) continue;
    if (f[2].to_string_view() == std::string(8, '\xff') && f[3].size() == 0) return out;
    auto b = DecodeBatch(f[3].to_string_view());
    if (b.ok()) out[FromBe(f[2].to_string_view())] = Digest(*b);
  }
}

class BusFaultsTest : public ::testing::Test {
 protected:
  std::string Ep(const std::string& name) const { return "ipc://" + dir_.path() + "/" + name; }
  std::string Config(bool journal, int64_t buffer_steps = 10000) const {
    std::string c = R"({"enable_kv_cache_events":true,"publisher":"zmq","endpoint":")" + Ep("pub") +
                    R"(","replay_endpoint":")" + Ep("replay") +
                    R"(","topic":"kv","buffer_steps":)" + std::to_string(buffer_steps);
    if (journal) c += R"(,"journal_dir":")" + dir_.path() + "/journal\"";
    return c + "}";
  }
  // Writes `count` batches with ids base.. as a JSON-lines input file.
  std::string Input(uint64_t base, uint64_t count) {
    std::string path = dir_.path() + "/input-" + std::to_string(base) + ".jsonl";
    std::ofstream f(path);
    for (uint64_t i = 0; i < count; ++i) f << BatchToJson(Batch(base + i), 0, std::nullopt) << "\n";
    return path;
  }
  std::unique_ptr<ChildProcess> Publish(bool journal, const std::string& input) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{KVO_BINARY, "events", "publish", "--kv-events-config",
                                 Config(journal), "--input", input, "--linger-ms", "60000"});
  }
  SubscriberOptions SubOptions() const {
    SubscriberOptions o;
    o.endpoint = Ep("pub");
    o.replay_endpoint = Ep("replay");
    o.topic = "kv";
    o.start_seq = 0;
    o.idle_probe_ms = 200;
    return o;
  }

  testing::TempDir dir_;
};

// Publisher restarts (kvo events publish, full speed) with and without a journal; the new
// process starts 0-500 ms after the old one ends (SIGTERM, or kill -9 for the journaled one at a
// random moment of its publishing). The view must converge to the new publisher's state.
TEST_F(BusFaultsTest, PublisherRestartsConvergeToThePublishersState) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (bool journal : {false, true}) {
    const int trials = FaultTrials(2, 20);
    const uint64_t new_batches = testing::LongFaultRun() ? 3000 : 1500;
    int failures = 0;
    uint64_t restarts_seen = 0;
    for (int t = 0; t < trials; ++t) {
      SCOPED_TRACE("journal " + std::to_string(journal) + " trial " + std::to_string(t) + " seed " +
                   std::to_string(seed));
      std::filesystem::remove_all(dir_.path() + "/journal");
      uint64_t gen = static_cast<uint64_t>(t) * 1'000'000 + (journal ? 500'000 : 0);
      auto sub = Subscriber::Create(SubOptions());
      ASSERT_TRUE(sub.ok());
      View view;
      std::unique_ptr<ChildProcess> old_pub;
      if (journal) {
        // kill -9 at a random moment of its publishing (the journal may lose its buffered tail,
        // and the restarted publisher then reuses seqs the subscriber has seen).
        old_pub = Publish(journal, Input(gen, 20000));
        Follow(**sub, &view, std::chrono::milliseconds(10 + rng() % 200));
        old_pub->Signal(SIGKILL);
      } else {
        old_pub = Publish(journal, Input(gen, 300 + rng() % 300));
        ASSERT_TRUE(old_pub->ReadStdoutLine(SteadyClock::now() + 30s).has_value())
            << old_pub->err();
        Follow(**sub, &view, 300ms);
        old_pub->Signal(SIGTERM);
      }
      old_pub->Wait(SteadyClock::now() + 30s);
      Follow(**sub, &view, std::chrono::milliseconds(rng() % 500));
      auto new_pub = Publish(journal, Input(gen + 100'000, new_batches));
      ASSERT_TRUE(new_pub->ReadStdoutLine(SteadyClock::now() + 30s).has_value()) << new_pub->err();
      State want = PublisherState(Ep("replay"));
      Follow(**sub, &view, 20s, [&](const View& v) { return v.state == want; });
      bool ok = view.state == want;
      EXPECT_TRUE(ok) << "view " << view.state.size() << " batches, publisher " << want.size()
                      << ", restarts " << view.restarts;
      failures += ok ? 0 : 1;
      restarts_seen += view.restarts;
      new_pub->Signal(SIGTERM);
      new_pub->Wait(SteadyClock::now() + 30s);
    }
    ReportFault({"bus",
                 journal ? std::string("kill -9 of a journaled publisher at a random moment, "
                                       "restart at once")
                         : "publisher restart without journal (vLLM default), new stream of " +
                               std::to_string(new_batches) +
                               " batches overtakes the old at full speed, 0-500 ms later",
                 trials, "subscriber view == the new publisher's replay from 0, by digest",
                 failures, seed, "restarts detected " + std::to_string(restarts_seen)});
  }
}

// Tiny HWM and a stalled consumer: every drop is a gap the replay fills; nothing is lost.
// With a replay window smaller than the stall, the loss is reported with its exact range.
TEST_F(BusFaultsTest, TinyHwmStalledConsumerAndReplayWindowExceeded) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int64_t buffer_steps : {100000, 200}) {
    const int trials = FaultTrials(2, 10);
    int failures = 0;
    uint64_t lost_total = 0, gaps_filled = 0;
    for (int t = 0; t < trials; ++t) {
      testing::TempDir dir;
      KvEventsConfig c;
      c.enable_kv_cache_events = true;
      c.publisher = "zmq";
      c.endpoint = "ipc://" + dir.path() + "/pub";
      c.replay_endpoint = "ipc://" + dir.path() + "/replay";
      c.topic = "kv";
      c.hwm = 10;
      c.buffer_steps = buffer_steps;
      auto pub = CreateEventPublisher(c, 0);
      ASSERT_TRUE(pub.ok());
      SubscriberOptions o;
      o.endpoint = c.endpoint;
      o.replay_endpoint = c.replay_endpoint;
      o.topic = "kv";
      o.start_seq = 0;
      o.hwm = 10;
      o.idle_probe_ms = 100;
      auto sub = Subscriber::Create(o);
      ASSERT_TRUE(sub.ok());
      const uint64_t n = 2000 + rng() % 2000;
      State want;
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_TRUE((*pub)->Publish(Batch(i)).ok());
        want[i] = Digest(Batch(i));
      }
      (*pub)->Flush();  // the consumer stalled throughout
      View view;
      Follow(**sub, &view, 20s, [&](const View& v) {
        return !v.state.empty() && v.state.rbegin()->first == n - 1 && v.state.size() + v.lost == n;
      });
      // Every seq is delivered with the published content, or inside a reported loss range.
      bool ok = view.state.size() + view.lost == n;
      for (const auto& [seq, d] : view.state) ok = ok && want[seq] == d;
      for (auto [from, to] : view.lost_ranges) {
        for (uint64_t s = from; s < to; ++s) ok = ok && !view.state.contains(s);
      }
      if (buffer_steps >= static_cast<int64_t>(n)) ok = ok && view.lost == 0;
      EXPECT_TRUE(ok) << "delivered " << view.state.size() << " lost " << view.lost << " of " << n;
      failures += ok ? 0 : 1;
      lost_total += view.lost;
      gaps_filled += (*sub)->stats().gaps_filled;
      (*pub)->Shutdown();
    }
    ReportFault({"bus",
                 buffer_steps > 1000
                     ? "tiny HWM (10) and a consumer stalled while 2-4 k batches are published"
                     : "replay window exceeded (buffer_steps 200, stalled consumer, HWM 10)",
                 trials,
                 "every seq delivered with its published content or inside a reported loss range" +
                     std::string(buffer_steps > 1000 ? "; nothing lost" : ""),
                 failures, seed,
                 "gaps filled " + std::to_string(gaps_filled) + ", reported lost " +
                     std::to_string(lost_total)});
  }
}

// Absurd live sequence numbers (2^64-1, 2^64-2, 10^6 and more ahead) among a normal stream.
TEST_F(BusFaultsTest, AbsurdSequenceNumbersAreNotLosses) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const int trials = FaultTrials(3, 30);
  int failures = 0;
  uint64_t absurd = 0;
  for (int t = 0; t < trials; ++t) {
    testing::TempDir dir;
    zmq::context_t ctx;
    zmq::socket_t pub(ctx, zmq::socket_type::pub);
    pub.set(zmq::sockopt::linger, 0);
    pub.bind("ipc://" + dir.path() + "/pub");
    SubscriberOptions o;
    o.endpoint = "ipc://" + dir.path() + "/pub";
    o.topic = "kv";
    auto sub = Subscriber::Create(o);
    ASSERT_TRUE(sub.ok());
    auto send = [&](uint64_t seq) {
      std::string s = Be64(seq), p = EncodeBatch(Batch(seq % 100000));
      pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(s), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(p), zmq::send_flags::none);
    };
    bool first = false;
    for (int i = 0; i < 500 && !first; ++i) {
      send(0);
      auto n = (*sub)->Next(10ms);
      ASSERT_TRUE(n.ok());
      first = n->has_value();
    }
    ASSERT_TRUE(first);
    uint64_t seq = 1;
    uint64_t last = 0;
    for (int i = 0; i < 50; ++i) {
      if (rng() % 5 == 0) {
        const uint64_t kinds[] = {~uint64_t{0}, seq + 1'000'000 + rng() % 1000,
                                  seq + (uint64_t{1} << 62) + rng() % 1000};
        uint64_t bad = kinds[rng() % 3];
        // A jump that wraps past 2^64 is a sequence going back (a restart whose first batches
        // were missed: counted lost, rightly), not a jump ahead: keep the stream ahead.
        if (bad != ~uint64_t{0} && bad < seq) bad = ~uint64_t{0};
        send(bad);
        if (bad != ~uint64_t{0}) seq = bad + 1;  // a new stream from there
      } else {
        send(seq++);
      }
      last = seq - 1;
    }
    View view;
    Follow(**sub, &view, 10s,
           [&](const View& v) { return !v.state.empty() && v.state.rbegin()->first == last; });
    SubscriberStats st = (*sub)->stats();
    bool ok = st.batches_lost < 1000 && !view.state.empty() && view.state.rbegin()->first == last;
    EXPECT_TRUE(ok) << "lost " << st.batches_lost << " last " << st.last_seq.value_or(0);
    failures += ok ? 0 : 1;
    absurd += st.absurd_sequences;
  }
  ReportFault({"bus", "absurd live sequence numbers (2^64-1, 10^6 and 2^62 ahead)", trials,
               "no 10^19 loss; the stream follows to its last batch", failures, seed,
               "absurd seqs counted " + std::to_string(absurd)});
}

// Hostile replay servers: garbage frames without end, an endless valid-looking reply, a reply
// that serves absurd seqs. The subscriber must stay bounded in time and keep following live.
TEST_F(BusFaultsTest, HostileReplayServers) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const int trials = FaultTrials(3, 15);
  int failures = 0;
  uint64_t failed_replays = 0;
  for (int t = 0; t < trials; ++t) {
    const int kind = t % 3;
    testing::TempDir dir;
    zmq::context_t ctx;
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.bind("ipc://" + dir.path() + "/replay");
    std::atomic<bool> stop{false};
    std::thread server([&] {
      std::mt19937_64 r(seed + t);
      while (!stop) {
        zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, 20ms);
        if (!(item.revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> req;
        if (!zmq::recv_multipart(router, std::back_inserter(req)) || req.size() != 3) continue;
        std::string id = req[0].to_string();
        uint64_t seq = FromBe(req[2].to_string_view());
        auto until = SteadyClock::now() + 3s;
        while (!stop && SteadyClock::now() < until) {
          std::vector<std::string> frames = {id, ""};
          if (kind == 0) {  // garbage: random frame counts and bytes
            size_t count = r() % 6;
            for (size_t i = 0; i < count; ++i) frames.push_back(std::string(r() % 12, char(r())));
          } else if (kind == 1) {  // endless, valid-looking
            frames.push_back("kv");
            frames.push_back(Be64(seq));
            frames.push_back(EncodeBatch(Batch(seq)));
            ++seq;
          } else {  // absurd seqs
            frames.push_back("kv");
            frames.push_back(Be64(~uint64_t{0} - (r() % 3)));
            frames.push_back(EncodeBatch(Batch(r() % 1000)));
          }
          std::vector<zmq::const_buffer> bufs;
          for (const std::string& f : frames) bufs.push_back(zmq::buffer(f));
          try {
            zmq::send_multipart(router, bufs, zmq::send_flags::dontwait);
          } catch (const zmq::error_t&) {
          }
        }
      }
    });
    SubscriberOptions o;
    o.endpoint = "ipc://" + dir.path() + "/pub";
    o.replay_endpoint = "ipc://" + dir.path() + "/replay";
    o.topic = "kv";
    o.start_seq = 0;
    o.replay_max_ms = 1000;
    o.replay_timeout_ms = 300;
    o.idle_probe_ms = 0;
    auto sub = Subscriber::Create(o);
    ASSERT_TRUE(sub.ok());
    auto start = SteadyClock::now();
    bool failed = false;
    int64_t longest_next_ms = 0;
    while (!failed && SteadyClock::now() - start < 10s) {
      auto t0 = SteadyClock::now();
      auto n = (*sub)->Next(50ms);
      longest_next_ms = std::max<int64_t>(
          longest_next_ms,
          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t0).count());
      ASSERT_TRUE(n.ok());
      for (const auto& notice : (*sub)->TakeNotices()) {
        failed |= notice.kind == NoticeKind::kReplayFailed;
      }
    }
    auto took = SteadyClock::now() - start;
    stop = true;
    server.join();
    SubscriberStats st = (*sub)->stats();
    // Losses only where the hostile reply itself skipped seqs: never an absurd count. The endless
    // valid reply (kind 1) skips a seq at every send its full queue refuses: over its 1 s that
    // adds up to ~10^6 on a fast machine, but never to more than the seqs it went through.
    const bool bounded_loss =
        kind == 1 ? st.batches_lost <= st.last_seq : st.batches_lost < o.max_seq_jump;
    bool ok = failed && took < 5s && longest_next_ms < 1000 && bounded_loss;
    EXPECT_TRUE(ok) << "kind " << kind << " failed " << failed << " took "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                    << " ms, longest Next " << longest_next_ms << " ms, lost " << st.batches_lost;
    failures += ok ? 0 : 1;
    failed_replays += st.replay_failures;
  }
  ReportFault({"bus",
               "hostile replay server: endless garbage frames, endless valid reply, absurd seqs",
               trials,
               "replay abandoned within its bounds (replay_max_ms 1 s), every Next() returns "
               "within 1 s, losses < max_seq_jump",
               failures, seed, "replays abandoned " + std::to_string(failed_replays)});
}

}  // namespace
}  // namespace kvo
