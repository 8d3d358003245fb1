// The KV-event bus over real ipc:// sockets: vLLM's publisher behaviours checked with a raw
// SUB + DEALER client (as vLLM's MockSubscriber), then kvo's Subscriber end to end.
#include <gtest/gtest.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "events/codec.h"
#include "events/journal.h"
#include "events/zmq_publisher.h"
#include "events/zmq_subscriber.h"
#include "tests/testing/counting_file_system.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo {
namespace {

using namespace std::chrono_literals;

EventBatch Batch(uint64_t i, size_t blocks = 1) {
  BlockStored s;
  for (size_t b = 0; b < blocks; ++b) s.block_hashes.push_back(BlockHash::Uint(i * 1000 + b));
  s.token_ids = {static_cast<int64_t>(i)};
  s.block_size = 16;
  s.medium = kMediumGpu;
  return EventBatch{1700000000.0 + static_cast<double>(i), {s}, std::nullopt};
}

uint64_t Seq(const zmq::message_t& m) {
  uint64_t v = 0;
  for (unsigned char c : m.to_string_view()) v = (v << 8) | c;
  return v;
}

std::string Be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
  return s;
}

class BusTest : public ::testing::Test {
 protected:
  std::string Ep(const std::string& name) { return "ipc://" + dir_.path() + "/" + name; }

  KvEventsConfig Config(const std::string& topic = "kv", int64_t buffer_steps = 10000) {
    KvEventsConfig c;
    c.enable_kv_cache_events = true;
    c.publisher = "zmq";
    c.endpoint = Ep("pub");
    c.replay_endpoint = Ep("replay");
    c.topic = topic;
    c.buffer_steps = buffer_steps;
    return c;
  }

  std::unique_ptr<EventPublisher> Publisher(const KvEventsConfig& c, Journal* journal = nullptr) {
    PublisherOptions o;
    o.journal = journal;
    auto p = CreateEventPublisher(c, 0, o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return std::move(p).value();
  }

  // A raw DEALER replay request, read until the end marker: the frames after the delimiter.
  std::vector<std::vector<std::string>> RawReplay(uint64_t start, int rcvhwm = 1000) {
    zmq::socket_t dealer(ctx_, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::rcvhwm, rcvhwm);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(Ep("replay"));
    std::string s = Be64(start);
    dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    dealer.send(zmq::buffer(s), zmq::send_flags::none);
    std::vector<std::vector<std::string>> replies;
    while (true) {
      zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 10s);
      if (!(item.revents & ZMQ_POLLIN)) {
        ADD_FAILURE() << "replay timed out";
        break;
      }
      std::vector<zmq::message_t> frames;
      EXPECT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(frames)));
      EXPECT_EQ(frames[0].size(), 0u);  // delimiter
      std::vector<std::string> rest;
      for (size_t i = 1; i < frames.size(); ++i) rest.push_back(frames[i].to_string());
      replies.push_back(rest);
      if (rest.size() == 3 && rest[1] == std::string(8, '\xff')) break;
    }
    return replies;
  }

  testing::TempDir dir_;
  zmq::context_t ctx_;
};

TEST_F(BusTest, PublishesThreeFramesWithSequenceNumbersAndRoundTrips) {
  auto pub = Publisher(Config());
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  auto replies = RawReplay(0);
  ASSERT_EQ(replies.size(), 11u);
  for (uint64_t i = 0; i < 10; ++i) {
    ASSERT_EQ(replies[i].size(), 3u);  // [topic, seq, payload]: the topic frame (#45177)
    EXPECT_EQ(replies[i][0], "kv");
    EXPECT_EQ(replies[i][1], Be64(i));
    auto batch = DecodeBatch(replies[i][2]);
    ASSERT_TRUE(batch.ok());
    EventBatch expected = Batch(i);
    expected.data_parallel_rank = 0;  // filled in by the publisher
    EXPECT_EQ(*batch, expected);
  }
  // End marker: empty topic (not the configured one), ff*8, empty payload.
  EXPECT_EQ(replies[10], (std::vector<std::string>{"", std::string(8, '\xff'), ""}));
}

TEST_F(BusTest, ReplayFromTheMiddleReturnsExactlyTheRest) {
  auto pub = Publisher(Config());
  for (uint64_t i = 0; i < 19; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  auto replies = RawReplay(10);
  ASSERT_EQ(replies.size(), 10u);
  for (uint64_t i = 0; i < 9; ++i) EXPECT_EQ(replies[i][1], Be64(10 + i));
}

TEST_F(BusTest, RingKeepsTheLastBufferStepsBatches) {
  auto pub = Publisher(Config("kv", 100));
  for (uint64_t i = 0; i < 110; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  auto replies = RawReplay(0);
  ASSERT_EQ(replies.size(), 101u);
  EXPECT_EQ(replies.front()[1], Be64(10));
  EXPECT_EQ(replies[99][1], Be64(109));
}

TEST_F(BusTest, InvalidReplayRequestGetsNoReplyAndIsCounted) {
  auto pub = Publisher(Config());
  ASSERT_TRUE(pub->Publish(Batch(0)).ok());
  pub->Flush();
  zmq::socket_t dealer(ctx_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(Ep("replay"));
  std::string s = Be64(0);
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(s), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(s), zmq::send_flags::none);  // one frame too many
  // A valid request on the same socket afterwards is answered: the bad one was skipped.
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(s), zmq::send_flags::none);
  std::vector<zmq::message_t> frames;
  ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(frames)));
  ASSERT_EQ(frames.size(), 4u);
  EXPECT_EQ(Seq(frames[2]), 0u);
  EXPECT_EQ(pub->stats().invalid_replay_requests, 1u);
}

TEST_F(BusTest, LongReplayToASlowClientResumesInsteadOfDropping) {
  auto pub = Publisher(Config("kv", 5000));
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_TRUE(pub->Publish(Batch(i, 16)).ok());
  pub->Flush();
  auto replies = RawReplay(0, /*rcvhwm=*/8);  // far below the 5000 messages of the reply
  ASSERT_EQ(replies.size(), 5001u);
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_EQ(replies[i][1], Be64(i));
}

