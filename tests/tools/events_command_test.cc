// End-to-end contract of `kvo events publish|tail|journal`: the real binary over real sockets,
// plus Python's pyzmq + msgpack as an independent vLLM-style consumer of what kvo publishes.
// Synchronisation is by events only (the publisher's status line, replay from seq 0, process
// exit); deadlines exist only to turn a hang into a failure.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "events/codec.h"
#include "events/event_json.h"
#include "events/journal.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using Json = nlohmann::json;
using testing::SteadyClock;

constexpr auto kGuard = std::chrono::seconds(60);  // failure guard for one process step
constexpr char kPython[] = "/usr/bin/python3";     // Debian's, with python3-msgpack/python3-zmq

using testing::ChildProcess;
using testing::RunCommand;
using RunResult = testing::CommandResult;

std::vector<std::string> Lines(const std::string& text) { return testing::SplitLines(text); }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// The input batches: A.3 examples 1, 2 and 4, then one with byte hashes, extra keys, every
// optional field, kvo's `reason`, and no data_parallel_rank (the publisher fills in its rank).
const std::vector<std::string> kInput = {
    R"({"ts":1700000000.5,"data_parallel_rank":0,"events":[{"type":"BlockStored",)"
    R"("block_hashes":[13366815110101616827,14660323646696587421],"parent_block_hash":null,)"
    R"("token_ids":[1,2,3,4,5,6,7,8],"block_size":4,"lora_id":null,"medium":"GPU",)"
    R"("lora_name":null,"extra_keys":[null,null],"group_idx":0,)"
    R"("kv_cache_spec_kind":"full_attention"}]})",
    R"({"ts":1700000001.0,"data_parallel_rank":0,"events":[{"type":"BlockRemoved",)"
    R"("block_hashes":[13366815110101616827],"medium":"GPU","group_idx":0},)"
    R"({"type":"AllBlocksCleared"}]})",
    R"({"ts":1700000002.25,"data_parallel_rank":1,"events":[{"type":"BlockStored",)"
    R"("block_hashes":[14660323646696587421],"parent_block_hash":null,"token_ids":[],)"
    R"("block_size":0,"lora_id":null,"medium":"CPU","lora_name":null,"group_idx":0}]})",
    R"({"ts":1700000003.125,"events":[{"type":"BlockStored","block_hashes":["00010203",)"
    R"("a0a1a2a3"],"parent_block_hash":"ffff","token_ids":[7,8],"block_size":1,"lora_id":7,)"
    R"("medium":"STORAGE","lora_name":"adapter-a","extra_keys":[["lora-a",["mm",3]],null],)"
    R"("group_idx":1,"kv_cache_spec_kind":"sliding_window","kv_cache_spec_sliding_window":4096,)"
    R"("locality":"REMOTE","ownership":"SHARED","session_id":"s-42"},{"type":"BlockRemoved",)"
    R"("block_hashes":[-5],"medium":"CPU","reason":"evicted"}]})",
};

// What a consumer must see for input line i published as seq `seq` on `topic` (the publisher
// fills in a missing data_parallel_rank with its own, 0). Canonical key order: BatchToJson's.
std::string Expected(size_t i, uint64_t seq, std::optional<std::string_view> topic) {
  Result<EventBatch> batch = BatchFromJson(kInput[i]);
  EXPECT_TRUE(batch.ok()) << batch.status().ToString();
  if (!batch.ok()) return "";
  if (!batch->data_parallel_rank) batch->data_parallel_rank = 0;
  return BatchToJson(*batch, seq, topic);
}

