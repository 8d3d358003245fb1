// nlohmann_json adapter: the only events/ file that calls nlohmann_json. Its exceptions stop here.
#include "events/event_json.h"

#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/json.h"
#include "events/block_hash.h"

namespace kvo {
namespace {

// ordered_json keeps insertion order, so objects come out in the wire's field order.
using Json = nlohmann::ordered_json;

// extra_keys nest tuples; the msgpack decoder stops at 32 levels, JSON input at the same depth.
constexpr int kMaxValueDepth = 32;

// ---------------------------------------------------------------------------------------------
// EventBatch -> JSON

Json HashToJson(const BlockHash& h) {
  switch (h.kind) {
    case BlockHash::Kind::kUint:
      return Json(h.value);
    case BlockHash::Kind::kInt:
      return Json(h.as_int());
    case BlockHash::Kind::kBytes:
      return Json(ToHex(h.bytes));
  }
  return Json(nullptr);
}

Json HashesToJson(const std::vector<BlockHash>& hashes) {
  Json out = Json::array();
  for (const BlockHash& h : hashes) out.push_back(HashToJson(h));
  return out;
}

Json ValueToJson(const Value& value) {
  return std::visit(
      [](const auto& v) -> Json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return Json(nullptr);
        } else if constexpr (std::is_same_v<T, Binary>) {
          Json o = Json::object();
          o["bytes"] = ToHex(v.data);
          return o;
        } else if constexpr (std::is_same_v<T, ValueArray>) {
          Json a = Json::array();
          for (const Value& item : v) a.push_back(ValueToJson(item));
          return a;
        } else {
          return Json(v);  // bool, int64_t, uint64_t, double, std::string
        }
      },
      value.v);
}

template <class T>
Json OptToJson(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

Json StoredToJson(const BlockStored& e) {
  Json o = Json::object();
  o["type"] = "BlockStored";
  o["block_hashes"] = HashesToJson(e.block_hashes);
  o["parent_block_hash"] = e.parent_block_hash ? HashToJson(*e.parent_block_hash) : Json(nullptr);
  o["token_ids"] = e.token_ids;
  o["block_size"] = e.block_size;
  o["lora_id"] = OptToJson(e.lora_id);
  o["medium"] = OptToJson(e.medium);
  o["lora_name"] = OptToJson(e.lora_name);
  if (e.extra_keys) {
    Json keys = Json::array();
    for (const Value& k : *e.extra_keys) keys.push_back(ValueToJson(k));
    o["extra_keys"] = std::move(keys);
  }
  if (e.group_idx) o["group_idx"] = *e.group_idx;
  if (e.kv_cache_spec_kind) o["kv_cache_spec_kind"] = *e.kv_cache_spec_kind;
  if (e.kv_cache_spec_sliding_window) {
    o["kv_cache_spec_sliding_window"] = *e.kv_cache_spec_sliding_window;
  }
  if (e.locality) o["locality"] = *e.locality;
  if (e.ownership) o["ownership"] = *e.ownership;
  if (e.session_id) o["session_id"] = *e.session_id;
  return o;
}

Json RemovedToJson(const BlockRemoved& e) {
  Json o = Json::object();
  o["type"] = "BlockRemoved";
  o["block_hashes"] = HashesToJson(e.block_hashes);
  o["medium"] = OptToJson(e.medium);
  if (e.group_idx) o["group_idx"] = *e.group_idx;
  if (e.locality) o["locality"] = *e.locality;
  if (e.ownership) o["ownership"] = *e.ownership;
  if (e.reason) o["reason"] = *e.reason;
  return o;
}

Json EventToJson(const KvEvent& event) {
  return std::visit(
      [](const auto& e) -> Json {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, BlockStored>) {
          return StoredToJson(e);
        } else if constexpr (std::is_same_v<T, BlockRemoved>) {
          return RemovedToJson(e);
        } else {
          Json o = Json::object();
          o["type"] = "AllBlocksCleared";
          return o;
        }
      },
      event);
}

// ---------------------------------------------------------------------------------------------
// JSON -> EventBatch. Every error names the path of the offending element.

const char* JsonTypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "other";
  }
}