TEST_F(BusTest, JournalServesReplayBeyondTheRingAndSeqSurvivesRestart) {
  JournalOptions jo;
  jo.dir = dir_.path() + "/journal";
  {
    auto journal = Journal::Open(jo);
    ASSERT_TRUE(journal.ok()) << journal.status().ToString();
    auto pub = Publisher(Config("kv", 10), journal->get());
    for (uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
    pub->Flush();
    auto replies = RawReplay(0);
    ASSERT_EQ(replies.size(), 101u);
    for (uint64_t i = 0; i < 100; ++i) ASSERT_EQ(replies[i][1], Be64(i));
    EXPECT_GE(pub->stats().replay_from_journal, 90u);
    pub->Shutdown();
  }
  auto journal = Journal::Open(jo);
  ASSERT_TRUE(journal.ok());
  auto pub = Publisher(Config("kv", 10), journal->get());
  EXPECT_EQ(pub->stats().next_seq, 100u);
  ASSERT_TRUE(pub->Publish(Batch(100)).ok());
  pub->Flush();
  auto replies = RawReplay(95);
  ASSERT_EQ(replies.size(), 7u);
  EXPECT_EQ(replies[5][1], Be64(100));
}

// A journal that cannot be written (a full disk) does not stop publishing, and a restart resumes
// past everything sent meanwhile: it used to resume at the last journaled seq + 1, reusing seqs
// subscribers had applied with other batches (an indexer resuming from a checkpoint among them
// would apply the new stream's batches as if they continued the old one).
TEST_F(BusTest, BatchesSentUnjournaledAreNeverReusedAfterARestart) {
  testing::CountingFileSystem fs;
  JournalOptions jo;
  jo.dir = dir_.path() + "/journal";
  jo.fs = &fs;
  {
    auto journal = Journal::Open(jo);
    ASSERT_TRUE(journal.ok()) << journal.status().ToString();
    auto pub = Publisher(Config("kv", 100), journal->get());
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
    pub->Flush();
    fs.fail_writes = true;
    for (uint64_t i = 10; i < 20; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
    pub->Flush();
    PublisherStats st = pub->stats();
    EXPECT_EQ(st.batches_published, 20u);  // sent, as vLLM would
    EXPECT_GE(st.journal_errors, 1u);
    EXPECT_EQ(st.journal_floor_errors, 0u);
    EXPECT_EQ((*journal)->seq_floor(), 20u);
    auto replies = RawReplay(15);  // the ring still has them
    ASSERT_EQ(replies.size(), 6u);
    EXPECT_EQ(replies[0][1], Be64(15));
    pub->Shutdown();
  }
  fs.fail_writes = false;
  auto journal = Journal::Open(jo);
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  auto pub = Publisher(Config("kv", 100), journal->get());
  EXPECT_EQ(pub->stats().next_seq, 20u);
  ASSERT_TRUE(pub->Publish(Batch(20)).ok());
  pub->Flush();
  // A client asking from a checkpoint inside the unjournaled run sees it as a hole.
  auto replies = RawReplay(5);
  std::vector<std::string> seqs;
  for (const auto& r : replies) seqs.push_back(r[1]);
  EXPECT_EQ(seqs, (std::vector<std::string>{Be64(5), Be64(6), Be64(7), Be64(8), Be64(9), Be64(20),
                                            std::string(8, '\xff')}));
}

// A replay that read the journal, caught up into the ring, then stalled on a slow client while
// the ring rolled past it goes back to the journal from where it is, not from where it left the
// journal: it used to resend the batches in between (going backwards; a vLLM-style client applies
// them twice).
TEST_F(BusTest, AReplayBackFromTheRingToTheJournalNeverGoesBackwards) {
  JournalOptions jo;
  jo.dir = dir_.path() + "/journal";
  auto journal = Journal::Open(jo);
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  auto pub = Publisher(Config("kv", 3000), journal->get());
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();  // the ring holds 2000 .. 4999, the journal everything
  zmq::socket_t dealer(ctx_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvhwm, 10);  // (1 trips a libzmq 4.3 assert, issue 3442, at close)
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(Ep("replay"));
  const std::string start = Be64(1500);
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  // Unread, the reply stalls once the queues fill: past seq 2100, so in the ring by then.
  ASSERT_TRUE(testing::Eventually([&] { return pub->stats().replay_batches_sent >= 600; }));
  for (uint64_t i = 5000; i < 8000; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();  // the ring rolled on to 5000 .. 7999: the rest of the reply is in the journal
  std::vector<uint64_t> seqs;
  while (true) {
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, 10s);
    ASSERT_TRUE(item.revents & ZMQ_POLLIN) << "replay timed out after " << seqs.size();
    std::vector<zmq::message_t> frames;
    ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(frames)));
    ASSERT_EQ(frames.size(), 4u);
    const uint64_t seq = Seq(frames[2]);
    if (seq == ~uint64_t{0}) break;
    seqs.push_back(seq);
  }
  ASSERT_EQ(seqs.size(), 3500u);  // 1500 .. 4999 (the end when it was asked), each once, in order
  for (size_t i = 0; i < seqs.size(); ++i) ASSERT_EQ(seqs[i], 1500 + i) << "reply " << i;
  pub->Shutdown();
}

// A client that sends replay requests and never reads the replies holds at most 8 of them; the
// rest are refused (no reply, counted), and another client is still answered in full. Each reply
// in progress used to be kept, without bound (a batch copy and, from the journal, an open file).
TEST_F(BusTest, AClientThatNeverReadsHoldsABoundedNumberOfReplies) {
  auto pub = Publisher(Config("kv", 5000));  // a reply far longer than the queues between
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  zmq::socket_t greedy(ctx_, zmq::socket_type::dealer);
  greedy.set(zmq::sockopt::rcvhwm, 10);  // (1 trips a libzmq 4.3 assert, issue 3442, at close)
  greedy.set(zmq::sockopt::linger, 0);
  greedy.connect(Ep("replay"));
  const std::string start = Be64(0);
  for (int i = 0; i < 100; ++i) {
    greedy.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    greedy.send(zmq::buffer(start), zmq::send_flags::none);
  }
  ASSERT_TRUE(testing::Eventually([&] { return pub->stats().replay_requests >= 100; }));
  EXPECT_EQ(pub->stats().replay_requests_refused, 92u);
  auto replies = RawReplay(4000);  // another client
  ASSERT_EQ(replies.size(), 1001u);
  EXPECT_EQ(replies[999][1], Be64(4999));
  pub->Shutdown();
}