// vLLM's documented consumer (vllm-compat.md A.4/A.8) in Python: SUB on the topic plus a DEALER
// replay from seq 0, read until the end marker, msgpack-decode each payload, print it as JSON
// in kvo's JSON form (compact separators, wire key order, byte hashes as hex).
constexpr char kPythonConsumer[] = R"PY(
import json, sys, zmq, msgpack
endpoint, replay, topic = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(endpoint)
sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
dealer = ctx.socket(zmq.DEALER)
dealer.setsockopt(zmq.RCVTIMEO, 30000)
dealer.connect(replay)
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
while True:
    frames = dealer.recv_multipart()
    assert frames[0] == b"", frames
    if len(frames) == 4:
        t, seq, payload = frames[1:]
    else:
        t, (seq, payload) = b"", frames[1:]
    if seq == b"\xff" * 8 and payload == b"":
        break
    ts, events, dp = msgpack.unpackb(payload, raw=False)
    out = {"seq": int.from_bytes(seq, "big"), "topic": t.decode(), "ts": ts,
           "data_parallel_rank": dp, "events": events}
    print(json.dumps(out, separators=(",", ":"), ensure_ascii=False,
                     default=lambda b: b.hex()), flush=True)
sub.close(0)
dealer.close(0)
ctx.term()
)PY";

class EventsCommandTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  std::string Endpoint() const { return "ipc://" + Path("pub"); }
  std::string ReplayEndpoint() const { return "ipc://" + Path("replay"); }
  std::string Config(bool with_journal) const {
    std::string c = R"({"enable_kv_cache_events":true,"publisher":"zmq","endpoint":")" +
                    Endpoint() + R"(","replay_endpoint":")" + ReplayEndpoint() +
                    R"(","topic":"kv")";
    if (with_journal) c += R"(,"journal_dir":")" + Path("journal") + "\"";
    return c + "}";
  }
  std::string WriteInput(const std::vector<std::string>& lines) const {
    std::string text;
    for (const std::string& l : lines) text += l + "\n";
    std::string path = Path("input.jsonl");
    WriteFile(path, text);
    return path;
  }

  kvo::testing::TempDir dir_;
};

