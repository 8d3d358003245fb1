#include "transfer/fs_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>

namespace kvo::fs_internal {
namespace {

constexpr uint64_t kDirectAlign = 4096;

Status Errno(std::string_view what, std::string_view name, int err) {
  std::string m = std::string(what) + " '" + std::string(name) + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status::OutOfSpace(std::move(m));
  if (err == ENOENT) return Status::NotFound(std::move(m));
  if (err == EROFS || err == EACCES || err == EPERM) {
    return Status::FailedPrecondition(std::move(m));
  }
  return Status::IOError(std::move(m));
}

// openat2(2) with RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH: `rel` (several components) is resolved
// beneath `dirfd`, a symlink anywhere (or "..", or an absolute path) fails it with ELOOP / EXDEV.
// -1 with errno ENOSYS where the kernel (or a seccomp filter: EPERM) has no openat2.
int OpenBeneath(int dirfd, const char* rel, int flags, mode_t mode = 0) {
#ifdef SYS_openat2
  struct open_how how {};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? mode : 0;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH;
  long fd = ::syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
  if (fd < 0 && errno == EPERM) errno = ENOSYS;  // seccomp: treat as absent
  return static_cast<int>(fd);
#else
  (void)dirfd, (void)rel, (void)flags, (void)mode;
  errno = ENOSYS;
  return -1;
#endif
}

void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

bool Aligned(const void* p, size_t n) {
  return reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0 && n % kDirectAlign == 0;
}

Status WriteAll(int fd, const void* data, size_t n, std::string_view name) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", name, errno);
    }
    if (w == 0) return Status::IOError("write '" + std::string(name) + "': wrote nothing");
    done += static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Reads up to n bytes; returns how many were read (short only at end of file).
Result<size_t> ReadAll(int fd, void* data, size_t n, std::string_view name) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read", name, errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

// The record of an open .bin: nullopt when none is recorded; a string of the raw bytes else.
Result<std::optional<std::string>> LoadRecord(const Dir& dir, int fd, const std::string& name,
                                              ChecksumStore store) {
  char buf[64];
  if (store == ChecksumStore::kXattr) {
    ssize_t n = ::fgetxattr(fd, kXattrName, buf, sizeof(buf));
    if (n < 0) {
      if (errno == ENODATA || errno == ENOTSUP) return std::optional<std::string>();
      if (errno == ERANGE) return std::optional<std::string>(std::string(65, 'x'));  // too long
      return Errno("read integrity record of", name, errno);
    }
    return std::optional<std::string>(std::string(buf, static_cast<size_t>(n)));
  }
  const std::string side = name + kSidecarSuffix;
  Fd sfd(::openat(dir.fd(), side.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (sfd.get() < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    if (errno == ELOOP) return std::optional<std::string>(std::string());  // invalid record
    return Errno("open integrity sidecar", side, errno);
  }
  struct stat sst {};
  if (::fstat(sfd.get(), &sst) != 0) return Errno("stat integrity sidecar", side, errno);
  if (!S_ISREG(sst.st_mode)) return std::optional<std::string>(std::string());  // invalid
  KVO_ASSIGN_OR_RETURN(size_t n, ReadAll(sfd.get(), buf, sizeof(buf), side));
  return std::optional<std::string>(std::string(buf, n));
}

// Removes `name` if it is still the inode `st` describes (a concurrent writer may have renamed a
// fresh file over it).
void RemoveIfSame(const Dir& dir, const std::string& name, const struct stat& st) {
  struct stat now {};
  if (::fstatat(dir.fd(), name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (now.st_ino != st.st_ino || now.st_dev != st.st_dev) return;
  ::unlinkat(dir.fd(), name.c_str(), 0);
  ::unlinkat(dir.fd(), (name + kSidecarSuffix).c_str(), 0);
}

// What the record of a file of `size` bytes says before any byte of the body is read: kOk with
// *rec set (checksum still to compare), kOk without *rec (no record, none required), or kCorrupt.
Result<ReadResult> CheckRecord(const Dir& dir, int fd, const std::string& name, uint64_t size,
                               ChecksumStore store, bool require,
                               const std::optional<uint64_t>& identity,
                               std::optional<IntegrityRecord>* rec) {
  ReadResult out;
  out.outcome = ReadOutcome::kOk;
  rec->reset();
  KVO_ASSIGN_OR_RETURN(std::optional<std::string> raw, LoadRecord(dir, fd, name, store));
  if (!raw.has_value()) {
    if (require) {
      out.outcome = ReadOutcome::kCorrupt;
      out.detail = "no integrity record";
    }
    return out;
  }
  *rec = DecodeRecord(*raw);
  if (!rec->has_value()) {
    out.outcome = ReadOutcome::kCorrupt;
    out.detail = "malformed integrity record";
    return out;
  }
  out.record_version = (*rec)->version;
  if ((*rec)->length != size) {
    out.outcome = ReadOutcome::kCorrupt;
    out.detail = "integrity record says " + std::to_string((*rec)->length) + " bytes, file has " +
                 std::to_string(size);
  } else if ((*rec)->version >= 2 && identity.has_value() && (*rec)->identity != *identity) {
    out.outcome = ReadOutcome::kCorrupt;
    out.misfiled = true;
    out.detail = "misfiled: its integrity record names another block (renamed or copied here)";
  } else if ((*rec)->version < 2 && require) {
    out.outcome = ReadOutcome::kCorrupt;
    out.detail = "version-1 integrity record (names no block) and require_checksum is set";
  }
  return out;
}

}  // namespace

std::string EncodeRecord(const IntegrityRecord& r) {
  std::string s(r.version == 1 ? "kvo1" : "kvo2", 4);
  s.append(4, '\0');
  PutU64(&s, r.length);
  PutU64(&s, r.xxh3);
  if (r.version != 1) PutU64(&s, r.identity);
  return s;
}

std::optional<IntegrityRecord> DecodeRecord(std::string_view b) {
  IntegrityRecord r;
  if (b.size() == kRecordBytes && b.substr(0, 4) == "kvo2") {
    r.version = 2;
    r.identity = GetU64(b.data() + 24);
  } else if (b.size() == kRecordBytesV1 && b.substr(0, 4) == "kvo1") {
    r.version = 1;
  } else {
    return std::nullopt;
  }
  if (b.substr(4, 4) != std::string_view("\0\0\0\0", 4)) return std::nullopt;
  r.length = GetU64(b.data() + 8);
  r.xxh3 = GetU64(b.data() + 16);
  return r;
}

uint64_t BlockIdentity(std::string_view ns_name, uint32_t rank, const FsBlockKey& key) {
  std::string id("kvo.block");
  id += '\0';
  id += ns_name;
  id += '\0';
  id += std::to_string(rank);
  id += '\0';
  id += std::to_string(key.group);
  id += '\0';
  id += key.hex;
  return XXH3_64bits(id.data(), id.size());
}

uint64_t Xxh3(const void* data, size_t n) { return XXH3_64bits(data, n); }

Dir::~Dir() {
  if (fd_ >= 0) ::close(fd_);
}

Dir& Dir::operator=(Dir&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Result<Dir> OpenRootDir(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("root_dir is empty");
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound("root_dir '" + path + "' does not exist");
    if (err == ENOTDIR || err == ELOOP) {
      return Status::FailedPrecondition("root_dir '" + path +
                                        "' is not a directory (or is a symlink)");
    }
    return Errno("open root_dir", path, err);
  }
  return Dir(fd);
}

Result<Dir> OpenChildDir(const Dir& parent, std::string_view name, bool create, uint32_t dir_mode,
                         std::string_view what, bool* not_a_dir) {
  const std::string n(name);
  if (not_a_dir != nullptr) *not_a_dir = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::openat(parent.fd(), n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return Dir(fd);
    int err = errno;
    if (err == ENOTDIR || err == ELOOP) {
      if (not_a_dir != nullptr) *not_a_dir = true;
      return Status::FailedPrecondition(std::string(what) + " '" + n +
                                        "' is a symlink or not a directory; not followed");
    }
    if (err != ENOENT) return Errno(std::string("open ") + std::string(what), n, err);
    if (!create) return Status::NotFound(std::string(what) + " '" + n + "' does not exist");
    if (::mkdirat(parent.fd(), n.c_str(), static_cast<mode_t>(dir_mode)) != 0 && errno != EEXIST) {
      return Errno(std::string("create ") + std::string(what), n, errno);
    }
  }
  return Status::IOError(std::string(what) + " '" + n + "' vanished while being created");
}

uint64_t RandomU63() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   (static_cast<uint64_t>(::getpid()) << 32) ^
                                   reinterpret_cast<uintptr_t>(&rng));
  return rng() >> 1;
}

Result<Dir> OpenBlockDir(const Dir& base, std::string_view dir1, std::string_view dir2, bool create,
                         uint32_t dir_mode, std::string_view what, bool* created) {
  if (created != nullptr) *created = false;
  std::string rel;
  rel.reserve(dir1.size() + 1 + dir2.size());
  rel.append(dir1).append(1, '/').append(dir2);
  int fd = OpenBeneath(base.fd(), rel.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) return Dir(fd);
  if (errno == ENOENT && !create) {
    return Status::NotFound(std::string(what) + " '" + rel + "' does not exist");
  }
  // Missing (to create), a symlink or non-directory on the way (ELOOP, ENOTDIR: the per-level
  // walk names which), no openat2 (ENOSYS, EINVAL), anything else: one component at a time.
  const bool missing = errno == ENOENT;
  KVO_ASSIGN_OR_RETURN(Dir d1, OpenChildDir(base, dir1, create, dir_mode, what));
  if (missing) {
    // The leaf was missing and its parent exists now: create it before the first open (saves
    // the open that would fail). EEXIST (a racing creator) is fine; what it is, the open checks.
    const std::string n(dir2);
    if (::mkdirat(d1.fd(), n.c_str(), static_cast<mode_t>(dir_mode)) == 0) {
      if (created != nullptr) *created = true;
    } else if (errno != EEXIST) {
      return Errno(std::string("create ") + std::string(what), n, errno);
    }
  }
  return OpenChildDir(d1, dir2, create, dir_mode, what);
}

namespace {

// How a finished O_TMPFILE gets its name: linkat(fd, "", AT_EMPTY_PATH) (Linux >= 6.10 lets the
// opener do it unprivileged), else through /proc/self/fd/N, else not at all (named temp files).
// Learnt by this process's first link. A wrong "not at all" (the first link's directory removed
// under it: ENOENT both ways) only costs speed: every later write takes the named temp file.
// A file system without O_TMPFILE costs one refused open per write (tiers on other file systems
// keep theirs).
enum class TmpLink : int { kUnknown, kEmptyPath, kProcFd, kNone };
std::atomic<int> g_tmp_link{static_cast<int>(TmpLink::kUnknown)};

// Names the open O_TMPFILE `fd` as `name` in `dir` (never replacing: EEXIST when taken). -1 with
// errno ENOTSUP when this process cannot link temp files (the caller falls back).
int LinkTmpFile(int fd, const Dir& dir, const char* name) {
  auto mode = static_cast<TmpLink>(g_tmp_link.load(std::memory_order_relaxed));
  if (mode == TmpLink::kUnknown || mode == TmpLink::kEmptyPath) {
    if (::linkat(fd, "", dir.fd(), name, AT_EMPTY_PATH) == 0) {
      g_tmp_link.store(static_cast<int>(TmpLink::kEmptyPath), std::memory_order_relaxed);
      return 0;
    }
    // ENOENT / EPERM: AT_EMPTY_PATH refused to this process (an older kernel without
    // CAP_DAC_READ_SEARCH); any other error is the link's own.
    if (errno != ENOENT && errno != EPERM) return -1;
    if (mode == TmpLink::kEmptyPath) return -1;  // it worked before: ENOENT is real
  }
  if (mode != TmpLink::kNone) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    if (::linkat(AT_FDCWD, path, dir.fd(), name, AT_SYMLINK_FOLLOW) == 0) {
      g_tmp_link.store(static_cast<int>(TmpLink::kProcFd), std::memory_order_relaxed);
      return 0;
    }
    if (errno != ENOENT && errno != EPERM && errno != EACCES) return -1;
    if (mode == TmpLink::kProcFd) return -1;
  }
  g_tmp_link.store(static_cast<int>(TmpLink::kNone), std::memory_order_relaxed);
  errno = ENOTSUP;
  return -1;
}

// Writes body and record to the open file `fd` (named `shown` in errors). A sidecar record is
// written (and renamed into place) beside `name` first.
Status WriteBodyAndRecord(const Dir& dir, int fd, const std::string& name, const std::string& shown,
                          const void* data, size_t n, const WriteOptions& opts);

}  // namespace

void ForceNamedTempFilesForTest(bool on) {
  g_tmp_link.store(static_cast<int>(on ? TmpLink::kNone : TmpLink::kUnknown));
}

Result<WriteOutcome> WriteFileAtomic(const Dir& dir, const std::string& name, const void* data,
                                     size_t n, const WriteOptions& opts) {
  struct stat st {};
  if (opts.dir_is_new) {
    // Nothing to look for in a directory this writer just created (a racing writer of the same
    // name is met by linkat's EEXIST, or replaced by rename as before).
  } else if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return Status::FailedPrecondition("'" + name +
                                        "' exists and is not a regular file (symlink?); not "
                                        "written");
    }
    return WriteOutcome::kExisted;
  } else if (errno != ENOENT) {
    return Errno("stat", name, errno);
  }
  const bool direct = opts.o_direct && Aligned(data, n);

  // A nameless O_TMPFILE linked under `name` once whole: no temp name, no rename, nothing left
  // behind by a crash, and linkat never replaces (a racing writer's file stays; EEXIST).
  if (g_tmp_link.load(std::memory_order_relaxed) != static_cast<int>(TmpLink::kNone)) {
    const int tflags = O_TMPFILE | O_WRONLY | O_CLOEXEC;
    int fd = ::openat(dir.fd(), ".", tflags | (direct ? O_DIRECT : 0),
                      static_cast<mode_t>(opts.file_mode));
    if (fd < 0 && direct && errno == EINVAL) {
      fd = ::openat(dir.fd(), ".", tflags, static_cast<mode_t>(opts.file_mode));
    }
    if (fd >= 0) {
      Fd file(fd);
      KVO_RETURN_IF_ERROR(WriteBodyAndRecord(dir, file.get(), name, name, data, n, opts));
      if (LinkTmpFile(file.get(), dir, name.c_str()) == 0) return WriteOutcome::kWritten;
      const int err = errno;
      if (err == EEXIST) {  // a concurrent writer of the same block named it first
        if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            !S_ISREG(st.st_mode)) {
          return Status::FailedPrecondition("'" + name +
                                            "' exists and is not a regular file (symlink?); not "
                                            "written");
        }
        return WriteOutcome::kExisted;
      }
      if (err != ENOTSUP) return Errno("link", name, err);
      // This process cannot link temp files: the named temp file below (written again).
    } else if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
      // EOPNOTSUPP / EISDIR / EINVAL: no O_TMPFILE on this file system or kernel (fall back).
      return Errno("create a temp file for", name, errno);
    }
  }

  const std::string tmp = name + "_" + std::to_string(RandomU63()) + ".tmp";
  int flags = O_CREAT | O_EXCL | O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::openat(dir.fd(), tmp.c_str(), flags | (direct ? O_DIRECT : 0),
                    static_cast<mode_t>(opts.file_mode));
  if (fd < 0 && direct && errno == EINVAL) {
    fd = ::openat(dir.fd(), tmp.c_str(), flags, static_cast<mode_t>(opts.file_mode));
  }
  if (fd < 0) return Errno("create", tmp, errno);
  Fd file(fd);
  auto fail = [&](Status s) -> Result<WriteOutcome> {
    ::unlinkat(dir.fd(), tmp.c_str(), 0);
    return s;
  };
  Status s = WriteBodyAndRecord(dir, file.get(), name, tmp, data, n, opts);
  if (!s.ok()) return fail(s);
  if (::close(file.release()) != 0) return fail(Errno("close", tmp, errno));
  if (::renameat(dir.fd(), tmp.c_str(), dir.fd(), name.c_str()) != 0) {
    return fail(Errno("rename to", name, errno));
  }
  return WriteOutcome::kWritten;
}

