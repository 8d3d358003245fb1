// `kvo events tail|publish|journal`: the KV-event bus from the command line.
//   tail     subscribes (SUB + DEALER replay) and prints one line per batch, in sequence order;
//   publish  publishes batches from a JSON-lines file through the real publisher;
//   journal  prints the records of a journal directory.
// JSON lines use events/event_json.h's form; stdout carries only data, notices go to stderr.
#include <signal.h>
#include <time.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "events/events.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

// nlohmann_json for the small status objects; its exceptions stop here.
void PrintJsonLine(FILE* out, const nlohmann::ordered_json& j) {
  std::string line;
  try {
    line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } catch (const std::exception& e) {
    line = std::string("{\"error\":\"") + e.what() + "\"}";
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), out);
  std::fflush(out);
}

// ---------------------------------------------------------------------------------------------
// kvo events tail

struct TailArgs {
  std::string endpoint;
  std::string replay_endpoint;
  std::string topic;
  uint64_t from_seq = 0;
  uint64_t max_batches = 0;
  int64_t timeout_ms = 0;
  int64_t replay_timeout_ms = SubscriberOptions{}.replay_timeout_ms;
  bool json = false;
  // Set when the option was given.
  CLI::Option* replay_opt = nullptr;
  CLI::Option* from_seq_opt = nullptr;
  CLI::Option* max_batches_opt = nullptr;
  CLI::Option* timeout_opt = nullptr;
};

// Every notice -- filled gaps included -- goes to stderr: with --json as one JSON object each
// (for programs that watch the stream), else as one text line each.
void ReportNotices(const std::vector<SubscriberNotice>& notices, bool json) {
  for (const SubscriberNotice& n : notices) {
    if (!json) {
      std::string line = std::string("notice ") + NoticeKindName(n.kind) + " [" +
                         std::to_string(n.from_seq) + ", " + std::to_string(n.to_seq) + ")";
      if (!n.detail.empty()) line += " " + n.detail;
      line += '\n';
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fflush(stderr);
      continue;
    }
    nlohmann::ordered_json j;
    j["notice"] = NoticeKindName(n.kind);
    j["from_seq"] = n.from_seq;
    j["to_seq"] = n.to_seq;
    j["detail"] = n.detail;
    PrintJsonLine(stderr, j);
  }
}

Status RunTail(const TailArgs& args) {
  if (args.timeout_opt->count() > 0 && args.timeout_ms < 0) {
    return Status::InvalidArgument("--timeout-ms must be >= 0, got " +
                                   std::to_string(args.timeout_ms));
  }
  KVO_RETURN_IF_ERROR(ValidateEndpoint(args.endpoint, "--endpoint"));
  if (args.replay_opt->count() > 0) {
    KVO_RETURN_IF_ERROR(ValidateEndpoint(args.replay_endpoint, "--replay-endpoint"));
  }
  SubscriberOptions options;
  options.endpoint = args.endpoint;
  if (args.replay_opt->count() > 0) options.replay_endpoint = args.replay_endpoint;
  options.topic = args.topic;
  if (args.from_seq_opt->count() > 0) options.start_seq = args.from_seq;
  if (args.replay_timeout_ms <= 0) {
    return Status::InvalidArgument("--replay-timeout-ms must be > 0, got " +
                                   std::to_string(args.replay_timeout_ms));
  }
  options.replay_timeout_ms = args.replay_timeout_ms;
  const bool bounded = args.max_batches_opt->count() > 0;
  const bool has_timeout = args.timeout_opt->count() > 0;
  if (bounded && args.max_batches == 0) return Status::Ok();

  KVO_ASSIGN_OR_RETURN(std::unique_ptr<Subscriber> subscriber, Subscriber::Create(options));

  using SteadyClock = std::chrono::steady_clock;
  auto idle_deadline = SteadyClock::now() + std::chrono::milliseconds(args.timeout_ms);
  uint64_t printed = 0;
  while (!bounded || printed < args.max_batches) {
    // Without a timeout, wake up every second anyway to report notices.
    std::chrono::milliseconds wait(1000);
    if (has_timeout) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(idle_deadline - SteadyClock::now());
      wait = std::clamp(left, std::chrono::milliseconds(0), wait);
    }
    KVO_ASSIGN_OR_RETURN(std::optional<ReceivedBatch> received, subscriber->Next(wait));
    ReportNotices(subscriber->TakeNotices(), args.json);
    if (!received) {
      if (has_timeout && SteadyClock::now() >= idle_deadline) {
        KVO_LOG_INFO("kvo events tail: no batch for {} ms; {} printed", args.timeout_ms, printed);
        return Status::Ok();
      }
      continue;
    }
    PrintLine(args.json ? BatchToJson(received->batch, received->seq, received->topic)
                        : BatchToText(received->batch, received->seq));
    ++printed;
    idle_deadline = SteadyClock::now() + std::chrono::milliseconds(args.timeout_ms);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// kvo events publish

struct PublishArgs {
  std::string config;
  std::string input;
  int64_t linger_ms = 1000;
  int64_t dp_rank = 0;
};

// Parses every line first, so that bad input publishes nothing. Blank lines are skipped.
Result<std::vector<EventBatch>> ReadBatches(const std::string& path) {
  std::string text;
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    KVO_ASSIGN_OR_RETURN(text, ReadInputFile(path, "--input"));
  }
  std::vector<EventBatch> batches;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Result<EventBatch> batch = BatchFromJson(line);
    if (!batch.ok()) {
      return Status::InvalidArgument(path + " line " + std::to_string(line_no) + ": " +
                                     batch.status().message());
    }
    batches.push_back(std::move(batch).value());
  }
  return batches;
}

