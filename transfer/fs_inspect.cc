#include "transfer/fs_inspect.h"

#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/hex.h"
#include "common/json.h"
#include "common/json_fields.h"
#include "transfer/fs_file.h"

namespace kvo {
namespace {

using fs_internal::Dir;
using fs_internal::WalkEntry;

// Recomputes the digest of a config.json the way vLLM computes it over its fields.
bool DigestMatches(const std::string& config_text, const std::string& ns_name,
                   std::string* model_name) {
  // Depth-limited: dump() below recurses once per level of a (hostile) config.json.
  Result<nlohmann::json> parsed = ParseJson(config_text);
  if (!parsed.ok()) return false;
  nlohmann::json& j = *parsed;
  if (!j.is_object()) return false;
  if (j.contains("model_name") && j["model_name"].is_string()) {
    *model_name = j["model_name"].get<std::string>();
  }
  const std::string compact = j.dump(-1, ' ', true);
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(compact.data()), compact.size(), md);
  const std::string digest = ToHex(std::string_view(reinterpret_cast<const char*>(md), 6));
  return ns_name.size() > 13 && ns_name.substr(ns_name.size() - 13) == "_" + digest;
}

// NotFound when absent; FailedPrecondition when not a regular file (a FIFO would block a plain
// open forever, so the open is non-blocking and the type checked before reading).
Result<std::string> ReadSmallFile(const Dir& dir, const std::string& name) {
  int fd = ::openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) return Status::FailedPrecondition(name + " is a symlink; not followed");
    return Status::NotFound(name);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::FailedPrecondition(name + " is not a regular file (a FIFO?); not read");
  }
  std::string buf(1 << 20, '\0');
  ssize_t n = ::read(fd, buf.data(), buf.size());
  ::close(fd);
  if (n < 0) return Status::IOError("read " + name);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

// The block size of a rank directory: the size most of its blocks have; 0 and *ambiguous when
// two sizes tie for the most.
uint64_t MostCommonSize(const std::map<uint64_t, uint64_t>& per_size, bool* ambiguous) {
  uint64_t best = 0, count = 0;
  *ambiguous = false;
  for (const auto& [size, n] : per_size) {
    if (n > count) {
      best = size;
      count = n;
      *ambiguous = false;
    } else if (n == count) {
      *ambiguous = true;
    }
  }
  return *ambiguous ? 0 : best;
}

FsRankReport InspectRank(const Dir& root, const std::string& dir_name, const std::string& ns,
                         uint32_t rank, const FsInspectOptions& options) {
  FsRankReport r;
  r.dir = dir_name;
  r.rank = rank;
  auto d = fs_internal::OpenChildDir(root, dir_name, false, 0700, "rank directory");
  if (!d.ok()) {
    r.problems.push_back(dir_name + ": " + d.status().message());
    return r;
  }
  if (options.verify) {
    // The namespace's block size, before any block is read: a file of another size is corrupt by
    // its size alone (truncated, or a sparse giant), whatever its record says.
    r.block_bytes = options.block_bytes;
    if (r.block_bytes == 0) {
      std::map<uint64_t, uint64_t> per_size;
      Status sized =
          fs_internal::WalkRankDir(*d, [&](const WalkEntry& e, const Dir&, const std::string&) {
            if (e.kind == WalkEntry::Kind::kBlock) ++per_size[e.size];
          });
      if (!sized.ok()) r.problems.push_back(dir_name + ": " + sized.message());
      r.block_bytes = MostCommonSize(per_size, &r.block_bytes_ambiguous);
      if (r.block_bytes_ambiguous) {
        r.problems.push_back(dir_name +
                             ": block sizes disagree and none is the most common; sizes are "
                             "checked against the blocks' records only (pass --block-bytes)");
      }
    }
  }
  Status s = fs_internal::WalkRankDir(
      *d, [&](const WalkEntry& e, const Dir& leaf, const std::string& name) {
        r.disk_bytes += e.disk_bytes;
        const std::string path = dir_name + "/" + e.rel_path;
        switch (e.kind) {
          case WalkEntry::Kind::kBlock: {
            ++r.blocks;
            r.bytes += e.size;
            ++r.blocks_per_group[e.key.group];
            ++r.blocks_per_size[e.size];
            if (options.list_blocks) r.blocks_list.push_back(e.key);
            if (!options.verify) break;
            // Either store works for reading: try the xattr, then the sidecar.
            fs_internal::VerifyOptions vo;
            vo.checksum = fs_internal::ChecksumStore::kXattr;
            vo.identity = fs_internal::BlockIdentity(ns, rank, e.key);
            vo.expected_size = r.block_bytes;
            auto v = fs_internal::VerifyFile(leaf, name, vo);
            if (v.ok() && v->outcome == fs_internal::ReadOutcome::kOk && !v->verified) {
              vo.checksum = fs_internal::ChecksumStore::kSidecar;
              v = fs_internal::VerifyFile(leaf, name, vo);
            }
            if (!v.ok()) {
              r.problems.push_back(path + ": " + v.status().message());
            } else if (v->outcome == fs_internal::ReadOutcome::kCorrupt) {
              ++r.corrupt;
              if (v->misfiled) ++r.misfiled;
              std::string why = path + ": corrupt (" + v->detail + ")";
              if (options.remove_corrupt) {
                Status rm = fs_internal::RemoveBlockFile(leaf, name);
                why += rm.ok() ? ", removed" : ", remove failed: " + rm.message();
              }
              r.problems.push_back(why);
            } else if (v->verified) {
              ++r.verified;
            } else {
              ++r.unverified;
            }
            break;
          }
          case WalkEntry::Kind::kTemp:
            ++r.temp_files;
            break;
          case WalkEntry::Kind::kSidecar:
            break;
          case WalkEntry::Kind::kInvalid:
          case WalkEntry::Kind::kSymlink:
            r.problems.push_back(path + ": " + e.why);
            break;
        }
      });
  if (!s.ok()) r.problems.push_back(dir_name + ": " + s.message());
  return r;
}

}  // namespace