namespace {

Status WriteBodyAndRecord(const Dir& dir, int fd, const std::string& name, const std::string& shown,
                          const void* data, size_t n, const WriteOptions& opts) {
  KVO_RETURN_IF_ERROR(WriteAll(fd, data, n, shown));
  if (!opts.write_checksum) return Status::Ok();
  IntegrityRecord record;
  record.length = n;
  record.xxh3 = Xxh3(data, n);
  record.identity = opts.identity;
  const std::string rec = EncodeRecord(record);
  if (opts.checksum == ChecksumStore::kXattr) {
    if (::fsetxattr(fd, kXattrName, rec.data(), rec.size(), 0) != 0) {
      return Errno("set integrity record on", shown, errno);
    }
    return Status::Ok();
  }
  WriteOptions side = opts;
  side.dir_is_new = false;  // the sidecar's name was just unlinked; look anyway
  side.o_direct = false;
  side.write_checksum = false;
  const std::string side_name = name + kSidecarSuffix;
  // A stale sidecar (of a block removed since) is replaced.
  ::unlinkat(dir.fd(), side_name.c_str(), 0);
  auto r = WriteFileAtomic(dir, side_name, rec.data(), rec.size(), side);
  return r.ok() ? Status::Ok() : r.status();
}

}  // namespace

