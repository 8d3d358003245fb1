// The disk fault tests' shared pieces (disk_faults_test.cc, disk_mount_faults_test.cc): host rows
// filled from seeds, file-tier options and keys, one job run with a 30 s bound, FIFO release.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/seeded_rows.h"
#include "transfer/fs_block_store.h"

namespace kvo::disk_faults {

inline constexpr uint64_t kRow = 8192;

struct Rows : kvo::testing::SeededRows {
  explicit Rows(uint64_t n, uint64_t row = kRow) : SeededRows(n, row) {}
};

inline FsBlockStoreOptions TierOptions(const std::string& root,
                                       const std::string& model = "fault-model") {
  FsBlockStoreOptions o;
  o.root_dir = root;
  o.fields.model_name = model;
  o.n_read_threads = 2;
  o.n_write_threads = 2;
  return o;
}

inline FsBlockKey Key(uint64_t i, uint32_t group = 0) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>((i + 1) * 0x9E3779B97F4A7C15ull));
  return FsBlockKey{buf, group};
}

// Runs one job; a job that does not finish within 30 s fails (the FIFOs planted by the attacks
// are released by the caller's `release`, so a hang becomes a failure, not a stuck test).
inline std::optional<FsJobResult> RunJob(FsBlockStore& tier, bool store,
                                         std::vector<FsBlockKey> keys, std::vector<int64_t> slots,
                                         const std::function<void()>& release = nullptr) {
  auto id = store ? tier.SubmitStore(std::move(keys), std::move(slots))
                  : tier.SubmitLoad(std::move(keys), std::move(slots));
  if (!id.ok()) {
    ADD_FAILURE() << id.status().ToString();
    return std::nullopt;
  }
  auto done = std::async(std::launch::async, [&] { return tier.Wait(*id); });
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    ADD_FAILURE() << "a file-tier job did not finish in 30 s";
    if (release) release();
  }
  if (!done.get().ok()) return std::nullopt;
  std::vector<FsJobResult> out;
  tier.TakeFinished(&out);
  if (out.size() != 1) return std::nullopt;
  return std::move(out[0]);
}

// Opening the other end of a FIFO releases an open blocked on it.
inline void ReleaseFifo(const std::string& path) {
  for (int flags : {O_WRONLY | O_NONBLOCK, O_RDONLY | O_NONBLOCK}) {
    int fd = ::open(path.c_str(), flags);
    if (fd >= 0) ::close(fd);
  }
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace kvo::disk_faults