Status RunPublish(const PublishArgs& args) {
  std::string config_json = args.config;
  if (!config_json.empty() && config_json[0] == '@') {
    KVO_ASSIGN_OR_RETURN(config_json, ReadInputFile(config_json.substr(1), "--kv-events-config"));
  }
  Result<KvEventsConfig> parsed = ParseKvEventsConfig(config_json);
  if (!parsed.ok()) return parsed.status().WithContext("--kv-events-config");
  const KvEventsConfig& config = *parsed;
  if (!config.enable_kv_cache_events || config.publisher == "null") {
    return Status::InvalidArgument(
        "--kv-events-config: enable_kv_cache_events is false or publisher is \"null\": nothing "
        "would be published");
  }
  if (args.dp_rank < 0) {
    return Status::InvalidArgument("--dp-rank must be >= 0, got " + std::to_string(args.dp_rank));
  }
  if (args.linger_ms < 0) {
    return Status::InvalidArgument("--linger-ms must be >= 0, got " +
                                   std::to_string(args.linger_ms));
  }
  // The DP port offset is checked before anything is read or bound (vLLM's ValueError).
  {
    Result<std::string> endpoint = OffsetEndpointPort(config.endpoint, args.dp_rank);
    if (!endpoint.ok()) return endpoint.status().WithContext("endpoint '" + config.endpoint + "'");
    if (config.replay_endpoint) {
      Result<std::string> replay = OffsetEndpointPort(*config.replay_endpoint, args.dp_rank);
      if (!replay.ok()) {
        return replay.status().WithContext("replay_endpoint '" + *config.replay_endpoint + "'");
      }
    }
  }
  KVO_ASSIGN_OR_RETURN(std::vector<EventBatch> batches, ReadBatches(args.input));

  sigset_t signals = BlockTerminationSignals();
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<EventPublisher> publisher,
                       CreateEventPublisher(config, args.dp_rank));
  std::optional<uint64_t> first_seq = publisher->stats().next_seq;
  for (size_t i = 0; i < batches.size(); ++i) {
    Status s = publisher->Publish(std::move(batches[i]));
    if (!s.ok()) {
      publisher->Shutdown();
      return s.WithContext("publishing batch " + std::to_string(i + 1));
    }
  }
  publisher->Flush();
  PublisherStats stats = publisher->stats();

  // One status line: the batches are now journaled, sent and held for replay.
  nlohmann::ordered_json summary;
  summary["published"] = batches.size();
  summary["first_seq"] = first_seq && !batches.empty() ? nlohmann::ordered_json(*first_seq)
                                                       : nlohmann::ordered_json(nullptr);
  summary["next_seq"] =
      stats.next_seq ? nlohmann::ordered_json(*stats.next_seq) : nlohmann::ordered_json(nullptr);
  if (std::optional<KvEventsConfig> resolved = publisher->publisher_config()) {
    summary["endpoint"] = resolved->endpoint;
    summary["replay_endpoint"] = resolved->replay_endpoint
                                     ? nlohmann::ordered_json(*resolved->replay_endpoint)
                                     : nlohmann::ordered_json(nullptr);
    summary["topic"] = resolved->topic;
  }
  summary["linger_ms"] = args.linger_ms;
  PrintJsonLine(stdout, summary);
  if (stats.send_errors > 0 || stats.journal_errors > 0) {
    KVO_LOG_WARN("kvo events publish: {} send errors, {} journal errors", stats.send_errors,
                 stats.journal_errors);
  }

  // Serve replay for late subscribers; SIGINT/SIGTERM ends the wait early.
  int sig = LingerUntilSignal(signals, args.linger_ms);
  if (sig != 0) KVO_LOG_INFO("kvo events publish: signal {}, shutting down", sig);
  publisher->Shutdown();
  stats = publisher->stats();
  if (stats.journal_errors > 0) {
    return Status::IOError(std::to_string(stats.journal_errors) +
                           " batches could not be journaled");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// kvo events journal

struct JournalArgs {
  std::string dir;
  uint64_t from_seq = 0;
  bool json = false;
};

// Exit status 1 when a record does not decode (each is named on stderr).
ExitCode RunJournal(const JournalArgs& args) {
  JournalOptions options;
  options.dir = args.dir;
  options.read_only = true;
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<Journal> journal, Journal::Open(options));
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<JournalReader> reader, journal->NewReader(args.from_seq));
  JournalRecord record;
  uint64_t failed = 0;
  while (true) {
    KVO_ASSIGN_OR_RETURN(bool more, reader->Next(&record));
    if (!more) break;
    Result<EventBatch> batch = DecodeBatch(record.payload);
    if (!batch.ok()) {
      ++failed;
      std::fprintf(stderr, "kvo: journal record seq=%llu does not decode: %s\n",
                   static_cast<unsigned long long>(record.seq), batch.status().ToString().c_str());
      continue;
    }
    PrintLine(args.json ? BatchToJson(*batch, record.seq, std::nullopt)
                        : BatchToText(*batch, record.seq));
  }
  if (failed > 0) {
    std::fprintf(stderr, "kvo: %llu journal records failed to decode\n",
                 static_cast<unsigned long long>(failed));
    return 1;
  }
  return 0;
}

}  // namespace

