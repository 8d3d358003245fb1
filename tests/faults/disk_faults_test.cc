// Disk faults, on purpose, against the real file tier, `kvo fs verify|scan` (issue 10, "the
// fault suite"): stored blocks truncated, bit-flipped, grown into sparse giants, misfiled (renamed
// over another block's name, group, rank or namespace), replaced by symlinks or FIFOs, records
// forged or removed; kill -9 of a process storing blocks and journaling what it stored. The full
// and read-only tmpfs and the journal-open faults are in disk_mount_faults_test.cc. Checked each
// time: no corrupt or misfiled block is ever served, errors are clear and name what failed,
// nothing stored is lost, nothing hangs.
// Seeded (KVO_TEST_SEED); trials from FaultTrials (KVO_FAULTS=long for more).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "events/journal.h"
#include "tests/faults/disk_harness.h"
#include "tests/testing/child_process.h"
#include "tests/testing/fault_report.h"
#include "tests/testing/temp_dir.h"
#include "transfer/fs_block_store.h"
#include "transfer/fs_file.h"

namespace kvo {
namespace {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;
using disk_faults::Key;
using disk_faults::kRow;
using disk_faults::ReadBytes;
using disk_faults::ReleaseFifo;
using disk_faults::Rows;
using disk_faults::RunJob;
using disk_faults::TierOptions;

// ---------------------------------------------------------------------------------------------
// Attacks on stored blocks.

enum class Attack {
  kTruncate,
  kBitFlip,
  kGrow,
  kSparseGiant,
  kMisfileSameGroup,
  kMisfileOtherGroup,
  kMisfileOtherRank,
  kMisfileOtherNamespace,
  kSymlink,
  kFifo,
  kForgedRecord,
  kRecordRemoved,
  kCount,
};

const char* AttackName(Attack a) {
  switch (a) {
    case Attack::kTruncate:
      return "truncated .bin (random length)";
    case Attack::kBitFlip:
      return "one bit flipped in a .bin";
    case Attack::kGrow:
      return ".bin grown by random bytes";
    case Attack::kSparseGiant:
      return ".bin grown into an 8 GiB sparse file";
    case Attack::kMisfileSameGroup:
      return "misfiled: another block's .bin (with its record) renamed over the name";
    case Attack::kMisfileOtherGroup:
      return "misfiled: the same hash's block of another group renamed over the name";
    case Attack::kMisfileOtherRank:
      return "misfiled: a block of another rank copied over the name";
    case Attack::kMisfileOtherNamespace:
      return "misfiled: a block of another namespace (model) copied over the name";
    case Attack::kSymlink:
      return ".bin replaced by a symlink to another block";
    case Attack::kFifo:
      return ".bin replaced by a FIFO";
    case Attack::kForgedRecord:
      return "another block's integrity record set on a .bin";
    case Attack::kRecordRemoved:
      return "integrity record removed (a vLLM-written block)";
    case Attack::kCount:
      break;
  }
  return "?";
}

// Copies a file with its xattr record (cp --preserve=xattr).
void CopyWithRecord(const std::string& from, const std::string& to) {
  stdfs::create_directories(stdfs::path(to).parent_path());
  const std::string bytes = ReadBytes(from);
  const std::string tmp = to + ".attack";
  std::ofstream(tmp, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  char rec[64];
  const ssize_t n = ::getxattr(from.c_str(), fs_internal::kXattrName, rec, sizeof(rec));
  if (n > 0) ::setxattr(tmp.c_str(), fs_internal::kXattrName, rec, static_cast<size_t>(n), 0);
  stdfs::rename(tmp, to);
}

// The file tier under attack: `n` blocks of group 0 stored by the main tier, their group-1
// twins (same hashes), and a rank-1 tier and another namespace holding copies to misfile from.
class AttackedTier {
 public:
  explicit AttackedTier(uint64_t n) : n_(n), rows_(2 * n + 4) {
    auto t = FsBlockStore::Open(TierOptions(dir_.path()), rows_.region());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    tier_ = std::move(t).value();
    FsBlockStoreOptions r1 = TierOptions(dir_.path());
    r1.rank = 1;
    rank1_ = std::move(FsBlockStore::Open(r1, rows_.region())).value();
    other_ = std::move(FsBlockStore::Open(TierOptions(dir_.path(), "other-model"), rows_.region()))
                 .value();
    for (uint64_t i = 0; i < n_; ++i) Restore(i);
  }

  FsBlockStore& tier() { return *tier_; }
  const std::string& root() const { return dir_.path(); }
  std::string Path(FsBlockStore& t, uint32_t rank, const FsBlockKey& k) {
    return dir_.path() + "/" + FsBlockRelativePath(t.namespace_name(), rank, k);
  }
  std::string Path(uint64_t i) { return Path(*tier_, 0, Key(i)); }
  static uint64_t Seed(uint64_t i, uint32_t variant = 0) { return 7000 + i * 8 + variant; }

  // (Re)stores block i in group 0 and group 1 of the main tier, and in the other tiers, each with
  // its own content.
  void Restore(uint64_t i) {
    RemoveAny(Path(i));
    ::unlink((Path(i) + ".kvo").c_str());
    rows_.Fill(0, Seed(i, 0));
    rows_.Fill(1, Seed(i, 1));
    auto st = RunJob(*tier_, true, {Key(i), Key(i, 1)}, {0, 1});
    EXPECT_TRUE(st && st->success) << "restore " << i;
    rows_.Fill(2, Seed(i, 2));
    st = RunJob(*rank1_, true, {Key(i)}, {2});
    EXPECT_TRUE(st && st->blocks[0].outcome != FsBlockOutcome::kError);
    rows_.Fill(3, Seed(i, 3));
    st = RunJob(*other_, true, {Key(i)}, {3});
    EXPECT_TRUE(st && st->blocks[0].outcome != FsBlockOutcome::kError);
  }

  // Applies `a` to block i (`j` is another stored block). Returns false when the attack leaves
  // the block's bytes and record as stored (so serving it is right).
  bool Apply(Attack a, uint64_t i, uint64_t j, std::mt19937_64& rng) {
    const std::string p = Path(i);
    switch (a) {
      case Attack::kTruncate:
        EXPECT_EQ(::truncate(p.c_str(), static_cast<off_t>(rng() % kRow)), 0);
        return true;
      case Attack::kBitFlip: {
        std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
        const auto at = static_cast<std::streamoff>(rng() % kRow);
        f.seekg(at);
        char c = 0;
        f.get(c);
        c = static_cast<char>(c ^ (1 << (rng() % 8)));
        f.seekp(at);
        f.put(c);
        return true;
      }
      case Attack::kGrow: {
        std::ofstream f(p, std::ios::app | std::ios::binary);
        f << std::string(1 + rng() % 5000, static_cast<char>(rng()));
        return true;
      }
      case Attack::kSparseGiant:
        EXPECT_EQ(::truncate(p.c_str(), off_t{8} << 30), 0);
        return true;
      case Attack::kMisfileSameGroup:
        stdfs::rename(Path(j), p);  // the xattr record moves with the inode
        return true;
      case Attack::kMisfileOtherGroup:
        stdfs::rename(Path(*tier_, 0, Key(i, 1)), p);
        return true;
      case Attack::kMisfileOtherRank:
        CopyWithRecord(Path(*rank1_, 1, Key(i)), p);
        return true;
      case Attack::kMisfileOtherNamespace:
        CopyWithRecord(Path(*other_, 0, Key(i)), p);
        return true;
      case Attack::kSymlink:
        stdfs::remove(p);
        stdfs::create_symlink(Path(j), p);
        return true;
      case Attack::kFifo:
        stdfs::remove(p);
        EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
        return true;
      case Attack::kForgedRecord: {
        char rec[64];
        const ssize_t n = ::getxattr(Path(j).c_str(), fs_internal::kXattrName, rec, sizeof(rec));
        EXPECT_GT(n, 0);
        EXPECT_EQ(::setxattr(p.c_str(), fs_internal::kXattrName, rec, static_cast<size_t>(n), 0),
                  0);
        return true;
      }
      case Attack::kRecordRemoved:
        EXPECT_EQ(::removexattr(p.c_str(), fs_internal::kXattrName), 0);
        return false;
      case Attack::kCount:
        break;
    }
    return false;
  }

  // Loads blocks `ids` into the upper rows; a load of block i is right when it is a miss or
  // corrupt, or serves exactly block i's bytes. Returns how many were wrong; *served counts kOk.
  int LoadAndCheck(const std::vector<uint64_t>& ids, int* served, bool* hung) {
    std::vector<FsBlockKey> keys;
    std::vector<int64_t> slots;
    for (size_t k = 0; k < ids.size(); ++k) {
      keys.push_back(Key(ids[k]));
      slots.push_back(static_cast<int64_t>(4 + k));
      std::memset(rows_.row(4 + k), 0xee, kRow);
    }
    bool released = false;
    auto ld = RunJob(*tier_, false, keys, slots, [&] {
      released = true;
      for (uint64_t id : ids) ReleaseFifo(Path(id));
    });
    *hung = released;
    if (!ld) return static_cast<int>(ids.size());
    int wrong = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      const FsBlockResult& b = ld->blocks[k];
      if (b.outcome == FsBlockOutcome::kOk) {
        ++*served;
        if (!rows_.Matches(4 + k, Seed(ids[k]))) ++wrong;
      } else if (b.outcome == FsBlockOutcome::kError &&
                 b.status.message().find("symbolic links") == std::string::npos) {
        // A symlinked .bin is an open error (ELOOP: never followed, left in place, never served,
        // as a transient error is); any other error is a failure of the tier.
        ADD_FAILURE() << "block " << ids[k] << ": " << b.status.ToString();
        ++wrong;
      }
    }
    return wrong;
  }

  static void RemoveAny(const std::string& p) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0) ::unlink(p.c_str());
  }