TEST_F(EventsCommandTest, PublishTailAndJournalAgree) {
  std::string input = WriteInput(kInput);
  std::string config_path = Path("config.json");
  WriteFile(config_path, Config(/*with_journal=*/true));

  ChildProcess publisher({KVO_BINARY, "events", "publish", "--kv-events-config", "@" + config_path,
                          "--input", input, "--linger-ms", "120000"});
  ASSERT_TRUE(publisher.started());
  // The status line comes after Flush(): every batch is journaled, sent and held for replay.
  std::optional<std::string> status = publisher.ReadStdoutLine(SteadyClock::now() + kGuard);
  ASSERT_TRUE(status.has_value()) << "publisher printed no status line; stderr:\n"
                                  << publisher.err();
  Json summary = Json::parse(*status);
  EXPECT_EQ(summary["published"], kInput.size()) << *status;
  EXPECT_EQ(summary["first_seq"], 0) << *status;
  EXPECT_EQ(summary["next_seq"], kInput.size()) << *status;
  EXPECT_EQ(summary["endpoint"], Endpoint()) << *status;

  const std::string n = std::to_string(kInput.size());
  {
    SCOPED_TRACE("kvo events tail --json");
    RunResult tail = RunCommand({KVO_BINARY, "events", "tail", "--endpoint", Endpoint(),
                                 "--replay-endpoint", ReplayEndpoint(), "--topic", "kv",
                                 "--from-seq", "0", "--max-batches", n, "--json"});
    ASSERT_EQ(tail.code, 0) << tail.err;
    std::vector<std::string> lines = Lines(tail.out);
    ASSERT_EQ(lines.size(), kInput.size()) << tail.out << "\nstderr:\n" << tail.err;
    for (size_t i = 0; i < kInput.size(); ++i) {
      EXPECT_EQ(lines[i], Expected(i, i, "kv")) << "batch " << i;
      // Independently of BatchToJson: the input line plus seq, topic and the filled-in rank.
      Json want = Json::parse(kInput[i]);
      want["seq"] = i;
      want["topic"] = "kv";
      if (!want.contains("data_parallel_rank")) want["data_parallel_rank"] = 0;
      EXPECT_EQ(Json::parse(lines[i]), want) << "batch " << i;
    }
  }
  {
    SCOPED_TRACE("kvo events tail (text), from seq 2");
    RunResult tail =
        RunCommand({KVO_BINARY, "events", "tail", "--endpoint", Endpoint(), "--replay-endpoint",
                    ReplayEndpoint(), "--topic", "kv", "--from-seq", "2", "--max-batches", "2"});
    ASSERT_EQ(tail.code, 0) << tail.err;
    std::vector<std::string> lines = Lines(tail.out);
    ASSERT_EQ(lines.size(), 3u) << tail.out;  // batch 3 has two events: two lines
    EXPECT_EQ(lines[0],
              "seq=2 ts=1700000002.250 dp=1 BlockStored medium=CPU group=0 "
              "hashes=[14660323646696587421] parent=- tokens=0 block_size=0");
    EXPECT_EQ(lines[1].rfind("seq=3 ts=1700000003.125 dp=0 BlockStored medium=STORAGE", 0), 0u)
        << lines[1];
    EXPECT_EQ(lines[2],
              "seq=3 ts=1700000003.125 dp=0 BlockRemoved medium=CPU group=- hashes=[-5] "
              "reason=evicted");
  }
  // SIGTERM ends the linger early and shuts down cleanly.
  publisher.Signal(SIGTERM);
  EXPECT_EQ(publisher.Wait(SteadyClock::now() + kGuard), 0) << publisher.err();

  {
    SCOPED_TRACE("kvo events journal --json");
    RunResult journal =
        RunCommand({KVO_BINARY, "events", "journal", "--dir", Path("journal"), "--json"});
    ASSERT_EQ(journal.code, 0) << journal.err;
    std::vector<std::string> lines = Lines(journal.out);
    ASSERT_EQ(lines.size(), kInput.size()) << journal.out;
    for (size_t i = 0; i < kInput.size(); ++i) {
      EXPECT_EQ(lines[i], Expected(i, i, std::nullopt)) << "record " << i;
    }
  }
  {
    SCOPED_TRACE("kvo events journal --from-seq 3 (text)");
    RunResult journal =
        RunCommand({KVO_BINARY, "events", "journal", "--dir", Path("journal"), "--from-seq", "3"});
    ASSERT_EQ(journal.code, 0) << journal.err;
    std::vector<std::string> lines = Lines(journal.out);
    ASSERT_EQ(lines.size(), 2u) << journal.out;
    EXPECT_EQ(lines[1],
              "seq=3 ts=1700000003.125 dp=0 BlockRemoved medium=CPU group=- hashes=[-5] "
              "reason=evicted");
  }
}

// The "a vLLM consumer reads kvo's bus" check: Python's pyzmq + msgpack (vLLM's own stack)
// replays from kvo's ROUTER and decodes every payload to the same values, in the same map order.
TEST_F(EventsCommandTest, PythonConsumerDecodesKvoBus) {
  if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " not found";
  RunResult probe = RunCommand({kPython, "-c", "import zmq, msgpack"});
  if (probe.code != 0) GTEST_SKIP() << "python3-zmq / python3-msgpack missing: " << probe.err;

  ChildProcess publisher({KVO_BINARY, "events", "publish", "--kv-events-config", Config(false),
                          "--input", WriteInput(kInput), "--linger-ms", "120000"});
  ASSERT_TRUE(publisher.started());
  std::optional<std::string> status = publisher.ReadStdoutLine(SteadyClock::now() + kGuard);
  ASSERT_TRUE(status.has_value()) << "publisher printed no status line; stderr:\n"
                                  << publisher.err();

  RunResult py = RunCommand({kPython, "-c", kPythonConsumer, Endpoint(), ReplayEndpoint(), "kv"});
  ASSERT_EQ(py.code, 0) << py.err;
  std::vector<std::string> lines = Lines(py.out);
  ASSERT_EQ(lines.size(), kInput.size()) << py.out << "\nstderr:\n" << py.err;
  for (size_t i = 0; i < kInput.size(); ++i) {
    // Same text: same values, same map key order on the wire, same float formatting.
    EXPECT_EQ(lines[i], Expected(i, i, "kv")) << "batch " << i;
  }
  publisher.Signal(SIGINT);
  EXPECT_EQ(publisher.Wait(SteadyClock::now() + kGuard), 0) << publisher.err();
}

