// libFuzzer target: a file-tier namespace's config.json, as `kvo fs scan|verify` (InspectFsRoot)
// reads it from disk, and the writer's side (FsFieldsConfigJson, FsNamespaceName). The first
// input byte picks the mode:
//   even: the rest is config.json's text, in a namespace directory named after the digest of its
//         fields computed here independently (sha256 of the sorted compact JSON, vLLM's rule) when
//         it is a JSON object, else after a wrong digest. InspectFsRoot must not crash, must find
//         the namespace, and must say the digest matches exactly when it does.
//   odd:  the rest becomes run fields (model name, dtype, layer names, canonical_format); the
//         writer must answer a Status, never throw; an accepted namespace name is one safe path
//         component; and config.json written the tier's way under that name is read back by
//         InspectFsRoot with a matching digest and the same model name.
#include <openssl/sha.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/hex.h"
#include "tests/fuzz/fuzz_check.h"
#include "transfer/fs_inspect.h"
#include "transfer/fs_namespace.h"

namespace {

std::string g_root;

std::string Digest12(const std::string& text) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), md);
  return kvo::ToHex(std::string_view(reinterpret_cast<const char*>(md), 6));
}

// Writes <root>/<ns>/config.json and returns the inspection of the root.
kvo::FsRootReport Inspect(const std::string& ns, std::string_view config) {
  const std::string root = g_root + "/root";
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  std::filesystem::create_directories(root + "/" + ns);
  {
    std::ofstream f(root + "/" + ns + "/config.json", std::ios::binary | std::ios::trunc);
    f.write(config.data(), static_cast<std::streamsize>(config.size()));
  }
  auto report = kvo::InspectFsRoot(root, kvo::FsInspectOptions{});
  FUZZ_CHECK(report.ok(), "%s", report.status().ToString().c_str());
  FUZZ_CHECK(report->namespaces.size() == 1 && report->namespaces[0].name == ns &&
                 report->namespaces[0].has_config,
             "the namespace was not found");
  for (const std::string& p : report->problems) FUZZ_CHECK_MESSAGE(p);
  return std::move(report).value();
}

// Splits off the next '\n'-terminated field.
std::string Next(std::string_view* in) {
  size_t end = in->find('\n');
  std::string out(in->substr(0, end));
  in->remove_prefix(end == std::string_view::npos ? in->size() : end + 1);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_root = kvo_fuzz::MakeScratchRoot("fsconfig");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned char mode = data[0];
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  if (mode % 2 == 0) {
    // The reference digest dump()s recursively: keep this side to shallow documents (a deep one
    // gets a wrong name, and InspectFsRoot must still not crash on it).
    size_t depth = 0;
    size_t max_depth = 0;
    for (char c : in) {
      if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
      if ((c == ']' || c == '}') && depth > 0) --depth;
    }
    nlohmann::json j = max_depth > 1000 ? nlohmann::json(nlohmann::json::value_t::discarded)
                                        : nlohmann::json::parse(in, nullptr, false);
    const bool object = !j.is_discarded() && j.is_object();
    const std::string ns =
        "model_" + (object ? Digest12(j.dump(-1, ' ', /*ensure_ascii=*/true)) : "000000000000");
    kvo::FsRootReport report = Inspect(ns, in);
    FUZZ_CHECK(report.namespaces[0].digest_matches == object || max_depth > 1000,
               "digest_matches %d for a config that is%s an object",
               report.namespaces[0].digest_matches, object ? "" : " not");
    return 0;
  }

  kvo::FsRunFields fields;
  fields.model_name = Next(&in);
  fields.dtype = Next(&in);
  fields.tokens_per_hash = mode;
  fields.parallel_agnostic = mode & 2;
  fields.replicated_layout = mode & 4;
  kvo::FsRunFields::Group group;
  group.layer_names.push_back(Next(&in));
  group.layer_names.push_back(Next(&in));
  fields.kv_cache_groups.push_back(group);
  if (mode & 8) fields.canonical_format_json = std::string(in);

  kvo::Result<std::string> name = kvo::FsNamespaceName(fields);
  kvo::Result<std::string> config = kvo::FsFieldsConfigJson(fields);
  FUZZ_CHECK(config.ok() || !name.ok(), "name %s, config %s", name.status().ToString().c_str(),
             config.status().ToString().c_str());
  // A name is refused for more (".", "..", a NUL byte) than config.json.
  if (!name.ok()) {
    FUZZ_CHECK(name.status().code() == kvo::StatusCode::kInvalidArgument, "%s",
               name.status().ToString().c_str());
    FUZZ_CHECK_MESSAGE(name.status().message());
    return 0;
  }
  FUZZ_CHECK(!name->empty() && *name != "." && *name != ".." &&
                 name->find('/') == std::string::npos && name->find('\0') == std::string::npos,
             "namespace name '%s' is not one path component", kvo_fuzz::Preview(*name).c_str());
  if (name->size() > 200) return 0;  // beyond NAME_MAX the tier's mkdir fails cleanly
  kvo::FsRootReport report = Inspect(*name, *config);
  FUZZ_CHECK(report.namespaces[0].digest_matches, "the tier's own config.json does not match");
  FUZZ_CHECK(report.namespaces[0].model_name == fields.model_name, "model name '%s'",
             kvo_fuzz::Preview(report.namespaces[0].model_name).c_str());
  return 0;
}
