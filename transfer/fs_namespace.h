// The file tier's namespace and block paths, exactly as vLLM's FileMapper writes them
// (vllm-compat.md B.11, E.10):
//
//   <root>/<model, '/' -> '_'>_<digest12>/config.json
//   <root>/<model, '/' -> '_'>_<digest12>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin
//
// digest12 = sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")))[:12];
// config.json = json.dump(fields, indent=2, sort_keys=True). Hashes are validated (lowercase hex)
// before they become path components.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace kvo {

// The run fields vLLM hashes into the namespace digest (B.11 "Fields").
struct FsRunFields {
  struct Group {
    uint32_t tokens_per_block = 16;
    std::vector<std::string> layer_names;
  };
  std::string model_name;
  uint32_t tokens_per_hash = 16;
  uint32_t blocks_per_file = 1;  // the FS tier uses blocks_per_chunk
  uint32_t tp_size = 1;
  uint32_t pp_size = 1;
  uint32_t pcp_size = 1;
  uint32_t dcp_size = 1;
  std::string dtype = "float16";  // the cache dtype, or the model dtype when "auto"
  std::vector<Group> kv_cache_groups;
  std::string inference_engine = "vllm";
  // true: tp/pp/pcp/dcp are written as 1 and "parallel_agnostic" is omitted; false: the field
  // "parallel_agnostic": false is written (vLLM writes it only when not parallel-agnostic).
  bool parallel_agnostic = false;
  bool replicated_layout = false;  // written as true only when set
  // Raw JSON value written under "canonical_format" when set (validated as JSON).
  std::optional<std::string> canonical_format_json;
};

// The sorted compact JSON the digest is computed over. InvalidArgument when model_name is empty
// or canonical_format_json is not JSON.
Result<std::string> FsFieldsCompactJson(const FsRunFields& fields);
// config.json's text (indent 2, sorted keys, no trailing newline, like Python's json.dump).
Result<std::string> FsFieldsConfigJson(const FsRunFields& fields);
// First 12 hex digits of sha256(compact JSON).
Result<std::string> FsNamespaceDigest(const FsRunFields& fields);
// "<model with '/' replaced by '_'>_<digest12>" (the directory name of config.json).
Result<std::string> FsNamespaceName(const FsRunFields& fields);

// A block's identity on disk: the full raw block hash as lowercase hex plus the KV group.
struct FsBlockKey {
  std::string hex;
  uint32_t group = 0;
  friend bool operator==(const FsBlockKey&, const FsBlockKey&) = default;
  friend auto operator<=>(const FsBlockKey&, const FsBlockKey&) = default;
};

// Lowercase hex, even length, 6..128 digits (vLLM: 64 for sha256, 32 for xxhash; 16 for a 64-bit
// hash). InvalidArgument naming the offending character otherwise.
Status ValidateBlockHex(std::string_view hex);
Result<FsBlockKey> MakeFsBlockKey(std::string_view hex, uint32_t group);
// From raw hash bytes (1..64 bytes -> hex).
Result<FsBlockKey> FsBlockKeyFromDigest(std::string_view digest, uint32_t group);

// "<hex[0:3]>", "<hex[3:5]>_g<group>", "<hex>.bin". REQUIRES: key validated.
std::string FsBlockDir1(const FsBlockKey& key);
std::string FsBlockDir2(const FsBlockKey& key);
std::string FsBlockFileName(const FsBlockKey& key);
// "<namespace>_r<rank>/<dir1>/<dir2>/<hex>.bin", relative to root_dir.
std::string FsBlockRelativePath(std::string_view ns_name, uint32_t rank, const FsBlockKey& key);

// Parses the names the other way, validating each (scan). Each returns nullopt on a bad name.
std::optional<uint32_t> ParseRankDirName(std::string_view name, std::string* ns_name);
bool ParseDir1Name(std::string_view name);  // three lowercase hex digits
std::optional<uint32_t> ParseDir2Name(std::string_view name, std::string* two_hex);
std::optional<std::string> ParseBlockFileName(std::string_view name);  // hex of "<hex>.bin"

}  // namespace kvo
