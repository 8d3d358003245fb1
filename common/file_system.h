// FileSystem seam (leveldb Env style): everything kvo writes or reads on disk goes through a
// FileSystem so tests can inject faults. PosixFileSystem is the real one. Implementations are
// thread-safe; the file objects they return are not (one owner at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/status.h"

namespace kvo {

// An append-only file. Append buffers in user space; Flush hands data to the OS; Sync makes it
// durable (fdatasync). Close flushes.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  virtual Status Flush() = 0;
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
  // Bytes in the file including buffered, unflushed bytes.
  virtual uint64_t Size() const = 0;
};

// A file read front to back.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to n bytes into *out (replacing its contents); an empty result means end of file.
  virtual Status Read(size_t n, std::string* out) = 0;
  virtual Status Skip(uint64_t n) = 0;
};

struct FileOptions {
  // Permission bits for newly created files / directories (ARCHITECTURE.md §6: 0600 / 0700).
  uint32_t file_mode = 0600;
  uint32_t dir_mode = 0700;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Opens `path` for appending, creating it (mode file_mode) when missing. The Posix file system
  // opens regular files only (no symlink, FIFO or device: FailedPrecondition naming the path; never
  // blocks on a FIFO); NewSequentialFile too.
  virtual Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path,
                                                                  const FileOptions& opts) = 0;
  virtual Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) = 0;
  // Whole-file convenience read.
  virtual Result<std::string> ReadFile(const std::string& path) = 0;
  // Names (not paths) of the entries of `dir`, excluding "." and "..", sorted.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Creates `dir` and its missing parents (mode dir_mode). Ok when it already exists.
  virtual Status CreateDirs(const std::string& dir, const FileOptions& opts) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  virtual Status Truncate(const std::string& path, uint64_t size) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;
  // fsyncs a directory so that creations, renames and removals in it are durable.
  virtual Status SyncDir(const std::string& dir) = 0;
};

// The process-wide POSIX file system. Never null; never deleted.
FileSystem* DefaultFileSystem();

// Joins two path parts with exactly one '/'.
std::string JoinPath(std::string_view a, std::string_view b);

// A fresh directory $TMPDIR/kvo-<name>-XXXXXX ($TMPDIR unset: /tmp), mode 0700, removed with its
// contents on destruction; path() is empty when it could not be created, and status() then says
// why, naming the path tried and the errno text. For scratch space of tests, benchmarks and the
// demo, not for anything kvo keeps.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(std::string_view name);
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }
  const Status& status() const { return status_; }

 private:
  std::string path_;
  Status status_;
};

}  // namespace kvo
