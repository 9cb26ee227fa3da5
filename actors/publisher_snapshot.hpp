// Snapshots of a rank's block index, served by its publisher.
//
// The publisher assigns the seq and applies every batch to the index in the
// same handler, so a snapshot begun between two batches is consistent with
// the last seq published (S = next_seq - 1). The index yields it a part at a
// time (block_index keeps the pre-image of every block a live event changes
// before the snapshot yielded it), each part encoded in the published
// dialect as BlockStored batches carrying seq S. The replay bridge asks for
// the next part when it has streamed the previous one (credit), so a slow
// router costs memory for two parts, not the whole snapshot, and live
// batches run between parts. One snapshot at a time per rank; the others
// wait in order.
#pragma once

#include "actors/publisher.hpp"

namespace kvs {

/// Blocks per snapshot batch, and batches per part sent to the bridge.
constexpr size_t snapshot_blocks_per_batch = 64;
constexpr size_t snapshot_batches_per_part = 4;

/// A router asked for a snapshot (through the replay bridge that sent it).
void snapshot_requested(publisher_actor::stateful_pointer<publisher_state> self,
                        const snapshot_request& req);

/// The bridge wants the next part of snapshot `c.id`, or cancels it.
void snapshot_credited(publisher_actor::stateful_pointer<publisher_state> self,
                       const snapshot_credit& c);

} // namespace kvs
