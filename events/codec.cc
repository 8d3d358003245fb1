// msgpack adapter: the only file that calls msgpack-cxx. Its exceptions stop here.
#include "events/codec.h"

#include <msgpack.hpp>

#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>

namespace kvo {
namespace {

// ---------------------------------------------------------------------------------------------
// Encoder: msgpack-cxx's packer writes the shortest int forms, float64 for double, str8 and
// fixmap/fixarray exactly as msgspec does (vllm-compat.md A.2).

struct StringSink {
  std::string* out;
  void write(const char* data, size_t n) { out->append(data, n); }
};
using Packer = msgpack::packer<StringSink>;

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// msgspec writes every Python float as float64 (0xcb). msgpack-cxx's pack_double would write an
// integral double such as 1700000001.0 as an int, so the bytes are written here.
void PackFloat64(StringSink& sink, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  char buf[9];
  buf[0] = static_cast<char>(0xcb);
  for (int i = 0; i < 8; ++i) buf[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
  sink.write(buf, sizeof buf);
}

void PackHash(Packer& pk, const BlockHash& h) {
  switch (h.kind) {
    case BlockHash::Kind::kUint:
      pk.pack_uint64(h.value);
      break;
    case BlockHash::Kind::kInt:
      pk.pack_int64(h.as_int());
      break;
    case BlockHash::Kind::kBytes:
      pk.pack_bin(static_cast<uint32_t>(h.bytes.size()));
      pk.pack_bin_body(h.bytes.data(), static_cast<uint32_t>(h.bytes.size()));
      break;
  }
}

void PackHashes(Packer& pk, const std::vector<BlockHash>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const BlockHash& h : hashes) PackHash(pk, h);
}

void PackInt(Packer& pk, int64_t v) {
  if (v >= 0) {
    pk.pack_uint64(static_cast<uint64_t>(v));
  } else {
    pk.pack_int64(v);
  }
}

void PackValue(Packer& pk, StringSink& sink, const Value& value) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          pk.pack_nil();
        } else if constexpr (std::is_same_v<T, bool>) {
          v ? pk.pack_true() : pk.pack_false();
        } else if constexpr (std::is_same_v<T, int64_t>) {
          PackInt(pk, v);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          pk.pack_uint64(v);
        } else if constexpr (std::is_same_v<T, double>) {
          PackFloat64(sink, v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          PackStr(pk, v);
        } else if constexpr (std::is_same_v<T, Binary>) {
          pk.pack_bin(static_cast<uint32_t>(v.data.size()));
          pk.pack_bin_body(v.data.data(), static_cast<uint32_t>(v.data.size()));
        } else {
          pk.pack_array(static_cast<uint32_t>(v.size()));
          for (const Value& item : v) PackValue(pk, sink, item);
        }
      },
      value.v);
}

template <class T, class F>
void PackOptional(Packer& pk, const std::optional<T>& v, F&& pack) {
  if (v) {
    pack(*v);
  } else {
    pk.pack_nil();
  }
}

void PackOptStr(Packer& pk, const std::optional<std::string>& v) {
  PackOptional(pk, v, [&](const std::string& s) { PackStr(pk, s); });
}
void PackOptInt(Packer& pk, const std::optional<int64_t>& v) {
  PackOptional(pk, v, [&](int64_t i) { PackInt(pk, i); });
}
void PackExtraKeys(Packer& pk, StringSink& sink, const std::optional<std::vector<Value>>& v) {
  PackOptional(pk, v, [&](const std::vector<Value>& keys) {
    pk.pack_array(static_cast<uint32_t>(keys.size()));
    for (const Value& k : keys) PackValue(pk, sink, k);
  });
}