namespace {

// The body of ReadFileVerified once `fd` (of `name`) is open. `dir` is the directory holding
// `name` (for sidecar records), or nullptr when not open: `open_dir` then opens it, needed only
// to remove a corrupt file.
Result<ReadResult> ReadOpened(const Dir* dir, const std::function<Result<Dir>()>& open_dir, int fd,
                              const std::string& name, void* data, size_t n, bool direct,
                              const ReadOptions& opts) {
  ReadResult out;
  Fd file(fd);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return Errno("stat", name, errno);
  auto corrupt = [&](ReadResult r) {
    if (opts.remove_corrupt) {
      if (dir != nullptr) {
        RemoveIfSame(*dir, name, st);
      } else if (auto d = open_dir(); d.ok()) {
        RemoveIfSame(*d, name, st);
      }
    }
    r.outcome = ReadOutcome::kCorrupt;
    return r;
  };
  if (!S_ISREG(st.st_mode)) {
    out.outcome = ReadOutcome::kCorrupt;
    out.detail = "not a regular file";
    return out;
  }
  if (static_cast<uint64_t>(st.st_size) != n) {
    out.detail = "size " + std::to_string(st.st_size) + ", expected " + std::to_string(n);
    return corrupt(std::move(out));
  }
  std::optional<IntegrityRecord> rec;
  const Dir none;
  KVO_ASSIGN_OR_RETURN(ReadResult checked,
                       CheckRecord(dir != nullptr ? *dir : none, file.get(), name, n, opts.checksum,
                                   opts.require_checksum, opts.identity, &rec));
  if (checked.outcome == ReadOutcome::kCorrupt) return corrupt(std::move(checked));
  // Buffered: the whole file is wanted at once; a larger readahead window saves round trips.
  if (!direct) ::posix_fadvise(file.get(), 0, static_cast<off_t>(n), POSIX_FADV_SEQUENTIAL);
  KVO_ASSIGN_OR_RETURN(size_t got, ReadAll(file.get(), data, n, name));
  if (got != n) {
    checked.detail = "short read: " + std::to_string(got) + " of " + std::to_string(n);
    return corrupt(std::move(checked));
  }
  if (rec.has_value()) {
    if (rec->xxh3 != Xxh3(data, n)) {
      checked.detail = "checksum mismatch";
      return corrupt(std::move(checked));
    }
    checked.verified = true;
  }
  return checked;
}

}  // namespace

