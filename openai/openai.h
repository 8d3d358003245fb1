// kvo_openai: the pieces of OpenAI's HTTP API that kvo's engine simulator (`kvo sim`), router
// (`kvo route`) and load generator (`kvo load`) share (openai/DESIGN.md): a deterministic text
// tokenizer (no model, no download), parsing of /v1/completions and /v1/chat/completions requests,
// OpenAI's error body, and Server-Sent Events framing (writing and reading).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace kvo::openai {

// ---- Tokenizer (openai/DESIGN.md "Tokenizer") ----
// Ids 0-255: single bytes (punctuation, control, lone whitespace); ids 256..kVocabSize-1: word
// pieces, by hash. Deterministic across processes, machines and builds.
inline constexpr uint32_t kVocabSize = 50000;
std::vector<uint32_t> Tokenize(std::string_view text);

// ---- Requests ----
enum class Endpoint { kCompletions, kChatCompletions };

struct ChatMessage {
  std::string role;
  std::string content;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                    // as sent ("" when absent)
  std::vector<uint32_t> prompt_tokens;  // the prompt as token ids (tokenized when text)
  bool prompt_was_text = false;
  int max_tokens = 16;  // tokens to generate (`max_tokens` / `max_completion_tokens`)
  bool stream = false;
};

// Upper bounds a request is checked against (InvalidArgument naming the field beyond them).
inline constexpr int kMaxTokensLimit = 1 << 20;
inline constexpr size_t kMaxPromptTokens = 1u << 22;

// POST /v1/completions: `prompt` (a string, an array of token ids, or a one-element array of
// either) or `prompt_token_ids` (array of ids), `max_tokens` (default 16), `stream`, `model`.
// InvalidArgument naming the field on anything else (a batch of prompts, n > 1, a wrong type).
Result<CompletionRequest> ParseCompletionRequest(std::string_view body);
// POST /v1/chat/completions: `messages` ([{role, content}], content a string or text parts) put
// through ChatTemplate and tokenized; `max_completion_tokens` or `max_tokens`, `stream`, `model`.
Result<CompletionRequest> ParseChatCompletionRequest(std::string_view body);
// The fixed chat template: "<|ROLE|>\nCONTENT\n" per message, then "<|assistant|>\n".
std::string ChatTemplate(const std::vector<ChatMessage>& messages);

// ---- Errors ----
// {"error":{"message":M,"type":T,"param":P or null,"code":HTTP status}}; `type` from the status
// when empty (400 invalid_request_error, 404 not_found_error, 503 service_unavailable_error, ...).
std::string ErrorJson(int http_status, std::string_view message, std::string_view param = {},
                      std::string_view type = {});
std::string ErrorType(int http_status);

// ---- Server-Sent Events ----
// "data: PAYLOAD\n\n" (PAYLOAD must hold no newline: JSON from a serializer never does).
std::string SseData(std::string_view payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Reads an SSE stream fed in arbitrary pieces and hands each event's data (the `data:` lines of an
// event, joined by '\n') to the callback; comments and other fields are skipped. Events end at a
// blank line ("\n\n" or "\r\n\r\n"). Bounded: an event larger than `max_event_bytes` is an error.
class SseReader {
 public:
  using OnData = std::function<void(std::string_view data)>;
  explicit SseReader(size_t max_event_bytes = 16u << 20) : max_event_bytes_(max_event_bytes) {}
  // InvalidArgument when an event passes the bound (the reader is then unusable).
  Status Feed(std::string_view bytes, const OnData& on_data);

 private:
  std::string pending_;
  size_t max_event_bytes_;
};

}  // namespace kvo::openai
