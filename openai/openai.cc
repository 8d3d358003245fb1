#include "openai/openai.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace kvo::openai {
namespace {

using json = nlohmann::json;

bool IsWordByte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

uint32_t Fnv1a32(std::string_view s, bool space) {
  uint32_t h = 2166136261u;
  auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 16777619u;
  };
  if (space) mix(' ');
  for (char c : s) mix(static_cast<unsigned char>(c));
  return h;
}

constexpr size_t kPieceBytes = 4;

Status Bad(std::string_view param, const std::string& why) {
  return Status::InvalidArgument(std::string(param) + ": " + why);
}

Result<json> ParseBody(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("body: not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("body: not a JSON object");
  return j;
}

Result<std::vector<uint32_t>> TokenIds(const json& a, std::string_view param) {
  if (a.size() > kMaxPromptTokens) {
    return Bad(param, "more than " + std::to_string(kMaxPromptTokens) + " tokens");
  }
  std::vector<uint32_t> out;
  out.reserve(a.size());
  for (const auto& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > 0xffffffffLL) {
      return Bad(param, "token ids must be integers in 0..4294967295");
    }
    out.push_back(static_cast<uint32_t>(t.get<int64_t>()));
  }
  return out;
}

// The fields both endpoints share: model, stream, n, max tokens.
Status CommonFields(const json& j, CompletionRequest& r, bool chat) {
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("model", "must be a string");
    r.model = it->get<std::string>();
  }
  if (auto it = j.find("stream"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return Bad("stream", "must be true or false");
    r.stream = it->get<bool>();
  }
  if (auto it = j.find("n"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 1) return Bad("n", "only n=1 is served");
  }
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (!chat && std::string_view(name) == "max_completion_tokens") continue;
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > kMaxTokensLimit) {
      return Bad(name, "must be an integer in 0.." + std::to_string(kMaxTokensLimit));
    }
    r.max_tokens = static_cast<int>(it->get<int64_t>());
    break;
  }
  return Status::Ok();
}

}  // namespace

std::vector<uint32_t> Tokenize(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 1);
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(text[i]);
    bool space = false;
    size_t start = i;
    if (c == ' ' && i + 1 < n && IsWordByte(static_cast<unsigned char>(text[i + 1]))) {
      space = true;
      start = i + 1;
    } else if (!IsWordByte(c)) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t end = start;
    while (end < n && IsWordByte(static_cast<unsigned char>(text[end]))) ++end;
    for (size_t p = start; p < end; p += kPieceBytes) {
      std::string_view piece = text.substr(p, std::min(kPieceBytes, end - p));
      out.push_back(256 + Fnv1a32(piece, space && p == start) % (kVocabSize - 256));
    }
    i = end;
  }
  return out;
}

std::string ChatTemplate(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "\n";
  return out + "<|assistant|>\n";
}

Result<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  KVO_ASSIGN_OR_RETURN(json j, ParseBody(body));
  CompletionRequest r;
  r.endpoint = Endpoint::kCompletions;
  KVO_RETURN_IF_ERROR(CommonFields(j, r, false));
  auto ids = j.find("prompt_token_ids");
  auto prompt = j.find("prompt");
  const bool has_ids = ids != j.end() && !ids->is_null();
  const bool has_prompt = prompt != j.end() && !prompt->is_null();
  if (has_ids && has_prompt) return Bad("prompt", "give prompt or prompt_token_ids, not both");
  if (has_ids) {
    if (!ids->is_array()) return Bad("prompt_token_ids", "must be an array of token ids");
    KVO_ASSIGN_OR_RETURN(r.prompt_tokens, TokenIds(*ids, "prompt_token_ids"));
    return r;
  }
  if (!has_prompt) return Bad("prompt", "missing (a string or an array of token ids)");
  const json* p = &*prompt;
  // A one-element batch: ["text"] or [[1,2,3]].
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
  } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    return Bad("prompt",
               "a batch of " + std::to_string(p->size()) + " prompts; send one prompt per request");
  }
  if (p->is_string()) {
    const auto& text = p->get_ref<const std::string&>();
    if (text.size() > kMaxPromptTokens) return Bad("prompt", "text too long");
    r.prompt_tokens = Tokenize(text);
    r.prompt_was_text = true;
  } else if (p->is_array()) {
    KVO_ASSIGN_OR_RETURN(r.prompt_tokens, TokenIds(*p, "prompt"));
  } else {
    return Bad("prompt", "must be a string or an array of token ids");
  }
  return r;
}