Result<ReadResult> ReadFileVerified(const Dir& dir, const std::string& name, void* data, size_t n,
                                    const ReadOptions& opts) {
  const int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  const bool direct = opts.o_direct && Aligned(data, n);
  int fd = ::openat(dir.fd(), name.c_str(), flags | (direct ? O_DIRECT : 0));
  if (fd < 0 && direct && errno == EINVAL) fd = ::openat(dir.fd(), name.c_str(), flags);
  if (fd < 0) {
    if (errno == ENOENT) return ReadResult{};  // kMissing
    // Any other open error (ELOOP: a symlink, never followed; EACCES, EIO, EMFILE ...) is an
    // error, not corruption: the path is left as it is (vLLM removes a block only on a proven
    // short read; a passing fault must not become data loss).
    return Errno("open", name, errno);
  }
  return ReadOpened(&dir, nullptr, fd, name, data, n, direct, opts);
}

Result<std::optional<ReadResult>> ReadBlockFileVerified(const Dir& base, std::string_view dir1,
                                                        std::string_view dir2,
                                                        const std::string& name, void* data,
                                                        size_t n, const ReadOptions& opts) {
  if (opts.checksum != ChecksumStore::kXattr) return std::optional<ReadResult>();
  std::string rel;
  rel.reserve(dir1.size() + dir2.size() + name.size() + 2);
  rel.append(dir1).append(1, '/').append(dir2).append(1, '/').append(name);
  const int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  const bool direct = opts.o_direct && Aligned(data, n);
  int fd = OpenBeneath(base.fd(), rel.c_str(), flags | (direct ? O_DIRECT : 0));
  if (fd < 0 && direct && errno == EINVAL) fd = OpenBeneath(base.fd(), rel.c_str(), flags);
  if (fd < 0) {
    // No symlink was met (that is ELOOP), so ENOENT is a plain miss; anything else (a symlink
    // somewhere, no openat2, EACCES ...) goes through the per-level walk, which names it.
    if (errno == ENOENT) return std::optional<ReadResult>(ReadResult{});
    return std::optional<ReadResult>();
  }
  auto open_dir = [&]() -> Result<Dir> {
    return OpenBlockDir(base, dir1, dir2, false, 0700, "block directory");
  };
  KVO_ASSIGN_OR_RETURN(ReadResult r,
                       ReadOpened(nullptr, open_dir, fd, name, data, n, direct, opts));
  return std::optional<ReadResult>(std::move(r));
}

