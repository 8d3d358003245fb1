// CountingFileSystem: the real file system with counted syncs and writes that fail on demand
// (OutOfSpace, as a full disk), for the journal's and the publisher's write-error paths.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/file_system.h"
#include "common/result.h"
#include "common/status.h"

namespace kvo::testing {

// Counts file and directory syncs; while fail_writes is set, appends and flushes of files fail
// (renames, creations and removals still work, as on a full disk).
class CountingFileSystem final : public FileSystem {
 public:
  std::atomic<int> file_syncs{0};
  std::atomic<int> dir_syncs{0};
  std::atomic<bool> fail_writes{false};

  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path,
                                                          const FileOptions& opts) override {
    KVO_ASSIGN_OR_RETURN(auto f, base_->NewAppendableFile(path, opts));
    return std::unique_ptr<WritableFile>(new File(this, std::move(f)));
  }
  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    return base_->NewSequentialFile(path);
  }
  Result<std::string> ReadFile(const std::string& path) override { return base_->ReadFile(path); }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  Status CreateDirs(const std::string& dir, const FileOptions& opts) override {
    return base_->CreateDirs(dir, opts);
  }
  Result<uint64_t> FileSize(const std::string& path) override { return base_->FileSize(path); }
  bool Exists(const std::string& path) override { return base_->Exists(path); }
  Status Truncate(const std::string& path, uint64_t size) override {
    return base_->Truncate(path, size);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  Status Remove(const std::string& path) override { return base_->Remove(path); }
  Status SyncDir(const std::string& dir) override {
    ++dir_syncs;
    return base_->SyncDir(dir);
  }

 private:
  class File final : public WritableFile {
   public:
    File(CountingFileSystem* fs, std::unique_ptr<WritableFile> f) : fs_(fs), f_(std::move(f)) {}
    Status Append(std::string_view data) override {
      if (fs_->fail_writes) return Status::OutOfSpace("injected");
      return f_->Append(data);
    }
    Status Flush() override {
      if (fs_->fail_writes) return Status::OutOfSpace("injected");
      return f_->Flush();
    }
    Status Sync() override {
      ++fs_->file_syncs;
      return f_->Sync();
    }
    Status Close() override { return f_->Close(); }
    uint64_t Size() const override { return f_->Size(); }

   private:
    CountingFileSystem* fs_;
    std::unique_ptr<WritableFile> f_;
  };

  FileSystem* base_ = DefaultFileSystem();
};

}  // namespace kvo::testing
