// One line of a `kvo manager ops` script (tools/manager_command.cc): a JSON object naming a manager
// API call and its keys, run against an OffloadManager, answered with one JSON line. A library
// function so that the command and the fuzzer (tests/fuzz/manager_ops_fuzz.cc) run the same parser.
//
// Input: {"op": "lookup"|"prepare_store"|"complete_store"|"prepare_load"|"complete_load"|"touch"|
// "take_events", "keys": ["<block hash hex>", ...], "success": true} (keys are group 0; success
// only for complete_store, default true).
// Output:
//   lookup         {"result":"HIT"|"MISS"|"HIT_PENDING"} (one key), {"results":[...]} (several)
//   prepare_store  {"result":null} when it cannot store, else
//                  {"keys_to_store":[...],"slots":[...],"evicted":[...]}
//   prepare_load   {"slots":[...]}
//   take_events    {"events":[{"keys":[...],"medium":"CPU","removed":false}, ...]}
//   others         {}
// An out-of-contract call (loading a missing key, completing an unknown one) answers
// {"error":"..."}; a bad line answers {"error":"line N: ..."} and is reported as bad.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "manager/offload_manager.h"

namespace kvo {

// Runs script line `number` (1-based, for error messages) against `manager`. nullopt for a blank
// line (only spaces, tabs and '\r'); else the answer, one line of JSON without a newline. Sets
// *bad_line when the line is not valid JSON or not a valid call (never clears it).
std::optional<std::string> RunOpsScriptLine(OffloadManager& manager, std::string_view text,
                                            size_t number, bool* bad_line);

}  // namespace kvo