Result<CompletionRequest> ParseChatCompletionRequest(std::string_view body) {
  KVO_ASSIGN_OR_RETURN(json j, ParseBody(body));
  CompletionRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  KVO_RETURN_IF_ERROR(CommonFields(j, r, true));
  auto msgs = j.find("messages");
  if (msgs == j.end() || !msgs->is_array() || msgs->empty()) {
    return Bad("messages", "must be a non-empty array of {role, content}");
  }
  std::vector<ChatMessage> messages;
  size_t total = 0;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Bad(where, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Bad(where + ".role", "must be a string");
    ChatMessage cm;
    cm.role = role->get<std::string>();
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      cm.content = "";
    } else if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const auto& part : *content) {
        auto text = part.is_object() ? part.find("text") : part.end();
        if (!part.is_object() || text == part.end() || !text->is_string()) {
          return Bad(where + ".content", "parts must be {\"type\":\"text\",\"text\":...}");
        }
        cm.content += text->get<std::string>();
      }
    } else {
      return Bad(where + ".content", "must be a string or an array of text parts");
    }
    total += cm.content.size();
    if (total > kMaxPromptTokens) return Bad("messages", "text too long");
    messages.push_back(std::move(cm));
  }
  r.prompt_tokens = Tokenize(ChatTemplate(messages));
  r.prompt_was_text = true;
  return r;
}

std::string ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 413:
    case 422:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 405:
      return "method_not_allowed_error";
    case 429:
      return "rate_limit_error";
    case 502:
    case 503:
    case 504:
      return "service_unavailable_error";
    default:
      return http_status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

std::string ErrorJson(int http_status, std::string_view message, std::string_view param,
                      std::string_view type) {
  json e = {{"message", std::string(message)},
            {"type", type.empty() ? ErrorType(http_status) : std::string(type)},
            {"param", param.empty() ? json(nullptr) : json(std::string(param))},
            {"code", http_status}};
  return json{{"error", std::move(e)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SseData(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  out += "data: ";
  out += payload;
  out += "\n\n";
  return out;
}

Status SseReader::Feed(std::string_view bytes, const OnData& on_data) {
  pending_.append(bytes);
  for (;;) {
    // The end of the next event: the first blank line.
    size_t end = std::string::npos, skip = 0;
    for (size_t i = 0; i + 1 < pending_.size(); ++i) {
      if (pending_[i] != '\n') continue;
      if (pending_[i + 1] == '\n') {
        end = i, skip = 2;
        break;
      }
      if (pending_[i + 1] == '\r' && i + 2 < pending_.size() && pending_[i + 2] == '\n') {
        end = i, skip = 3;
        break;
      }
    }
    if (end == std::string::npos) break;
    std::string_view event(pending_.data(), end);
    std::string data;
    bool any = false;
    while (!event.empty()) {
      size_t nl = event.find('\n');
      std::string_view line = event.substr(0, nl);
      event = nl == std::string_view::npos ? std::string_view() : event.substr(nl + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!line.starts_with("data:")) continue;
      line.remove_prefix(5);
      if (line.starts_with(" ")) line.remove_prefix(1);
      if (any) data += '\n';
      data += line;
      any = true;
    }
    pending_.erase(0, end + skip);
    if (any) on_data(data);
  }
  if (pending_.size() > max_event_bytes_) {
    return Status::InvalidArgument("SSE event larger than " + std::to_string(max_event_bytes_) +
                                   " bytes");
  }
  return Status::Ok();
}

}  // namespace kvo::openai
