// JSON adapter for kv_connector_extra_config: the only file of the manager that calls
// nlohmann_json for it; its exceptions stop here.
#include "manager/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "common/json.h"
#include "common/logging.h"
#include "manager/cache_policy.h"
#include "transfer/fs_block_store.h"

namespace kvo {
namespace {

using nlohmann::json;

constexpr std::string_view kCtx = "kv_connector_extra_config";
constexpr std::string_view kConnectorName = "OffloadingConnector";

// The secondary tier types vLLM registers (tiering/factory.py), and the one kvo implements.
const std::vector<std::string>& VllmTierTypes() {
  static const std::vector<std::string> types = {"example", "fs", "obj", "p2p"};
  return types;
}
constexpr std::string_view kFsTier = "fs";

const std::vector<std::string>& KvRoles() {
  static const std::vector<std::string> roles = {"kv_producer", "kv_consumer", "kv_both"};
  return roles;
}

std::string Show(const json& v) { return DescribeJson(v); }

// Python's repr of a list of strings: ['lru', 'arc'].
std::string PyList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += "'" + items[i] + "'";
  }
  return out + "]";
}

bool Contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

Status Invalid(std::string message) {
  return Status::InvalidArgument(std::string(kCtx) + ": " + std::move(message));
}

Status WrongValue(std::string_view key, const json& v, std::string_view allowed) {
  return Invalid("'" + std::string(key) + "' must be " + std::string(allowed) + ", got " + Show(v));
}

// Python truthiness of a JSON value (what `if not x:` tests).
bool Falsy(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return true;
    case json::value_t::boolean:
      return !v.get<bool>();
    case json::value_t::number_integer:
      return v.get<int64_t>() == 0;
    case json::value_t::number_unsigned:
      return v.get<uint64_t>() == 0;
    case json::value_t::number_float:
      return v.get<double>() == 0.0;
    case json::value_t::string:
      return v.get_ref<const std::string&>().empty();
    case json::value_t::array:
    case json::value_t::object:
      return v.empty();
    default:
      return false;
  }
}

void Warn(OffloadConfig* c, std::string message) {
  KVO_LOG_WARN("{}", message);
  c->warnings.push_back(std::move(message));
}

// Reads a JSON integer, or a float with an integral value (1e12), into int64.
Status ReadInt(std::string_view key, const json& v, int64_t* out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return WrongValue(key, v, "an integer in the int64 range");
    }
    *out = v.get<int64_t>();
    return Status::Ok();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::trunc(d) == d && d >= -9.2e18 && d <= 9.2e18) {
      *out = static_cast<int64_t>(d);
      return Status::Ok();
    }
  }
  return WrongValue(key, v, "an integer");
}

Status ReadPositive(std::string_view key, const json& v, uint64_t* out) {
  int64_t i = 0;
  KVO_RETURN_IF_ERROR(ReadInt(key, v, &i));
  if (i <= 0) return WrongValue(key, v, "an integer greater than 0");
  *out = static_cast<uint64_t>(i);
  return Status::Ok();
}

Status ReadBool(std::string_view key, const json& v, bool* out) {
  if (!v.is_boolean()) return WrongValue(key, v, "true or false");
  *out = v.get<bool>();
  return Status::Ok();
}

// cpu_bytes_to_use: a number of bytes, int or float (vLLM's --kv-offloading-size writes
// GiB * 2**30 as a float); truncated as Python's int() does.
Status ReadCpuBytes(const json* v, uint64_t* out) {
  static constexpr char kVllmMessage[] =
      "cpu_bytes_to_use must be specified in kv_connector_extra_config";
  if (v == nullptr) return Status::InvalidArgument(kVllmMessage);
  if (Falsy(*v))
    return Status::InvalidArgument(std::string(kVllmMessage) + " (got " + Show(*v) + ")");
  constexpr std::string_view kAllowed = "a positive number of bytes (the total across all workers)";
  if (v->is_number_unsigned()) {
    *out = v->get<uint64_t>();
  } else if (v->is_number_integer()) {
    if (v->get<int64_t>() < 0) return WrongValue("cpu_bytes_to_use", *v, kAllowed);
    *out = static_cast<uint64_t>(v->get<int64_t>());
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!(d >= 1.0) || d >= 18446744073709551616.0) {
      return WrongValue("cpu_bytes_to_use", *v, kAllowed);
    }
    *out = static_cast<uint64_t>(d);
  } else {
    return WrongValue("cpu_bytes_to_use", *v, kAllowed);
  }
  return Status::Ok();
}

