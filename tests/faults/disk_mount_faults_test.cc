// Disk faults, on purpose (issue 10, "the fault suite"), the second half of disk_faults_test.cc:
// a full and a read-only tmpfs (mounted here when permitted) under the real file tier; junk journal
// tails and FIFOs named like journal segments or config.json at journal open. Checked each time:
// nothing stored is lost, errors are clear and name what failed, nothing hangs.
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
using disk_faults::ReadBytes;
using disk_faults::ReleaseFifo;
using disk_faults::Rows;
using disk_faults::RunJob;
using disk_faults::TierOptions;

// ---------------------------------------------------------------------------------------------
// Full and read-only tmpfs.

class Mount {
 public:
  Mount(const std::string& path, const char* opts) : path_(path) {
    mounted_ = ::mount("tmpfs", path.c_str(), "tmpfs", 0, opts) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~Mount() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  bool RemountReadOnly() {
    return ::mount("tmpfs", path_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string error_;
};

TEST(DiskFaultsTest, FullTmpfsLosesNothingStored) {
  SetLogLevel("error");
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  const int trials = testing::FaultTrials(4, 30);
  int64_t failures = 0;
  uint64_t stored_total = 0, full_total = 0, records_total = 0, floors_total = 0;
  for (int trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial));
    const std::string mnt = dir.path() + "/m" + std::to_string(trial);
    stdfs::create_directories(mnt);
    const uint64_t kib = 160 + rng() % 400;
    Mount m(mnt, ("size=" + std::to_string(kib) + "k").c_str());
    if (!m.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << m.error() << ")";
    bool ok = true;
    // The file tier: more blocks than fit.
    {
      stdfs::create_directories(mnt + "/fs");
      Rows rows(96);
      auto tier = FsBlockStore::Open(TierOptions(mnt + "/fs"), rows.region());
      ASSERT_TRUE(tier.ok()) << tier.status().ToString();
      std::vector<FsBlockKey> keys;
      std::vector<int64_t> slots;
      for (uint64_t i = 0; i < 48; ++i) {
        rows.Fill(i, seed + i);
        keys.push_back(Key(i));
        slots.push_back(static_cast<int64_t>(i));
      }
      auto st = RunJob(**tier, true, keys, slots);
      ASSERT_TRUE(st.has_value());
      std::vector<int64_t> back;
      for (uint64_t i = 0; i < 48; ++i) back.push_back(static_cast<int64_t>(48 + i));
      auto ld = RunJob(**tier, false, keys, back);
      ASSERT_TRUE(ld.has_value());
      for (uint64_t i = 0; i < 48; ++i) {
        const FsBlockResult& s = st->blocks[i];
        if (s.outcome == FsBlockOutcome::kOk) {
          ++stored_total;
          ok = ok && ld->blocks[i].outcome == FsBlockOutcome::kOk && rows.Matches(48 + i, seed + i);
        } else {
          ++full_total;
          ok = ok && s.outcome == FsBlockOutcome::kError &&
               s.status.code() == StatusCode::kOutOfSpace &&
               ld->blocks[i].outcome == FsBlockOutcome::kMiss;
          EXPECT_EQ(s.status.code(), StatusCode::kOutOfSpace) << s.status.ToString();
        }
      }
      for (const auto& e : stdfs::recursive_directory_iterator(mnt + "/fs")) {
        if (e.path().string().find(".tmp") != std::string::npos) ok = false;
      }
    }
    // The journal on the full disk: appends fail (sticky), every flushed record survives a
    // reopen, and the reopened journal opens (torn tail truncated). The sequence floor is raised
    // past the failed run on the full disk, as the publisher does before sending it, and the
    // reopened journal resumes past it.
    {
      JournalOptions jo;
      jo.dir = mnt + "/journal";
      std::vector<uint64_t> flushed;
      uint64_t floor = 0;
      {
        auto j = Journal::Open(jo);
        if (!j.ok()) {
          // The tier may have filled the disk completely: a clear out-of-space error.
          EXPECT_EQ(j.status().code(), StatusCode::kOutOfSpace) << j.status().ToString();
        } else {
          std::string payload(1000 + rng() % 3000, 'p');
          for (uint64_t s = 1; s < 100000; ++s) {
            bool failed = !(*j)->Append(s, payload).ok();
            if (!failed && s % 4 == 0) {
              failed = !(*j)->Flush().ok();
              if (!failed) {
                for (uint64_t k = s - 3; k <= s; ++k) flushed.push_back(k);
              }
            }
            if (failed) {
              Status raised = (*j)->RaiseSeqFloor(s + 1);
              EXPECT_TRUE(raised.ok()) << raised.ToString();
              if (raised.ok()) floor = s + 1;
              ok = ok && raised.ok();
              break;
            }
          }
        }
      }
      auto j = Journal::Open(jo);
      if (j.ok()) {
        ok = ok && (*j)->seq_floor() >= floor;
        floors_total += floor > 0 ? 1 : 0;
        auto reader = (*j)->NewReader(0);
        ASSERT_TRUE(reader.ok());
        std::set<uint64_t> have;
        JournalRecord rec;
        while (true) {
          auto more = (*reader)->Next(&rec);
          if (!more.ok() || !*more) {
            ok = ok && more.ok();
            break;
          }
          have.insert(rec.seq);
        }
        for (uint64_t s : flushed) ok = ok && have.count(s) == 1;
        records_total += flushed.size();
      } else {
        ok = ok && j.status().code() == StatusCode::kOutOfSpace;
      }
    }
    EXPECT_TRUE(ok);
    if (!ok) ++failures;
  }
  testing::ReportFault({"file tier + journal",
                        "full tmpfs (ENOSPC) under the file tier and the "
                        "journal (160-560 KiB mounts)",
                        trials,
                        "full stores are OutOfSpace per block and misses; every stored block loads "
                        "byte-exact; no temp file left; every flushed journal record is read back "
                        "after reopening; the sequence floor is raised on the full disk and kept",
                        failures, seed,
                        std::to_string(stored_total) + " blocks stored, " +
                            std::to_string(full_total) + " refused full, " +
                            std::to_string(records_total) + " flushed records checked, " +
                            std::to_string(floors_total) + " floors raised full"});
}

TEST(DiskFaultsTest, ReadOnlyTmpfsServesWhatIsStoredAndRefusesClearly) {
  SetLogLevel("error");
  const unsigned seed = testing::TestSeed();
  testing::TempDir dir;
  const int trials = testing::FaultTrials(2, 10);
  int64_t failures = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const std::string mnt = dir.path() + "/m" + std::to_string(trial);
    stdfs::create_directories(mnt);
    Mount m(mnt, "size=4m");
    if (!m.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << m.error() << ")";
    Rows rows(16);
    stdfs::create_directories(mnt + "/fs");
    auto tier = FsBlockStore::Open(TierOptions(mnt + "/fs"), rows.region());
    ASSERT_TRUE(tier.ok());
    std::vector<FsBlockKey> keys;
    std::vector<int64_t> slots;
    for (uint64_t i = 0; i < 8; ++i) {
      rows.Fill(i, seed + trial * 100 + i);
      keys.push_back(Key(i));
      slots.push_back(static_cast<int64_t>(i));
    }
    ASSERT_TRUE(RunJob(**tier, true, keys, slots)->success);
    {
      JournalOptions jo;
      jo.dir = mnt + "/journal";
      auto j = Journal::Open(jo);
      ASSERT_TRUE(j.ok());
      for (uint64_t s = 1; s <= 50; ++s) ASSERT_TRUE((*j)->Append(s, "r").ok());
    }
    if (!m.RemountReadOnly()) GTEST_SKIP() << "cannot remount read-only: " << std::strerror(errno);
    bool ok = true;
    // Loads still serve every stored block; stores fail with an error naming the cause.
    std::vector<int64_t> back;
    for (uint64_t i = 0; i < 8; ++i) back.push_back(static_cast<int64_t>(8 + i));
    auto ld = RunJob(**tier, false, keys, back);
    for (uint64_t i = 0; i < 8; ++i) {
      ok = ok && ld && ld->blocks[i].outcome == FsBlockOutcome::kOk &&
           rows.Matches(8 + i, seed + trial * 100 + i);
    }
    rows.Fill(0, 1);
    auto st = RunJob(**tier, true, {Key(100)}, {0});
    ok = ok && st && st->blocks[0].outcome == FsBlockOutcome::kError &&
         st->blocks[0].status.message().find("Read-only file system") != std::string::npos;
    // A new tier on it: a clear error naming root_dir.
    auto ro = FsBlockStore::Open(TierOptions(mnt + "/fs"), rows.region());
    ok = ok && !ro.ok() && ro.status().message().find(mnt + "/fs") != std::string::npos;
    EXPECT_FALSE(ro.ok());
    // The journal: a read-write open fails clearly; a read-only open reads all 50 records.
    JournalOptions jo;
    jo.dir = mnt + "/journal";
    auto rw = Journal::Open(jo);
    if (rw.ok()) {
      // Opening needs no write when there is nothing to repair; the first append must fail.
      Status s = (*rw)->Append(51, "x");
      if (s.ok()) s = (*rw)->Flush();
      ok = ok && !s.ok() && s.message().find("Read-only file system") != std::string::npos;
    } else {
      ok = ok && rw.status().message().find("Read-only file system") != std::string::npos;
    }
    jo.read_only = true;
    auto rd = Journal::Open(jo);
    ok = ok && rd.ok() && (*rd)->last_seq() == 50;
    // A temp dir under the read-only mount: the error names the path and the errno text.
    const char* old = std::getenv("TMPDIR");
    const std::string saved = old != nullptr ? old : "";
    ::setenv("TMPDIR", mnt.c_str(), 1);
    ScopedTempDir scratch("ro");
    if (old != nullptr)
      ::setenv("TMPDIR", saved.c_str(), 1);
    else
      ::unsetenv("TMPDIR");
    ok = ok && scratch.path().empty() &&
         scratch.status().message().find(mnt + "/kvo-ro-") != std::string::npos &&
         scratch.status().message().find("Read-only file system") != std::string::npos;
    EXPECT_TRUE(ok) << scratch.status().ToString();
    if (!ok) ++failures;
  }
  testing::ReportFault({"file tier + journal",
                        "tmpfs remounted read-only under a live tier and "
                        "journal",
                        trials,
                        "every stored block still loads byte-exact; stores, a new tier, journal "
                        "appends and temp dirs fail with errors naming the path and EROFS; a "
                        "read-only journal open reads every record",
                        failures, seed, ""});
}

// ---------------------------------------------------------------------------------------------
// Journal open: junk tails and FIFOs.

TEST(DiskFaultsTest, JournalOpensPastJunkTailsAndRefusesFifos) {
  SetLogLevel("error");
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  const int trials = testing::FaultTrials(6, 40);
  int64_t failures = 0;
  double worst = 0;
  uint64_t worst_bytes = 0;
  for (int trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial));
    JournalOptions jo;
    jo.dir = dir.path() + "/j" + std::to_string(trial);
    const uint64_t records = 1 + rng() % 200;
    {
      auto j = Journal::Open(jo);
      ASSERT_TRUE(j.ok());
      for (uint64_t s = 1; s <= records; ++s)
        ASSERT_TRUE((*j)->Append(s, std::string(rng() % 300, 'a')).ok());
    }
    const std::string seg = jo.dir + "/" + JournalSegmentName(1);
    const std::string good = ReadBytes(seg);
    // The last trial is 16 MiB of junk (the size that took 12 s to open); others up to 2 MiB.
    const size_t junk_bytes = trial + 1 == trials ? (size_t{16} << 20) : rng() % (2u << 20);
    std::string junk(junk_bytes, '\0');
    const int kind = static_cast<int>(rng() % 3);
    for (char& c : junk)
      c = kind == 0 ? static_cast<char>(rng()) : kind == 1 ? '\0' : static_cast<char>(rng() % 4);
    {
      std::ofstream f(seg, std::ios::app | std::ios::binary);
      f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    }
    const auto start = Clock::now();
    auto j = Journal::Open(jo);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    if (secs > worst) {
      worst = secs;
      worst_bytes = junk_bytes;
    }
    bool ok = j.ok() && (*j)->last_seq() == records && ReadBytes(seg) == good;
    EXPECT_TRUE(ok) << (j.ok() ? "" : j.status().ToString());
    if (!ok) ++failures;
  }
  testing::ReportFault({"journal",
                        "junk appended to the last segment (random, zero or low-entropy "
                        "bytes, up to 2 MiB; one of 16 MiB)",
                        trials, "the journal opens, the junk is truncated, every record is kept",
                        failures, seed,
                        "slowest open " + std::to_string(worst).substr(0, 5) + " s with " +
                            std::to_string(worst_bytes >> 10) + " KiB of junk (ASan build)"});