void PackStoredMap(Packer& pk, StringSink& sink, const BlockStored& e) {
  uint32_t n = 8;  // tag + 7 required fields
  n += e.extra_keys.has_value() + e.group_idx.has_value() + e.kv_cache_spec_kind.has_value() +
       e.kv_cache_spec_sliding_window.has_value() + e.locality.has_value() +
       e.ownership.has_value() + e.session_id.has_value();
  pk.pack_map(n);
  PackStr(pk, "type");
  PackStr(pk, "BlockStored");
  PackStr(pk, "block_hashes");
  PackHashes(pk, e.block_hashes);
  PackStr(pk, "parent_block_hash");
  PackOptional(pk, e.parent_block_hash, [&](const BlockHash& h) { PackHash(pk, h); });
  PackStr(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
  for (int64_t t : e.token_ids) PackInt(pk, t);
  PackStr(pk, "block_size");
  PackInt(pk, e.block_size);
  PackStr(pk, "lora_id");
  PackOptInt(pk, e.lora_id);
  PackStr(pk, "medium");
  PackOptStr(pk, e.medium);
  PackStr(pk, "lora_name");
  PackOptStr(pk, e.lora_name);
  if (e.extra_keys) {
    PackStr(pk, "extra_keys");
    PackExtraKeys(pk, sink, e.extra_keys);
  }
  auto opt_int = [&](const char* key, const std::optional<int64_t>& v) {
    if (v) {
      PackStr(pk, key);
      PackInt(pk, *v);
    }
  };
  auto opt_str = [&](const char* key, const std::optional<std::string>& v) {
    if (v) {
      PackStr(pk, key);
      PackStr(pk, *v);
    }
  };
  opt_int("group_idx", e.group_idx);
  opt_str("kv_cache_spec_kind", e.kv_cache_spec_kind);
  opt_int("kv_cache_spec_sliding_window", e.kv_cache_spec_sliding_window);
  opt_str("locality", e.locality);
  opt_str("ownership", e.ownership);
  opt_str("session_id", e.session_id);
}

void PackRemovedMap(Packer& pk, const BlockRemoved& e) {
  uint32_t n = 3 + e.group_idx.has_value() + e.locality.has_value() + e.ownership.has_value() +
               e.reason.has_value();
  pk.pack_map(n);
  PackStr(pk, "type");
  PackStr(pk, "BlockRemoved");
  PackStr(pk, "block_hashes");
  PackHashes(pk, e.block_hashes);
  PackStr(pk, "medium");
  PackOptStr(pk, e.medium);
  if (e.group_idx) {
    PackStr(pk, "group_idx");
    PackInt(pk, *e.group_idx);
  }
  for (const auto& [key, v] :
       {std::pair{"locality", &e.locality}, std::pair{"ownership", &e.ownership},
        std::pair{"reason", &e.reason}}) {
    if (*v) {
      PackStr(pk, key);
      PackStr(pk, **v);
    }
  }
}

// Legacy positional form: every field of the v0.23 schema, then the newer trailing fields only
// when one of them is set (older decoders ignore trailing elements).
void PackStoredArray(Packer& pk, StringSink& sink, const BlockStored& e) {
  bool tail = e.locality || e.ownership || e.session_id;
  pk.pack_array(tail ? 15 : 12);
  PackStr(pk, "BlockStored");
  PackHashes(pk, e.block_hashes);
  PackOptional(pk, e.parent_block_hash, [&](const BlockHash& h) { PackHash(pk, h); });
  pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
  for (int64_t t : e.token_ids) PackInt(pk, t);
  PackInt(pk, e.block_size);
  PackOptInt(pk, e.lora_id);
  PackOptStr(pk, e.medium);
  PackOptStr(pk, e.lora_name);
  PackExtraKeys(pk, sink, e.extra_keys);
  PackOptInt(pk, e.group_idx);
  PackOptStr(pk, e.kv_cache_spec_kind);
  PackOptInt(pk, e.kv_cache_spec_sliding_window);
  if (tail) {
    PackOptStr(pk, e.locality);
    PackOptStr(pk, e.ownership);
    PackOptStr(pk, e.session_id);
  }
}

void PackRemovedArray(Packer& pk, const BlockRemoved& e) {
  bool tail = e.locality || e.ownership;
  pk.pack_array(tail ? 6 : 4);
  PackStr(pk, "BlockRemoved");
  PackHashes(pk, e.block_hashes);
  PackOptStr(pk, e.medium);
  PackOptInt(pk, e.group_idx);
  if (tail) {
    PackOptStr(pk, e.locality);
    PackOptStr(pk, e.ownership);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoder: walks msgpack objects; every error names the path of the offending element.

const char* TypeName(msgpack::type::object_type t) {
  switch (t) {
    case msgpack::type::NIL:
      return "nil";
    case msgpack::type::BOOLEAN:
      return "bool";
    case msgpack::type::POSITIVE_INTEGER:
      return "int";
    case msgpack::type::NEGATIVE_INTEGER:
      return "negative int";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return "float";
    case msgpack::type::STR:
      return "str";
    case msgpack::type::BIN:
      return "bin";
    case msgpack::type::ARRAY:
      return "array";
    case msgpack::type::MAP:
      return "map";
    case msgpack::type::EXT:
      return "ext";
  }
  return "unknown";
}

// A location in the batch ("events[2].block_hashes[0]") built on the stack and rendered only
// when an error needs it, so the success path allocates nothing for it.
class Path {
 public:
  explicit Path(std::string_view root) : name_(root) {}
  Path Field(std::string_view name) const { return Path(this, name, 0, false); }
  Path Index(size_t index) const { return Path(this, {}, index, true); }
  std::string str() const {
    std::string out = parent_ != nullptr ? parent_->str() : std::string();
    if (is_index_) return out + "[" + std::to_string(index_) + "]";
    return out.empty() ? std::string(name_) : out + "." + std::string(name_);
  }

 private:
  Path(const Path* parent, std::string_view name, size_t index, bool is_index)
      : parent_(parent), name_(name), index_(index), is_index_(is_index) {}
  const Path* parent_ = nullptr;
  std::string_view name_;
  size_t index_ = 0;
  bool is_index_ = false;
};

class Decoder {
 public:
  Status error;

  bool Fail(const Path& path, const char* expected, const msgpack::object& got) {
    error = Status::InvalidArgument(path.str() + ": expected " + expected + ", got " +
                                    TypeName(got.type));
    return false;
  }
  bool FailMsg(std::string msg) {
    error = Status::InvalidArgument(std::move(msg));
    return false;
  }

  bool Int(const msgpack::object& o, const Path& path, int64_t* out) {
    if (o.type == msgpack::type::POSITIVE_INTEGER) {
      if (o.via.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return FailMsg(path.str() + ": integer " + std::to_string(o.via.u64) +
                       " out of int64 range");
      }
      *out = static_cast<int64_t>(o.via.u64);
      return true;
    }
    if (o.type == msgpack::type::NEGATIVE_INTEGER) {
      *out = o.via.i64;
      return true;
    }
    return Fail(path, "int", o);
  }

  bool OptInt(const msgpack::object& o, const Path& path, std::optional<int64_t>* out) {
    if (o.type == msgpack::type::NIL) {
      out->reset();
      return true;
    }
    int64_t v = 0;
    if (!Int(o, path, &v)) return false;
    *out = v;
    return true;
  }

  bool OptStr(const msgpack::object& o, const Path& path, std::optional<std::string>* out) {
    if (o.type == msgpack::type::NIL) {
      out->reset();
      return true;
    }
    if (o.type != msgpack::type::STR) return Fail(path, "str or nil", o);
    out->emplace(o.via.str.ptr, o.via.str.size);
    return true;
  }

  bool Hash(const msgpack::object& o, const Path& path, BlockHash* out) {
    switch (o.type) {
      case msgpack::type::POSITIVE_INTEGER:
        *out = BlockHash::Uint(o.via.u64);
        return true;
      case msgpack::type::NEGATIVE_INTEGER:
        *out = BlockHash::NegativeInt(o.via.i64);
        return true;
      case msgpack::type::BIN:
        *out = BlockHash::Bytes(std::string(o.via.bin.ptr, o.via.bin.size));
        return true;
      default:
        return Fail(path, "int or bin (block hash)", o);
    }
  }

  bool Hashes(const msgpack::object& o, const Path& path, std::vector<BlockHash>* out) {
    if (o.type != msgpack::type::ARRAY) return Fail(path, "array of block hashes", o);
    out->resize(o.via.array.size);
    for (uint32_t i = 0; i < o.via.array.size; ++i) {
      if (!Hash(o.via.array.ptr[i], path.Index(i), &(*out)[i])) {
        return false;
      }
    }
    return true;
  }

  bool OptHash(const msgpack::object& o, const Path& path, std::optional<BlockHash>* out) {
    if (o.type == msgpack::type::NIL) {
      out->reset();
      return true;
    }
    BlockHash h;
    if (!Hash(o, path, &h)) return false;
    *out = std::move(h);
    return true;
  }

  bool Tokens(const msgpack::object& o, const Path& path, std::vector<int64_t>* out) {
    if (o.type != msgpack::type::ARRAY) return Fail(path, "array of ints", o);
    out->resize(o.via.array.size);
    const msgpack::object* items = o.via.array.ptr;
    for (uint32_t i = 0; i < o.via.array.size; ++i) {
      // Fast path for the common case; Int() builds the error path only on failure.
      if (items[i].type == msgpack::type::POSITIVE_INTEGER &&
          items[i].via.u64 <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        (*out)[i] = static_cast<int64_t>(items[i].via.u64);
      } else if (!Int(items[i], path.Index(i), &(*out)[i])) {
        return false;
      }
    }
    return true;
  }

  bool AnyValue(const msgpack::object& o, const Path& path, Value* out) {
    switch (o.type) {
      case msgpack::type::NIL:
        out->v = std::monostate{};
        return true;
      case msgpack::type::BOOLEAN:
        out->v = o.via.boolean;
        return true;
      case msgpack::type::POSITIVE_INTEGER:
        if (o.via.u64 <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          out->v = static_cast<int64_t>(o.via.u64);
        } else {
          out->v = o.via.u64;
        }
        return true;
      case msgpack::type::NEGATIVE_INTEGER:
        out->v = o.via.i64;
        return true;
      case msgpack::type::FLOAT32:
      case msgpack::type::FLOAT64:
        out->v = o.via.f64;
        return true;
      case msgpack::type::STR:
        out->v = std::string(o.via.str.ptr, o.via.str.size);
        return true;
      case msgpack::type::BIN:
        out->v = Binary{std::string(o.via.bin.ptr, o.via.bin.size)};
        return true;
      case msgpack::type::ARRAY: {
        ValueArray items(o.via.array.size);
        for (uint32_t i = 0; i < o.via.array.size; ++i) {
          if (!AnyValue(o.via.array.ptr[i], path.Index(i), &items[i])) {
            return false;
          }
        }
        out->v = std::move(items);
        return true;
      }
      default:
        return Fail(path, "nil, bool, int, float, str, bin or array", o);
    }
  }

  bool ExtraKeys(const msgpack::object& o, const Path& path,
                 std::optional<std::vector<Value>>* out) {
    if (o.type == msgpack::type::NIL) {
      out->reset();
      return true;
    }
    if (o.type != msgpack::type::ARRAY) return Fail(path, "array or nil", o);
    std::vector<Value> keys(o.via.array.size);
    for (uint32_t i = 0; i < o.via.array.size; ++i) {
      const msgpack::object& k = o.via.array.ptr[i];
      Path item_path = path.Index(i);
      if (k.type != msgpack::type::NIL && k.type != msgpack::type::ARRAY) {
        return Fail(item_path, "array (tuple) or nil", k);
      }
      if (!AnyValue(k, item_path, &keys[i])) return false;
    }
    *out = std::move(keys);
    return true;
  }

  // Field setters shared by the map and the positional forms. `index` is the field's position in
  // the declaration order of A.1 (0-based, tag excluded).
  bool StoredField(BlockStored* e, int index, const msgpack::object& o, const Path& p) {
    switch (index) {
      case 0:
        return Hashes(o, p, &e->block_hashes);
      case 1:
        return OptHash(o, p, &e->parent_block_hash);
      case 2:
        return Tokens(o, p, &e->token_ids);
      case 3:
        return Int(o, p, &e->block_size);
      case 4:
        return OptInt(o, p, &e->lora_id);
      case 5:
        return OptStr(o, p, &e->medium);
      case 6:
        return OptStr(o, p, &e->lora_name);
      case 7:
        return ExtraKeys(o, p, &e->extra_keys);
      case 8:
        return OptInt(o, p, &e->group_idx);
      case 9:
        return OptStr(o, p, &e->kv_cache_spec_kind);
      case 10:
        return OptInt(o, p, &e->kv_cache_spec_sliding_window);
      case 11:
        return OptStr(o, p, &e->locality);
      case 12:
        return OptStr(o, p, &e->ownership);
      case 13:
        return OptStr(o, p, &e->session_id);
      default:
        return true;  // trailing elements from a newer schema are ignored
    }
  }

  bool RemovedField(BlockRemoved* e, int index, const msgpack::object& o, const Path& p) {
    switch (index) {
      case 0:
        return Hashes(o, p, &e->block_hashes);
      case 1:
        return OptStr(o, p, &e->medium);
      case 2:
        return OptInt(o, p, &e->group_idx);
      case 3:
        return OptStr(o, p, &e->locality);
      case 4:
        return OptStr(o, p, &e->ownership);
      case 5:
        return OptStr(o, p, &e->reason);
      default:
        return true;
    }
  }

  static constexpr std::string_view kStoredKeys[] = {"block_hashes",
                                                     "parent_block_hash",
                                                     "token_ids",
                                                     "block_size",
                                                     "lora_id",
                                                     "medium",
                                                     "lora_name",
                                                     "extra_keys",
                                                     "group_idx",
                                                     "kv_cache_spec_kind",
                                                     "kv_cache_spec_sliding_window",
                                                     "locality",
                                                     "ownership",
                                                     "session_id"};
  // Fields of the first schema generation (#16750): required in every encoding.
  static constexpr int kStoredRequired = 5;
  static constexpr std::string_view kRemovedKeys[] = {"block_hashes", "medium",    "group_idx",
                                                      "locality",     "ownership", "reason"};
  static constexpr int kRemovedRequired = 1;

  template <class E, size_t N>
  bool MapEvent(const msgpack::object& o, const Path& path, const std::string_view (&keys)[N],
                int required, E* e,
                bool (Decoder::*field)(E*, int, const msgpack::object&, const Path&)) {
    uint32_t seen = 0;
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      const msgpack::object_kv& kv = o.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) {
        return Fail(path.Field("<key>"), "str", kv.key);
      }
      std::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
      for (size_t f = 0; f < N; ++f) {
        if (key == keys[f]) {
          if (!(this->*field)(e, static_cast<int>(f), kv.val, path.Field(key))) {
            return false;
          }
          seen |= 1u << f;
          break;
        }
      }
      // Unknown keys (including "type") are ignored, as msgspec does.
    }
    for (int f = 0; f < required; ++f) {
      if ((seen & (1u << f)) == 0) {
        return FailMsg(path.str() + ": missing required field '" + std::string(keys[f]) + "'");
      }
    }
    return true;
  }

  template <class E>
  bool ArrayEvent(const msgpack::object& o, const Path& path, int required, E* e,
                  bool (Decoder::*field)(E*, int, const msgpack::object&, const Path&)) {
    uint32_t fields = o.via.array.size - 1;  // element 0 is the tag
    if (fields < static_cast<uint32_t>(required)) {
      return FailMsg(path.str() + ": positional event has " + std::to_string(fields) +
                     " fields, needs at least " + std::to_string(required));
    }
    for (uint32_t i = 0; i < fields; ++i) {
      if (!(this->*field)(e, static_cast<int>(i), o.via.array.ptr[i + 1], path.Index(i + 1))) {
        return false;
      }
    }
    return true;
  }

  bool Event(const msgpack::object& o, const Path& path, KvEvent* out) {
    std::string_view tag;
    const msgpack::object* tag_obj = nullptr;
    if (o.type == msgpack::type::MAP) {
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const msgpack::object_kv& kv = o.via.map.ptr[i];
        if (kv.key.type == msgpack::type::STR &&
            std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == "type") {
          tag_obj = &kv.val;
          break;
        }
      }
      if (tag_obj == nullptr) return FailMsg(path.str() + ": event map has no 'type' tag");
    } else if (o.type == msgpack::type::ARRAY) {
      if (o.via.array.size == 0) return FailMsg(path.str() + ": empty positional event");
      tag_obj = &o.via.array.ptr[0];
    } else {
      return Fail(path, "map or array (event)", o);
    }
    if (tag_obj->type != msgpack::type::STR) return Fail(path.Field("type"), "str", *tag_obj);
    tag = std::string_view(tag_obj->via.str.ptr, tag_obj->via.str.size);
    bool is_map = o.type == msgpack::type::MAP;

    if (tag == "BlockStored") {
      BlockStored e;
      bool ok = is_map ? MapEvent(o, path, kStoredKeys, kStoredRequired, &e, &Decoder::StoredField)
                       : ArrayEvent(o, path, kStoredRequired, &e, &Decoder::StoredField);
      if (!ok) return false;
      *out = std::move(e);
      return true;
    }
    if (tag == "BlockRemoved") {
      BlockRemoved e;
      bool ok = is_map
                    ? MapEvent(o, path, kRemovedKeys, kRemovedRequired, &e, &Decoder::RemovedField)
                    : ArrayEvent(o, path, kRemovedRequired, &e, &Decoder::RemovedField);
      if (!ok) return false;
      *out = std::move(e);
      return true;
    }
    if (tag == "AllBlocksCleared") {
      *out = AllBlocksCleared{};
      return true;
    }
    return FailMsg(path.str() + ": unknown event type '" + std::string(tag.substr(0, 64)) + "'");
  }

  bool Batch(const msgpack::object& o, EventBatch* out) {
    if (o.type != msgpack::type::ARRAY)
      return Fail(Path("batch"), "array [ts, events, dp_rank]", o);
    const msgpack::object_array& a = o.via.array;
    if (a.size < 2) {
      return FailMsg("batch: array has " + std::to_string(a.size) +
                     " elements, needs at least 2 (ts, events)");
    }
    const msgpack::object& ts = a.ptr[0];
    if (ts.type == msgpack::type::FLOAT64 || ts.type == msgpack::type::FLOAT32) {
      out->ts = ts.via.f64;
    } else if (ts.type == msgpack::type::POSITIVE_INTEGER) {
      out->ts = static_cast<double>(ts.via.u64);
    } else if (ts.type == msgpack::type::NEGATIVE_INTEGER) {
      out->ts = static_cast<double>(ts.via.i64);
    } else {
      return Fail(Path("batch").Field("ts"), "float", ts);
    }
    const msgpack::object& events = a.ptr[1];
    if (events.type != msgpack::type::ARRAY)
      return Fail(Path("batch").Field("events"), "array", events);
    out->events.resize(events.via.array.size);
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      if (!Event(events.via.array.ptr[i], Path("events").Index(i), &out->events[i])) {
        return false;
      }
    }
    if (a.size >= 3 &&
        !OptInt(a.ptr[2], Path("batch").Field("data_parallel_rank"), &out->data_parallel_rank)) {
      return false;
    }
    return true;
  }
};

}  // namespace