void AddEventsCommands(CLI::App& app, CommandTable& commands) {
  CLI::App* events = app.add_subcommand("events", "KV-event bus: tail, publish, journal");
  events->require_subcommand(1);

  auto tail_args = std::make_shared<TailArgs>();
  CLI::App* tail = events->add_subcommand(
      "tail", "Subscribe to a publisher and print its batches in sequence order");
  tail->add_option("--endpoint", tail_args->endpoint, "the publisher's PUB endpoint")->required();
  tail_args->replay_opt = tail->add_option("--replay-endpoint", tail_args->replay_endpoint,
                                           "its ROUTER replay endpoint (gap filling)");
  tail->add_option("--topic", tail_args->topic, "topic prefix filter");
  tail_args->from_seq_opt = tail->add_option(
      "--from-seq", tail_args->from_seq, "replay from this sequence first (default: live only)");
  tail_args->max_batches_opt =
      tail->add_option("--max-batches", tail_args->max_batches, "exit 0 after N batches");
  tail->add_flag("--json", tail_args->json, "one JSON object per batch (default: text)");
  tail_args->timeout_opt = tail->add_option("--timeout-ms", tail_args->timeout_ms,
                                            "exit 0 after this long without a batch");
  tail->add_option("--replay-timeout-ms", tail_args->replay_timeout_ms,
                   "how long to wait for a replay's end marker before reporting a gap")
      ->capture_default_str();
  commands.AddStatus(tail, [tail_args] { return RunTail(*tail_args); });

  auto publish_args = std::make_shared<PublishArgs>();
  CLI::App* publish = events->add_subcommand(
      "publish", "Publish the batches of a JSON-lines file, then serve replay for a while");
  publish
      ->add_option("--kv-events-config", publish_args->config,
                   "vLLM's --kv-events-config JSON, or @path to read it from a file")
      ->required();
  publish
      ->add_option("--input", publish_args->input,
                   "JSON lines, one batch each ('-' for stdin); seq is assigned by the publisher")
      ->required();
  publish
      ->add_option("--linger-ms", publish_args->linger_ms,
                   "serve replay this long after publishing (SIGINT/SIGTERM end it early)")
      ->capture_default_str();
  publish->add_option("--dp-rank", publish_args->dp_rank, "data-parallel rank (offsets ports)")
      ->capture_default_str();
  commands.AddStatus(publish, [publish_args] { return RunPublish(*publish_args); });

  auto journal_args = std::make_shared<JournalArgs>();
  CLI::App* journal =
      events->add_subcommand("journal", "Print the records of a journal directory (read-only)");
  journal->add_option("--dir", journal_args->dir, "journal directory")->required();
  journal->add_option("--from-seq", journal_args->from_seq, "first sequence to print")
      ->capture_default_str();
  journal->add_flag("--json", journal_args->json, "one JSON object per record (default: text)");
  commands.Add(journal, [journal_args] { return RunJournal(*journal_args); });
}

}  // namespace kvo::cli