Result<ReadResult> VerifyFile(const Dir& dir, const std::string& name, const VerifyOptions& opts) {
  int fd = ::openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  ReadResult out;
  if (fd < 0) {
    if (errno == ENOENT) return out;
    if (errno == ELOOP) {
      out.outcome = ReadOutcome::kCorrupt;
      out.detail = "symlink (not followed)";
      if (opts.remove_corrupt) ::unlinkat(dir.fd(), name.c_str(), 0);
      return out;
    }
    return Errno("open", name, errno);
  }
  Fd file(fd);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return Errno("stat", name, errno);
  if (!S_ISREG(st.st_mode)) {
    out.outcome = ReadOutcome::kCorrupt;
    out.detail = "not a regular file";
    return out;
  }
  auto corrupt = [&](ReadResult r) {
    if (opts.remove_corrupt) RemoveIfSame(dir, name, st);
    r.outcome = ReadOutcome::kCorrupt;
    return r;
  };
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (opts.expected_size != 0 && size != opts.expected_size) {
    out.detail = "size " + std::to_string(size) + ", the namespace's blocks are " +
                 std::to_string(opts.expected_size) + " bytes";
    return corrupt(std::move(out));
  }
  std::optional<IntegrityRecord> rec;
  KVO_ASSIGN_OR_RETURN(ReadResult checked, CheckRecord(dir, file.get(), name, size, opts.checksum,
                                                       false, opts.identity, &rec));
  if (checked.outcome == ReadOutcome::kCorrupt) return corrupt(std::move(checked));
  // Hash the body in bounded memory (a block may be large; a hostile one sparse and huge).
  constexpr size_t kChunk = 1 << 20;
  std::unique_ptr<char[]> buf(new char[kChunk]);
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return Status::Internal("verify: out of memory");
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> guard(state, XXH3_freeState);
  XXH3_64bits_reset(state);
  uint64_t done = 0;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, size - done));
    ssize_t r = ::pread(file.get(), buf.get(), want, static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read", name, errno);
    }
    if (r == 0) break;
    XXH3_64bits_update(state, buf.get(), static_cast<size_t>(r));
    done += static_cast<uint64_t>(r);
  }
  if (done != size) {
    checked.detail = "short read: " + std::to_string(done) + " of " + std::to_string(size);
    return corrupt(std::move(checked));
  }
  if (rec.has_value()) {
    if (rec->xxh3 != XXH3_64bits_digest(state)) {
      checked.detail = "checksum mismatch";
      return corrupt(std::move(checked));
    }
    checked.verified = true;
  }
  return checked;
}