void EncodeBatchTo(const EventBatch& batch, std::string* out, const EncodeOptions& options) {
  StringSink sink{out};
  Packer pk(sink);
  pk.pack_array(3);
  PackFloat64(sink, batch.ts);
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  bool as_map = options.encoding == EventEncoding::kMap;
  for (const KvEvent& event : batch.events) {
    std::visit(
        [&](const auto& e) {
          using T = std::decay_t<decltype(e)>;
          if constexpr (std::is_same_v<T, BlockStored>) {
            as_map ? PackStoredMap(pk, sink, e) : PackStoredArray(pk, sink, e);
          } else if constexpr (std::is_same_v<T, BlockRemoved>) {
            as_map ? PackRemovedMap(pk, e) : PackRemovedArray(pk, e);
          } else if (as_map) {
            pk.pack_map(1);
            PackStr(pk, "type");
            PackStr(pk, "AllBlocksCleared");
          } else {
            pk.pack_array(1);
            PackStr(pk, "AllBlocksCleared");
          }
        },
        event);
  }
  PackOptInt(pk, batch.data_parallel_rank);
}

std::string EncodeBatch(const EventBatch& batch, const EncodeOptions& options) {
  std::string out;
  out.reserve(64 + 32 * batch.events.size());
  EncodeBatchTo(batch, &out, options);
  return out;
}