// The value of `key`, or nullptr when absent.
const json* Find(const json& object, std::string_view key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Absent or JSON null: vLLM's extra_config.get(key) is None either way.
const json* FindNonNull(const json& object, std::string_view key) {
  const json* v = Find(object, key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

Result<FsTierConfig> ParseFsTier(const std::string& path, const json& t) {
  FsTierConfig fs;
  bool has_root = false;
  for (const auto& [key, v] : t.items()) {
    const std::string name = path + "." + key;
    if (key == "type" || key == "module_path") {
      continue;  // handled by the caller
    } else if (key == "root_dir") {
      if (!v.is_string() || v.get<std::string>().empty()) {
        return WrongValue(name, v, "a non-empty directory path (string)");
      }
      fs.root_dir = v.get<std::string>();
      has_root = true;
    } else if (key == "n_read_threads" || key == "n_write_threads") {
      int64_t n = 0;
      KVO_RETURN_IF_ERROR(ReadInt(name, v, &n));
      if (n < 0) return WrongValue(name, v, "a non-negative integer");
      if (n > kFsMaxThreadsPerPool) {
        return WrongValue(
            name, v, "at most " + std::to_string(kFsMaxThreadsPerPool) + " (threads per pool)");
      }
      (key == "n_read_threads" ? fs.n_read_threads : fs.n_write_threads) = n;
    } else if (key == "enable_kv_events") {
      KVO_RETURN_IF_ERROR(ReadBool(name, v, &fs.enable_kv_events));
    } else if (key == "locality") {
      if (v.is_null()) {
        fs.locality.reset();
      } else if (v.is_string() && v.get<std::string>() == "LOCAL") {
        fs.locality = TierLocality::kLocal;
      } else if (v.is_string() && v.get<std::string>() == "REMOTE") {
        fs.locality = TierLocality::kRemote;
      } else {
        const std::string shown = v.is_string() ? "'" + v.get<std::string>() + "'" : Show(v);
        return Invalid("'" + name + "': " + shown +
                       " is not a valid Locality (allowed: null, \"LOCAL\" or \"REMOTE\"; "
                       "case-sensitive)");
      }
    } else if (key == "max_bytes") {
      int64_t n = 0;
      KVO_RETURN_IF_ERROR(ReadInt(name, v, &n));
      if (n < 0) return WrongValue(name, v, "a non-negative integer (0 = unbounded)");
      fs.max_bytes = static_cast<uint64_t>(n);
    } else {
      return Invalid("'" + path + "': unknown fs tier key '" + CutForMessage(key) + "' (value " +
                     Show(v) +
                     "); vLLM rejects it too (TypeError: unexpected keyword argument); allowed: "
                     "root_dir, n_read_threads, n_write_threads, enable_kv_events, locality, "
                     "max_bytes");
    }
  }
  if (!has_root) {
    return Invalid("'" + path + "': an fs tier needs 'root_dir' (the directory shared by the " +
                   "engines), got " + Show(t));
  }
  if (fs.n_read_threads + fs.n_write_threads < 1) {
    return Invalid("'" + path + "': n_read_threads + n_write_threads must be at least 1, got " +
                   std::to_string(fs.n_read_threads) + " + " + std::to_string(fs.n_write_threads));
  }
  return fs;
}

Result<std::vector<SecondaryTierConfig>> ParseSecondaryTiers(const json* v) {
  std::vector<SecondaryTierConfig> tiers;
  if (v == nullptr) return tiers;
  if (!v->is_array()) {
    return Invalid("secondary_tiers must be a list of tier configurations (got " + Show(*v) + ")");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    const std::string path = "secondary_tiers[" + std::to_string(i) + "]";
    if (!t.is_object()) return WrongValue(path, t, "an object (a tier configuration)");
    const json* type = Find(t, "type");
    if (type == nullptr || Falsy(*type)) {
      return Invalid("Secondary tier configuration must include 'type' (" + path + ": " + Show(t) +
                     ")");
    }
    if (!type->is_string()) return WrongValue(path + ".type", *type, "a string");
    const std::string type_name = type->get<std::string>();
    if (const json* module = FindNonNull(t, "module_path")) {
      return Invalid("'" + path + ".module_path' (" + Show(*module) +
                     ") names a Python module vLLM would import; kvo cannot load Python tiers "
                     "(supported type: 'fs')");
    }
    if (type_name != kFsTier) {
      if (Contains(VllmTierTypes(), type_name)) {
        return Invalid("'" + path + ".type': secondary tier type '" + type_name +
                       "' is not supported by kvo (supported: 'fs')");
      }
      return Invalid("'" + path + ".type': Unknown secondary tier type: '" + type_name +
                     "'. Supported types: " + PyList(VllmTierTypes()) + " (kvo implements 'fs')");
    }
    SecondaryTierConfig tier;
    tier.type = type_name;
    KVO_ASSIGN_OR_RETURN(tier.fs, ParseFsTier(path, t));
    tiers.push_back(std::move(tier));
  }
  return tiers;
}

Status CheckBlockSizeMultiple(uint64_t block_size, const KvGeometry& g) {
  if (g.gpu_block_size == 0 || block_size % g.gpu_block_size != 0) {
    return Invalid("'block_size' " + std::to_string(block_size) +
                   " must be a multiple of the GPU block size " + std::to_string(g.gpu_block_size) +
                   " (tokens per GPU block)");
  }
  return Status::Ok();
}

Result<OffloadConfig> ParseExtra(const json& extra, OffloadConfig c) {
  if (!extra.is_object()) {
    return Status::InvalidArgument(std::string(kCtx) + ": expected a JSON object, got " +
                                   Show(extra));
  }

  // Chunking (offloading/config.py runs first in vLLM, so its errors come first here too).
  const json* block_size = FindNonNull(extra, "block_size");
  const json* blocks_per_chunk = FindNonNull(extra, "blocks_per_chunk");
  if (block_size != nullptr && blocks_per_chunk != nullptr) {
    return Status::InvalidArgument(
        "Specify only one of 'block_size' or 'blocks_per_chunk' in kv_connector_extra_config. "
        "(got block_size=" +
        Show(*block_size) + ", blocks_per_chunk=" + Show(*blocks_per_chunk) + ")");
  }
  if (blocks_per_chunk != nullptr) {
    int64_t n = 0;
    KVO_RETURN_IF_ERROR(ReadInt("blocks_per_chunk", *blocks_per_chunk, &n));
    if (n <= 0) {
      return Status::InvalidArgument("'blocks_per_chunk' must be greater than 0. (" +
                                     std::string(kCtx) +
                                     ": got blocks_per_chunk=" + Show(*blocks_per_chunk) + ")");
    }
    c.blocks_per_chunk = static_cast<uint64_t>(n);
  }
  if (block_size != nullptr) {
    uint64_t n = 0;
    KVO_RETURN_IF_ERROR(ReadPositive("block_size", *block_size, &n));
    c.block_size = n;
  }

  // spec_name / spec_module_path (kv_offload/factory.py).
  const json* spec_module = FindNonNull(extra, "spec_module_path");
  if (spec_module != nullptr && !spec_module->is_string()) {
    return WrongValue("spec_module_path", *spec_module, "a string (a Python module path)");
  }
  if (const json* spec = Find(extra, "spec_name")) {
    const std::string name = spec->is_string() ? spec->get<std::string>() : Show(*spec);
    if (name == OffloadSpecName(OffloadSpec::kCpu)) {
      c.spec = OffloadSpec::kCpu;
    } else if (name == OffloadSpecName(OffloadSpec::kTiering)) {
      c.spec = OffloadSpec::kTiering;
    } else if (spec_module != nullptr) {
      return Invalid("'spec_name' " + Show(*spec) + " with 'spec_module_path' " +
                     Show(*spec_module) +
                     ": out-of-tree specs are Python classes vLLM imports; kvo cannot load them "
                     "(supported spec_name: 'CPUOffloadingSpec', 'TieringOffloadingSpec')");
    } else {
      return Invalid("'spec_name': Unsupported spec type: " + name +
                     " (supported: 'CPUOffloadingSpec', 'TieringOffloadingSpec')");
    }
  }
  if (spec_module != nullptr) {
    Warn(&c, std::string(kCtx) + ": 'spec_module_path' " + Show(*spec_module) +
                 " is ignored: spec_name '" + std::string(OffloadSpecName(c.spec)) +
                 "' is built in (vLLM ignores it too)");
  }

  // cpu_bytes_to_use (cpu/spec.py).
  KVO_RETURN_IF_ERROR(ReadCpuBytes(Find(extra, "cpu_bytes_to_use"), &c.cpu_bytes_to_use));

  // eviction_policy / cache_policy_module_path (cpu/policies/factory.py).
  if (const json* v = Find(extra, "eviction_policy")) {
    if (!v->is_string()) return WrongValue("eviction_policy", *v, "a policy name (string)");
    c.eviction_policy = v->get<std::string>();
  }
  const json* policy_module = FindNonNull(extra, "cache_policy_module_path");
  if (policy_module != nullptr && !policy_module->is_string()) {
    return WrongValue("cache_policy_module_path", *policy_module,
                      "a string (a Python module path)");
  }
  const std::vector<std::string> policies = SupportedEvictionPolicies();
  if (Contains(policies, c.eviction_policy)) {
    if (policy_module != nullptr) {
      Warn(&c, std::string(kCtx) + ": 'cache_policy_module_path' " + Show(*policy_module) +
                   " is ignored: eviction_policy '" + c.eviction_policy +
                   "' is registered (vLLM ignores it too)");
    }
  } else if (policy_module != nullptr) {
    return Invalid("'eviction_policy' '" + c.eviction_policy +
                   "' with 'cache_policy_module_path' " + Show(*policy_module) +
                   ": out-of-tree policies are Python classes vLLM imports; kvo cannot load them. "
                   "Supported: " +
                   PyList(policies) + "; register a C++ policy by name with CachePolicyRegistry");
  } else {
    return Invalid("'eviction_policy': Unknown cache policy: '" + c.eviction_policy +
                   "'. Supported: " + PyList(policies) +
                   ". For an out-of-tree policy, register it by name with CachePolicyRegistry "
                   "(cache_policy_module_path is Python-only).");
  }

  // Booleans.
  if (const json* v = Find(extra, "offload_prompt_only")) {
    KVO_RETURN_IF_ERROR(ReadBool("offload_prompt_only", *v, &c.offload_prompt_only));
  }
  if (const json* v = Find(extra, "self_describing_kv_events")) {
    KVO_RETURN_IF_ERROR(ReadBool("self_describing_kv_events", *v, &c.self_describing_kv_events));
  }
  if (const json* v = Find(extra, "canonical_layout")) {
    KVO_RETURN_IF_ERROR(ReadBool("canonical_layout", *v, &c.canonical_layout));
    if (c.canonical_layout) {
      Warn(&c, std::string(kCtx) +
                   ": 'canonical_layout' true is accepted, but kvo does not implement vLLM's "
                   "canonical per-layer CPU layout: rows keep the direct layout, so files written "
                   "by kvo match vLLM's only when vLLM also runs without canonical_layout");
    }
  }

  // store_threshold / max_tracker_size (cpu/spec.py; rejected by TieringOffloadingSpec).
  if (const json* v = Find(extra, "store_threshold")) {
    KVO_RETURN_IF_ERROR(ReadInt("store_threshold", *v, &c.store_threshold));
  }
  if (const json* v = Find(extra, "max_tracker_size")) {
    KVO_RETURN_IF_ERROR(ReadInt("max_tracker_size", *v, &c.max_tracker_size));
  }
  if (c.store_threshold_enabled() && c.max_tracker_size < 1) {
    return WrongValue("max_tracker_size", json(c.max_tracker_size),
                      "an integer greater than 0 when store_threshold >= 2");
  }
  if (c.spec == OffloadSpec::kTiering && c.store_threshold_enabled()) {
    return Status::InvalidArgument(
        "store_threshold is not supported for TieringOffloadingSpec (" + std::string(kCtx) +
        ": got store_threshold=" + std::to_string(c.store_threshold) + "; values < 2 disable it)");
  }

  // secondary_tiers (tiering/spec.py reads it; the CPU spec never does).
  if (const json* v = Find(extra, "secondary_tiers")) {
    if (c.spec == OffloadSpec::kTiering) {
      KVO_ASSIGN_OR_RETURN(c.secondary_tiers, ParseSecondaryTiers(v));
    } else {
      Warn(&c, std::string(kCtx) +
                   ": 'secondary_tiers' is ignored: it is only read with spec_name "
                   "'TieringOffloadingSpec' (spec_name is 'CPUOffloadingSpec'; vLLM ignores it "
                   "too)");
    }
  }

  // Keys vLLM does not read: kept and reported.
  for (const auto& [key, v] : extra.items()) {
    if (Contains(OffloadConfigKeys(), key)) continue;
    c.unknown_keys.push_back(key);
  }
  if (!c.unknown_keys.empty()) {
    std::string names;
    for (const std::string& k : c.unknown_keys) {
      if (!names.empty()) names += ", ";
      if (names.size() > 256) {
        names += "... (" + std::to_string(c.unknown_keys.size()) + " keys)";
        break;
      }
      names += "'" + CutForMessage(k) + "'";
    }
    std::string message = std::string(kCtx) + ": ignoring unknown key(s) " + names +
                          " (vLLM ignores keys it does not read)";
    if (Contains(c.unknown_keys, "num_cpu_blocks")) {
      message += "; 'num_cpu_blocks' is no longer read by vLLM: use cpu_bytes_to_use";
    }
    Warn(&c, std::move(message));
  }
  return c;
}

Result<OffloadConfig> Parse(std::string_view text) {
  KVO_ASSIGN_OR_RETURN(json doc, ParseJson(text, kCtx));
  if (!doc.is_object()) {
    return Status::InvalidArgument(std::string(kCtx) + ": expected a JSON object, got " +
                                   Show(doc));
  }
  OffloadConfig c;
  const json* connector = Find(doc, "kv_connector");
  if (connector == nullptr) {
    if (Find(doc, "kv_connector_extra_config") != nullptr) {
      return Status::InvalidArgument(
          "kv-transfer-config: 'kv_connector' is missing; set \"kv_connector\": "
          "\"OffloadingConnector\" next to 'kv_connector_extra_config'");
    }
    return ParseExtra(doc, std::move(c));
  }

  // The whole --kv-transfer-config object (vLLM's KVTransferConfig).
  if (!connector->is_string() || connector->get<std::string>() != kConnectorName) {
    return Status::InvalidArgument("kv-transfer-config: 'kv_connector' " + Show(*connector) +
                                   " is not supported by kvo: kvo implements "
                                   "\"OffloadingConnector\" only");
  }
  const json* role = FindNonNull(doc, "kv_role");
  if (role == nullptr) {
    return Status::InvalidArgument(
        "kv-transfer-config: Please specify kv_role when kv_connector is set, supported roles "
        "are ('kv_producer', 'kv_consumer', 'kv_both')");
  }
  if (!role->is_string() || !Contains(KvRoles(), role->get<std::string>())) {
    return Status::InvalidArgument("kv-transfer-config: Unsupported kv_role: " + Show(*role) +
                                   ". Supported roles are ('kv_producer', 'kv_consumer', "
                                   "'kv_both')");
  }
  c.kv_role = role->get<std::string>();
  for (const auto& [key, v] : doc.items()) {
    if (!Contains(KvTransferConfigKeys(), key)) {
      Warn(&c, "kv-transfer-config: ignoring unknown key '" + CutForMessage(key) + "' (value " +
                   Show(v) + ")");
    }
  }
  if (const json* module = FindNonNull(doc, "kv_connector_module_path")) {
    Warn(&c, "kv-transfer-config: 'kv_connector_module_path' " + Show(*module) +
                 " is ignored: OffloadingConnector is built in");
  }
  const json* extra = Find(doc, "kv_connector_extra_config");
  if (extra == nullptr) return ParseExtra(json::object(), std::move(c));
  return ParseExtra(*extra, std::move(c));
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string_view OffloadSpecName(OffloadSpec spec) {
  return spec == OffloadSpec::kTiering ? "TieringOffloadingSpec" : "CPUOffloadingSpec";
}

std::string_view TierLocalityName(TierLocality locality) {
  return locality == TierLocality::kRemote ? "REMOTE" : "LOCAL";
}

std::vector<std::string> SupportedEvictionPolicies() {
  return CachePolicyRegistry::Global().Names();
}

const std::vector<std::string>& OffloadConfigKeys() {
  static const std::vector<std::string> keys = {
      "spec_name",        "spec_module_path", "cpu_bytes_to_use",          "block_size",
      "blocks_per_chunk", "eviction_policy",  "cache_policy_module_path",  "offload_prompt_only",
      "store_threshold",  "max_tracker_size", "self_describing_kv_events", "canonical_layout",
      "secondary_tiers",
  };
  return keys;
}

const std::vector<std::string>& FsTierConfigKeys() {
  static const std::vector<std::string> keys = {
      "type",           "module_path",     "root_dir",
      "n_read_threads", "n_write_threads", "enable_kv_events",
      "locality",       "max_bytes",
  };
  return keys;
}

const std::vector<std::string>& KvTransferConfigKeys() {
  static const std::vector<std::string> keys = {
      "kv_connector",
      "engine_id",
      "kv_buffer_device",
      "kv_buffer_size",
      "kv_role",
      "kv_rank",
      "kv_parallel_size",
      "kv_ip",
      "kv_port",
      "kv_connector_extra_config",
      "kv_connector_module_path",
      "enable_permute_local_kv",
      "kv_load_failure_policy",
  };
  return keys;
}

Result<OffloadConfig> ParseOffloadConfig(std::string_view json_text) { return Parse(json_text); }

Result<OffloadConfig> ParseOffloadConfig(std::string_view json_text, const KvGeometry& geometry) {
  KVO_ASSIGN_OR_RETURN(OffloadConfig c, Parse(json_text));
  KVO_RETURN_IF_ERROR(ValidateKvGeometry(geometry));
  if (c.block_size.has_value())
    KVO_RETURN_IF_ERROR(CheckBlockSizeMultiple(*c.block_size, geometry));
  return c;
}

Status ValidateKvGeometry(const KvGeometry& g) {
  if (g.gpu_block_size == 0) {
    return Status::InvalidArgument("KV geometry: gpu_block_size must be greater than 0");
  }
  if (g.tokens_per_hash == 0 || g.gpu_block_size % g.tokens_per_hash != 0) {
    return Status::InvalidArgument(
        "KV geometry: tokens_per_block=" + std::to_string(g.gpu_block_size) +
        " not divisible by tokens_per_hash=" + std::to_string(g.tokens_per_hash));
  }
  if (g.world_size == 0) {
    return Status::InvalidArgument("KV geometry: world_size must be at least 1");
  }
  return Status::Ok();
}

Result<OffloadGeometry> ComputeOffloadGeometry(const OffloadConfig& config, const KvGeometry& g,
                                               uint64_t page_size) {
  KVO_RETURN_IF_ERROR(ValidateKvGeometry(g));
  if (page_size == 0) return Status::InvalidArgument("page size must be greater than 0");
  OffloadGeometry out;
  if (config.blocks_per_chunk.has_value()) {
    out.blocks_per_chunk = *config.blocks_per_chunk;
  } else if (config.block_size.has_value()) {
    KVO_RETURN_IF_ERROR(CheckBlockSizeMultiple(*config.block_size, g));
    out.blocks_per_chunk = *config.block_size / g.gpu_block_size;
  }
  if (out.blocks_per_chunk == 0) {
    return Invalid("'blocks_per_chunk' must be greater than 0, got 0");
  }
  const auto overflow = [&](std::string_view what) {
    return Status::InvalidArgument("offload geometry: " + std::string(what) +
                                   " overflows 64 bits (worker_kv_bytes_per_block=" +
                                   std::to_string(g.worker_kv_bytes_per_block) +
                                   ", world_size=" + std::to_string(g.world_size) +
                                   ", blocks_per_chunk=" + std::to_string(out.blocks_per_chunk) +
                                   ")");
  };
  if (MulOverflows(out.blocks_per_chunk, g.gpu_block_size, &out.tokens_per_chunk)) {
    return overflow("tokens_per_chunk");
  }
  out.hashes_per_chunk = out.tokens_per_chunk / g.tokens_per_hash;
  out.num_copies = g.replicated_layout ? 1 : g.world_size;
  uint64_t per_copy = 0;
  if (MulOverflows(g.worker_kv_bytes_per_block, out.blocks_per_chunk, &per_copy) ||
      MulOverflows(per_copy, out.num_copies, &out.kv_bytes_per_chunk)) {
    return overflow("kv_bytes_per_chunk");
  }
  const uint64_t rem = out.kv_bytes_per_chunk % page_size;
  out.row_bytes = out.kv_bytes_per_chunk;
  if (rem != 0) {
    if (__builtin_add_overflow(out.kv_bytes_per_chunk, page_size - rem, &out.row_bytes)) {
      return overflow("row_bytes");
    }
  }
  out.num_blocks = out.row_bytes == 0 ? 0 : config.cpu_bytes_to_use / out.row_bytes;
  const size_t max_blocks = MaxPolicyBlocks(config.eviction_policy);
  if (out.num_blocks > max_blocks) {
    return Status::InvalidArgument(
        "offload geometry: cpu_bytes_to_use=" + std::to_string(config.cpu_bytes_to_use) +
        " holds " + std::to_string(out.num_blocks) + " CPU blocks of " +
        std::to_string(out.row_bytes) + " bytes; at most " + std::to_string(max_blocks) +
        " with eviction_policy '" + CutForMessage(config.eviction_policy) +
        "' (use a larger block_size or less cpu_bytes_to_use)");
  }
  out.cpu_page_size_per_worker = out.kv_bytes_per_chunk / out.num_copies;
  return out;
}

}  // namespace kvo
