#include "transfer/fs_block_store.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/clock.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/fs_file.h"

namespace kvo {

using fs_internal::ChecksumStore;
using fs_internal::Dir;
using fs_internal::WalkEntry;

std::string_view FsBlockOutcomeName(FsBlockOutcome o) {
  switch (o) {
    case FsBlockOutcome::kOk:
      return "ok";
    case FsBlockOutcome::kSkipped:
      return "skipped";
    case FsBlockOutcome::kMiss:
      return "miss";
    case FsBlockOutcome::kCorrupt:
      return "corrupt";
    case FsBlockOutcome::kError:
      return "error";
  }
  return "?";
}

namespace {

struct Job {
  JobId id = 0;
  bool is_store = false;
  std::vector<FsBlockKey> keys;
  std::vector<int64_t> slots;
  std::vector<FsBlockResult> results;
  std::atomic<size_t> remaining{0};
  std::atomic<uint64_t> bytes{0};
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  bool done = false;  // guarded by Impl::mu
};

struct Task {
  std::shared_ptr<Job> job;
  size_t index = 0;
};

}  // namespace

struct FsBlockStore::Impl {
  FsBlockStoreOptions options;
  HostRegion region;
  std::string ns_name;
  Dir root;
  Dir rank;
  bool o_direct = false;
  ChecksumStore checksum = ChecksumStore::kXattr;
  Clock* clock = SystemClock();
  std::atomic<uint64_t> corrupt_count{0};
  std::atomic<uint64_t> misfiled_count{0};

  Mutex mu;
  CondVar work_cv{&mu};
  CondVar done_cv{&mu};
  std::deque<Task> load_q GUARDED_BY(mu);
  std::deque<Task> store_q GUARDED_BY(mu);
  bool stopping GUARDED_BY(mu) = false;
  uint64_t next_id GUARDED_BY(mu) = 1;
  std::unordered_map<uint64_t, std::shared_ptr<Job>> jobs GUARDED_BY(mu);
  std::deque<std::shared_ptr<Job>> finished GUARDED_BY(mu);
  std::vector<std::thread> threads;

  ~Impl() {
    {
      MutexLock lock(&mu);
      stopping = true;
    }
    work_cv.SignalAll();
    for (auto& t : threads) t.join();
  }

  void Start() {
    const int nr = options.n_read_threads;  // Open checked: each >= 0, together >= 1
    const int nw = options.n_write_threads;
    for (int i = 0; i < nr + nw; ++i) {
      const bool reader = i < nr;
      threads.emplace_back([this, reader] { Loop(reader); });
      std::string n = std::string(reader ? "kvo-fs-rd-" : "kvo-fs-wr-") + std::to_string(i);
      pthread_setname_np(threads.back().native_handle(), n.substr(0, 15).c_str());
    }
  }

  // Readers take loads first, writers stores first; each falls back to the other queue.
  void Loop(bool reader) {
    while (true) {
      Task task;
      {
        MutexLock lock(&mu);
        while (load_q.empty() && store_q.empty() && !stopping) work_cv.Wait();
        if (load_q.empty() && store_q.empty()) return;  // stopping, drained
        std::deque<Task>* first = reader ? &load_q : &store_q;
        std::deque<Task>* second = reader ? &store_q : &load_q;
        std::deque<Task>* q = first->empty() ? second : first;
        task = std::move(q->front());
        q->pop_front();
      }
      Run(task);
    }
  }

  void Run(const Task& t) {
    Job& job = *t.job;
    const int64_t begin = clock->MonotonicNanos();
    FsBlockResult r = job.is_store ? StoreOne(job.keys[t.index], job.slots[t.index])
                                   : LoadOne(job.keys[t.index], job.slots[t.index]);
    r.seconds = static_cast<double>(clock->MonotonicNanos() - begin) / 1e9;
    if (r.outcome == FsBlockOutcome::kOk) {
      r.bytes = region.row_stride;
      job.bytes.fetch_add(region.row_stride);
    }
    job.results[t.index] = std::move(r);
    if (job.remaining.fetch_sub(1) == 1) {
      const int64_t end = clock->MonotonicNanos();
      MutexLock lock(&mu);
      job.end_ns = end;
      job.done = true;
      finished.push_back(t.job);
      done_cv.SignalAll();
    }
  }

  uint8_t* Row(int64_t slot) const {
    return reinterpret_cast<uint8_t*>(region.base +
                                      static_cast<uint64_t>(slot) * region.row_stride);
  }