Result<FsRootReport> InspectFsRoot(const std::string& root_dir, const FsInspectOptions& options) {
  KVO_ASSIGN_OR_RETURN(Dir root, fs_internal::OpenRootDir(root_dir));
  KVO_ASSIGN_OR_RETURN(auto entries, fs_internal::ListDirEntries(root, root_dir));
  FsRootReport report;
  report.root_dir = root_dir;
  std::map<std::string, FsNamespaceReport> namespaces;
  for (const auto& e : entries) {
    if (e.is_symlink) {
      report.problems.push_back(e.name + ": symlink (not followed)");
      continue;
    }
    if (!e.is_dir) {
      if (e.name.rfind(".kvo-probe-", 0) != 0) {
        report.problems.push_back(e.name + ": not a directory");
      }
      continue;
    }
    std::string ns;
    if (auto rank = ParseRankDirName(e.name, &ns)) {
      FsNamespaceReport& n = namespaces[ns];
      n.name = ns;
      n.ranks.push_back(InspectRank(root, e.name, ns, *rank, options));
      continue;
    }
    auto d = fs_internal::OpenChildDir(root, e.name, false, 0700, "namespace directory");
    if (!d.ok()) {
      report.problems.push_back(e.name + ": " + d.status().message());
      continue;
    }
    auto config = ReadSmallFile(*d, "config.json");
    if (!config.ok() && config.status().code() == StatusCode::kFailedPrecondition) {
      report.problems.push_back(e.name + "/" + config.status().message());
      continue;
    }
    if (!config.ok()) {
      report.problems.push_back(e.name + ": neither a namespace (no config.json) nor a rank dir");
      continue;
    }
    FsNamespaceReport& n = namespaces[e.name];
    n.name = e.name;
    n.has_config = true;
    n.digest_matches = DigestMatches(*config, e.name, &n.model_name);
    if (!n.digest_matches) {
      report.problems.push_back(e.name + "/config.json: fields do not hash to the name's digest");
    }
  }
  for (auto& [name, n] : namespaces) {
    if (!n.has_config) report.problems.push_back(name + ": rank directories without config.json");
    for (const auto& r : n.ranks) {
      report.blocks += r.blocks;
      report.bytes += r.bytes;
      report.disk_bytes += r.disk_bytes;
      report.corrupt += r.corrupt;
      report.ambiguous = report.ambiguous || r.block_bytes_ambiguous;
    }
    report.namespaces.push_back(std::move(n));
  }
  return report;
}

