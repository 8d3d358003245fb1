#include "transfer/fs_namespace.h"

#include <openssl/sha.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "common/hex.h"
#include "common/json.h"

namespace kvo {
namespace {

Result<nlohmann::json> FieldsJson(const FsRunFields& f) {
  if (f.model_name.empty()) return Status::InvalidArgument("fs tier: model_name is empty");
  nlohmann::json j = nlohmann::json::object();
  j["model_name"] = f.model_name;
  j["tokens_per_hash"] = f.tokens_per_hash;
  j["blocks_per_file"] = f.blocks_per_file;
  j["tp_size"] = f.parallel_agnostic ? 1 : f.tp_size;
  j["pp_size"] = f.parallel_agnostic ? 1 : f.pp_size;
  j["pcp_size"] = f.parallel_agnostic ? 1 : f.pcp_size;
  j["dcp_size"] = f.parallel_agnostic ? 1 : f.dcp_size;
  j["dtype"] = f.dtype;
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : f.kv_cache_groups) {
    groups.push_back({{"tokens_per_block", g.tokens_per_block}, {"layer_names", g.layer_names}});
  }
  j["kv_cache_groups"] = std::move(groups);
  j["inference_engine"] = f.inference_engine;
  if (!f.parallel_agnostic) j["parallel_agnostic"] = false;
  if (f.replicated_layout) j["replicated_layout"] = true;
  if (f.canonical_format_json.has_value()) {
    auto canonical = ParseJson(*f.canonical_format_json, "fs tier: canonical_format is not JSON");
    if (!canonical.ok()) return canonical.status();
    j["canonical_format"] = std::move(canonical).value();
  }
  return j;
}

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

}  // namespace

// nlohmann's object is a std::map, so keys come out sorted (byte order, as Python's sort_keys for
// ASCII keys); ensure_ascii matches Python's default escaping.
namespace {

// A field that is not UTF-8 (a model path of raw bytes, say) has no JSON form: InvalidArgument
// rather than nlohmann's exception.
Result<std::string> DumpFields(const FsRunFields& fields, int indent) {
  KVO_ASSIGN_OR_RETURN(nlohmann::json j, FieldsJson(fields));
  try {
    return j.dump(indent, ' ', /*ensure_ascii=*/true);
  } catch (const nlohmann::json::type_error& e) {
    return Status::InvalidArgument(std::string("fs tier: run fields are not valid UTF-8 (") +
                                   e.what() + ")");
  }
}

}  // namespace

Result<std::string> FsFieldsCompactJson(const FsRunFields& fields) {
  return DumpFields(fields, -1);
}

Result<std::string> FsFieldsConfigJson(const FsRunFields& fields) { return DumpFields(fields, 2); }

Result<std::string> FsNamespaceDigest(const FsRunFields& fields) {
  KVO_ASSIGN_OR_RETURN(std::string compact, FsFieldsCompactJson(fields));
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(compact.data()), compact.size(), md);
  return ToHex(std::string_view(reinterpret_cast<const char*>(md), 6));
}

Result<std::string> FsNamespaceName(const FsRunFields& fields) {
  KVO_ASSIGN_OR_RETURN(std::string digest, FsNamespaceDigest(fields));
  std::string model = fields.model_name;
  for (char& c : model) {
    if (c == '/') c = '_';
  }
  if (model == "." || model == ".." || model.find('\0') != std::string::npos) {
    return Status::InvalidArgument("fs tier: model_name '" + fields.model_name +
                                   "' cannot be a directory name");
  }
  return model + "_" + digest;
}

Status ValidateBlockHex(std::string_view hex) {
  if (hex.size() < 6 || hex.size() > 128 || hex.size() % 2 != 0) {
    return Status::InvalidArgument("block hash '" + std::string(hex.substr(0, 140)) +
                                   "': need an even number of 6..128 hex digits, got " +
                                   std::to_string(hex.size()));
  }
  for (size_t i = 0; i < hex.size(); ++i) {
    if (!IsLowerHex(hex[i])) {
      return Status::InvalidArgument("block hash '" + std::string(hex) +
                                     "': not lowercase hex at position " + std::to_string(i));
    }
  }
  return Status::Ok();
}

Result<FsBlockKey> MakeFsBlockKey(std::string_view hex, uint32_t group) {
  KVO_RETURN_IF_ERROR(ValidateBlockHex(hex));
  return FsBlockKey{std::string(hex), group};
}

Result<FsBlockKey> FsBlockKeyFromDigest(std::string_view digest, uint32_t group) {
  return MakeFsBlockKey(ToHex(digest), group);
}

std::string FsBlockDir1(const FsBlockKey& key) { return key.hex.substr(0, 3); }
std::string FsBlockDir2(const FsBlockKey& key) {
  return key.hex.substr(3, 2) + "_g" + std::to_string(key.group);
}
std::string FsBlockFileName(const FsBlockKey& key) { return key.hex + ".bin"; }

std::string FsBlockRelativePath(std::string_view ns_name, uint32_t rank, const FsBlockKey& key) {
  return std::string(ns_name) + "_r" + std::to_string(rank) + "/" + FsBlockDir1(key) + "/" +
         FsBlockDir2(key) + "/" + FsBlockFileName(key);
}

namespace {
std::optional<uint32_t> ParseDecimal(std::string_view s) {
  // Up to 10 digits: every u32 (ranks and groups are u32); from_chars refuses what overflows.
  if (s.empty() || s.size() > 10) return std::nullopt;
  if (s.size() > 1 && s[0] == '0') return std::nullopt;  // canonical form only
  uint32_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}
}  // namespace

std::optional<uint32_t> ParseRankDirName(std::string_view name, std::string* ns_name) {
  size_t pos = name.rfind("_r");
  if (pos == std::string_view::npos || pos == 0) return std::nullopt;
  auto rank = ParseDecimal(name.substr(pos + 2));
  if (!rank) return std::nullopt;
  if (ns_name != nullptr) *ns_name = std::string(name.substr(0, pos));
  return rank;
}

bool ParseDir1Name(std::string_view name) {
  return name.size() == 3 && IsLowerHex(name[0]) && IsLowerHex(name[1]) && IsLowerHex(name[2]);
}

std::optional<uint32_t> ParseDir2Name(std::string_view name, std::string* two_hex) {
  if (name.size() < 5 || !IsLowerHex(name[0]) || !IsLowerHex(name[1]) ||
      name.substr(2, 2) != "_g") {
    return std::nullopt;
  }
  auto group = ParseDecimal(name.substr(4));
  if (!group) return std::nullopt;
  if (two_hex != nullptr) *two_hex = std::string(name.substr(0, 2));
  return group;
}

std::optional<std::string> ParseBlockFileName(std::string_view name) {
  if (name.size() < 5 || name.substr(name.size() - 4) != ".bin") return std::nullopt;
  std::string_view hex = name.substr(0, name.size() - 4);
  if (!ValidateBlockHex(hex).ok()) return std::nullopt;
  return std::string(hex);
}

}  // namespace kvo
