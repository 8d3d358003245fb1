// kvo hash: vLLM's chained block hashes of a token sequence (vllm-compat.md A.7), so a router or
// an operator can check what an engine will publish for a prompt.
//
//   kvo hash [--algo sha256|sha256_cbor|xxhash|xxhash_cbor] [--seed S] --block-size B
//            --tokens 1,2,3... [--extra-keys JSON] [--json]
//
// --seed is the engines' PYTHONHASHSEED. Without it, current vLLM's rule: "vllm-none-hash" for the
// sha256 variants; the xxhash variants have no default (the engine's seed must be given).
//
// Text output: "# none_hash <hex>", then "<block> <hex digest> <u64 wire hash>" per full block.
// --json: one {"block","hash","wire_hash","parent"} object per full block and line.
// Bad input exits 2 with a message naming the value.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/result.h"
#include "common/status.h"
#include "events/block_hash.h"
#include "events/event_json.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

struct HashArgs {
  std::string algo = "sha256";
  std::string seed;
  std::string block_size = "16";
  std::string tokens;
  std::string extra_keys;
  bool json = false;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

Result<size_t> ParseBlockSize(std::string_view text) {
  const std::string_view s = Trim(text);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v == 0) {
    return Status::InvalidArgument("--block-size must be a positive integer, got '" +
                                   std::string(text) + "'");
  }
  return static_cast<size_t>(v);
}

// "1,2,3" (spaces allowed around the commas); an empty list is no tokens.
Result<std::vector<int64_t>> ParseTokens(std::string_view text) {
  std::vector<int64_t> out;
  if (Trim(text).empty()) return out;
  size_t pos = 0;
  for (size_t index = 0;; ++index) {
    const size_t comma = text.find(',', pos);
    const std::string_view item = Trim(
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos));
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      const bool range = ec == std::errc::result_out_of_range;
      return Status::InvalidArgument("--tokens: token " + std::to_string(index) + " '" +
                                     std::string(item) + "' is " +
                                     (range ? "outside the int64 range" : "not an integer") +
                                     " (expected comma-separated token ids, e.g. 1,2,3)");
    }
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

Status RunHash(const HashArgs& args, bool have_seed, bool have_tokens) {
  KVO_ASSIGN_OR_RETURN(HashAlgo algo, ParseHashAlgo(args.algo));
  auto seed = ResolveNoneHashSeed(algo, have_seed ? std::optional(args.seed) : std::nullopt);
  if (!seed.ok()) return Status::InvalidArgument("--seed: " + seed.status().message());
  if (!have_tokens) return Status::InvalidArgument("--tokens is required, e.g. --tokens 1,2,3,4");
  KVO_ASSIGN_OR_RETURN(size_t block_size, ParseBlockSize(args.block_size));
  KVO_ASSIGN_OR_RETURN(std::vector<int64_t> tokens, ParseTokens(args.tokens));

  BlockHashOptions options;
  options.algo = algo;
  options.none_hash = NoneHash(algo, *seed);
  options.block_size = block_size;
  if (!args.extra_keys.empty()) {
    KVO_ASSIGN_OR_RETURN(options.extra_keys,
                         ExtraKeysFromJsonText(args.extra_keys, "--extra-keys"));
    for (size_t i = 0; i < options.extra_keys.size(); ++i) {
      Status s = CheckExtraKeys(options.extra_keys[i]);
      if (!s.ok()) return s.WithContext("--extra-keys[" + std::to_string(i) + "]");
    }
  }
  KVO_ASSIGN_OR_RETURN(std::vector<std::string> hashes, HashBlocks(tokens, options));

  std::string out;
  if (!args.json) out += "# none_hash " + ToHex(options.none_hash) + "\n";
  for (size_t i = 0; i < hashes.size(); ++i) {
    const std::string hex = ToHex(hashes[i]);
    if (args.json) {
      nlohmann::ordered_json line;
      line["block"] = i;
      line["hash"] = hex;
      line["wire_hash"] = BlockDigest::Low64(hashes[i]);
      line["parent"] = ToHex(i == 0 ? options.none_hash : hashes[i - 1]);
      out += line.dump() + "\n";
    } else {
      out += std::to_string(i) + " " + hex + " " + std::to_string(BlockDigest::Low64(hashes[i])) +
             "\n";
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

void AddHashCommand(CLI::App& app, CommandTable& commands) {
  auto args = std::make_shared<HashArgs>();
  CLI::App* cmd = app.add_subcommand(
      "hash",
      "vLLM block hashes of a token sequence: NONE_HASH, then per full block the digest and its "
      "u64 wire form (vllm-compat.md A.7)");
  cmd->add_option("--algo", args->algo,
                  "vLLM's --prefix-caching-hash-algo: sha256|sha256_cbor|xxhash|xxhash_cbor")
      ->capture_default_str();
  CLI::Option* seed = cmd->add_option(
      "--seed", args->seed,
      "the engines' PYTHONHASHSEED (a string, e.g. 0); unset: \"vllm-none-hash\" for sha256 and "
      "sha256_cbor (vLLM's default), required for xxhash and xxhash_cbor");
  cmd->add_option("--block-size", args->block_size, "tokens per hashed block")
      ->capture_default_str();
  CLI::Option* tokens =
      cmd->add_option("--tokens", args->tokens, "comma-separated token ids, e.g. 1,2,3,4");
  cmd->add_option("--extra-keys", args->extra_keys,
                  "JSON array, entry i = block i's extra keys: null or an array of strings, "
                  "integers, {\"bytes\":\"<hex>\"} and nested arrays (tuples); entries past the "
                  "last full block are ignored");
  cmd->add_flag("--json", args->json, "one JSON object per block");
  commands.AddStatus(
      cmd, [args, seed, tokens] { return RunHash(*args, seed->count() > 0, tokens->count() > 0); });
}

}  // namespace kvo::cli
