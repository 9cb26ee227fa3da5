#include "metrics/catalog.hpp"

#include <array>

namespace kvs {

namespace {

constexpr metric_info catalog[] = {
  // -- event relay, label dp_rank ----------------------------------------------
  {"kvsidecar_events_received_total", "Messages received from the engine's KV-event stream"},
  {"kvsidecar_events_accepted_total", "Engine batches accepted into a publisher queue"},
  {"kvsidecar_events_published_total", "Batches published with a sequence number"},
  {"kvsidecar_events_keepalives_total",
   "Empty batches published because the rank was quiet for events.keepalive_interval"},
  {"kvsidecar_events_published_events_total", "Events inside the published batches"},
  {"kvsidecar_events_sent_total", "Batches sent on the PUB socket to routers"},
  {"kvsidecar_events_dropped_total",
   "Batches dropped, by reason: bad_payload (not a batch), queue_full (publisher queue full), "
   "subscriber_hwm (drop episodes: a router's pipe was full, so it missed this batch and "
   "every later one until it drained to its low-water mark: at most one gap per episode, "
   "which the router recovers through replay)"},
  {"kvsidecar_events_invalid_events_total",
   "Single events dropped from a batch (unknown tag or malformed field)"},
  {"kvsidecar_events_gaps_total", "Gaps detected in the engine's sequence numbers"},
  {"kvsidecar_events_refilled_total", "Batches of gaps recovered from the engine's replay"},
  {"kvsidecar_events_lost_total", "Batches of gaps that could not be recovered"},
  {"kvsidecar_events_caught_up_total",
   "Engine batches fetched from the engine's replay at (re)connect: those published before "
   "we subscribed, and those in flight until our subscription reached the engine"},
  {"kvsidecar_events_engine_restarts_total",
   "Restart fences (AllBlocksCleared) published for new engine streams (seq went back, jumped "
   "past the replay buffer, or the stream after a reconnect did not continue the old one); at "
   "most one per events.restart_min_interval, besides the first after each reconnect"},
  {"kvsidecar_events_engine_restarts_coalesced_total",
   "New engine streams seen within events.restart_min_interval of the last fence: no fence of "
   "their own, one owed fence follows when the interval has passed"},
  {"kvsidecar_events_fence_skipped_total",
   "Engine batches whose seq jumped past events.buffer_steps, more than any replay could fill: "
   "a new stream, not counted as lost (one per such batch)"},
  {"kvsidecar_events_ingest_disconnects_total",
   "Engine connection lost or handshake failed (e.g. a frame above ingest_max_message_size)"},
  {"kvsidecar_events_ingest_reconnects_total", "Engine connection established again after a loss"},
  {"kvsidecar_events_seq", "The next sequence number the rank will publish"},
  {"kvsidecar_events_queued", "Batches accepted and not yet on the wire"},
  {"kvsidecar_events_index_blocks", "Blocks the rank holds now (its block index, for snapshots)"},
  {"kvsidecar_events_index_bytes", "Estimated memory of the rank's block index"},
  {"kvsidecar_events_index_refused_total",
   "Blocks not indexed because events.index_max_blocks was reached"},
  {"kvsidecar_events_snapshots_total", "Snapshots served to late routers"},
  {"kvsidecar_events_snapshot_requests_total", "Snapshot requests received on the replay ROUTER"},
  {"kvsidecar_events_subscribers",
   "Distinct topics routers subscribe to on the PUB (XPUB reports each topic once: "
   "0 means no router listens)"},
  {"kvsidecar_events_replay_requests_total",
   "Valid replay and snapshot requests received (= completed + abandoned + refused + streams "
   "+ waiting)"},
  {"kvsidecar_events_replay_rejected_total", "Malformed replay requests ignored"},
  {"kvsidecar_events_replay_refused_total",
   "Valid replay requests refused: events.replay_max_streams streaming and "
   "events.replay_max_waiting waiting (or 16 snapshots streaming); the client hears nothing"},
  {"kvsidecar_events_replay_completed_total", "Replays and snapshots streamed to their end marker"},
  {"kvsidecar_events_replay_batches_total", "Batches streamed to replay clients"},
  {"kvsidecar_events_replay_streams", "Replay streams in progress"},
  {"kvsidecar_events_replay_waiting",
   "Replay requests waiting for a stream (events.replay_max_streams in progress)"},
  {"kvsidecar_events_replay_abandoned_total", "Replay streams given up (client gone)"},
  {"kvsidecar_events_replay_fell_behind_total",
   "Replays ended early: the client read slower than the buffer turned over"},
  {"kvsidecar_events_join_subscribers", "Routers subscribed to the join endpoint"},
  {"kvsidecar_events_joins_total", "Snapshots taken for a router subscribing to the join endpoint"},
  {"kvsidecar_events_join_snapshot_batches_total",
   "Snapshot batches sent on the join endpoint (numbered up to the snapshot's seq)"},
  {"kvsidecar_events_join_snapshot_blocks_total", "Blocks in the join endpoint's snapshots"},
  {"kvsidecar_events_join_sent_total", "Live batches sent on the join endpoint"},
  {"kvsidecar_events_join_dropped_total",
   "Live batches the join endpoint dropped: its router was more than events.hwm behind"},
  {"kvsidecar_events_replay_kept_batches", "Batches kept for replay"},
  {"kvsidecar_events_replay_kept_bytes", "Payload bytes kept for replay"},
  {"kvsidecar_events_payload_pool_bytes",
   "Bytes of large-payload buffers kept for reuse (at most events.buffer_bytes per rank)"},
  {"kvsidecar_events_payloads_reused_total",
   "Engine payloads copied into a reused buffer instead of newly allocated memory"},
  // -- cache server ---------------------------------------------------------------
  {"kvsidecar_cache_l2_prefetches_total", "LOOKUPs that asked the L2 tiers for the rest of the prefix"},
  {"kvsidecar_cache_l2_prefetch_failures_total", "L2 prefetches that failed (answered with the L1 hits)"},
  {"kvsidecar_cache_l2_write_skipped_total",
   "Committed chunks not written to L2 because l2.queue_bytes was full"},
  {"kvsidecar_cache_l2_queued_bytes", "Chunk bytes waiting to be written to L2"},
  {"kvsidecar_cache_reply_drops_total",
   "Replies dropped because the client's queue was at cache.hwm (it stopped reading)"},
  {"kvsidecar_cache_reply_unroutable_total", "Replies to clients that left before the answer"},
  {"kvsidecar_cache_kv_event_subscribers", "subscribe_kv_events streams open"},
  {"kvsidecar_cache_kv_event_log_records", "Records in the subscribe_kv_events replay log"},
  {"kvsidecar_cache_lookups_total", "LOOKUP requests answered by the store"},
  {"kvsidecar_cache_lookup_hit_chunks_total", "Chunks found by lookups, by tier"},
  {"kvsidecar_cache_lookup_miss_chunks_total", "Chunks asked for beyond the hit prefix"},
  {"kvsidecar_cache_chunks", "Chunks held in L1"},
  {"kvsidecar_cache_reserved_chunks", "Chunk slots reserved for stores in progress"},
  {"kvsidecar_cache_l1_used_bytes", "L1 bytes in use (slots of chunks and reservations)"},
  {"kvsidecar_cache_l1_capacity_bytes", "L1 capacity (cache.l1_size)"},
  {"kvsidecar_cache_l1_arenas",
   "L1 arenas open: engine-driven instances writing L1 in place (cache.engine_driven_in_place)"},
  {"kvsidecar_cache_l1_arena_heals_total",
   "faults in an L1 arena whose engine had truncated its object, healed (that engine's chunks "
   "read as zeros)"},
  {"kvsidecar_cache_l1_usage_ratio", "L1 used / capacity"},
  {"kvsidecar_cache_locks", "Outstanding read locks on chunks"},
  {"kvsidecar_cache_locked_chunks", "Chunks with at least one read lock"},
  {"kvsidecar_cache_lock_sessions", "Request sessions holding read locks"},
  {"kvsidecar_cache_sessions", "Live request sessions in the engine bridge"},
  {"kvsidecar_cache_sessions_started_total", "Request sessions started"},
  {"kvsidecar_cache_sessions_ended_total", "Request sessions ended"},
  {"kvsidecar_cache_stored_chunks_total", "Chunks committed to L1"},
  {"kvsidecar_cache_evictions_total", "Chunks evicted, by tier"},
  {"kvsidecar_cache_salt_bytes",
   "L1 bytes per cache_salt (the 16 largest salts; the rest summed under salt=\"_other\")"},
  {"kvsidecar_cache_salt_chunks", "L1 chunks per cache_salt (the same salts)"},
  {"kvsidecar_cache_salt_limit_bytes", "The quota of those salts that have one"},
  {"kvsidecar_cache_quota_salts", "cache_salts with a quota ([cache.quotas], PUT /quota)"},
  {"kvsidecar_cache_quota_evictions_total",
   "Chunks evicted to keep a cache_salt within its quota (cache.quota_mode = isolated)"},
  {"kvsidecar_cache_store_refused_total", "STOREs refused (no space, all chunks locked)"},
  {"kvsidecar_cache_reannounced_chunks_total",
   "L1 chunks announced again (BlockStored CPU) after an AllBlocksCleared on cache.events_rank"},
  {"kvsidecar_cache_events_dropped_total",
   "BlockStored/BlockRemoved announcements dropped (publisher queue full)"},
  {"kvsidecar_cache_instances", "Registered engine instances"},
  {"kvsidecar_cache_registrations_total", "KV-cache registrations accepted"},
  {"kvsidecar_cache_registration_failures_total", "KV-cache registrations refused"},
  {"kvsidecar_cache_instances_reaped_total", "Instances reaped after heartbeat_timeout"},
  {"kvsidecar_cache_instances_released_total",
   "Instances dropped at once because the connection that registered them ended"},
  {"kvsidecar_cache_connections_ended_total",
   "Engine connections (ZeroMQ or gRPC) seen to end; each frees the instances it registered"},
  {"kvsidecar_cache_requests_total", "LMCache MP requests received"},
  {"kvsidecar_cache_grpc_requests_total", "Of the LMCache MP requests, those that came over gRPC"},
  {"kvsidecar_grpc_calls_total", "gRPC calls accepted on cache.grpc_endpoint"},
  {"kvsidecar_grpc_replies_total", "gRPC calls answered OK (a stream: each batch written)"},
  {"kvsidecar_grpc_failed_total", "gRPC calls answered FAILED_PRECONDITION (the server's failure reply)"},
  {"kvsidecar_grpc_bad_requests_total",
   "gRPC calls answered INVALID_ARGUMENT (a message that did not parse, a field out of range)"},
  {"kvsidecar_grpc_unimplemented_total", "gRPC calls to a path outside LMCache's table"},
  {"kvsidecar_grpc_overloaded_total",
   "gRPC calls refused RESOURCE_EXHAUSTED (more than cache.hwm unanswered of one client)"},
  {"kvsidecar_grpc_cancelled_total", "gRPC calls whose client went away before the answer"},
  {"kvsidecar_grpc_kv_event_streams", "Open SubscribeKvEvents streams"},
  {"kvsidecar_cache_replies_total", "LMCache MP replies sent"},
  {"kvsidecar_cache_rejected_requests_total", "Malformed requests rejected, by kind"},
  {"kvsidecar_cache_request_duration_seconds",
   "Request to reply time in the sidecar, by op (WAIT_PREFETCH_STATUS includes its wait)"},
  {"kvsidecar_cache_copies_total", "Copies between engine memory and L1"},
  {"kvsidecar_cache_engine_driven_instances",
   "Instances registered in LMCache's engine-driven mode (each with a staging pool)"},
  {"kvsidecar_cache_staging_free_slots", "Free chunk slots of all engine-driven staging pools"},
  {"kvsidecar_cache_staging_copies_total",
   "Copies between engine-driven staging pools and L1 (commit_store, prepare_retrieve)"},
  {"kvsidecar_cache_copy_failures_total", "Copies that failed"},
  {"kvsidecar_cache_copies_inflight", "Asynchronous copies not yet complete"},
  {"kvsidecar_cache_store_bytes_total", "Bytes copied from engine memory into L1 (STORE)"},
  {"kvsidecar_cache_retrieve_bytes_total", "Bytes copied from L1 into engine memory (RETRIEVE)"},
  {"kvsidecar_cache_copy_seconds_total",
   "Time copies took, submit to completion, by op (bytes_total / this = GB/s)"},
  {"kvsidecar_cache_copy_throughput_gbps", "Per-copy throughput in GB/s, by op"},
  // -- process -----------------------------------------------------------------------
  {"kvsidecar_up", "1 while the process runs"},
  {"kvsidecar_ready", "1 while /readyz answers 200"},
  {"kvsidecar_uptime_seconds", "Seconds since the process started"},
  {"kvsidecar_build_info", "The version, as a label"},
  {"kvsidecar_http_connections", "Connections open on the HTTP port (probes, scrapes)"},
  {"kvsidecar_http_requests_total", "HTTP requests answered, by status code"},
  {"kvsidecar_http_closed_total",
   "HTTP connections the server closed or refused, by reason: head_timeout (no whole request "
   "head in 5 s), write_timeout (answer not read in 10 s), evicted (the oldest, past 256 "
   "connections), bad_request (a 400 or 431)"},
  {"kvsidecar_coordinator_calls_failed_total",
   "Membership calls to the LMCache coordinator that failed (no answer in 2 s, an answer over "
   "1 MiB, not HTTP, a non-2xx, bad JSON), by call: register, heartbeat, deregister"},
  {"kvsidecar_scrape_timeouts_total",
   "Scrapes an actor did not answer in time (its last values were exported), by actor "
   "(its log label without the id: publisher[dp=0], l2)"},
  {"kvsidecar_connections",
   "Peers connected to a listening ZeroMQ socket, by socket (events.endpoint dp=0, "
   "events.replay_endpoint dp=0, cache.endpoint, ...)"},
  {"kvsidecar_connections_refused_total",
   "Handshakes refused on a listening ZeroMQ socket because events.max_connections / "
   "cache.max_connections peers were connected, by socket"},
  // -- L2 tiers (the l2 actor) --------------------------------------------------
  {"kvsidecar_l2_written_chunks_total", "Chunks written through to the L2 tiers"},
  {"kvsidecar_l2_fetched_chunks_total", "Chunks fetched from an L2 tier for a prefetch, by tier"},
  {"kvsidecar_l2_events_dropped_total",
   "L2's BlockStored/BlockRemoved dropped (publisher queue full)"},
  {"kvsidecar_l2_reannounced_chunks_total",
   "L2 chunks announced again after an AllBlocksCleared (one per medium)"},
  {"kvsidecar_coordinator_events_queued_total",
   "L2 objects written, dropped or read back, queued for the LMCache coordinator"},
  {"kvsidecar_coordinator_events_dropped_total",
   "Coordinator events dropped because the queue held coordinator.event_queue_max"},
  {"kvsidecar_coordinator_events_posted_total", "Coordinator events the coordinator accepted"},
  {"kvsidecar_coordinator_event_batches_posted_total",
   "CacheEventBatches (store, delete, access) in the accepted POST /events"},
  {"kvsidecar_coordinator_event_posts_failed_total",
   "POST /events that failed (no answer in 2 s, over 1 MiB, not HTTP, a non-2xx)"},
  {"kvsidecar_coordinator_events_lost_total", "Events the failed POST /events carried"},
  {"kvsidecar_l2_objects", "Objects an L2 tier holds, by tier"},
  {"kvsidecar_l2_bytes", "Bytes an L2 tier holds (headers included), by tier"},
  {"kvsidecar_l2_puts_total", "Objects written to an L2 tier, by tier"},
  {"kvsidecar_l2_hits_total", "Objects found in an L2 tier, by tier"},
  {"kvsidecar_l2_misses_total", "Objects asked of an L2 tier and not there, by tier"},
  {"kvsidecar_l2_adopted_objects_total",
   "l2.format = \"lmcache\": files another writer (an LMCache node, another sidecar) put in the "
   "shared folder, found and indexed"},
  {"kvsidecar_l2_evictions_total", "Objects an L2 tier evicted (LRU within its size), by tier"},
  {"kvsidecar_l2_quota_evicted_objects_total",
   "Objects the L2 quota passes erased (l2.quota_mode = \"isolated\": a salt over "
   "watermark x its limit, or without a quota)"},
  {"kvsidecar_l2_errors_total",
   "L2 faults by kind: disk_no_space, disk_io, disk_rejected (a file failed its header check), "
   "disk_wrong_size (l2.format = lmcache: a file not of its layout's length, left alone), "
   "redis (error replies, I/O), redis_unreachable (keys whose node is down), redis_rejected "
   "(values failing their header check), redis_connect (failed connections)"},
  {"process_resident_memory_bytes", "Resident set size of the process"},
  {"process_start_time_seconds", "Start time of the process, seconds since the Unix epoch"},
};

} // namespace

const metric_info* find_metric(std::string_view name) {
  for (auto& m : catalog)
    if (m.name == name)
      return &m;
  return nullptr;
}

} // namespace kvs