SubscriberOptions SubOptions(const std::string& pub, const std::string& replay,
                             std::optional<uint64_t> start) {
  SubscriberOptions o;
  o.endpoint = pub;
  o.replay_endpoint = replay;
  o.topic = "kv";
  o.start_seq = start;
  o.idle_probe_ms = 20;
  return o;
}

// SubOptions for the hand-made publishers below: no idle probes, so the raw replay servers answer
// only the requests a test's script causes.
SubscriberOptions UnprobedOptions(const std::string& pub, const std::string& replay,
                                  std::optional<uint64_t> start) {
  SubscriberOptions o = SubOptions(pub, replay, start);
  o.idle_probe_ms = 0;
  return o;
}

// Reads until `count` batches arrived (or 20 s passed, which fails the test).
std::vector<ReceivedBatch> ReadN(Subscriber& sub, size_t count) {
  std::vector<ReceivedBatch> out;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
    auto next = sub.Next(100ms);
    EXPECT_TRUE(next.ok()) << next.status().ToString();
    if (next.ok() && next->has_value()) out.push_back(std::move(**next));
  }
  return out;
}

void ExpectInOrder(const std::vector<ReceivedBatch>& got, uint64_t first, size_t count) {
  ASSERT_EQ(got.size(), count);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(got[i].seq, first + i) << "position " << i;
    EventBatch expected = Batch(first + i);
    expected.data_parallel_rank = 0;
    ASSERT_EQ(got[i].batch, expected);
  }
}