Status TypeError(const std::string& path, std::string_view expected, const Json& got) {
  return Status::InvalidArgument(path + ": expected " + std::string(expected) + ", got " +
                                 JsonTypeName(got));
}

Result<int64_t> IntFromJson(const Json& j, const std::string& path) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::InvalidArgument(path + ": integer " + std::to_string(v) +
                                     " out of int64 range");
    }
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  return TypeError(path, "integer", j);
}

Result<std::optional<int64_t>> OptIntFromJson(const Json& j, const std::string& path) {
  if (j.is_null()) return std::optional<int64_t>();
  KVO_ASSIGN_OR_RETURN(int64_t v, IntFromJson(j, path));
  return std::optional<int64_t>(v);
}

Result<std::optional<std::string>> OptStrFromJson(const Json& j, const std::string& path) {
  if (j.is_null()) return std::optional<std::string>();
  if (!j.is_string()) return TypeError(path, "string or null", j);
  return std::optional<std::string>(j.get<std::string>());
}

Result<BlockHash> HashFromJson(const Json& j, const std::string& path) {
  if (j.is_number_unsigned()) return BlockHash::Uint(j.get<uint64_t>());
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v >= 0) return BlockHash::Uint(static_cast<uint64_t>(v));
    return BlockHash::NegativeInt(v);
  }
  if (j.is_string()) {
    Result<std::string> raw = ParseHex(j.get_ref<const std::string&>());
    if (!raw.ok()) {
      return Status::InvalidArgument(path +
                                     ": expected integer or hex string: " + raw.status().message());
    }
    return BlockHash::Bytes(std::move(raw).value());
  }
  return TypeError(path, "integer or hex string", j);
}

Result<std::vector<BlockHash>> HashesFromJson(const Json& j, const std::string& path) {
  if (!j.is_array()) return TypeError(path, "array of block hashes", j);
  std::vector<BlockHash> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    KVO_ASSIGN_OR_RETURN(BlockHash h, HashFromJson(j[i], path + "[" + std::to_string(i) + "]"));
    out.push_back(std::move(h));
  }
  return out;
}

Result<Value> ValueFromJson(const Json& j, const std::string& path, int depth) {
  if (depth > kMaxValueDepth) {
    return Status::InvalidArgument(path + ": nested deeper than " + std::to_string(kMaxValueDepth) +
                                   " levels");
  }
  Value out;
  switch (j.type()) {
    case Json::value_t::null:
      break;
    case Json::value_t::boolean:
      out.v = j.get<bool>();
      break;
    case Json::value_t::number_unsigned: {
      // The msgpack decoder's rule: an int that fits int64 is int64, a larger one uint64.
      uint64_t v = j.get<uint64_t>();
      if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        out.v = static_cast<int64_t>(v);
      } else {
        out.v = v;
      }
      break;
    }
    case Json::value_t::number_integer:
      out.v = j.get<int64_t>();
      break;
    case Json::value_t::number_float:
      out.v = j.get<double>();
      break;
    case Json::value_t::string:
      out.v = j.get<std::string>();
      break;
    case Json::value_t::object: {
      auto it = j.find("bytes");
      if (j.size() != 1 || it == j.end() || !it->is_string()) {
        return Status::InvalidArgument(path +
                                       ": expected {\"bytes\":\"<hex>\"} for a bytes value, got "
                                       "an object with other keys");
      }
      Result<std::string> raw = ParseHex(it->get_ref<const std::string&>());
      if (!raw.ok()) return Status::InvalidArgument(path + ".bytes: " + raw.status().message());
      out.v = Binary{std::move(raw).value()};
      break;
    }
    case Json::value_t::array: {
      ValueArray items;
      items.reserve(j.size());
      for (size_t i = 0; i < j.size(); ++i) {
        KVO_ASSIGN_OR_RETURN(Value item,
                             ValueFromJson(j[i], path + "[" + std::to_string(i) + "]", depth + 1));
        items.push_back(std::move(item));
      }
      out.v = std::move(items);
      break;
    }
    default:
      return TypeError(path, "null, boolean, number, string, {\"bytes\":..} or array", j);
  }
  return out;
}