TEST_F(EventsCommandTest, InlineConfigAndLingerZero) {
  // --kv-events-config as inline JSON; a publisher without a journal; linger 0 exits at once.
  RunResult publish = RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config",
                                  Config(/*with_journal=*/false), "--input", WriteInput(kInput),
                                  "--linger-ms", "0"});
  ASSERT_EQ(publish.code, 0) << publish.err;
  Json summary = Json::parse(Lines(publish.out).at(0));
  EXPECT_EQ(summary["published"], kInput.size());
  EXPECT_EQ(summary["replay_endpoint"], ReplayEndpoint());
  EXPECT_EQ(summary["topic"], "kv");
}

TEST_F(EventsCommandTest, BadLinePublishesNothing) {
  std::vector<std::string> lines = {kInput[0], "", kInput[1],
                                    R"({"ts":1.0,"events":[{"type":"BlockRemoved",)"
                                    R"("block_hashes":[1.5],"medium":"GPU"}]})",
                                    kInput[2]};
  RunResult publish = RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config",
                                  Config(/*with_journal=*/true), "--input", WriteInput(lines)});
  EXPECT_EQ(publish.code, 2) << publish.err;
  EXPECT_NE(publish.err.find("line 4"), std::string::npos) << publish.err;
  EXPECT_NE(publish.err.find("events[0].block_hashes[0]: expected integer or hex string"),
            std::string::npos)
      << publish.err;
  EXPECT_TRUE(publish.out.empty()) << publish.out;
  // Validated before the publisher was created: no journal, no socket.
  struct stat st;
  EXPECT_NE(::stat(Path("journal").c_str(), &st), 0);
  EXPECT_NE(::stat(Path("pub").c_str(), &st), 0);

  RunResult not_json = RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config",
                                   Config(false), "--input", WriteInput({kInput[0], "{nope"})});
  EXPECT_EQ(not_json.code, 2) << not_json.err;
  EXPECT_NE(not_json.err.find("line 2"), std::string::npos) << not_json.err;
}

TEST_F(EventsCommandTest, IpcEndpointWithDpRankIsInvalid) {
  RunResult publish =
      RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config", Config(false), "--input",
                  WriteInput(kInput), "--dp-rank", "1", "--linger-ms", "0"});
  EXPECT_EQ(publish.code, 2) << publish.err;
  EXPECT_NE(publish.err.find("Invalid endpoint"), std::string::npos) << publish.err;
  EXPECT_TRUE(publish.out.empty()) << publish.out;
}

TEST_F(EventsCommandTest, DisabledOrBadConfigIsInvalid) {
  std::string input = WriteInput(kInput);
  for (const std::string& config :
       {std::string(R"({"enable_kv_cache_events":false,"endpoint":")") + Endpoint() + "\"}",
        std::string(R"({"enable_kv_cache_events":true,"publisher":"null"})")}) {
    RunResult publish = RunCommand(
        {KVO_BINARY, "events", "publish", "--kv-events-config", config, "--input", input});
    EXPECT_EQ(publish.code, 2) << config << "\n" << publish.err;
    EXPECT_NE(publish.err.find("nothing would be published"), std::string::npos) << publish.err;
  }
  RunResult bad = RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config",
                              R"({"enable_kv_cache_events":true,"bogus":1})", "--input", input});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("bogus"), std::string::npos) << bad.err;
  RunResult missing_file = RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config",
                                       "@" + Path("no-such.json"), "--input", input});
  EXPECT_EQ(missing_file.code, 2) << missing_file.err;
  RunResult missing_input = RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config",
                                        Config(false), "--input", Path("no-such.jsonl")});
  EXPECT_EQ(missing_input.code, 2) << missing_input.err;
  EXPECT_NE(missing_input.err.find("no-such.jsonl"), std::string::npos) << missing_input.err;
}