  FsBlockResult StoreOne(const FsBlockKey& key, int64_t slot) {
    FsBlockResult r;
    bool fresh = false;
    auto d2 = fs_internal::OpenBlockDir(rank, FsBlockDir1(key), FsBlockDir2(key), true,
                                        options.dir_mode, "block directory", &fresh);
    if (!d2.ok()) return Error(d2.status());
    fs_internal::WriteOptions wo;
    wo.file_mode = options.file_mode;
    wo.o_direct = o_direct;
    wo.checksum = checksum;
    wo.identity = fs_internal::BlockIdentity(ns_name, options.rank, key);
    wo.dir_is_new = fresh;
    auto w =
        fs_internal::WriteFileAtomic(*d2, FsBlockFileName(key), Row(slot), region.row_stride, wo);
    if (!w.ok()) return Error(w.status().WithContext("store " + key.hex));
    r.outcome =
        *w == fs_internal::WriteOutcome::kWritten ? FsBlockOutcome::kOk : FsBlockOutcome::kSkipped;
    return r;
  }

  FsBlockResult LoadOne(const FsBlockKey& key, int64_t slot) {
    FsBlockResult r;
    fs_internal::ReadOptions ro;
    ro.o_direct = o_direct;
    ro.checksum = checksum;
    ro.require_checksum = options.require_checksum;
    ro.identity = fs_internal::BlockIdentity(ns_name, options.rank, key);
    const std::string dir1 = FsBlockDir1(key), dir2 = FsBlockDir2(key), name = FsBlockFileName(key);
    // One openat2 of "<hhh>/<hh>_g<group>/<hash>.bin" (no symlink followed); where it cannot
    // decide, the directories one by one (which classify a symlinked directory as corrupt).
    auto fast = fs_internal::ReadBlockFileVerified(rank, dir1, dir2, name, Row(slot),
                                                   region.row_stride, ro);
    if (!fast.ok()) return Error(fast.status().WithContext("load " + key.hex));
    if (fast->has_value()) return Classify(key, **fast);
    bool not_a_dir = false;  // a symlink or non-directory in the path (ELOOP / ENOTDIR)
    auto d1 = fs_internal::OpenChildDir(rank, dir1, false, options.dir_mode, "block directory",
                                        &not_a_dir);
    Result<Dir> d2 = d1.ok() ? fs_internal::OpenChildDir(*d1, dir2, false, options.dir_mode,
                                                         "block directory", &not_a_dir)
                             : Result<Dir>(d1.status());
    if (!d2.ok()) {
      if (d2.status().code() == StatusCode::kNotFound) {
        r.outcome = FsBlockOutcome::kMiss;
        return r;
      }
      // Only a planted path is corrupt; a directory we may not open (EACCES, EPERM) is an error
      // and the block stays (the manager keeps its key: the file is still on disk).
      if (not_a_dir) {
        corrupt_count.fetch_add(1);
        r.outcome = FsBlockOutcome::kCorrupt;
        r.status = Status::Corruption("load " + key.hex + ": " + d2.status().message());
        return r;
      }
      return Error(d2.status());
    }
    auto rd = fs_internal::ReadFileVerified(*d2, name, Row(slot), region.row_stride, ro);
    if (!rd.ok()) return Error(rd.status().WithContext("load " + key.hex));
    return Classify(key, *rd);
  }

  // A read's outcome as the job reports it (a corrupt block counted and logged).
  FsBlockResult Classify(const FsBlockKey& key, const fs_internal::ReadResult& read) {
    FsBlockResult r;
    const fs_internal::ReadResult* rd = &read;
    switch (rd->outcome) {
      case fs_internal::ReadOutcome::kOk:
        r.outcome = FsBlockOutcome::kOk;
        r.verified = rd->verified;
        break;
      case fs_internal::ReadOutcome::kMissing:
        r.outcome = FsBlockOutcome::kMiss;
        break;
      case fs_internal::ReadOutcome::kCorrupt:
        r.outcome = FsBlockOutcome::kCorrupt;
        r.misfiled = rd->misfiled;
        (rd->misfiled ? misfiled_count : corrupt_count).fetch_add(1);
        r.status = Status::Corruption("block " + key.hex + " group " + std::to_string(key.group) +
                                      ": " + rd->detail + " (removed)");
        KVO_LOG_WARN("fs tier: {}", r.status.message());
        break;
    }
    return r;
  }

  static FsBlockResult Error(Status s) {
    FsBlockResult r;
    r.outcome = FsBlockOutcome::kError;
    r.status = std::move(s);
    return r;
  }

