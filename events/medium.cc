#include "events/medium.h"

namespace kvo {
namespace {

struct MediumEntry {
  Medium medium;
  std::string_view name;
};
constexpr MediumEntry kMediumNames[] = {
    {Medium::kGpu, "GPU"}, {Medium::kCpu, "CPU"}, {Medium::kStorage, "STORAGE"}};

struct ReasonEntry {
  RemovalReason reason;
  std::string_view name;
};
constexpr ReasonEntry kReasonNames[] = {
    {RemovalReason::kNone, ""},           {RemovalReason::kEvicted, "evicted"},
    {RemovalReason::kDemoted, "demoted"}, {RemovalReason::kFailed, "failed"},
    {RemovalReason::kCleared, "cleared"}, {RemovalReason::kRestart, "restart"}};

}  // namespace

std::string_view MediumName(Medium m) {
  for (const MediumEntry& e : kMediumNames) {
    if (e.medium == m) return e.name;
  }
  return "other";
}

Medium MediumFromName(std::string_view name) {
  for (const MediumEntry& e : kMediumNames) {
    if (e.name == name) return e.medium;
  }
  return Medium::kOther;
}

std::string_view RemovalReasonName(RemovalReason r) {
  for (const ReasonEntry& e : kReasonNames) {
    if (e.reason == r) return e.name;
  }
  return "";
}

std::optional<RemovalReason> RemovalReasonFromName(std::string_view name) {
  for (const ReasonEntry& e : kReasonNames) {
    if (e.name == name) return e.reason;
  }
  return std::nullopt;
}

}  // namespace kvo