Result<std::optional<std::vector<Value>>> ExtraKeysFromJson(const Json& j,
                                                            const std::string& path) {
  if (j.is_null()) return std::optional<std::vector<Value>>();
  if (!j.is_array()) return TypeError(path, "array or null", j);
  std::vector<Value> keys;
  keys.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    std::string item_path = path + "[" + std::to_string(i) + "]";
    if (!j[i].is_null() && !j[i].is_array()) {
      return TypeError(item_path, "array (tuple) or null", j[i]);
    }
    KVO_ASSIGN_OR_RETURN(Value k, ValueFromJson(j[i], item_path, 1));
    keys.push_back(std::move(k));
  }
  return std::optional<std::vector<Value>>(std::move(keys));
}

Result<std::vector<int64_t>> TokensFromJson(const Json& j, const std::string& path) {
  if (!j.is_array()) return TypeError(path, "array of integers", j);
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    KVO_ASSIGN_OR_RETURN(int64_t t, IntFromJson(j[i], path + "[" + std::to_string(i) + "]"));
    out.push_back(t);
  }
  return out;
}

// Field tables: every key the event may carry. Required keys must be present (null allowed
// where the wire allows nil); an unknown key is an error (a misspelt optional field would
// otherwise vanish silently).
Status CheckKeys(const Json& o, const std::string& path, std::initializer_list<const char*> known,
                 std::initializer_list<const char*> required) {
  for (const char* key : required) {
    if (!o.contains(key)) {
      return Status::InvalidArgument(path + ": missing required field '" + key + "'");
    }
  }
  for (auto it = o.begin(); it != o.end(); ++it) {
    bool ok = it.key() == "type";
    for (const char* key : known) ok = ok || it.key() == key;
    if (!ok)
      return Status::InvalidArgument(path + ": unknown field '" + CutForMessage(it.key()) + "'");
  }
  return Status::Ok();
}

