// The public header of kvo_transfer: asynchronous data movement between the engine's KV cache,
// the CPU tier's host rows (TransferEngine; host engine here, CUDA engine in transfer/cuda) and
// the file-system tier (FsBlockStore, vLLM's on-disk layout plus kvo's integrity checks), all
// under one job contract (transfer/job.h).
#pragma once

#include "transfer/fs_block_store.h"
#include "transfer/fs_inspect.h"
#include "transfer/fs_namespace.h"
#include "transfer/job.h"
#include "transfer/kv_layout.h"
#include "transfer/staging_plan.h"
#include "transfer/transfer_engine.h"
