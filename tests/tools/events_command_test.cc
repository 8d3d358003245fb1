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

#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "events/codec.h"
#include "events/event_json.h"
#include "events/journal.h"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace kvo {
namespace {

using Json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

constexpr auto kGuard = std::chrono::seconds(60);  // failure guard for one process step
constexpr char kPython[] = "/usr/bin/python3";     // Debian's, with python3-msgpack/python3-zmq

// A child process with its stdout and stderr on pipes. Killed (SIGKILL) if still running when
// destroyed, so a failed assertion never leaves a publisher behind.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int out[2];
    int err[2];
    if (::pipe(out) != 0 || ::pipe(err) != 0) {
      ADD_FAILURE() << "pipe: " << std::strerror(errno);
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    posix_spawn_file_actions_addclose(&actions, err[0]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(rc);
      pid_ = -1;
    }
  }
  ~Child() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  void Signal(int sig) {
    if (pid_ > 0 && !status_) ::kill(pid_, sig);
  }

  // The next complete stdout line, or nullopt at EOF or when `deadline` passes (failure guard).
  std::optional<std::string> ReadStdoutLine(SteadyClock::time_point deadline) {
    while (true) {
      size_t nl = out_.find('\n', out_pos_);
      if (nl != std::string::npos) {
        std::string line = out_.substr(out_pos_, nl - out_pos_);
        out_pos_ = nl + 1;
        return line;
      }
      if (!Pump(deadline, /*want_stdout=*/true)) return std::nullopt;
    }
  }

  // Reads both pipes to EOF and reaps the child. Returns the exit code, -1 when it was killed by
  // a signal or the deadline passed (then the child is SIGKILLed).
  int Wait(SteadyClock::time_point deadline) {
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (!Pump(deadline, false)) break;
    }
    if (out_fd_ >= 0 || err_fd_ >= 0) {
      ADD_FAILURE() << "child " << pid_
                    << " still running at the deadline; killing it\nstderr: " << err_;
      ::kill(pid_, SIGKILL);
    }
    int st = 0;
    ::waitpid(pid_, &st, 0);
    status_ = st;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  std::string out() const { return out_.substr(out_pos_); }
  const std::string& err() const { return err_; }

 private:
  // Waits for data on the open pipes and appends it. False at the deadline, or when EOF on
  // stdout was reached while a stdout line was wanted.
  bool Pump(SteadyClock::time_point deadline, bool want_stdout) {
    pollfd fds[2];
    int n = 0;
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    if (n == 0 || (want_stdout && out_fd_ < 0)) return false;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return false;
    int r = ::poll(fds, static_cast<nfds_t>(n), static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) return true;
    if (r <= 0) return false;
    for (int i = 0; i < n; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[65536];
      ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      bool is_out = fds[i].fd == out_fd_;
      if (got > 0) {
        (is_out ? out_ : err_).append(buf, static_cast<size_t>(got));
      } else {
        ::close(fds[i].fd);
        (is_out ? out_fd_ : err_fd_) = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  size_t out_pos_ = 0;
  std::string err_;
  std::optional<int> status_;
};

struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
};

RunResult RunCommand(const std::vector<std::string>& argv) {
  Child child(argv);
  RunResult r;
  if (!child.started()) return r;
  r.code = child.Wait(SteadyClock::now() + kGuard);
  r.out = child.out();
  r.err = child.err();
  return r;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

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

  Child publisher({KVO_BINARY, "events", "publish", "--kv-events-config", "@" + config_path,
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

  Child publisher({KVO_BINARY, "events", "publish", "--kv-events-config", Config(false), "--input",
                   WriteInput(kInput), "--linger-ms", "120000"});
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

}  // namespace
}  // namespace kvo
