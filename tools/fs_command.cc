// kvo fs scan|verify|du --root-dir DIR [--json]: inspect a file-tier root directory (kvo's or
// vLLM's; the layout is the same).
//   scan    namespaces (digest checked against config.json), rank directories, blocks per group,
//           temp files and anything that does not belong; --blocks lists every block.
//   verify  as scan, and checks every block: its size against the namespace's block size
//           (--block-bytes, else the size most blocks of the rank directory have; a file of another
//           size is corrupt without being read), then its integrity record (xattr or sidecar:
//           bytes and identity, so a misfiled block is caught); exit status 1 when a block is
//           corrupt or the block size is ambiguous; --remove-corrupt deletes corrupt blocks.
//   du      bytes per namespace and rank (apparent and allocated).
// Nothing is modified except with --remove-corrupt. Symlinks are reported, never followed.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/commands.h"
#include "transfer/transfer.h"

namespace kvo::cli {
namespace {

struct FsArgs {
  std::string root_dir;
  bool json = false;
  bool blocks = false;
  bool remove_corrupt = false;
  uint64_t block_bytes = 0;
};

// Exit status 1 when verify finds a corrupt or ambiguous block.
ExitCode Run(const std::string& mode, const FsArgs& args) {
  FsInspectOptions o;
  o.verify = mode == "verify";
  o.remove_corrupt = args.remove_corrupt;
  o.list_blocks = args.blocks;
  o.block_bytes = args.block_bytes;
  KVO_ASSIGN_OR_RETURN(FsRootReport report_value, InspectFsRoot(args.root_dir, o));
  const FsRootReport* report = &report_value;
  if (mode == "du") {
    if (args.json) {
      nlohmann::ordered_json j;
      j["root_dir"] = report->root_dir;
      j["bytes"] = report->bytes;
      j["disk_bytes"] = report->disk_bytes;
      j["blocks"] = report->blocks;
      nlohmann::ordered_json dirs = nlohmann::ordered_json::array();
      for (const auto& n : report->namespaces) {
        for (const auto& r : n.ranks) {
          dirs.push_back({{"dir", r.dir},
                          {"blocks", r.blocks},
                          {"bytes", r.bytes},
                          {"disk_bytes", r.disk_bytes}});
        }
      }
      j["dirs"] = dirs;
      std::printf("%s\n", j.dump().c_str());
    } else {
      for (const auto& n : report->namespaces) {
        for (const auto& r : n.ranks) {
          std::printf("%14llu %14llu %8llu  %s\n", static_cast<unsigned long long>(r.bytes),
                      static_cast<unsigned long long>(r.disk_bytes),
                      static_cast<unsigned long long>(r.blocks), r.dir.c_str());
        }
      }
      std::printf("%14llu %14llu %8llu  total (bytes, on disk, blocks)\n",
                  static_cast<unsigned long long>(report->bytes),
                  static_cast<unsigned long long>(report->disk_bytes),
                  static_cast<unsigned long long>(report->blocks));
    }
    return 0;
  }
  if (args.json) {
    std::printf("%s\n", FsRootReportJson(*report, args.blocks).c_str());
  } else {
    std::printf("%s", FsRootReportText(*report, args.blocks).c_str());
  }
  return o.verify && (report->corrupt > 0 || report->ambiguous) ? 1 : 0;
}

}  // namespace

void AddFsCommand(CLI::App& app, CommandTable& commands) {
  auto* fs = app.add_subcommand("fs", "Inspect a file-tier root directory (vLLM layout)");
  fs->require_subcommand(1);
  for (const char* mode : {"scan", "verify", "du"}) {
    const char* help = std::string(mode) == "scan"     ? "List namespaces and blocks"
                       : std::string(mode) == "verify" ? "Verify every block's checksum"
                                                       : "Report space used";
    auto* sub = fs->add_subcommand(mode, help);
    auto args = std::make_shared<FsArgs>();
    sub->add_option("--root-dir", args->root_dir, "the tier's root_dir")->required();
    sub->add_flag("--json", args->json, "one JSON object");
    if (std::string(mode) == "scan") sub->add_flag("--blocks", args->blocks, "list every block");
    if (std::string(mode) == "verify") {
      sub->add_flag("--remove-corrupt", args->remove_corrupt, "delete corrupt blocks");
      sub->add_option("--block-bytes", args->block_bytes,
                      "every block's size (vLLM's row_stride); default: the most common size")
          ->check(CLI::PositiveNumber);
    }
    std::string m = mode;
    commands.Add(sub, [m, args] { return Run(m, *args); });
  }
}

}  // namespace kvo::cli