 private:
  testing::TempDir dir_;
  uint64_t n_;
  Rows rows_;
  std::unique_ptr<FsBlockStore> tier_, rank1_, other_;
};

struct Tally {
  int64_t trials = 0, failures = 0, served = 0;
};

TEST(DiskFaultsTest, AttackedBlocksAreNeverServedWrong) {
  SetLogLevel("error");  // every corrupt load logs a warning
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  constexpr uint64_t kBlocks = 24;
  AttackedTier t(kBlocks);
  ASSERT_TRUE(t.tier().xattr_records()) << "this file system has no user xattrs";
  const int trials = testing::FaultTrials(240, 2400);
  std::map<Attack, Tally> tally;
  bool any_hang = false;
  for (int trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial));
    const auto a = static_cast<Attack>(trial % static_cast<int>(Attack::kCount));
    const uint64_t i = rng() % kBlocks;
    const uint64_t j = (i + 1 + rng() % (kBlocks - 1)) % kBlocks;
    t.Apply(a, i, j, rng);
    // The victim, and every other block but j (which a misfile may have moved away).
    std::vector<uint64_t> ids = {i};
    for (uint64_t k = 0; k < kBlocks; ++k) {
      if (k != i && k != j) ids.push_back(k);
    }
    int served = 0;
    bool hung = false;
    const int wrong = t.LoadAndCheck(ids, &served, &hung);
    any_hang = any_hang || hung;
    Tally& k = tally[a];
    ++k.trials;
    // Every block but the victim must be served intact (nothing stored is lost).
    const bool others_intact = served >= static_cast<int>(ids.size()) - 1;
    if (wrong > 0 || hung || !others_intact) ++k.failures;
    EXPECT_EQ(wrong, 0) << AttackName(a);
    EXPECT_TRUE(others_intact) << AttackName(a) << ": " << served << " of " << ids.size();
    // The victim was served only by the attack that leaves it as stored.
    if (served == static_cast<int>(ids.size())) ++k.served;
    t.Restore(i);
    t.Restore(j);
  }
  EXPECT_FALSE(any_hang);
  // Misfiled: a record naming another block (whole blocks moved, or a record set on another
  // block's bytes).
  EXPECT_EQ(t.tier().misfiled_blocks(),
            static_cast<uint64_t>(tally[Attack::kMisfileSameGroup].trials +
                                  tally[Attack::kMisfileOtherGroup].trials +
                                  tally[Attack::kMisfileOtherRank].trials +
                                  tally[Attack::kMisfileOtherNamespace].trials +
                                  tally[Attack::kForgedRecord].trials));
  for (auto& [a, k] : tally) {
    testing::ReportFault({"file tier", AttackName(a), k.trials,
                          "the attacked block is a miss (never served) unless its bytes and record "
                          "are as stored; all " +
                              std::to_string(kBlocks - 2) +
                              " other blocks load byte-exact; no load blocks",
                          k.failures, seed,
                          "victim served in " + std::to_string(k.served) + " of " +
                              std::to_string(k.trials) + " trials"});
  }
  EXPECT_EQ(tally[Attack::kRecordRemoved].served, tally[Attack::kRecordRemoved].trials);
  for (Attack a : {Attack::kTruncate, Attack::kBitFlip, Attack::kMisfileSameGroup,
                   Attack::kMisfileOtherNamespace, Attack::kSparseGiant, Attack::kFifo}) {
    EXPECT_EQ(tally[a].served, 0) << AttackName(a);
  }
}

