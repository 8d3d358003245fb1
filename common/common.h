// The public header of kvo_common: errors, logging, seams (clock, file system, executor).
#pragma once

#include "common/check.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/result.h"
#include "common/status.h"
#include "common/thread_pool.h"
