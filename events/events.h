// The public header of kvo_events: event values, the msgpack codec, block hashes, the journal and
// the ZeroMQ publisher/subscriber.
#pragma once

#include "events/block_hash.h"
#include "events/codec.h"
#include "events/event.h"
#include "events/event_fold.h"
#include "events/event_json.h"
#include "events/journal.h"
#include "events/kv_events_config.h"
#include "events/zmq_publisher.h"
#include "events/zmq_subscriber.h"