TEST_F(BusTest, LateJoinerReplaysEverythingThenFollowsLive) {
  auto pub = Publisher(Config());
  for (uint64_t i = 0; i < 50; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  auto sub = Subscriber::Create(SubOptions(Ep("pub"), Ep("replay"), 0));
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto first = ReadN(**sub, 50);
  ExpectInOrder(first, 0, 50);
  EXPECT_TRUE(first[0].replayed);
  for (uint64_t i = 50; i < 80; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  auto rest = ReadN(**sub, 30);
  ExpectInOrder(rest, 50, 30);
  for (const auto& n : (*sub)->TakeNotices()) {
    EXPECT_NE(n.kind, NoticeKind::kGapUnrecoverable) << n.detail;
  }
}

TEST_F(BusTest, TopicFilterAppliesToLiveAndReplay) {
  auto pub = Publisher(Config("foo"));
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  SubscriberOptions o = SubOptions(Ep("pub"), Ep("replay"), 0);
  o.topic = "bar";
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok());
  auto next = (*sub)->Next(200ms);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
}

// The end-to-end check: a journaled publisher; a subscriber that joins late, loses
// messages to a tiny HWM while not reading, and restarts from its last seq; it receives every
// batch exactly once, in order.
TEST_F(BusTest, LateLossyRestartingSubscriberGetsEveryBatchExactlyOnce) {
  JournalOptions jo;
  jo.dir = dir_.path() + "/journal";
  auto journal = Journal::Open(jo);
  ASSERT_TRUE(journal.ok());
  KvEventsConfig c = Config("kv", 64);  // a small ring: old batches come from the journal
  c.hwm = 4;
  auto pub = Publisher(c, journal->get());
  for (uint64_t i = 0; i < 300; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();

  std::vector<ReceivedBatch> all;
  uint64_t resume_from = 0;
  {
    SubscriberOptions o = SubOptions(Ep("pub"), Ep("replay"), 0);
    o.hwm = 4;
    auto sub = Subscriber::Create(o);
    ASSERT_TRUE(sub.ok());
    auto part = ReadN(**sub, 300);
    // Not reading while 2000 more are published: the tiny HWMs drop most of them.
    for (uint64_t i = 300; i < 2300; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
    pub->Flush();
    auto more = ReadN(**sub, 1000);
    part.insert(part.end(), more.begin(), more.end());
    EXPECT_GT((*sub)->stats().gaps_filled + (*sub)->stats().replay_requests, 1u);
    for (const auto& n : (*sub)->TakeNotices()) {
      EXPECT_NE(n.kind, NoticeKind::kGapUnrecoverable) << n.detail;
    }
    resume_from = part.back().seq + 1;
    all = std::move(part);
  }  // the subscriber "crashes" here
  for (uint64_t i = 2300; i < 2500; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  SubscriberOptions o = SubOptions(Ep("pub"), Ep("replay"), resume_from);
  o.hwm = 4;
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok());
  auto rest = ReadN(**sub, 2500 - resume_from);
  all.insert(all.end(), rest.begin(), rest.end());
  ExpectInOrder(all, 0, 2500);
  for (const auto& n : (*sub)->TakeNotices()) {
    EXPECT_NE(n.kind, NoticeKind::kGapUnrecoverable) << n.detail;
    EXPECT_NE(n.kind, NoticeKind::kPublisherRestart) << n.detail;
  }
}

TEST_F(BusTest, DetectsPublisherRestartAndReadsTheNewStream) {
  auto sub_opts = SubOptions(Ep("pub"), Ep("replay"), 0);
  std::unique_ptr<Subscriber> sub;
  {
    auto pub = Publisher(Config());
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
    pub->Flush();
    auto created = Subscriber::Create(sub_opts);
    ASSERT_TRUE(created.ok());
    sub = std::move(created).value();
    ExpectInOrder(ReadN(*sub, 10), 0, 10);
  }  // the publisher process "dies": its ring is gone
  auto pub = Publisher(Config());
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  ExpectInOrder(ReadN(*sub, 3), 0, 3);
  bool restart = false;
  for (const auto& n : sub->TakeNotices()) restart |= n.kind == NoticeKind::kPublisherRestart;
  EXPECT_TRUE(restart);
  EXPECT_EQ(sub->stats().restarts, 1u);
}

TEST_F(BusTest, ReplayThatCannotReachBackIsReported) {
  auto pub = Publisher(Config("kv", 10));
  for (uint64_t i = 0; i < 30; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  auto sub = Subscriber::Create(SubOptions(Ep("pub"), Ep("replay"), 5));
  ASSERT_TRUE(sub.ok());
  auto got = ReadN(**sub, 10);
  ASSERT_EQ(got.size(), 10u);
  EXPECT_EQ(got[0].seq, 20u);
  auto notices = (*sub)->TakeNotices();
  ASSERT_FALSE(notices.empty());
  EXPECT_EQ(notices[0].kind, NoticeKind::kGapUnrecoverable);
  EXPECT_EQ(notices[0].from_seq, 5u);
  EXPECT_EQ(notices[0].to_seq, 20u);
  EXPECT_EQ((*sub)->stats().batches_lost, 15u);
}

TEST_F(BusTest, DataParallelRanksPublishOnOffsetEndpointsAndTagTheirBatches) {
  KvEventsConfig c = Config();
  c.endpoint = "inproc://bus-dp";
  c.replay_endpoint = "inproc://bus-dp-replay";
  auto rank0 = CreateEventPublisher(c, 0);
  auto rank1 = CreateEventPublisher(c, 1);
  ASSERT_TRUE(rank0.ok() && rank1.ok());
  ASSERT_TRUE((*rank0)->Publish(Batch(0)).ok());
  ASSERT_TRUE((*rank1)->Publish(Batch(1)).ok());
  (*rank0)->Flush();
  (*rank1)->Flush();
  for (int64_t rank : {0, 1}) {
    SubscriberOptions o = SubOptions(*OffsetEndpointPort(c.endpoint, rank),
                                     *OffsetEndpointPort(*c.replay_endpoint, rank), 0);
    auto sub = Subscriber::Create(o);
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    auto got = ReadN(**sub, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].batch.data_parallel_rank, rank);
    EXPECT_EQ(got[0].batch.events, Batch(static_cast<uint64_t>(rank)).events);
  }
}

// A pre-#45177 publisher (vLLM <= 0.25) answers replay with [seq, payload]: hand-rolled ROUTER.
TEST_F(BusTest, AcceptsTheOldTwoFrameReplyShape) {
  zmq::socket_t router(ctx_, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind(Ep("replay"));
  zmq::socket_t pub(ctx_, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.bind(Ep("pub"));
  auto sub = Subscriber::Create(SubOptions(Ep("pub"), Ep("replay"), std::nullopt));
  ASSERT_TRUE(sub.ok());
  // A live message with seq 3 while the subscriber expects nothing yet: delivered, then seq 6
  // shows a gap, answered by the old-shape replay below.
  std::string p3 = EncodeBatch(Batch(3)), p4 = EncodeBatch(Batch(4)), p5 = EncodeBatch(Batch(5));
  std::string p6 = EncodeBatch(Batch(6));
  // Handshake: keep sending seq 3 until the subscriber has it (PUB drops before it connects).
  std::optional<ReceivedBatch> first;
  for (int i = 0; i < 500 && !first; ++i) {
    pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(Be64(3)), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(p3), zmq::send_flags::none);
    auto n = (*sub)->Next(10ms);
    ASSERT_TRUE(n.ok());
    if (n->has_value()) first = std::move(**n);
  }
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->seq, 3u);
  pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(Be64(6)), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(p6), zmq::send_flags::none);
  std::thread server([&] {
    std::vector<zmq::message_t> req;
    ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(req)));
    ASSERT_EQ(req.size(), 3u);
    // The gap replay asks from the last delivered batch (3), whose answer is checked.
    EXPECT_EQ(Seq(req[2]), 3u);
    std::string id = req[0].to_string();
    for (auto [seq, payload] :
         {std::pair{3, &p3}, std::pair{4, &p4}, std::pair{5, &p5}, std::pair{6, &p6}}) {
      const std::string seq_bytes = Be64(seq);  // outlives the send below
      std::array<zmq::const_buffer, 4> frames = {zmq::buffer(id), zmq::const_buffer(nullptr, 0),
                                                 zmq::buffer(seq_bytes), zmq::buffer(*payload)};
      zmq::send_multipart(router, frames);
    }
    const std::string end_seq(8, '\xff');
    std::array<zmq::const_buffer, 4> end = {zmq::buffer(id), zmq::const_buffer(nullptr, 0),
                                            zmq::buffer(end_seq), zmq::const_buffer(nullptr, 0)};
    zmq::send_multipart(router, end);
  });
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 300 && seqs.size() < 3; ++i) {
    auto n = (*sub)->Next(20ms);
    ASSERT_TRUE(n.ok());
    if (n->has_value()) seqs.push_back((*n)->seq);
  }
  server.join();
  EXPECT_EQ(seqs, (std::vector<uint64_t>{4, 5, 6}));
}

TEST_F(BusTest, MalformedLiveMessagesAreCountedAndSkipped) {
  zmq::socket_t pub(ctx_, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.bind(Ep("pub"));
  SubscriberOptions o = SubOptions(Ep("pub"), "", std::nullopt);
  o.replay_endpoint.reset();
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok());
  std::string good = EncodeBatch(Batch(1));
  std::optional<ReceivedBatch> got;
  for (int i = 0; i < 500 && !got; ++i) {
    pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);  // two frames only
    pub.send(zmq::buffer(Be64(0)), zmq::send_flags::none);
    pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);  // short seq frame
    pub.send(zmq::str_buffer("abc"), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(good), zmq::send_flags::none);
    pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);  // undecodable payload
    pub.send(zmq::buffer(Be64(2 * i)), zmq::send_flags::sndmore);
    pub.send(zmq::str_buffer("\xc1"), zmq::send_flags::none);
    pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);  // a good one
    pub.send(zmq::buffer(Be64(2 * i + 1)), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(good), zmq::send_flags::none);
    auto n = (*sub)->Next(10ms);
    ASSERT_TRUE(n.ok());
    if (n->has_value()) got = std::move(**n);
  }
  ASSERT_TRUE(got.has_value());
  auto stats = (*sub)->stats();
  EXPECT_GE(stats.malformed_messages, 2u);
  EXPECT_GE(stats.decode_errors, 1u);
}