TEST_F(EventsCommandTest, TailTimesOutQuietly) {
  // Nobody publishes: --timeout-ms ends the wait with status 0 and no output.
  RunResult tail = RunCommand({KVO_BINARY, "events", "tail", "--endpoint", Endpoint(),
                               "--replay-endpoint", ReplayEndpoint(), "--from-seq", "0", "--json",
                               "--timeout-ms", "300", "--replay-timeout-ms", "200"});
  EXPECT_EQ(tail.code, 0) << tail.err;
  EXPECT_TRUE(tail.out.empty()) << tail.out;
  // The unanswered replay is a notice on stderr (a JSON object with --json), never on stdout.
  EXPECT_NE(tail.err.find(R"({"notice":")"), std::string::npos) << tail.err;

  RunResult live_only =
      RunCommand({KVO_BINARY, "events", "tail", "--endpoint", Endpoint(), "--timeout-ms", "100"});
  EXPECT_EQ(live_only.code, 0) << live_only.err;
  EXPECT_TRUE(live_only.out.empty()) << live_only.out;

  RunResult bad =
      RunCommand({KVO_BINARY, "events", "tail", "--endpoint", Endpoint(), "--timeout-ms", "-1"});
  EXPECT_EQ(bad.code, 2) << bad.err;
}

TEST_F(EventsCommandTest, JournalSkipsUndecodableRecords) {
  {
    JournalOptions options;
    options.dir = Path("journal");
    Result<std::unique_ptr<Journal>> journal = Journal::Open(options);
    ASSERT_TRUE(journal.ok()) << journal.status().ToString();
    for (size_t i = 0; i < 3; ++i) {
      Result<EventBatch> batch = BatchFromJson(kInput[i]);
      ASSERT_TRUE(batch.ok());
      std::string payload = i == 1 ? std::string("\xc1 not msgpack") : EncodeBatch(*batch);
      ASSERT_TRUE((*journal)->Append(10 + i, payload).ok());
    }
    ASSERT_TRUE((*journal)->Flush().ok());
  }
  RunResult journal =
      RunCommand({KVO_BINARY, "events", "journal", "--dir", Path("journal"), "--json"});
  EXPECT_EQ(journal.code, 1) << journal.err;
  EXPECT_NE(journal.err.find("seq=11"), std::string::npos) << journal.err;
  std::vector<std::string> lines = Lines(journal.out);
  ASSERT_EQ(lines.size(), 2u) << journal.out;
  EXPECT_EQ(lines[0], Expected(0, 10, std::nullopt));
  EXPECT_EQ(lines[1], Expected(2, 12, std::nullopt));

  RunResult from = RunCommand(
      {KVO_BINARY, "events", "journal", "--dir", Path("journal"), "--from-seq", "12", "--json"});
  EXPECT_EQ(from.code, 0) << from.err;
  EXPECT_EQ(from.out, Expected(2, 12, std::nullopt) + "\n");
}

TEST_F(EventsCommandTest, JournalOfMissingDirFails) {
  RunResult journal = RunCommand({KVO_BINARY, "events", "journal", "--dir", Path("none")});
  EXPECT_NE(journal.code, 0);
  EXPECT_NE(journal.err.find("kvo: "), std::string::npos) << journal.err;
  EXPECT_TRUE(journal.out.empty()) << journal.out;
}

// Issue 10 item 12: a directory as --input published nothing and exited 0.
TEST_F(EventsCommandTest, InputDirectoryIsAnError) {
  RunResult publish = RunCommand({KVO_BINARY, "events", "publish", "--kv-events-config",
                                  Config(false), "--input", dir_.path(), "--linger-ms", "0"});
  EXPECT_EQ(publish.code, 2) << publish.err;
  EXPECT_NE(publish.err.find("is a directory"), std::string::npos) << publish.err;
  EXPECT_TRUE(publish.out.empty()) << publish.out;
}

// Issue 10 item 12: impossible endpoints are refused, naming the flag and the value.
TEST_F(EventsCommandTest, TailRefusesImpossibleEndpoints) {
  RunResult port = RunCommand(
      {KVO_BINARY, "events", "tail", "--endpoint", "tcp://127.0.0.1:99999", "--timeout-ms", "1"});
  EXPECT_EQ(port.code, 2) << port.err;
  EXPECT_NE(port.err.find("--endpoint 'tcp://127.0.0.1:99999'"), std::string::npos) << port.err;
  RunResult replay = RunCommand({KVO_BINARY, "events", "tail", "--endpoint", Endpoint(),
                                 "--replay-endpoint", "tcp://h:0", "--timeout-ms", "1"});
  EXPECT_EQ(replay.code, 2) << replay.err;
  EXPECT_NE(replay.err.find("--replay-endpoint"), std::string::npos) << replay.err;
}

// Issue 10 item 13: `kvo events tail` reports the gaps it filled from replay (text and --json).
TEST_F(EventsCommandTest, TailReportsFilledGaps) {
  for (bool json : {false, true}) {
    SCOPED_TRACE(json ? "json" : "text");
    kvo::testing::TempDir dir;
    const std::string pub_ep = "ipc://" + dir.path() + "/pub";
    const std::string replay_ep = "ipc://" + dir.path() + "/replay";
    zmq::context_t ctx;
    zmq::socket_t pub(ctx, zmq::socket_type::pub);
    pub.set(zmq::sockopt::linger, 0);
    pub.bind(pub_ep);
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.bind(replay_ep);
    auto payload = [](uint64_t i) {
      EventBatch b;
      b.ts = 1700000000.0 + static_cast<double>(i);
      b.data_parallel_rank = 0;
      return EncodeBatch(b);
    };
    auto be64 = [](uint64_t v) {
      std::string s(8, '\0');
      for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
      return s;
    };
    auto send = [&](uint64_t seq) {
      std::string seq_bytes = be64(seq), p = payload(seq);
      pub.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(p), zmq::send_flags::none);
    };
    std::vector<std::string> argv = {KVO_BINARY, "events",       "tail", "--endpoint",
                                     pub_ep,     "--topic",      "kv",   "--replay-endpoint",
                                     replay_ep,  "--timeout-ms", "1500"};
    if (json) argv.push_back("--json");
    ChildProcess tail(argv);
    // Seq 3 until the tail prints it (PUB drops messages before the SUB connects).
    std::optional<std::string> first;
    auto guard = SteadyClock::now() + kGuard;
    while (!first && SteadyClock::now() < guard) {
      send(3);
      first = tail.ReadStdoutLine(SteadyClock::now() + std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(first.has_value()) << tail.err();
    send(6);  // 4 and 5 are missing: the tail asks for a replay
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(20000));
    ASSERT_TRUE(item.revents & ZMQ_POLLIN) << tail.err();
    std::vector<zmq::message_t> req;
    ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(req)));
    ASSERT_EQ(req.size(), 3u);
    std::string id = req[0].to_string();
    for (uint64_t seq = 3; seq <= 7; ++seq) {
      std::string seq_bytes = seq == 7 ? std::string(8, '\xff') : be64(seq);
      std::string p = seq == 7 ? std::string() : payload(seq);
      std::array<zmq::const_buffer, 5> frames = {zmq::buffer(id), zmq::const_buffer(nullptr, 0),
                                                 zmq::str_buffer("kv"), zmq::buffer(seq_bytes),
                                                 zmq::buffer(p)};
      zmq::send_multipart(router, frames);
    }
    ASSERT_EQ(tail.Wait(SteadyClock::now() + kGuard), 0) << tail.err();
    EXPECT_EQ(Lines(tail.out()).size(), 3u) << tail.out();  // 4, 5, 6
    const std::string want =
        json ? R"({"notice":"gap_filled","from_seq":4,"to_seq":7)" : "notice gap_filled [4, 7)";
    EXPECT_NE(tail.err().find(want), std::string::npos) << tail.err();
  }
}

}  // namespace
}  // namespace kvo