// `kvo fs verify` (the real binary) over a tier with several attacked blocks at once: every
// damaged or misfiled block counted corrupt (exit 1), symlinks and FIFOs reported and never
// opened, sparse giants judged by size within seconds, --remove-corrupt leaves a clean tier.
TEST(DiskFaultsTest, FsVerifyFindsEveryAttackedBlock) {
  SetLogLevel("error");
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  constexpr uint64_t kBlocks = 40;
  const int rounds = testing::FaultTrials(3, 20);
  int64_t failures = 0;
  double worst_seconds = 0;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " round " + std::to_string(round));
    AttackedTier t(kBlocks);
    // Distinct victims; each gets one attack. The last victims' partners are left alone.
    std::vector<uint64_t> order(kBlocks);
    for (uint64_t k = 0; k < kBlocks; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    const std::vector<Attack> attacks = {Attack::kTruncate,
                                         Attack::kBitFlip,
                                         Attack::kGrow,
                                         Attack::kSparseGiant,
                                         Attack::kMisfileSameGroup,
                                         Attack::kMisfileOtherGroup,
                                         Attack::kMisfileOtherRank,
                                         Attack::kMisfileOtherNamespace,
                                         Attack::kForgedRecord,
                                         Attack::kSymlink,
                                         Attack::kFifo,
                                         Attack::kRecordRemoved};
    uint64_t want_corrupt = 0, want_misfiled = 0, want_problems = 0, want_unverified = 0;
    std::set<uint64_t> gone;  // blocks moved away by a same-group misfile
    for (size_t a = 0; a < attacks.size(); ++a) {
      const uint64_t i = order[2 * a], j = order[2 * a + 1];
      t.Apply(attacks[a], i, j, rng);
      switch (attacks[a]) {
        case Attack::kSymlink:
        case Attack::kFifo:
          ++want_problems;
          break;
        case Attack::kRecordRemoved:
          ++want_unverified;
          break;
        case Attack::kMisfileSameGroup:
          gone.insert(j);
          ++want_corrupt;
          ++want_misfiled;
          break;
        case Attack::kMisfileOtherGroup:
        case Attack::kMisfileOtherRank:
        case Attack::kMisfileOtherNamespace:
        case Attack::kForgedRecord:  // the record names another block
          ++want_corrupt;
          ++want_misfiled;
          break;
        default:
          ++want_corrupt;
      }
    }
    (void)gone;
    const auto start = Clock::now();
    testing::CommandResult r = testing::RunCommand(
        {KVO_BINARY, "fs", "verify", "--json", "--root-dir", t.root()}, std::chrono::seconds(120));
    worst_seconds =
        std::max(worst_seconds, std::chrono::duration<double>(Clock::now() - start).count());
    EXPECT_EQ(r.code, 1) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out << r.err;
    // The main namespace, rank 0.
    nlohmann::json rank0;
    for (const auto& ns : j["namespaces"]) {
      for (const auto& rk : ns["ranks"]) {
        if (rk["dir"].get<std::string>() == t.tier().namespace_name() + "_r0") rank0 = rk;
      }
    }
    ASSERT_TRUE(rank0.is_object()) << r.out;
    bool ok = rank0["corrupt"].get<uint64_t>() == want_corrupt &&
              rank0["misfiled"].get<uint64_t>() == want_misfiled &&
              rank0["unverified"].get<uint64_t>() == want_unverified &&
              rank0["block_bytes"].get<uint64_t>() == kRow;
    size_t link_or_fifo = 0;
    for (const auto& p : rank0["problems"]) {
      const std::string s = p.get<std::string>();
      if (s.find("symlink") != std::string::npos ||
          s.find("not a regular file") != std::string::npos) {
        ++link_or_fifo;
      }
    }
    ok = ok && link_or_fifo == want_problems;
    EXPECT_TRUE(ok) << rank0.dump(1);
    // Remove what is corrupt; then verify finds no corrupt block, and every untouched block is
    // still there and verified.
    r = testing::RunCommand(
        {KVO_BINARY, "fs", "verify", "--json", "--remove-corrupt", "--root-dir", t.root()},
        std::chrono::seconds(120));
    EXPECT_EQ(r.code, 1);  // it reports what it removed
    r = testing::RunCommand({KVO_BINARY, "fs", "verify", "--json", "--root-dir", t.root()},
                            std::chrono::seconds(120));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    auto after = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(after.is_discarded());
    for (const auto& ns : after["namespaces"]) {
      for (const auto& rk : ns["ranks"]) {
        if (rk["dir"].get<std::string>() != t.tier().namespace_name() + "_r0") continue;
        const uint64_t untouched = kBlocks * 2 - 2 * attacks.size();  // group 0 and 1
        EXPECT_GE(rk["verified"].get<uint64_t>(), untouched) << rk.dump(1);
        ok = ok && rk["verified"].get<uint64_t>() >= untouched;
      }
    }
    if (!ok) ++failures;
  }
  testing::ReportFault({"file tier",
                        "kvo fs verify over a tier with 12 kinds of attacked blocks at once "
                        "(truncated, flipped, grown, 8 GiB sparse, misfiled x4, forged record, "
                        "symlink, FIFO, record removed)",
                        rounds,
                        "every damaged or misfiled block counted corrupt (exit 1), symlinks and "
                        "FIFOs reported unopened, record-less blocks unverified; after "
                        "--remove-corrupt verify exits 0 and every untouched block verifies",
                        failures, seed,
                        "slowest verify (40 blocks, one 8 GiB sparse): " +
                            std::to_string(worst_seconds).substr(0, 5) + " s"});
}