namespace {

using Json = nlohmann::ordered_json;

// {"<key>": count} with the map's keys as strings.
template <typename K>
Json CountsJson(const std::map<K, uint64_t>& counts) {
  Json out = Json::object();
  for (const auto& [k, c] : counts) out[std::to_string(k)] = c;
  return out;
}

const JsonFields<FsRankReport>& RankFields() {
  static const JsonFields<FsRankReport> fields = {
      {"dir", &FsRankReport::dir},
      {"rank", &FsRankReport::rank},
      {"blocks", &FsRankReport::blocks},
      {"bytes", &FsRankReport::bytes},
      {"disk_bytes", &FsRankReport::disk_bytes},
      {"temp_files", &FsRankReport::temp_files},
      {"blocks_per_group", [](const FsRankReport& r) { return CountsJson(r.blocks_per_group); }},
      {"blocks_per_size", [](const FsRankReport& r) { return CountsJson(r.blocks_per_size); }},
      {"verified", &FsRankReport::verified},
      {"unverified", &FsRankReport::unverified},
      {"corrupt", &FsRankReport::corrupt},
      {"misfiled", &FsRankReport::misfiled},
      {"block_bytes", &FsRankReport::block_bytes},
      {"problems", &FsRankReport::problems},
  };
  return fields;
}

}  // namespace

std::string FsRootReportJson(const FsRootReport& report, bool with_blocks) {
  static const JsonFields<FsRootReport> kRoot = {
      {"root_dir", &FsRootReport::root_dir}, {"blocks", &FsRootReport::blocks},
      {"bytes", &FsRootReport::bytes},       {"disk_bytes", &FsRootReport::disk_bytes},
      {"corrupt", &FsRootReport::corrupt},
  };
  static const JsonFields<FsNamespaceReport> kNamespace = {
      {"name", &FsNamespaceReport::name},
      {"model_name", &FsNamespaceReport::model_name},
      {"has_config", &FsNamespaceReport::has_config},
      {"digest_matches", &FsNamespaceReport::digest_matches},
  };
  Json j = kRoot.ToJson(report);
  Json nss = Json::array();
  for (const auto& n : report.namespaces) {
    Json jn = kNamespace.ToJson(n);
    Json ranks = Json::array();
    for (const auto& r : n.ranks) {
      Json jr = RankFields().ToJson(r);
      if (with_blocks) {
        Json bl = Json::array();
        for (const auto& k : r.blocks_list) bl.push_back({{"hash", k.hex}, {"group", k.group}});
        jr["block_list"] = bl;
      }
      ranks.push_back(std::move(jr));
    }
    jn["ranks"] = std::move(ranks);
    nss.push_back(std::move(jn));
  }
  j["namespaces"] = std::move(nss);
  j["problems"] = report.problems;
  return j.dump();
}

std::string FsRootReportText(const FsRootReport& report, bool with_blocks) {
  std::string out = "root " + report.root_dir + ": " + std::to_string(report.blocks) + " blocks, " +
                    std::to_string(report.bytes) + " bytes (" + std::to_string(report.disk_bytes) +
                    " on disk)\n";
  for (const auto& n : report.namespaces) {
    out += "namespace " + n.name + " model '" + n.model_name + "'" +
           (n.has_config ? "" : " [no config.json]") +
           (n.has_config && !n.digest_matches ? " [digest mismatch]" : "") + "\n";
    for (const auto& r : n.ranks) {
      out += "  " + r.dir + ": " + std::to_string(r.blocks) + " blocks, " +
             std::to_string(r.bytes) + " bytes, " + std::to_string(r.disk_bytes) + " on disk, " +
             std::to_string(r.temp_files) + " temp files";
      for (const auto& [g, c] : r.blocks_per_group) {
        out += ", g" + std::to_string(g) + "=" + std::to_string(c);
      }
      if (r.verified + r.unverified + r.corrupt > 0) {
        out += "; verified " + std::to_string(r.verified) + ", unverified " +
               std::to_string(r.unverified) + ", corrupt " + std::to_string(r.corrupt) +
               " (misfiled " + std::to_string(r.misfiled) + ")";
        if (r.block_bytes != 0) out += ", blocks of " + std::to_string(r.block_bytes) + " bytes";
      }
      out += "\n";
      if (with_blocks) {
        for (const auto& k : r.blocks_list) {
          out += "    " + k.hex + " g" + std::to_string(k.group) + "\n";
        }
      }
      for (const auto& p : r.problems) out += "  problem: " + p + "\n";
    }
  }
  for (const auto& p : report.problems) out += "problem: " + p + "\n";
  return out;
}

}  // namespace kvo