Status RemoveBlockFile(const Dir& dir, const std::string& name) {
  if (::unlinkat(dir.fd(), name.c_str(), 0) != 0 && errno != ENOENT) {
    return Errno("remove", name, errno);
  }
  const std::string side = name + kSidecarSuffix;
  if (::unlinkat(dir.fd(), side.c_str(), 0) != 0 && errno != ENOENT) {
    return Errno("remove", side, errno);
  }
  return Status::Ok();
}

Result<Probe> ProbeDir(const Dir& dir, std::string_view what) {
  Probe p;
  const std::string name = ".kvo-probe-" + std::to_string(RandomU63()) + ".tmp";
  int fd = ::openat(dir.fd(), name.c_str(),
                    O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_DIRECT, 0600);
  if (fd >= 0) {
    void* buf = std::aligned_alloc(kDirectAlign, kDirectAlign);
    std::memset(buf, 0, kDirectAlign);
    p.o_direct = ::pwrite(fd, buf, kDirectAlign, 0) == static_cast<ssize_t>(kDirectAlign);
    std::free(buf);
  } else {
    fd = ::openat(dir.fd(), name.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC,
                  0600);
    if (fd < 0) {
      Status s = Errno(std::string(what) + " is not writable: create", name, errno);
      return s;
    }
  }
  p.xattr = ::fsetxattr(fd, kXattrName, "probe", 5, 0) == 0;
  ::close(fd);
  ::unlinkat(dir.fd(), name.c_str(), 0);
  return p;
}

}  // namespace kvo::fs_internal