  // FIFOs named like a segment: Journal::Open and `kvo events journal` fail naming the path;
  // config.json as a FIFO: `kvo fs scan` reports it. Nothing blocks.
  const int fifo_trials = testing::FaultTrials(2, 10);
  int64_t fifo_failures = 0;
  for (int trial = 0; trial < fifo_trials; ++trial) {
    JournalOptions jo;
    jo.dir = dir.path() + "/f" + std::to_string(trial);
    {
      auto j = Journal::Open(jo);
      ASSERT_TRUE(j.ok());
      ASSERT_TRUE((*j)->Append(1, "a").ok());
    }
    const std::string fifo = jo.dir + "/" + JournalSegmentName(1000 + trial);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto open = std::async(std::launch::async, [&] { return Journal::Open(jo).status(); });
    bool ok = true;
    if (open.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ok = false;
      ADD_FAILURE() << "Journal::Open blocked on a FIFO";
      ReleaseFifo(fifo);
    }
    const Status s = open.get();
    ok = ok && !s.ok() && s.message().find(fifo) != std::string::npos &&
         s.message().find("FIFO") != std::string::npos;
    EXPECT_TRUE(ok) << s.ToString();
    const testing::CommandResult cli = testing::RunCommand(
        {KVO_BINARY, "events", "journal", "--dir", jo.dir}, std::chrono::seconds(30));
    ok = ok && cli.code > 0 && cli.err.find(fifo) != std::string::npos;
    EXPECT_GT(cli.code, 0) << cli.err;
    EXPECT_NE(cli.err.find(fifo), std::string::npos) << cli.err;
    if (cli.code < 0) ReleaseFifo(fifo);
    // config.json as a FIFO under a tier root.
    const std::string root = dir.path() + "/root" + std::to_string(trial);
    stdfs::create_directories(root);
    {
      Rows rows(1);
      ASSERT_TRUE(FsBlockStore::Open(TierOptions(root), rows.region()).ok());
    }
    std::string config;
    for (const auto& e : stdfs::directory_iterator(root)) {
      if (stdfs::exists(e.path() / "config.json")) config = (e.path() / "config.json").string();
    }
    ASSERT_FALSE(config.empty());
    stdfs::remove(config);
    ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
    const testing::CommandResult scan = testing::RunCommand(
        {KVO_BINARY, "fs", "scan", "--root-dir", root}, std::chrono::seconds(30));
    if (scan.code < 0) ReleaseFifo(config);
    ok = ok && scan.code == 0 && scan.out.find("config.json") != std::string::npos &&
         scan.out.find("not a regular file") != std::string::npos;
    EXPECT_EQ(scan.code, 0) << scan.err;
    EXPECT_NE(scan.out.find("not a regular file"), std::string::npos) << scan.out;
    if (!ok) ++fifo_failures;
  }
  testing::ReportFault({"journal + file tier",
                        "FIFOs named like a journal segment and like "
                        "config.json",
                        fifo_trials,
                        "Journal::Open, `kvo events journal` and `kvo fs scan` return promptly "
                        "with an error or problem naming the FIFO",
                        fifo_failures, seed, ""});
}

}  // namespace
}  // namespace kvo
