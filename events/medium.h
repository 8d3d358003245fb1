// A block's medium (vLLM's `medium` field of BlockStored / BlockRemoved) and the reason it was
// removed (kvo's `reason` extension of BlockRemoved), as types. Modules compare these; the names
// (the one table, events/medium.cc) are used only where an event, a JSON document or a command
// line is written or read. The event structs (events/event.h) keep the wire string, since a
// publisher may send a medium this table does not know and it must round-trip unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvo {

enum class Medium : uint8_t { kGpu, kCpu, kStorage, kOther };

// "GPU" | "CPU" | "STORAGE" (vLLM's names); kOther: "other".
std::string_view MediumName(Medium m);
// The medium a wire name denotes (exact, upper case as on the wire); any other name is kOther.
Medium MediumFromName(std::string_view name);

// kNone: no reason given (a stored event, or a removal that names none).
enum class RemovalReason : uint8_t { kNone, kEvicted, kDemoted, kFailed, kCleared, kRestart };

// "" | "evicted" | "demoted" | "failed" | "cleared" | "restart".
std::string_view RemovalReasonName(RemovalReason r);
// The reason a wire name denotes; nullopt for a name the table does not know.
std::optional<RemovalReason> RemovalReasonFromName(std::string_view name);

}  // namespace kvo
