#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace kvo {
namespace {

Status ErrnoStatus(std::string_view what, const std::string& path, int err) {
  std::string m(what);
  m += " '" + path + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status::OutOfSpace(std::move(m));
  if (err == ENOENT) return Status::NotFound(std::move(m));
  return Status::IOError(std::move(m));
}

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

// Opens `path` (O_NOFOLLOW) and keeps it only when it is a regular file. The open itself is
// non-blocking, so that a FIFO (or a device) planted under a file's name is an error naming the
// path instead of a hang: opening a FIFO blocks until a writer (or reader) appears.
Result<int> OpenRegular(const std::string& path, int flags, mode_t mode, std::string_view what) {
  int fd = ::open(path.c_str(), flags | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return Status::FailedPrecondition(std::string(what) + " '" + path +
                                        "': is a symlink; not followed");
    }
    if (err == ENXIO) {  // O_WRONLY|O_NONBLOCK on a FIFO without a reader
      return Status::FailedPrecondition(std::string(what) + " '" + path +
                                        "': is a FIFO, not a regular file; not opened");
    }
    return ErrnoStatus(what, path, err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::FailedPrecondition(std::string(what) + " '" + path + "': is " +
                                      FileKind(st.st_mode) + ", not a regular file; not opened");
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("fcntl", path, err);
  }
  return fd;
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) Close().IgnoreError();
  }

  Status Append(std::string_view data) override {
    if (fd_ < 0) return Status::FailedPrecondition("append to closed file '" + path_ + "'");
    size_ += data.size();
    if (buf_.size() + data.size() <= kBufferSize) {
      buf_.append(data);
      return Status::Ok();
    }
    KVO_RETURN_IF_ERROR(Flush());
    if (data.size() >= kBufferSize) return WriteAll(data);
    buf_.append(data);
    return Status::Ok();
  }

  Status Flush() override {
    if (buf_.empty()) return Status::Ok();
    Status s = WriteAll(buf_);
    buf_.clear();
    return s;
  }

  Status Sync() override {
    KVO_RETURN_IF_ERROR(Flush());
    if (::fdatasync(fd_) != 0) return ErrnoStatus("fdatasync", path_, errno);
    return Status::Ok();
  }

  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    Status s = Flush();
    if (::close(fd_) != 0 && s.ok()) s = ErrnoStatus("close", path_, errno);
    fd_ = -1;
    return s;
  }

  uint64_t Size() const override { return size_; }

 private:
  static constexpr size_t kBufferSize = 1 << 16;

  Status WriteAll(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return Status::Ok();
  }

  std::string path_;
  int fd_;
  uint64_t size_;
  std::string buf_;
};

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { ::close(fd_); }

  Status Read(size_t n, std::string* out) override {
    out->resize(n);
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::read(fd_, out->data() + got, n - got);
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("read", path_, errno);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    out->resize(got);
    return Status::Ok();
  }

  Status Skip(uint64_t n) override {
    if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) return ErrnoStatus("seek", path_, errno);
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path,
                                                          const FileOptions& opts) override {
    KVO_ASSIGN_OR_RETURN(int fd,
                         OpenRegular(path, O_WRONLY | O_CREAT | O_APPEND,
                                     static_cast<mode_t>(opts.file_mode), "open for append"));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("stat", path, err);
    }
    return std::unique_ptr<WritableFile>(
        new PosixWritableFile(path, fd, static_cast<uint64_t>(st.st_size)));
  }

  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    KVO_ASSIGN_OR_RETURN(int fd, OpenRegular(path, O_RDONLY, 0, "open for read"));
    return std::unique_ptr<SequentialFile>(new PosixSequentialFile(path, fd));
  }

  Result<std::string> ReadFile(const std::string& path) override {
    KVO_ASSIGN_OR_RETURN(auto file, NewSequentialFile(path));
    std::string all, chunk;
    while (true) {
      KVO_RETURN_IF_ERROR(file->Read(1 << 20, &chunk));
      if (chunk.empty()) break;
      all += chunk;
    }
    return all;
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus("list directory", dir, errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      std::string_view n(e->d_name);
      if (n == "." || n == "..") continue;
      names.emplace_back(n);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDirs(const std::string& dir, const FileOptions& opts) override {
    if (dir.empty()) return Status::InvalidArgument("empty directory path");
    std::string partial;
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      partial = dir.substr(0, pos);
      if (partial.empty()) continue;
      if (::mkdir(partial.c_str(), static_cast<mode_t>(opts.dir_mode)) != 0 && errno != EEXIST) {
        return ErrnoStatus("create directory", partial, errno);
      }
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus("stat", dir, errno);
    if (!S_ISDIR(st.st_mode)) return Status::IOError("'" + dir + "' exists and is not a directory");
    return Status::Ok();
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("stat", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  bool Exists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  Status Truncate(const std::string& path, uint64_t size) override {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) {
      return ErrnoStatus("truncate", path, errno);
    }
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus("rename", from, errno);
    return Status::Ok();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus("remove", path, errno);
    return Status::Ok();
  }

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open directory", dir, errno);
    Status s;
    if (::fsync(fd) != 0) s = ErrnoStatus("fsync directory", dir, errno);
    ::close(fd);
    return s;
  }
};

}  // namespace

FileSystem* DefaultFileSystem() {
  static PosixFileSystem fs;
  return &fs;
}

std::string JoinPath(std::string_view a, std::string_view b) {
  std::string out(a);
  while (!out.empty() && out.back() == '/') out.pop_back();
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out += '/';
  out += b;
  return out;
}

ScopedTempDir::ScopedTempDir(std::string_view name) {
  const char* env = std::getenv("TMPDIR");
  const std::string base = env != nullptr && *env != '\0' ? env : "/tmp";
  std::string tmpl = base + "/kvo-" + std::string(name) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) != nullptr) {
    path_ = tmpl;
  } else {
    const int err = errno;
    status_ = ErrnoStatus(std::string("cannot create a temp dir under ") +
                              (env != nullptr && *env != '\0' ? "$TMPDIR" : "/tmp") + ": mkdtemp",
                          tmpl, err);
  }
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

}  // namespace kvo
