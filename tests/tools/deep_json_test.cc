// Every command that reads JSON, given a value nested 10^5 deep where a scalar is expected (issue
// 10 item 1): before, each error message dump()ed the value and the recursion overflowed the
// stack (SIGSEGV); now each refuses the document with an error naming the nesting limit, in a
// bounded message, through the real `kvo` binary.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

std::string Deep(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// The command ran to an exit code (no signal), said why, and did not echo the document.
void ExpectRefused(const std::vector<std::string>& argv, const char* needle = "nested deeper") {
  testing::CommandResult r = testing::RunCommand(argv, std::chrono::seconds(60));
  const std::string all = r.out + r.err;
  EXPECT_NE(r.code, -1) << argv[1] << " " << argv[2] << " crashed: " << r.err.substr(0, 2000);
  EXPECT_NE(all.find(needle), std::string::npos) << argv[1] << " " << argv[2] << ": " << all;
  EXPECT_LT(all.size(), 4096u) << argv[1] << " " << argv[2] << " echoed its input";
}

TEST(DeepJsonTest, KvEventsConfig) {
  testing::TempDir dir;
  WriteFile(dir.path() + "/in.jsonl", "");
  // One argument is at most 128 KiB (MAX_ARG_STRLEN): 60 000 levels.
  ExpectRefused({KVO_BINARY, "events", "publish", "--kv-events-config",
                 "{\"enable_kv_cache_events\": true, \"topic\": " + Deep(60000) + "}", "--input",
                 dir.path() + "/in.jsonl"});
}

TEST(DeepJsonTest, IndexServeConfig) {
  testing::TempDir dir;
  WriteFile(dir.path() + "/indexer.json", "{\"max_query_tokens\": " + Deep(100000) + "}");
  ExpectRefused({KVO_BINARY, "index", "serve", "--db", dir.path() + "/index.sqlite", "--config",
                 dir.path() + "/indexer.json", "--http", "127.0.0.1:0"});
}

TEST(DeepJsonTest, PlanTrace) {
  testing::TempDir dir;
  WriteFile(dir.path() + "/trace.jsonl",
            "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1, " +
                Deep(100000) + "]}\n");
  ExpectRefused({KVO_BINARY, "plan", "--trace", dir.path() + "/trace.jsonl", "--block-tokens",
                 "512", "--capacity-tokens", "1e6", "--policy", "lru"});
}

TEST(DeepJsonTest, ManagerOps) {
  testing::TempDir dir;
  WriteFile(dir.path() + "/ops.jsonl", "{\"op\": \"lookup\", \"keys\": [" + Deep(100000) + "]}\n");
  ExpectRefused({KVO_BINARY, "manager", "ops", "--num-blocks", "8", "--policy", "lru", "--ops",
                 dir.path() + "/ops.jsonl"});
}

TEST(DeepJsonTest, FsScanConfigJson) {
  testing::TempDir dir;
  const std::string root = dir.path() + "/root";
  ASSERT_EQ(::mkdir(root.c_str(), 0700), 0);
  const std::string ns = root + "/model_0123456789ab";
  ASSERT_EQ(::mkdir(ns.c_str(), 0700), 0);
  WriteFile(ns + "/config.json", "{\"model_name\": \"m\", \"x\": " + Deep(100000) + "}");
  // The namespace is reported as not matching its digest; the scan itself completes.
  ExpectRefused({KVO_BINARY, "fs", "scan", "--root-dir", root}, "do not hash to the name's digest");
}

}  // namespace
}  // namespace kvo