  Result<JobId> Submit(bool is_store, std::vector<FsBlockKey> keys, std::vector<int64_t> slots) {
    const char* what = is_store ? "fs store job" : "fs load job";
    if (keys.empty()) return Status::InvalidArgument(std::string(what) + ": no blocks");
    if (keys.size() != slots.size()) {
      return Status::InvalidArgument(std::string(what) + ": " + std::to_string(keys.size()) +
                                     " keys but " + std::to_string(slots.size()) + " slots");
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      Status s = ValidateBlockHex(keys[i].hex);
      if (!s.ok()) return s.WithContext(what);
      if (slots[i] < 0 || static_cast<uint64_t>(slots[i]) >= region.num_slots) {
        return Status::OutOfRange(std::string(what) + ": CPU slot " + std::to_string(slots[i]) +
                                  " out of range [0, " + std::to_string(region.num_slots) + ")");
      }
    }
    auto job = std::make_shared<Job>();
    job->is_store = is_store;
    job->keys = std::move(keys);
    job->slots = std::move(slots);
    job->results.resize(job->keys.size());
    job->remaining.store(job->keys.size());
    job->start_ns = clock->MonotonicNanos();
    {
      MutexLock lock(&mu);
      job->id = next_id++;
      jobs[job->id] = job;
      auto& q = is_store ? store_q : load_q;
      for (size_t i = 0; i < job->keys.size(); ++i) q.push_back({job, i});
    }
    work_cv.SignalAll();
    return job->id;
  }
};

Result<std::unique_ptr<FsBlockStore>> FsBlockStore::Open(FsBlockStoreOptions options,
                                                         HostRegion region) {
  if (region.base == 0 || region.num_slots == 0 || region.row_stride == 0) {
    return Status::InvalidArgument("fs tier: empty host region");
  }
  for (const auto& [name, n] :
       {std::pair<const char*, int>{"n_read_threads", options.n_read_threads},
        {"n_write_threads", options.n_write_threads}}) {
    if (n < 0 || n > kFsMaxThreadsPerPool) {
      return Status::InvalidArgument("fs tier: " + std::string(name) + " must be 0.." +
                                     std::to_string(kFsMaxThreadsPerPool) + ", got " +
                                     std::to_string(n));
    }
  }
  if (options.n_read_threads + options.n_write_threads < 1) {
    return Status::InvalidArgument("fs tier: n_read_threads + n_write_threads must be >= 1");
  }
  KVO_ASSIGN_OR_RETURN(std::string ns, FsNamespaceName(options.fields));
  KVO_ASSIGN_OR_RETURN(std::string config, FsFieldsConfigJson(options.fields));
  KVO_ASSIGN_OR_RETURN(Dir root, fs_internal::OpenRootDir(options.root_dir));
  KVO_ASSIGN_OR_RETURN(fs_internal::Probe probe,
                       fs_internal::ProbeDir(root, "root_dir '" + options.root_dir + "'"));
  KVO_ASSIGN_OR_RETURN(Dir ns_dir, fs_internal::OpenChildDir(root, ns, true, options.dir_mode,
                                                             "namespace directory"));
  fs_internal::WriteOptions cw;
  cw.file_mode = options.file_mode;
  cw.write_checksum = false;
  auto wrote =
      fs_internal::WriteFileAtomic(ns_dir, "config.json", config.data(), config.size(), cw);
  if (!wrote.ok()) return wrote.status().WithContext("fs tier: write config.json");
  const std::string rank_name = ns + "_r" + std::to_string(options.rank);
  KVO_ASSIGN_OR_RETURN(Dir rank, fs_internal::OpenChildDir(root, rank_name, true, options.dir_mode,
                                                           "rank directory"));
  std::unique_ptr<FsBlockStore> tier(new FsBlockStore());
  tier->impl_ = std::make_unique<Impl>();
  Impl& impl = *tier->impl_;
  impl.options = std::move(options);
  impl.region = region;
  impl.ns_name = ns;
  impl.root = std::move(root);
  impl.rank = std::move(rank);
  impl.o_direct = impl.options.try_o_direct && probe.o_direct;
  if (impl.options.force_sidecar_records) probe.xattr = false;
  impl.checksum = probe.xattr ? ChecksumStore::kXattr : ChecksumStore::kSidecar;
  tier->ns_name_ = ns;
  tier->region_ = region;
  tier->o_direct_ = impl.o_direct;
  tier->xattr_ = probe.xattr;
  impl.Start();
  KVO_LOG_INFO("fs tier: {} under '{}', O_DIRECT {}, integrity records in {}", rank_name,
               impl.options.root_dir, impl.o_direct ? "on" : "off",
               probe.xattr ? "xattrs" : "sidecar files");
  return tier;
}

FsBlockStore::~FsBlockStore() {
  if (impl_ != nullptr) Drain();
}

Result<JobId> FsBlockStore::SubmitStore(std::vector<FsBlockKey> keys, std::vector<int64_t> slots) {
  return impl_->Submit(true, std::move(keys), std::move(slots));
}

Result<JobId> FsBlockStore::SubmitLoad(std::vector<FsBlockKey> keys, std::vector<int64_t> slots) {
  return impl_->Submit(false, std::move(keys), std::move(slots));
}

void FsBlockStore::TakeFinished(std::vector<FsJobResult>* out) {
  MutexLock lock(&impl_->mu);
  for (auto& job : impl_->finished) {
    FsJobResult r;
    r.job_id = job->id;
    r.is_store = job->is_store;
    r.bytes = job->bytes.load();
    r.seconds = static_cast<double>(job->end_ns - job->start_ns) / 1e9;
    r.success = std::all_of(job->results.begin(), job->results.end(), [](const FsBlockResult& b) {
      return b.outcome == FsBlockOutcome::kOk || b.outcome == FsBlockOutcome::kSkipped;
    });
    r.blocks = std::move(job->results);
    impl_->jobs.erase(job->id);
    out->push_back(std::move(r));
  }
  impl_->finished.clear();
}

Status FsBlockStore::Wait(JobId job_id) {
  MutexLock lock(&impl_->mu);
  auto it = impl_->jobs.find(job_id);
  if (it == impl_->jobs.end()) {
    return Status::NotFound("fs job " + std::to_string(job_id) + " unknown or already taken");
  }
  std::shared_ptr<Job> job = it->second;
  while (!job->done) impl_->done_cv.Wait();
  return Status::Ok();
}

void FsBlockStore::Drain() {
  MutexLock lock(&impl_->mu);
  while (true) {
    bool all = true;
    for (const auto& [id, job] : impl_->jobs) all = all && job->done;
    if (all) return;
    impl_->done_cv.Wait();
  }
}

uint64_t FsBlockStore::corrupt_blocks() const { return impl_->corrupt_count.load(); }
uint64_t FsBlockStore::misfiled_blocks() const { return impl_->misfiled_count.load(); }

bool FsBlockStore::Exists(const FsBlockKey& key) {
  if (!ValidateBlockHex(key.hex).ok()) return false;
  auto d2 = fs_internal::OpenBlockDir(impl_->rank, FsBlockDir1(key), FsBlockDir2(key), false, 0700,
                                      "directory");
  if (!d2.ok()) return false;
  struct stat st {};
  return ::fstatat(d2->fd(), FsBlockFileName(key).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISREG(st.st_mode);
}

Status FsBlockStore::Delete(const FsBlockKey& key) {
  KVO_RETURN_IF_ERROR(ValidateBlockHex(key.hex));
  auto d1 = fs_internal::OpenChildDir(impl_->rank, FsBlockDir1(key), false, 0700, "directory");
  if (!d1.ok()) return d1.status().code() == StatusCode::kNotFound ? Status::Ok() : d1.status();
  auto d2 = fs_internal::OpenChildDir(*d1, FsBlockDir2(key), false, 0700, "directory");
  if (!d2.ok()) return d2.status().code() == StatusCode::kNotFound ? Status::Ok() : d2.status();
  return fs_internal::RemoveBlockFile(*d2, FsBlockFileName(key));
}

Result<FsScanResult> FsBlockStore::Scan(double temp_age_seconds) {
  FsScanResult out;
  const uint64_t want = impl_->region.row_stride;
  KVO_RETURN_IF_ERROR(fs_internal::WalkRankDir(
      impl_->rank, [&](const WalkEntry& e, const Dir& dir, const std::string& name) {
        switch (e.kind) {
          case WalkEntry::Kind::kBlock:
            if (e.size != want) {
              fs_internal::RemoveBlockFile(dir, name).IgnoreError();
              ++out.wrong_size_removed;
              out.problems.push_back(e.rel_path + ": size " + std::to_string(e.size) +
                                     ", expected " + std::to_string(want) + " (removed)");
            } else {
              out.blocks.push_back(e.key);
            }
            break;
          case WalkEntry::Kind::kTemp:
            if (e.age_seconds >= temp_age_seconds) {
              ::unlinkat(dir.fd(), name.c_str(), 0);
              ++out.temp_files_removed;
            }
            break;
          case WalkEntry::Kind::kSidecar: {
            // An orphan (its .bin gone: a crash between the record and the link) as old as a
            // stale temp file; a younger one may belong to another writer's store in flight.
            if (e.age_seconds < temp_age_seconds) break;
            const std::string bin =
                name.substr(0, name.size() - (sizeof(fs_internal::kSidecarSuffix) - 1));
            struct stat st {};
            if (::fstatat(dir.fd(), bin.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 &&
                errno == ENOENT && ::unlinkat(dir.fd(), name.c_str(), 0) == 0) {
              ++out.orphan_sidecars_removed;
            }
            break;
          }
          case WalkEntry::Kind::kInvalid:
          case WalkEntry::Kind::kSymlink:
            out.problems.push_back(e.rel_path + ": " + e.why);
            break;
        }
      }));
  return out;
}

std::string FsBlockStore::rank_dir() const {
  return impl_->options.root_dir + "/" + ns_name_ + "_r" + std::to_string(impl_->options.rank);
}

}  // namespace kvo
