#include "cache/lookup_keys.hpp"

#include "cache/chunk_hash.hpp"
#include "cache/lmcache_token_hash.hpp"

#include <algorithm>

namespace kvs {

namespace {

template <class Token>
std::vector<std::string> names_of(const Token* tokens, size_t n, size_t cs, size_t n_chunks) {
  std::vector<std::string> out;
  if (cs == 0)
    return out;
  append_lmcache_chunk_hashes(tokens, std::min(n, n_chunks * cs), cs, out);
  return out;
}

template <class Token>
std::shared_ptr<const std::vector<uint32_t>> tokens_of(const Token* tokens, size_t n,
                                                       size_t n_tokens) {
  n = std::min(n, n_tokens);
  auto out = std::make_shared<std::vector<uint32_t>>(n);
  for (size_t i = 0; i < n; ++i)
    (*out)[i] = static_cast<uint32_t>(tokens[i]);
  return out;
}

} // namespace

std::vector<uint64_t> prefix_chunk_hashes(const int64_t* tokens, size_t n, size_t cs,
                                          size_t n_chunks, uint64_t seed) {
  return chunk_hashes(tokens, std::min(n, n_chunks * cs), cs, seed);
}

std::vector<uint64_t> prefix_chunk_hashes(const uint32_t* tokens, size_t n, size_t cs,
                                          size_t n_chunks, uint64_t seed) {
  // kvsidecar's hash reads int64 tokens: the engine's ids widened.
  std::vector<int64_t> wide(tokens, tokens + std::min(n, n_chunks * cs));
  return chunk_hashes(wide.data(), wide.size(), cs, seed);
}

std::vector<std::string> prefix_l2_names(const int64_t* tokens, size_t n, size_t cs,
                                         size_t n_chunks) {
  return names_of(tokens, n, cs, n_chunks);
}

std::vector<std::string> prefix_l2_names(const uint32_t* tokens, size_t n, size_t cs,
                                         size_t n_chunks) {
  return names_of(tokens, n, cs, n_chunks);
}

std::shared_ptr<const std::vector<uint32_t>> prefix_l2_tokens(const int64_t* tokens, size_t n,
                                                              size_t n_tokens) {
  return tokens_of(tokens, n, n_tokens);
}

std::shared_ptr<const std::vector<uint32_t>> prefix_l2_tokens(const uint32_t* tokens, size_t n,
                                                              size_t n_tokens) {
  return tokens_of(tokens, n, n_tokens);
}

} // namespace kvs
