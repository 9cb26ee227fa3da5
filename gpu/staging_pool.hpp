// The transfer buffers of one engine-driven instance (LMCache's
// engine_driven mode: prepare_store / commit_store / prepare_retrieve /
// commit_retrieve). In that mode the engine copies its own pages: it maps a
// shared-memory object the server names in the registration reply, gathers
// a chunk into the slot prepare_store handed out (or scatters the one
// prepare_retrieve filled), and commits. LMCache hands out its whole L1
// pool for that; kvsidecar gives each instance an object of its own, so no
// client can read or write what another client's requests hold (L1 itself
// is never mapped by a client). The sidecar copies between these slots and
// L1 at commit / prepare time.
//
// One object per instance, created here (O_EXCL, mode 0600: only the
// sidecar's user, or the peer's user when the peer's uid is known and the
// sidecar may hand it over), its pages reserved up front (posix_fallocate:
// a /dev/shm too small fails the registration, not the engine on its first
// write), cut into `slots` slots of `slot_bytes`. Unlinked and unmapped when
// the pool is destroyed (unregister, reap, re-register, shutdown).
//
// Not thread-safe: the gpu_transfer actor owns every pool.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

class staging_pool {
public:
  /// Creates, sizes and maps the object `name` ("/kvsidecar.…"). Error
  /// kinds: "staging" (with the system call and errno text).
  static expected<std::unique_ptr<staging_pool>> create(std::string name, uint64_t slot_bytes,
                                                        uint32_t slots,
                                                        std::optional<uint32_t> owner_uid);
  ~staging_pool();
  staging_pool(const staging_pool&) = delete;
  staging_pool& operator=(const staging_pool&) = delete;

  /// The same slots inside an L1 arena's object (cache/slot_pool.hpp
  /// open_arena with extra_bytes): [origin, origin + slots * slot_bytes)
  /// of the object `name`, which the store created and unlinks. Offsets
  /// (take, give, copy) are offsets in the whole object, as the engine
  /// sees it. Error kinds as create().
  static expected<std::unique_ptr<staging_pool>> open_in(std::string name, uint64_t origin,
                                                         uint64_t slot_bytes, uint32_t slots);

  const std::string& name() const { return name_; }
  /// Where the slots start in the object (0 unless open_in).
  uint64_t origin() const { return origin_; }
  uint64_t size() const { return size_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return static_cast<uint32_t>(taken_.size()); }
  uint32_t free_slots() const { return static_cast<uint32_t>(free_.size()); }

  /// Up to `n` free slots (fewer when fewer are free), as byte offsets.
  std::vector<uint64_t> take(uint32_t n);
  /// Returns slots; an offset that is not a taken slot is an error ("staging")
  /// and nothing is returned then.
  status give(const std::vector<uint64_t>& offsets);
  /// Whether `offset` is a slot currently taken.
  bool is_taken(uint64_t offset) const;
  /// The slot's bytes; `offset` must be a taken slot's.
  uint8_t* at(uint64_t offset) const { return base_ + (offset - origin_); }
  /// Copies one slot's bytes between taken slot offsets[i] and l1[i]
  /// (to_l1: slot -> l1). Every offset is checked before a byte moves; the
  /// copy runs under the SIGBUS guard (gpu/fault_guard.hpp), because the
  /// engine opens the object read-write and may shrink it. Error kind
  /// "staging" (bad offset, sizes) or "shm_truncated". `lengths` (a hybrid
  /// instance's slots hold chunks of their group's size): bytes per slot,
  /// each at most slot_bytes(); empty: slot_bytes() each.
  status copy(const std::vector<uint64_t>& offsets, const std::vector<uint8_t*>& l1,
              bool to_l1, const std::vector<uint64_t>& lengths = {}) const;

private:
  /// `base` maps `size` bytes: `slots` slots of `slot_bytes`, all free.
  staging_pool(std::string name, uint8_t* base, uint64_t size, uint64_t slot_bytes,
               uint32_t slots);
  std::string name_;
  bool owns_name_ = true; ///< unlinks name_ when destroyed (not open_in's)
  uint64_t origin_ = 0;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t slot_bytes_ = 0;
  std::vector<uint32_t> free_;  ///< slot numbers, taken from the back
  std::vector<bool> taken_;
};

/// A fresh, unguessable object name for `instance_id`:
/// "/kvsidecar.<pid>.ed.<instance>.<16 hex>".
std::string staging_pool_name(int64_t instance_id);

/// Unlinks the staging objects of sidecars that are gone: names of the form
/// above whose pid is no live process (a sidecar killed before it could
/// unlink). `shm_dir` is where the kernel shows POSIX shared memory. Returns
/// how many were removed; objects of live processes are left alone.
size_t remove_stale_staging_pools(const std::string& shm_dir = "/dev/shm");

} // namespace kvs
