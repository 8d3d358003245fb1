#include "tests/testing/fault_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kvo::testing {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

bool LongFaultRun() {
  const char* mode = std::getenv("KVO_FAULTS");
  return mode != nullptr && std::string(mode) == "long";
}

int FaultTrials(int quick, int long_run) { return LongFaultRun() ? long_run : quick; }

void ReportFault(const FaultRecord& r) {
  std::printf("[ fault ] %s | %s | trials=%lld failures=%lld seed=%llu | %s%s%s\n", r.area.c_str(),
              r.fault.c_str(), static_cast<long long>(r.trials), static_cast<long long>(r.failures),
              static_cast<unsigned long long>(r.seed), r.checked.c_str(),
              r.figures.empty() ? "" : " | ", r.figures.c_str());
  const char* dir = std::getenv("KVO_FAULT_REPORT_DIR");
  if (dir == nullptr || *dir == '\0') return;
  std::string line =
      "{\"area\":" + JsonString(r.area) + ",\"fault\":" + JsonString(r.fault) +
      ",\"trials\":" + std::to_string(r.trials) + ",\"checked\":" + JsonString(r.checked) +
      ",\"failures\":" + std::to_string(r.failures) + ",\"seed\":" + std::to_string(r.seed) +
      ",\"figures\":" + JsonString(r.figures) +
      ",\"mode\":" + JsonString(LongFaultRun() ? "long" : "quick") + "}\n";
  std::string path = std::string(dir) + "/faults.jsonl";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  // One write(2) per record: appends of a line this size do not interleave.
  ssize_t n = ::write(fd, line.data(), line.size());
  (void)n;
  ::close(fd);
}

}  // namespace kvo::testing