// A replay client that stops reading (its queue full) must not starve other clients' replays
// (found by tests/faults/bus_faults_test.cc: a subscriber mid-replay blocked every later request).
TEST_F(BusTest, StalledReplayClientDoesNotBlockOthers) {
  auto pub = Publisher(Config("kv", 10000));
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
  pub->Flush();
  zmq::socket_t stalled(ctx_, zmq::socket_type::dealer);
  stalled.set(zmq::sockopt::rcvhwm, 10);
  stalled.set(zmq::sockopt::linger, 0);
  stalled.connect(Ep("replay"));
  std::string start = Be64(0);
  stalled.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  stalled.send(zmq::buffer(start), zmq::send_flags::none);
  // Wait until the publisher has taken the stalled request (it counts requests).
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (pub->stats().replay_requests < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(pub->stats().replay_requests, 1u);
  auto replies = RawReplay(4990);  // fails on its own 10 s guard when starved
  ASSERT_EQ(replies.size(), 11u);
  EXPECT_EQ(replies[0][1], Be64(4990));
}

// ---------------------------------------------------------------------------------------------
// Restarts, absurd sequence numbers and hostile replay servers (issue 10 items 3, 4, 6, 10, 12).

// What an indexer holds from a subscriber: seq -> ts of the delivered batch, emptied by a restart.
struct View {
  std::map<uint64_t, double> ts;
  std::vector<SubscriberNotice> notices;
  uint64_t restarts = 0;
};

// Follows `sub` until the view equals `want` (seq -> ts) or `limit` passes.
bool FollowUntil(Subscriber& sub, const std::map<uint64_t, double>& want, View* view,
                 std::chrono::milliseconds limit = 20s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto next = sub.Next(50ms);
    EXPECT_TRUE(next.ok()) << next.status().ToString();
    if (!next.ok()) return false;
    for (SubscriberNotice& n : sub.TakeNotices()) {
      if (n.kind == NoticeKind::kPublisherRestart) {
        view->ts.clear();
        ++view->restarts;
      }
      view->notices.push_back(std::move(n));
    }
    if (next->has_value()) view->ts[(*next)->seq] = (*next)->batch.ts;
    if (view->ts == want) return true;
  }
  return false;
}

std::map<uint64_t, double> Stream(uint64_t base, uint64_t count, uint64_t first_seq = 0) {
  std::map<uint64_t, double> out;
  for (uint64_t i = 0; i < count; ++i) out[first_seq + i] = Batch(base + i).ts;
  return out;
}

// Item 3: a vLLM-style publisher (no journal) restarts and its new sequence overtakes the old one
// at once. Before: live batches below the last replayed seq were taken for replay duplicates, so
// the index became the old 300 batches plus the new ones from seq 300.
TEST_F(BusTest, OvertakingRestartWithoutJournalIsDetectedAndTheNewStreamRead) {
  for (int rate : {5000, 2000, 0}) {  // batches/s; 0: as fast as possible
    SCOPED_TRACE("rate " + std::to_string(rate));
    testing::TempDir dir;
    KvEventsConfig c = Config();
    c.endpoint = "ipc://" + dir.path() + "/pub";
    c.replay_endpoint = "ipc://" + dir.path() + "/replay";
    auto o = SubOptions(c.endpoint, *c.replay_endpoint, 0);
    o.idle_probe_ms = 1000;
    std::unique_ptr<Subscriber> sub;
    View view;
    {
      auto old_pub = Publisher(c);
      for (uint64_t i = 0; i < 300; ++i) ASSERT_TRUE(old_pub->Publish(Batch(i)).ok());
      old_pub->Flush();
      auto created = Subscriber::Create(o);
      ASSERT_TRUE(created.ok());
      sub = std::move(created).value();
      ASSERT_TRUE(FollowUntil(*sub, Stream(0, 300), &view));  // through the initial replay
    }
    auto new_pub = Publisher(c);
    std::thread writer([&] {
      auto start = std::chrono::steady_clock::now();
      for (uint64_t i = 0; i < 3000; ++i) {
        if (rate > 0) std::this_thread::sleep_until(start + i * 1s / rate);  // pacing, not sync
        ASSERT_TRUE(new_pub->Publish(Batch(100000 + i)).ok());
      }
      new_pub->Flush();
    });
    bool converged = FollowUntil(*sub, Stream(100000, 3000), &view, 30s);
    writer.join();
    EXPECT_TRUE(converged) << "view holds " << view.ts.size() << " batches, restarts "
                           << view.restarts;
    EXPECT_GE(view.restarts, 1u);
    EXPECT_EQ(sub->stats().batches_lost, 0u);
  }
}

