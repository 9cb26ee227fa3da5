// Snapshots of a rank's block index, served by its indexer.
//
// The indexer applies the published batches in seq order, so a snapshot
// begun between two of them is consistent with the last seq applied (S). The
// index yields it a part at a time (block_index keeps the pre-image of every
// block a live event changes before the snapshot yielded it): raw
// BlockStored batches that the replay bridge encodes in the published
// dialect, each carrying seq S, on its own (lower-priority) thread. The
// bridge asks for the next part when it has streamed the previous one
// (credit), so a slow router costs memory for two parts, not the whole
// snapshot. Parts are small (snapshot_blocks_per_part blocks: a walk of tens
// of µs), so index updates wait little behind them; live publishing never
// waits for them at all (another actor, another thread). One snapshot at a
// time per rank; the others wait in order.
#pragma once

#include "actors/relay/indexer.hpp"

namespace kvs {

/// Blocks per snapshot batch, and batches per part sent to the bridge.
constexpr size_t snapshot_blocks_per_batch = 64;
constexpr size_t snapshot_batches_per_part = 4;

/// A router asked for a snapshot (through the replay bridge that sent it).
void snapshot_requested(indexer_actor::stateful_pointer<indexer_state> self,
                        const snapshot_request& req);

/// The bridge wants the next part of snapshot `c.id`, or cancels it.
void snapshot_credited(indexer_actor::stateful_pointer<indexer_state> self,
                       const snapshot_credit& c);

} // namespace kvs
