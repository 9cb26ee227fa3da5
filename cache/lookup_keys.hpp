// lookup_keys: what a lookup of a token prefix asks the store for, built in
// one place for the sessions (LMCache's LOOKUP, STORE, RETRIEVE and the
// engine-driven ops) and the HTTP API (prefetches, checksums): kvsidecar's
// chunk hashes and, with l2.format = "lmcache", LMCache's object names of
// those chunks and the tokens they cover (store_lookup's fields).
//
// Tokens come as the engine's uint32 ids (a session's key) or as the HTTP
// API's integers (int64: a token outside uint32 ends LMCache's names, as
// it ends LMCache's keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvs {

/// Hashes of the full chunks among chunks [0, n_chunks) of `tokens`
/// (prefix-chained from `seed`: cache/chunk_hash.hpp).
std::vector<uint64_t> prefix_chunk_hashes(const int64_t* tokens, size_t n, size_t chunk_size,
                                          size_t n_chunks, uint64_t seed);
std::vector<uint64_t> prefix_chunk_hashes(const uint32_t* tokens, size_t n, size_t chunk_size,
                                          size_t n_chunks, uint64_t seed);

/// LMCache's chunk hashes (its object names) of chunks [0, n_chunks),
/// fewer past a token outside uint32.
std::vector<std::string> prefix_l2_names(const int64_t* tokens, size_t n, size_t chunk_size,
                                         size_t n_chunks);
std::vector<std::string> prefix_l2_names(const uint32_t* tokens, size_t n, size_t chunk_size,
                                         size_t n_chunks);

/// The first min(n, n_tokens) tokens as LMCache's keys carry them
/// (store_lookup::tokens); every one of them must fit uint32.
std::shared_ptr<const std::vector<uint32_t>> prefix_l2_tokens(const int64_t* tokens, size_t n,
                                                              size_t n_tokens);
std::shared_ptr<const std::vector<uint32_t>> prefix_l2_tokens(const uint32_t* tokens, size_t n,
                                                              size_t n_tokens);

} // namespace kvs
