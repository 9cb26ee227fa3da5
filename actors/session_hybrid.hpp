// Engine-driven transfers of hybrid-KV models (LMCache 0.5.7 workers that
// registered more than one group: sliding-window, recurrent or indexer
// groups beside full attention). Their chunks travel through the instance's
// staging pool, a slot per group's chunk, or inline in the messages
// (lmcache_wire/tensor_envelope.hpp's grouped envelope); each group's part
// of a chunk is its own L1 entry (cache/group_lookup.hpp):
//
//   prepare_store:    check skipped_chunks; inline, nothing is held (the data
//                     comes with the commit); over a staging pool, reserve each
//                     group's chunks (not skipped, not stored) and hand out a
//                     slot of the group's size for each (LMCache's
//                     ShmTransferStrategy: slots, chunk_indices, group_ids)
//   commit_store:     inline, check every group's tensors against its layout,
//                     then per group reserve -> copy -> commit; over the pool,
//                     copy each slot into its L1 chunk -> commit; all or nothing
//   prepare_retrieve: per group acquire its in-window suffix of the range
//                     (the whole range for full attention), then encode it
//                     inline or copy it into slots -> release the pins;
//                     a miss unless every group has every chunk of it
#pragma once

#include "actors/session_steps.hpp"

namespace kvs::session_steps {

/// prepare_store of chunks [begin, end) of a hybrid instance (`taken`
/// carries its groups and no slot; the slots are taken here, one per
/// group's chunk):
/// inline, marks `key` as prepared and answers; over the staging pool,
/// reserves each group's chunks and answers with a slot for each.
void prepare_store_groups(self_ptr self, const mp_call& call, const gpu_stage_taken& taken,
                          const session_state::staged_key& key, size_t begin, size_t end);

/// commit_store of a prepared hybrid store (`t`): answers True once every
/// chunk the data carries is committed, False (nothing committed) otherwise.
void commit_store_groups(self_ptr self, const mp_call& call, staged_transfer t);

/// prepare_retrieve of chunks [begin, end) of a hybrid instance; answers
/// and then calls prepared().
void prepare_retrieve_groups(self_ptr self, const mp_call& call, const gpu_stage_taken& taken,
                             size_t begin, size_t end);

} // namespace kvs::session_steps