// ---------------------------------------------------------------------------------------------
// kill -9 of a storing process.

// The child: stores blocks through the file tier in jobs of 4 and, after each job completed,
// journals which blocks it stored (flushed: a killed process's flushed records survive). Never
// returns.
[[noreturn]] void StoringChild(const std::string& root, const std::string& journal_dir,
                               uint64_t first, int report_fd) {
  Rows rows(4, kRow);
  auto tier = FsBlockStore::Open(TierOptions(root), rows.region());
  if (!tier.ok()) ::_exit(2);
  JournalOptions jo;
  jo.dir = journal_dir;
  auto journal = Journal::Open(jo);
  if (!journal.ok()) ::_exit(3);
  uint64_t seq = (*journal)->empty() ? 1 : (*journal)->last_seq() + 1;
  for (uint64_t i = first;; i += 4) {
    std::vector<FsBlockKey> keys;
    std::vector<int64_t> slots;
    for (uint64_t k = 0; k < 4; ++k) {
      rows.Fill(k, 5000 + i + k);
      keys.push_back(Key(i + k));
      slots.push_back(static_cast<int64_t>(k));
    }
    auto id = (*tier)->SubmitStore(keys, slots);
    if (!id.ok() || !(*tier)->Wait(*id).ok()) ::_exit(4);
    std::vector<FsJobResult> done;
    (*tier)->TakeFinished(&done);
    if (done.size() != 1 || !done[0].success) ::_exit(5);
    std::string payload;
    for (uint64_t k = 0; k < 4; ++k) payload += std::to_string(i + k) + ",";
    if (!(*journal)->Append(seq++, payload).ok() || !(*journal)->Flush().ok()) ::_exit(6);
    const char one = 'j';
    if (::write(report_fd, &one, 1) != 1) ::_exit(7);
  }
}