// Item 4: a journaled publisher lost its journal's tail (fsync never + power loss) and reuses
// sequence numbers the subscriber has seen, with other batches. Before: skipped as duplicates.
TEST_F(BusTest, SequenceReuseAfterALostJournalTailIsARestart) {
  JournalOptions lost;
  lost.dir = dir_.path() + "/journal-survivor";
  {
    // What survived the power loss: the first 60 records.
    auto survivor = Journal::Open(lost);
    ASSERT_TRUE(survivor.ok());
    for (uint64_t i = 0; i < 60; ++i) {
      EventBatch b = Batch(i);
      b.data_parallel_rank = 0;
      ASSERT_TRUE((*survivor)->Append(i, EncodeBatch(b)).ok());
    }
    ASSERT_TRUE((*survivor)->Sync().ok());
  }
  JournalOptions full;
  full.dir = dir_.path() + "/journal";
  auto journal = Journal::Open(full);
  ASSERT_TRUE(journal.ok());
  std::unique_ptr<Subscriber> sub;
  View view;
  {
    auto pub = Publisher(Config(), journal->get());
    for (uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(pub->Publish(Batch(i)).ok());
    pub->Flush();
    auto created = Subscriber::Create(SubOptions(Ep("pub"), Ep("replay"), 0));
    ASSERT_TRUE(created.ok());
    sub = std::move(created).value();
    ASSERT_TRUE(FollowUntil(*sub, Stream(0, 100), &view));
  }
  auto survivor = Journal::Open(lost);
  ASSERT_TRUE(survivor.ok());
  auto pub = Publisher(Config(), survivor->get());
  ASSERT_EQ(pub->stats().next_seq, 60u);
  for (uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(pub->Publish(Batch(5000 + i)).ok());
  pub->Flush();
  std::map<uint64_t, double> want = Stream(0, 60);
  want.merge(Stream(5000, 100, 60));
  EXPECT_TRUE(FollowUntil(*sub, want, &view)) << "view holds " << view.ts.size();
  EXPECT_GE(view.restarts, 1u);
}

// A raw PUB socket for hand-made live messages; sends `seq` until the subscriber has one (the
// PUB drops messages before the SUB connects).
class RawPub {
 public:
  RawPub(zmq::context_t& ctx, const std::string& endpoint) : pub_(ctx, zmq::socket_type::pub) {
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind(endpoint);
  }
  void Send(uint64_t seq, const std::string& payload) {
    pub_.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(Be64(seq)), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(payload), zmq::send_flags::none);
  }
  std::optional<ReceivedBatch> Handshake(Subscriber& sub, uint64_t seq) {
    for (int i = 0; i < 500; ++i) {
      Send(seq, EncodeBatch(Batch(seq)));
      auto n = sub.Next(10ms);
      if (n.ok() && n->has_value()) return std::move(**n);
    }
    return std::nullopt;
  }

 private:
  zmq::socket_t pub_;
};

// Item 10: one absurd live sequence number is a restart (a new stream), not 1.8e19 lost batches;
// the end-marker value is garbage.
TEST_F(BusTest, AbsurdLiveSequenceNumbersAreCountedNotLost) {
  RawPub pub(ctx_, Ep("pub"));
  SubscriberOptions o = SubOptions(Ep("pub"), "", std::nullopt);
  o.replay_endpoint.reset();
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(pub.Handshake(**sub, 0).has_value());
  pub.Send(1, EncodeBatch(Batch(1)));
  pub.Send(~uint64_t{0}, EncodeBatch(Batch(2)));
  pub.Send(2'000'002, EncodeBatch(Batch(3)));
  pub.Send(2'000'003, EncodeBatch(Batch(4)));
  auto got = ReadN(**sub, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].seq, 1u);
  EXPECT_EQ(got[1].seq, 2'000'002u);
  EXPECT_EQ(got[2].seq, 2'000'003u);
  SubscriberStats st = (*sub)->stats();
  EXPECT_EQ(st.batches_lost, 0u);
  EXPECT_EQ(st.absurd_sequences, 2u);
  EXPECT_EQ(st.restarts, 1u);
}

// A hand-rolled replay server answering each request with `answer(start, send)`.
class RawReplayServer {
 public:
  using Send = std::function<bool(const std::string& seq, const std::string& payload)>;
  RawReplayServer(zmq::context_t& ctx, const std::string& endpoint,
                  std::function<void(uint64_t, const Send&)> answer)
      : router_(ctx, zmq::socket_type::router), answer_(std::move(answer)) {
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::sndhwm, 0);
    router_.bind(endpoint);
    thread_ = std::thread([this] { Run(); });
  }
  ~RawReplayServer() {
    stop_ = true;
    thread_.join();
  }
  int requests() const { return requests_.load(); }
  std::atomic<bool> stop_{false};

 private:
  void Run() {
    while (!stop_) {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 20ms);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(router_, std::back_inserter(req))) continue;
      if (req.size() != 3) continue;
      ++requests_;
      std::string id = req[0].to_string();
      answer_(Seq(req[2]), [&](const std::string& seq, const std::string& payload) {
        if (stop_) return false;
        std::array<zmq::const_buffer, 4> frames = {zmq::buffer(id), zmq::const_buffer(nullptr, 0),
                                                   zmq::buffer(seq), zmq::buffer(payload)};
        zmq::send_multipart(router_, frames);
        return true;
      });
    }
  }
  zmq::socket_t router_;
  std::function<void(uint64_t, const Send&)> answer_;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

// Items 6 and 10: an endless reply is applied as it streams (the first batch comes long before any
// end) and abandoned after replay_max_ms; a reply serving an absurd seq is abandoned, not
// followed. Before: Create() buffered the whole reply (growing without bound) until it stopped.
TEST_F(BusTest, EndlessReplyIsStreamedAndAbandonedAfterItsTimeBound) {
  RawReplayServer server(
      ctx_, Ep("replay"), [&](uint64_t start, const RawReplayServer::Send& send) {
        auto until = std::chrono::steady_clock::now() + 5s;  // bounded for the test's sake
        for (uint64_t seq = start; std::chrono::steady_clock::now() < until; ++seq) {
          if (!send(Be64(seq), EncodeBatch(Batch(seq)))) return;
        }
      });
  SubscriberOptions o = SubOptions(Ep("pub"), Ep("replay"), 0);
  o.replay_max_ms = 600;
  o.idle_probe_ms = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok());
  auto first = ReadN(**sub, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].seq, 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "the reply was buffered whole";
  bool failed = false;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!failed && std::chrono::steady_clock::now() < deadline) {
    auto n = (*sub)->Next(10ms);
    ASSERT_TRUE(n.ok());
    for (const auto& notice : (*sub)->TakeNotices()) {
      EXPECT_NE(notice.kind, NoticeKind::kGapUnrecoverable) << notice.detail;
      failed |= notice.kind == NoticeKind::kReplayFailed;
    }
  }
  EXPECT_TRUE(failed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_EQ((*sub)->stats().replay_failures, 1u);
  EXPECT_EQ((*sub)->stats().batches_lost, 0u);
}

TEST_F(BusTest, ReplayServingAnAbsurdSequenceIsAbandoned) {
  RawReplayServer server(ctx_, Ep("replay"),
                         [&](uint64_t start, const RawReplayServer::Send& send) {
                           send(Be64(start), EncodeBatch(Batch(start)));
                           send(Be64(~uint64_t{0} - 1), EncodeBatch(Batch(1)));
                           send(Be64(~uint64_t{0}), "");
                         });
  auto sub = Subscriber::Create(SubOptions(Ep("pub"), Ep("replay"), 0));
  ASSERT_TRUE(sub.ok());
  auto got = ReadN(**sub, 1);
  ASSERT_EQ(got.size(), 1u);
  auto n = (*sub)->Next(300ms);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->has_value());
  SubscriberStats st = (*sub)->stats();
  EXPECT_EQ(st.batches_lost, 0u);
  EXPECT_GE(st.replay_failures, 1u);
  EXPECT_EQ(st.last_seq, 0u);
}