Result<BlockStored> StoredFromJson(const Json& o, const std::string& path) {
  KVO_RETURN_IF_ERROR(
      CheckKeys(o, path,
                {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"},
                {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name"}));
  auto p = [&](const char* key) { return path + "." + key; };
  BlockStored e;
  KVO_ASSIGN_OR_RETURN(e.block_hashes, HashesFromJson(o["block_hashes"], p("block_hashes")));
  const Json& parent = o["parent_block_hash"];
  if (!parent.is_null()) {
    KVO_ASSIGN_OR_RETURN(e.parent_block_hash, HashFromJson(parent, p("parent_block_hash")));
  }
  KVO_ASSIGN_OR_RETURN(e.token_ids, TokensFromJson(o["token_ids"], p("token_ids")));
  KVO_ASSIGN_OR_RETURN(e.block_size, IntFromJson(o["block_size"], p("block_size")));
  KVO_ASSIGN_OR_RETURN(e.lora_id, OptIntFromJson(o["lora_id"], p("lora_id")));
  KVO_ASSIGN_OR_RETURN(e.medium, OptStrFromJson(o["medium"], p("medium")));
  KVO_ASSIGN_OR_RETURN(e.lora_name, OptStrFromJson(o["lora_name"], p("lora_name")));
  if (auto it = o.find("extra_keys"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.extra_keys, ExtraKeysFromJson(*it, p("extra_keys")));
  }
  if (auto it = o.find("group_idx"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.group_idx, OptIntFromJson(*it, p("group_idx")));
  }
  if (auto it = o.find("kv_cache_spec_kind"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.kv_cache_spec_kind, OptStrFromJson(*it, p("kv_cache_spec_kind")));
  }
  if (auto it = o.find("kv_cache_spec_sliding_window"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.kv_cache_spec_sliding_window,
                         OptIntFromJson(*it, p("kv_cache_spec_sliding_window")));
  }
  if (auto it = o.find("locality"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.locality, OptStrFromJson(*it, p("locality")));
  }
  if (auto it = o.find("ownership"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.ownership, OptStrFromJson(*it, p("ownership")));
  }
  if (auto it = o.find("session_id"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.session_id, OptStrFromJson(*it, p("session_id")));
  }
  return e;
}

Result<BlockRemoved> RemovedFromJson(const Json& o, const std::string& path) {
  KVO_RETURN_IF_ERROR(
      CheckKeys(o, path, {"block_hashes", "medium", "group_idx", "locality", "ownership", "reason"},
                {"block_hashes", "medium"}));
  auto p = [&](const char* key) { return path + "." + key; };
  BlockRemoved e;
  KVO_ASSIGN_OR_RETURN(e.block_hashes, HashesFromJson(o["block_hashes"], p("block_hashes")));
  KVO_ASSIGN_OR_RETURN(e.medium, OptStrFromJson(o["medium"], p("medium")));
  if (auto it = o.find("group_idx"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.group_idx, OptIntFromJson(*it, p("group_idx")));
  }
  if (auto it = o.find("locality"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.locality, OptStrFromJson(*it, p("locality")));
  }
  if (auto it = o.find("ownership"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.ownership, OptStrFromJson(*it, p("ownership")));
  }
  if (auto it = o.find("reason"); it != o.end()) {
    KVO_ASSIGN_OR_RETURN(e.reason, OptStrFromJson(*it, p("reason")));
  }
  return e;
}

Result<KvEvent> EventFromJson(const Json& o, const std::string& path) {
  if (!o.is_object()) return TypeError(path, "object (event)", o);
  auto type = o.find("type");
  if (type == o.end()) return Status::InvalidArgument(path + ": missing required field 'type'");
  if (!type->is_string()) return TypeError(path + ".type", "string", *type);
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "BlockStored") {
    KVO_ASSIGN_OR_RETURN(BlockStored e, StoredFromJson(o, path));
    return KvEvent(std::move(e));
  }
  if (name == "BlockRemoved") {
    KVO_ASSIGN_OR_RETURN(BlockRemoved e, RemovedFromJson(o, path));
    return KvEvent(std::move(e));
  }
  if (name == "AllBlocksCleared") {
    KVO_RETURN_IF_ERROR(CheckKeys(o, path, {}, {}));
    return KvEvent(AllBlocksCleared{});
  }
  return Status::InvalidArgument(path + ".type: unknown event type '" + name.substr(0, 64) +
                                 "' (BlockStored, BlockRemoved or AllBlocksCleared)");
}

Result<EventBatch> BatchFromJsonValue(const Json& j) {
  if (!j.is_object()) return TypeError("batch", "object", j);
  KVO_RETURN_IF_ERROR(
      CheckKeys(j, "batch", {"seq", "topic", "ts", "data_parallel_rank", "events"}, {}));
  EventBatch batch;
  auto ts = j.find("ts");
  if (ts == j.end()) return Status::InvalidArgument("batch: missing required field 'ts'");
  if (!ts->is_number()) return TypeError("ts", "number", *ts);
  batch.ts = ts->get<double>();
  if (auto dp = j.find("data_parallel_rank"); dp != j.end()) {
    KVO_ASSIGN_OR_RETURN(batch.data_parallel_rank, OptIntFromJson(*dp, "data_parallel_rank"));
  }
  auto events = j.find("events");
  if (events == j.end()) return Status::InvalidArgument("batch: missing required field 'events'");
  if (!events->is_array()) return TypeError("events", "array", *events);
  batch.events.reserve(events->size());
  for (size_t i = 0; i < events->size(); ++i) {
    KVO_ASSIGN_OR_RETURN(KvEvent e,
                         EventFromJson((*events)[i], "events[" + std::to_string(i) + "]"));
    batch.events.push_back(std::move(e));
  }
  return batch;
}

// ---------------------------------------------------------------------------------------------
// Text form.

std::string HashText(const BlockHash& h) {
  std::string s = h.ToString();
  // A 32-byte digest is 64 hex digits: keep enough to recognise it.
  if (h.is_bytes() && s.size() > 16) s = s.substr(0, 12) + "..";
  return s;
}

std::string HashesText(const std::vector<BlockHash>& hashes) {
  constexpr size_t kShown = 3;
  std::string out = "[";
  for (size_t i = 0; i < hashes.size() && i < kShown; ++i) {
    if (i > 0) out += ',';
    out += HashText(hashes[i]);
  }
  if (hashes.size() > kShown) out += ",..+" + std::to_string(hashes.size() - kShown);
  out += ']';
  return out;
}

std::string OptText(const std::optional<std::string>& s) { return s ? *s : "-"; }
std::string OptText(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "-"; }

std::string EventText(const KvEvent& event) {
  return std::visit(
      [](const auto& e) -> std::string {
        using T = std::decay_t<decltype(e)>;
        std::string s;
        if constexpr (std::is_same_v<T, BlockStored>) {
          s = "BlockStored medium=" + OptText(e.medium) + " group=" + OptText(e.group_idx) +
              " hashes=" + HashesText(e.block_hashes) +
              " parent=" + (e.parent_block_hash ? HashText(*e.parent_block_hash) : "-") +
              " tokens=" + std::to_string(e.token_ids.size()) +
              " block_size=" + std::to_string(e.block_size);
          if (e.lora_id) s += " lora_id=" + std::to_string(*e.lora_id);
          if (e.lora_name) s += " lora=" + *e.lora_name;
          if (e.extra_keys) {
            size_t set = 0;
            for (const Value& k : *e.extra_keys) set += !k.is_nil();
            s += " extra_keys=" + std::to_string(set) + "/" + std::to_string(e.extra_keys->size());
          }
          if (e.kv_cache_spec_kind) s += " kind=" + *e.kv_cache_spec_kind;
          if (e.kv_cache_spec_sliding_window) {
            s += " window=" + std::to_string(*e.kv_cache_spec_sliding_window);
          }
          if (e.locality) s += " locality=" + *e.locality;
          if (e.ownership) s += " ownership=" + *e.ownership;
          if (e.session_id) s += " session=" + *e.session_id;
        } else if constexpr (std::is_same_v<T, BlockRemoved>) {
          s = "BlockRemoved medium=" + OptText(e.medium) + " group=" + OptText(e.group_idx) +
              " hashes=" + HashesText(e.block_hashes);
          if (e.locality) s += " locality=" + *e.locality;
          if (e.ownership) s += " ownership=" + *e.ownership;
          if (e.reason) s += " reason=" + *e.reason;
        } else {
          s = "AllBlocksCleared";
        }
        return s;
      },
      event);
}

}  // namespace

std::string BatchToJson(const EventBatch& batch, std::optional<uint64_t> seq,
                        std::optional<std::string_view> topic) {
  try {
    Json o = Json::object();
    if (seq) o["seq"] = *seq;
    if (topic) o["topic"] = std::string(*topic);
    o["ts"] = batch.ts;
    o["data_parallel_rank"] = OptToJson(batch.data_parallel_rank);
    Json events = Json::array();
    for (const KvEvent& e : batch.events) events.push_back(EventToJson(e));
    o["events"] = std::move(events);
    // Strings from the wire need not be UTF-8: replace bad bytes rather than throw. A non-finite
    // float has no JSON form and prints as null.
    return o.dump(-1, ' ', false, Json::error_handler_t::replace);
  } catch (const std::exception&) {
    // Only allocation failure gets here; keep the output a JSON object.
    return std::string("{\"error\":\"cannot format batch as JSON\"}");
  }
}

std::string BatchToText(const EventBatch& batch, uint64_t seq) {
  char head[96];
  std::snprintf(head, sizeof head, "seq=%" PRIu64 " ts=%.3f dp=%s", seq, batch.ts,
                OptText(batch.data_parallel_rank).c_str());
  if (batch.events.empty()) return std::string(head) + " (no events)";
  std::string out;
  for (size_t i = 0; i < batch.events.size(); ++i) {
    if (i > 0) out += '\n';
    out += head;
    out += ' ';
    out += EventText(batch.events[i]);
  }
  return out;
}

Result<EventBatch> BatchFromJson(std::string_view json) {
  KVO_ASSIGN_OR_RETURN(Json j, ParseJson(json));
  try {
    return BatchFromJsonValue(j);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("cannot read JSON batch: ") + e.what());
  }
}

Result<std::vector<Value>> ExtraKeysFromJsonText(std::string_view json, const std::string& what) {
  KVO_ASSIGN_OR_RETURN(Json doc, ParseJson(json, what));
  if (doc.is_null()) return TypeError(what, "array with one entry per block", doc);
  KVO_ASSIGN_OR_RETURN(std::optional<std::vector<Value>> keys, ExtraKeysFromJson(doc, what));
  return std::move(keys).value();
}

}  // namespace kvo
