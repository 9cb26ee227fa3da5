// md5_lanes: many independent MD5 streams hashed together, one per SIMD
// lane (the "multi-buffer" technique). One MD5 stream cannot be
// vectorised (every step needs the previous one), but N streams run the
// same steps on different data: 8 streams in AVX2's 32-bit lanes, 16 in
// AVX-512's. For POST /cache/checksums' block-id form, which hashes a
// request's chunks (or each chunk's layers) as separate digests
// (admin/chunk_digests.hpp).
//
// The path is chosen at run time from the CPU (__builtin_cpu_supports);
// the SIMD code is compiled with function-level target attributes, so the
// binary still runs on any x86-64 (and other CPUs get the scalar path,
// md5_stream's). Every path gives md5_stream's digest byte for byte.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace kvs {

enum class md5_path {
  best,         ///< the fastest this CPU runs for the number of streams: avx512, but avx512vl
                ///< for 8 streams or fewer; else avx2; else scalar (BENCHMARKS.md, "MD5 in SIMD lanes")
  scalar,       ///< md5_stream, one stream at a time
  avx2,         ///< 8 lanes, message words by 128-bit loads + in-register transpose
  avx2_gather,  ///< 8 lanes, message words by vpgatherqd
  avx512vl,     ///< 8 lanes in 256-bit vectors (AVX-512VL), loads + transpose, vprold, vpternlogd
  avx512,       ///< 16 lanes (AVX-512F), loads + transpose, vprold, vpternlogd
  avx512_gather ///< 16 lanes, message words by vpgatherqd
};

/// Whether this CPU and build can run `path` (best and scalar: always).
bool md5_path_available(md5_path path);
/// The path `best` stands for on this CPU with more than 8 streams.
md5_path md5_best_path();
/// How many streams `path` hashes at once (scalar: 1; best: its path's).
size_t md5_lanes_of(md5_path path);
/// "scalar", "avx2", ...
const char* md5_path_name(md5_path path);

/// One piece of a stream: `size` bytes at `data`.
struct md5_piece {
  const void* data = nullptr;
  size_t size = 0;
};

/// A stream's bytes, pulled piece by piece (the pieces end to end are the
/// message, whatever their sizes): each call returns the next piece, which
/// must stay readable until the next call; a piece of size 0 ends the stream.
using md5_source = std::function<md5_piece()>;

/// A source over pieces that all stay readable while it is hashed.
md5_source md5_pieces(std::vector<md5_piece> pieces);

/// The MD5 of each source, in order, as 32 lowercase hex digits: lanes
/// take the next source as they finish one, so streams of any lengths
/// share the lanes; the last stream left finishes on the scalar code.
/// `path` must be available (md5_path_available); throws
/// std::invalid_argument if not.
std::vector<std::string> md5_hex_lanes(std::vector<md5_source> sources,
                                       md5_path path = md5_path::best);

} // namespace kvs