// The seqs of `got`, and `count` consecutive seqs from `first`.
std::vector<uint64_t> Seqs(const std::vector<ReceivedBatch>& got) {
  std::vector<uint64_t> out;
  for (const ReceivedBatch& b : got) out.push_back(b.seq);
  return out;
}
std::vector<uint64_t> SeqRun(uint64_t first, size_t count) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < count; ++i) out.push_back(first + i);
  return out;
}

// A replay from 0 (a fresh indexer: "everything the publisher still has") to a publisher that has
// sent 2,000,000 batches begins at its buffer's first seq: what it holds is delivered and what
// lies before is reported lost (not counted in batches_lost: 2,000,000 or 10^19, the seq may be
// garbage). The absurd-jump rule used to abandon that replay, and the live
// message after it "restarted" the stream there: the buffered batches were never delivered and
// never reported.
TEST_F(BusTest, AReplayFromZeroToALongRunningPublisherDeliversItsBuffer) {
  constexpr uint64_t kFirst = 2'000'000;
  RawReplayServer server(ctx_, Ep("replay"),
                         [&](uint64_t start, const RawReplayServer::Send& send) {
                           for (uint64_t seq = std::max(start, kFirst); seq < kFirst + 5; ++seq) {
                             send(Be64(seq), EncodeBatch(Batch(seq)));
                           }
                           send(Be64(~uint64_t{0}), "");
                         });
  RawPub pub(ctx_, Ep("pub"));
  auto sub = Subscriber::Create(UnprobedOptions(Ep("pub"), Ep("replay"), 0));
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(Seqs(ReadN(**sub, 5)), SeqRun(kFirst, 5));
  auto live = pub.Handshake(**sub, kFirst + 5);
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->seq, kFirst + 5);
  std::vector<SubscriberNotice> notices = (*sub)->TakeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].kind, NoticeKind::kGapUnrecoverable);
  EXPECT_EQ(notices[0].from_seq, 0u);
  EXPECT_EQ(notices[0].to_seq, kFirst);
  SubscriberStats st = (*sub)->stats();
  EXPECT_EQ(st.restarts, 0u);
  EXPECT_EQ(st.absurd_sequences, 0u);
  EXPECT_EQ(st.replay_failures, 0u);
  EXPECT_EQ(st.batches_lost, 0u);  // a range this long is reported, not counted (item 10)
}

// A publisher at seq 5,000,009 whose journal lost its tail serves seq 5,000,003 again with other
// content: one restart, then the new stream replayed from 0. It used to be reported twice (the
// sequence "jumped" 5,000,003 from the restart's 0) and the new stream was not replayed.
TEST_F(BusTest, ARestartAtAHighSequenceIsReportedOnceAndTheNewStreamReplayed) {
  constexpr uint64_t kBase = 5'000'000;
  // The new stream: kBase .. kBase + 3, other batches (100 + i) than the old stream's.
  RawReplayServer server(ctx_, Ep("replay"),
                         [&](uint64_t start, const RawReplayServer::Send& send) {
                           for (uint64_t seq = std::max(start, kBase); seq < kBase + 4; ++seq) {
                             send(Be64(seq), EncodeBatch(Batch(100 + seq - kBase)));
                           }
                           send(Be64(~uint64_t{0}), "");
                         });
  RawPub pub(ctx_, Ep("pub"));
  auto sub = Subscriber::Create(UnprobedOptions(Ep("pub"), Ep("replay"), std::nullopt));
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(pub.Handshake(**sub, kBase).has_value());
  for (uint64_t seq = kBase + 1; seq < kBase + 10; ++seq) pub.Send(seq, EncodeBatch(Batch(seq)));
  EXPECT_EQ(Seqs(ReadN(**sub, 9)), SeqRun(kBase + 1, 9));
  (void)(*sub)->TakeNotices();
  pub.Send(kBase + 3, EncodeBatch(Batch(103)));  // the restarted publisher, live
  std::vector<ReceivedBatch> fresh = ReadN(**sub, 4);
  EXPECT_EQ(Seqs(fresh), SeqRun(kBase, 4));
  for (size_t i = 0; i < fresh.size(); ++i) {
    EXPECT_EQ(fresh[i].batch.events.size(), 1u);
    EXPECT_EQ(std::get<BlockStored>(fresh[i].batch.events[0]).token_ids,
              std::vector<int64_t>{static_cast<int64_t>(100 + i)});
  }
  size_t restarts = 0;
  for (const SubscriberNotice& n : (*sub)->TakeNotices()) {
    restarts += n.kind == NoticeKind::kPublisherRestart ? 1 : 0;
  }
  EXPECT_EQ(restarts, 1u);
  SubscriberStats st = (*sub)->stats();
  EXPECT_EQ(st.restarts, 1u);
  EXPECT_EQ(st.absurd_sequences, 0u);
}

// A live message that started a gap replay, when that replay shows the publisher restarted: it
// was received before the restart replay, so it is the old stream's (or the new stream's and in
// that replay). It used to be delivered after the new stream's batches, reporting the seqs
// between as lost.
TEST_F(BusTest, TheLiveMessageAGapReplayRanForIsDroppedWhenTheReplayFindsARestart) {
  // The restarted publisher holds B0 .. B7 (batches 100 + seq); asked from anywhere but 0 it
  // answers from its seq 5, which differs from the A5 delivered.
  RawReplayServer server(ctx_, Ep("replay"),
                         [&](uint64_t start, const RawReplayServer::Send& send) {
                           for (uint64_t seq = start == 0 ? 0 : 5; seq < 8; ++seq) {
                             send(Be64(seq), EncodeBatch(Batch(100 + seq)));
                           }
                           send(Be64(~uint64_t{0}), "");
                         });
  RawPub pub(ctx_, Ep("pub"));
  auto sub = Subscriber::Create(UnprobedOptions(Ep("pub"), Ep("replay"), std::nullopt));
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(pub.Handshake(**sub, 0).has_value());
  for (uint64_t seq = 1; seq < 6; ++seq) pub.Send(seq, EncodeBatch(Batch(seq)));
  EXPECT_EQ(Seqs(ReadN(**sub, 5)), SeqRun(1, 5));
  pub.Send(10, EncodeBatch(Batch(10)));  // A10: a gap, sent before the old publisher went
  std::vector<ReceivedBatch> fresh = ReadN(**sub, 8);
  EXPECT_EQ(Seqs(fresh), SeqRun(0, 8));
  auto more = (*sub)->Next(300ms);
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(more->has_value()) << "delivered seq " << (*more)->seq << " after the new stream";
  for (const SubscriberNotice& n : (*sub)->TakeNotices()) {
    EXPECT_NE(n.kind, NoticeKind::kGapUnrecoverable) << n.from_seq << ".." << n.to_seq;
  }
  EXPECT_EQ((*sub)->stats().restarts, 1u);
}