Result<EventBatch> DecodeBatch(std::string_view payload, const DecodeLimits& limits) {
  if (payload.empty()) return Status::InvalidArgument("batch: empty payload");
  if (payload.size() > limits.max_payload_bytes) {
    return Status::InvalidArgument("batch: payload of " + std::to_string(payload.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(limits.max_payload_bytes));
  }
  msgpack::unpack_limit limit(limits.max_array_elements, limits.max_map_entries,
                              limits.max_string_bytes, limits.max_string_bytes,
                              limits.max_string_bytes, limits.max_depth);
  msgpack::object_handle handle;
  size_t offset = 0;
  try {
    handle = msgpack::unpack(payload.data(), payload.size(), offset, nullptr, nullptr, limit);
  } catch (const msgpack::insufficient_bytes&) {
    return Status::InvalidArgument("batch: truncated msgpack (" + std::to_string(payload.size()) +
                                   " bytes)");
  } catch (const msgpack::size_overflow& e) {
    return Status::InvalidArgument(std::string("batch: element exceeds decode limits (") +
                                   e.what() + ")");
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("batch: malformed msgpack: ") + e.what());
  }
  if (offset != payload.size()) {
    return Status::InvalidArgument("batch: " + std::to_string(payload.size() - offset) +
                                   " trailing bytes after the batch");
  }
  Decoder decoder;
  EventBatch batch;
  if (!decoder.Batch(handle.get(), &batch)) return decoder.error;
  return batch;
}

}  // namespace kvo