TEST(DiskFaultsTest, KillDashNineOfAStoringProcessServesNoTornBlock) {
  SetLogLevel("error");
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  const std::string root = dir.path() + "/fs";
  const std::string journal_dir = dir.path() + "/journal";
  stdfs::create_directories(root);
  const int trials = testing::FaultTrials(6, 40);
  int64_t failures = 0;
  uint64_t next_first = 0, checked_blocks = 0;
  for (int trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial));
    const uint64_t first = next_first;
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      StoringChild(root, journal_dir, first, fds[1]);
    }
    ::close(fds[1]);
    // Kill at a random moment: after the child reported a random number of journaled jobs (it
    // keeps storing while the signal is on its way, so the kill lands anywhere in a job).
    const int jobs = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < jobs; ++k) {
      struct pollfd pfd = {fds[0], POLLIN, 0};
      char c;
      if (::poll(&pfd, 1, 30000) != 1 || ::read(fds[0], &c, 1) != 1) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        FAIL() << "the storing child reported nothing for 30 s, or died early";
      }
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ::close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
    // Restart: the journal opens, and every block it says was stored loads byte-exact; every
    // other block the tier has is whole and verified (a torn write is never visible).
    JournalOptions jo;
    jo.dir = journal_dir;
    auto j = Journal::Open(jo);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    std::set<uint64_t> completed;
    {
      auto reader = (*j)->NewReader(0);
      ASSERT_TRUE(reader.ok());
      JournalRecord rec;
      while (true) {
        auto more = (*reader)->Next(&rec);
        ASSERT_TRUE(more.ok()) << more.status().ToString();
        if (!*more) break;
        std::stringstream ss(rec.payload);
        std::string item;
        while (std::getline(ss, item, ',')) completed.insert(std::stoull(item));
      }
    }
    Rows rows(8, kRow);
    auto tier = FsBlockStore::Open(TierOptions(root), rows.region());
    ASSERT_TRUE(tier.ok());
    auto scan = (*tier)->Scan();
    ASSERT_TRUE(scan.ok());
    std::set<FsBlockKey> present(scan->blocks.begin(), scan->blocks.end());
    bool ok = true;
    uint64_t highest = first;
    for (uint64_t b : completed) highest = std::max(highest, b);
    for (uint64_t b = 0; b <= highest + 8; ++b) {
      const bool done = completed.count(b) == 1;
      if (!done && present.count(Key(b)) == 0) continue;
      auto ld = RunJob(**tier, false, {Key(b)}, {0});
      const bool exact =
          ld && ld->blocks[0].outcome == FsBlockOutcome::kOk && rows.Matches(0, 5000 + b);
      const bool miss = ld && ld->blocks[0].outcome == FsBlockOutcome::kMiss;
      if (done ? !exact : !(exact || miss)) {
        ok = false;
        ADD_FAILURE() << "block " << b << (done ? " (journaled as stored)" : "") << ": "
                      << (ld ? std::string(FsBlockOutcomeName(ld->blocks[0].outcome)) : "no job");
      }
      ++checked_blocks;
    }
    if (!ok) ++failures;
    next_first = ((highest + 8) / 4 + 1) * 4;
  }
  testing::ReportFault({"engine",
                        "kill -9 of a process storing blocks through the file tier and "
                        "journaling each completed store (flushed), at a random moment",
                        trials,
                        "after restart the journal opens; every block it names loads byte-exact; "
                        "every other block is whole and verified or absent (no torn block served)",
                        failures, seed,
                        std::to_string(checked_blocks) + " blocks checked after the kills"});
}

}  // namespace
}  // namespace kvo