// Item 12: a replay that times out is a failed replay, not "gap_unrecoverable [x, x)".
TEST_F(BusTest, ReplayTimeOutIsReportedAsAFailedReplayNotALoss) {
  RawReplayServer server(ctx_, Ep("replay"), [](uint64_t, const RawReplayServer::Send&) {});
  SubscriberOptions o = SubOptions(Ep("pub"), Ep("replay"), 0);
  o.replay_timeout_ms = 100;
  o.idle_probe_ms = 0;
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok());
  std::vector<SubscriberNotice> notices;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (notices.empty() && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE((*sub)->Next(20ms).ok());
    notices = (*sub)->TakeNotices();
  }
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].kind, NoticeKind::kReplayFailed);
  EXPECT_EQ((*sub)->stats().replay_failures, 1u);
}

// Item 13: a gap that replay filled is reported (kGapFilled with its range).
TEST_F(BusTest, FilledGapsAreReported) {
  RawPub pub(ctx_, Ep("pub"));
  RawReplayServer server(ctx_, Ep("replay"),
                         [&](uint64_t start, const RawReplayServer::Send& send) {
                           for (uint64_t seq = start; seq <= 6; ++seq)
                             send(Be64(seq), EncodeBatch(Batch(seq)));
                           send(Be64(~uint64_t{0}), "");
                         });
  auto sub = Subscriber::Create(UnprobedOptions(Ep("pub"), Ep("replay"), std::nullopt));
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(pub.Handshake(**sub, 3).has_value());
  (*sub)->TakeNotices();
  pub.Send(6, EncodeBatch(Batch(6)));
  auto got = ReadN(**sub, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].seq, 6u);
  ASSERT_TRUE((*sub)->Next(100ms).ok());  // the reply's end marker: the gap is filled
  auto notices = (*sub)->TakeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].kind, NoticeKind::kGapFilled);
  EXPECT_EQ(notices[0].from_seq, 4u);
  EXPECT_EQ(notices[0].to_seq, 7u);
  EXPECT_EQ((*sub)->stats().gaps_filled, 1u);
}

// A gap replay with a hole: the hole is gap_unrecoverable, and gap_filled covers only what the
// reply supplied, never the hole too (it reported [6, 31) beside the loss of [6, 20): a consumer
// summing the two counted those batches twice).
TEST_F(BusTest, FilledAndLostRangesOfOneReplayDoNotOverlap) {
  RawPub pub(ctx_, Ep("pub"));
  RawReplayServer server(ctx_, Ep("replay"),
                         [&](uint64_t start, const RawReplayServer::Send& send) {
                           if (start <= 5) send(Be64(5), EncodeBatch(Batch(5)));
                           for (uint64_t seq = std::max<uint64_t>(start, 20); seq <= 30; ++seq) {
                             send(Be64(seq), EncodeBatch(Batch(seq)));
                           }
                           send(Be64(~uint64_t{0}), "");
                         });
  auto sub = Subscriber::Create(UnprobedOptions(Ep("pub"), Ep("replay"), std::nullopt));
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(pub.Handshake(**sub, 0).has_value());
  for (uint64_t seq = 1; seq <= 5; ++seq) pub.Send(seq, EncodeBatch(Batch(seq)));
  EXPECT_EQ(Seqs(ReadN(**sub, 5)), SeqRun(1, 5));
  (void)(*sub)->TakeNotices();
  pub.Send(30, EncodeBatch(Batch(30)));
  EXPECT_EQ(Seqs(ReadN(**sub, 11)), SeqRun(20, 11));
  ASSERT_TRUE((*sub)->Next(100ms).ok());  // the reply's end marker
  std::vector<std::pair<NoticeKind, std::pair<uint64_t, uint64_t>>> got;
  for (const SubscriberNotice& n : (*sub)->TakeNotices()) {
    got.push_back({n.kind, {n.from_seq, n.to_seq}});
  }
  const std::vector<std::pair<NoticeKind, std::pair<uint64_t, uint64_t>>> want = {
      {NoticeKind::kGapUnrecoverable, {6, 20}}, {NoticeKind::kGapFilled, {20, 31}}};
  EXPECT_EQ(got, want);
  EXPECT_EQ((*sub)->stats().gaps_filled, 1u);
  EXPECT_EQ((*sub)->stats().batches_lost, 14u);
}

// Shutdown beside a Publish and beside another Shutdown (an engine's teardown on one thread, the
// destructor or a signal handler's path on another). Two Shutdowns both joined the consumer thread
// (std::system_error: the process ended), and a Publish that enqueued just before Shutdown woke
// the consumer through an eventfd Shutdown had closed (or a descriptor reused meanwhile). Run
// under TSan in CI, which also reports the old unsynchronised close.
TEST_F(BusTest, ShutdownRacesPublishAndAnotherShutdown) {
  for (int round = 0; round < 20; ++round) {
    auto pub = Publisher(Config());
    ASSERT_NE(pub, nullptr);
    std::atomic<bool> go{false};
    std::thread publisher([&] {
      while (!go.load()) std::this_thread::yield();
      for (uint64_t i = 0; pub->Publish(Batch(i)).ok(); ++i) {
      }
    });
    std::thread first([&] {
      while (!go.load()) std::this_thread::yield();
      pub->Shutdown();
    });
    std::thread second([&] {
      while (!go.load()) std::this_thread::yield();
      pub->Shutdown();
    });
    go = true;
    publisher.join();
    first.join();
    second.join();
    EXPECT_FALSE(pub->Publish(Batch(0)).ok());  // closed
  }
}

}  // namespace
}  // namespace kvo