namespace kvo::fs_internal {
namespace {

struct Listed {
  std::string name;
  struct stat st {};
  bool stat_ok = false;
};

Result<std::vector<Listed>> ListWithStat(const Dir& dir, std::string_view what) {
  int fd = ::dup(dir.fd());
  if (fd < 0) return Errno("dup", what, errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    int err = errno;
    ::close(fd);
    return Errno("list", what, err);
  }
  ::rewinddir(d);
  std::vector<Listed> out;
  while (struct dirent* e = ::readdir(d)) {
    std::string_view n(e->d_name);
    if (n == "." || n == "..") continue;
    Listed l;
    l.name = std::string(n);
    l.stat_ok = ::fstatat(dir.fd(), e->d_name, &l.st, AT_SYMLINK_NOFOLLOW) == 0;
    out.push_back(std::move(l));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(),
            [](const Listed& a, const Listed& b) { return a.name < b.name; });
  return out;
}

double AgeSeconds(const struct stat& st) {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) +
         static_cast<double>(now.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

Status WalkRankDir(
    const Dir& rank,
    const std::function<void(const WalkEntry&, const Dir&, const std::string&)>& fn) {
  KVO_ASSIGN_OR_RETURN(std::vector<Listed> level1, ListWithStat(rank, "rank directory"));
  auto emit_other = [&](const Listed& l, const std::string& rel, const Dir& dir, std::string why) {
    WalkEntry e;
    e.rel_path = rel;
    if (l.stat_ok && S_ISLNK(l.st.st_mode)) {
      e.kind = WalkEntry::Kind::kSymlink;
      e.why = "symlink (not followed)";
    } else {
      e.kind = WalkEntry::Kind::kInvalid;
      e.why = std::move(why);
    }
    fn(e, dir, l.name);
  };
  for (const Listed& l1 : level1) {
    const std::string rel1 = l1.name;
    if (!l1.stat_ok || !S_ISDIR(l1.st.st_mode) || !ParseDir1Name(l1.name)) {
      emit_other(l1, rel1, rank, "not a <3 hex digits> directory");
      continue;
    }
    auto d1 = OpenChildDir(rank, l1.name, false, 0700, "directory");
    if (!d1.ok()) {
      emit_other(l1, rel1, rank, d1.status().ToString());
      continue;
    }
    auto level2 = ListWithStat(*d1, rel1);
    if (!level2.ok()) {
      emit_other(l1, rel1, rank, level2.status().ToString());
      continue;
    }
    for (const Listed& l2 : *level2) {
      const std::string rel2 = rel1 + "/" + l2.name;
      std::string two;
      std::optional<uint32_t> group;
      if (l2.stat_ok && S_ISDIR(l2.st.st_mode)) group = ParseDir2Name(l2.name, &two);
      if (!group) {
        emit_other(l2, rel2, *d1, "not a <2 hex digits>_g<group> directory");
        continue;
      }
      auto d2 = OpenChildDir(*d1, l2.name, false, 0700, "directory");
      if (!d2.ok()) {
        emit_other(l2, rel2, *d1, d2.status().ToString());
        continue;
      }
      auto files = ListWithStat(*d2, rel2);
      if (!files.ok()) {
        emit_other(l2, rel2, *d1, files.status().ToString());
        continue;
      }
      for (const Listed& f : *files) {
        WalkEntry e;
        e.rel_path = rel2 + "/" + f.name;
        if (!f.stat_ok || !S_ISREG(f.st.st_mode)) {
          emit_other(f, e.rel_path, *d2, "not a regular file");
          continue;
        }
        e.size = static_cast<uint64_t>(f.st.st_size);
        e.disk_bytes = static_cast<uint64_t>(f.st.st_blocks) * 512;
        e.age_seconds = AgeSeconds(f.st);
        if (EndsWith(f.name, ".tmp")) {
          e.kind = WalkEntry::Kind::kTemp;
        } else if (EndsWith(f.name, std::string(".bin") + kSidecarSuffix)) {
          e.kind = WalkEntry::Kind::kSidecar;
        } else if (auto hex = ParseBlockFileName(f.name)) {
          if (hex->substr(0, 3) != l1.name || hex->substr(3, 2) != two) {
            e.kind = WalkEntry::Kind::kInvalid;
            e.why = "hash does not belong in this directory";
          } else {
            e.kind = WalkEntry::Kind::kBlock;
            e.key = FsBlockKey{*hex, *group};
          }
        } else {
          e.kind = WalkEntry::Kind::kInvalid;
          e.why = "not <hex>.bin";
        }
        fn(e, *d2, f.name);
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvo::fs_internal

namespace kvo::fs_internal {

Result<std::vector<DirEntry>> ListDirEntries(const Dir& dir, std::string_view what) {
  KVO_ASSIGN_OR_RETURN(std::vector<Listed> listed, ListWithStat(dir, what));
  std::vector<DirEntry> out;
  for (const Listed& l : listed) {
    DirEntry e;
    e.name = l.name;
    if (l.stat_ok) {
      e.is_dir = S_ISDIR(l.st.st_mode);
      e.is_regular = S_ISREG(l.st.st_mode);
      e.is_symlink = S_ISLNK(l.st.st_mode);
      e.size = static_cast<uint64_t>(l.st.st_size);
      e.disk_bytes = static_cast<uint64_t>(l.st.st_blocks) * 512;
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace kvo::fs_internal
