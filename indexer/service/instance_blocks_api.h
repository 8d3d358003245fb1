// GET /v1/instances/{instance}/blocks: the blocks the index holds for one instance, per medium —
// what `kvo demo` compares with each engine's own state (its consistency verdict). Read-only.
//
//   {instance} matches a source named exactly so (--source/--config) and every stream registered
//   through POST /register under that instance_id (sources "<instance>@<tenant>@<rank>"), also
//   one that has published nothing yet (its sets are empty).
//   -> 200 {"instance", "sources": [name, ...],
//           "blocks": {"GPU": ["<16 hex digits>", ...], "CPU": [...], "DISK": [...], <other>:
//           [...]}, "digest": {medium: "<16 hex digits>"}, "count": {medium: n}}
//      Media as the router API names them (vLLM's STORAGE is DISK); GPU, CPU and DISK are always
//      present. A block is its engine hash in the 64-bit wire form, listed once per medium
//      (whatever groups, ranks or reference counts hold it), sorted ascending.
//      digest = BlockSetDigest (indexer/instance_blocks.h) of that medium's list.
//   -> 404 {"error"} when no source matches; 405 for a method other than GET.
#pragma once

#include "http/http_server.h"
#include "indexer/indexer.h"
#include "indexer/instance_blocks.h"

namespace kvo {

// Serves GET /v1/instances/{instance}/blocks into *out; false (and *out untouched) for any other
// path.
bool ServeInstanceBlocks(const HttpRequest& request, const Indexer& index, HttpResponse* out);

}  // namespace kvo
