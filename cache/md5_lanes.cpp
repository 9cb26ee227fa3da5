#include "cache/md5_lanes.hpp"

#include "cache/md5.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#define KVS_MD5_X86 1
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics (unpack, insert, rotate, gather) start from
// _mm512_undefined_epi32(), a self-initialised variable that
// -Wmaybe-uninitialized flags once inlined here; the warning points into
// the header, so it is turned off before the header for this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#else
#define KVS_MD5_X86 0
#endif

namespace kvs {

namespace {

/// Each lane's state words: state[w * lanes + lane], w = a, b, c, d.
/// `p[lane]` points at the lane's next `blocks` 64-byte blocks.
using kernel_fn = void (*)(uint32_t* state, const unsigned char* const* p, size_t blocks);

#if KVS_MD5_X86

using md5_detail::sines;

// The 64 steps of RFC 1321 on vectors a, b, c, d and message words m[16],
// four at a time (a step's output becomes the next step's b); the
// including kernel defines ADD, ROTL, K(i) and the round functions.
#define KVS_MD5_STEP(FN, a, b, c, d, x, i, s)                                                      \
  a = ADD(b, ROTL(ADD(ADD(a, FN(b, c, d)), ADD(x, K(i))), s));
#define KVS_MD5_QUAD(FN, i, g0, g1, g2, g3, s0, s1, s2, s3)                                        \
  KVS_MD5_STEP(FN, a, b, c, d, m[g0], i, s0)                                                       \
  KVS_MD5_STEP(FN, d, a, b, c, m[g1], i + 1, s1)                                                   \
  KVS_MD5_STEP(FN, c, d, a, b, m[g2], i + 2, s2)                                                   \
  KVS_MD5_STEP(FN, b, c, d, a, m[g3], i + 3, s3)
#define KVS_MD5_64_STEPS                                                                           \
  KVS_MD5_QUAD(FF, 0, 0, 1, 2, 3, 7, 12, 17, 22)                                                   \
  KVS_MD5_QUAD(FF, 4, 4, 5, 6, 7, 7, 12, 17, 22)                                                   \
  KVS_MD5_QUAD(FF, 8, 8, 9, 10, 11, 7, 12, 17, 22)                                                 \
  KVS_MD5_QUAD(FF, 12, 12, 13, 14, 15, 7, 12, 17, 22)                                              \
  KVS_MD5_QUAD(GG, 16, 1, 6, 11, 0, 5, 9, 14, 20)                                                  \
  KVS_MD5_QUAD(GG, 20, 5, 10, 15, 4, 5, 9, 14, 20)                                                 \
  KVS_MD5_QUAD(GG, 24, 9, 14, 3, 8, 5, 9, 14, 20)                                                  \
  KVS_MD5_QUAD(GG, 28, 13, 2, 7, 12, 5, 9, 14, 20)                                                 \
  KVS_MD5_QUAD(HH, 32, 5, 8, 11, 14, 4, 11, 16, 23)                                                \
  KVS_MD5_QUAD(HH, 36, 1, 4, 7, 10, 4, 11, 16, 23)                                                 \
  KVS_MD5_QUAD(HH, 40, 13, 0, 3, 6, 4, 11, 16, 23)                                                 \
  KVS_MD5_QUAD(HH, 44, 9, 12, 15, 2, 4, 11, 16, 23)                                                \
  KVS_MD5_QUAD(II, 48, 0, 7, 14, 5, 6, 10, 15, 21)                                                 \
  KVS_MD5_QUAD(II, 52, 12, 3, 10, 1, 6, 10, 15, 21)                                                \
  KVS_MD5_QUAD(II, 56, 8, 15, 6, 13, 6, 10, 15, 21)                                                \
  KVS_MD5_QUAD(II, 60, 4, 11, 2, 9, 6, 10, 15, 21)
/// One block: the steps, then the chaining addition.
#define KVS_MD5_BLOCK                                                                              \
  {                                                                                                \
    const auto a0 = a, b0 = b, c0 = c, d0 = d;                                                     \
    KVS_MD5_64_STEPS                                                                               \
    a = ADD(a, a0);                                                                                \
    b = ADD(b, b0);                                                                                \
    c = ADD(c, c0);                                                                                \
    d = ADD(d, d0);                                                                                \
  }

/// A kernel over vectors of type V: the lanes' state in, `blocks` blocks
/// (WORDS fills m[16] with word w of every lane's block k), the state out.
#define KVS_MD5_KERNEL(V, LOAD, STORE, WORDS)                                                      \
  auto* s = reinterpret_cast<V*>(state);                                                           \
  V a = LOAD(s), b = LOAD(s + 1), c = LOAD(s + 2), d = LOAD(s + 3);                                \
  for (size_t k = 0; k < blocks; ++k) {                                                            \
    V m[16];                                                                                       \
    WORDS(m, p, 64 * k);                                                                           \
    KVS_MD5_BLOCK                                                                                  \
  }                                                                                                \
  STORE(s, a);                                                                                     \
  STORE(s + 1, b);                                                                                 \
  STORE(s + 2, c);                                                                                 \
  STORE(s + 3, d);

// -- 8 lanes in 256-bit vectors ------------------------------------------------

#define KVS_AVX2 __attribute__((target("avx2")))

/// Words 4g..4g+3 of 8 lanes' blocks at byte `off`: each 256-bit row holds
/// lane q's four words low and lane q+4's high, then a 4x4 transpose inside
/// each 128-bit half puts word w of lanes 0..7 in one vector. The inserts
/// take their 128 bits straight from memory (not the shuffle port).
KVS_AVX2 __attribute__((always_inline)) inline void
avx2_words(__m256i* m, const unsigned char* const* p, size_t off) {
  for (int g = 0; g < 4; ++g) {
    __m256i r[4];
    for (int q = 0; q < 4; ++q)
      r[q] = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[q] + off))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[q + 4] + off)), 1);
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    m[4 * g] = _mm256_unpacklo_epi64(t0, t2);
    m[4 * g + 1] = _mm256_unpackhi_epi64(t0, t2);
    m[4 * g + 2] = _mm256_unpacklo_epi64(t1, t3);
    m[4 * g + 3] = _mm256_unpackhi_epi64(t1, t3);
    off += 16;
  }
}

/// The same words by vpgatherqd, four lanes a gather (lane i's word at
/// p[0] + (p[i] - p[0]), so one base pointer serves all lanes). Slower than
/// the loads (BENCHMARKS.md); kept as a measured path.
KVS_AVX2 __attribute__((always_inline)) inline void
avx2_gather_words(__m256i* m, const unsigned char* const* p, size_t off) {
  auto diff = [p](int i) { return static_cast<long long>(p[i] - p[0]); };
  const __m256i lo = _mm256_set_epi64x(diff(3), diff(2), diff(1), diff(0));
  const __m256i hi = _mm256_set_epi64x(diff(7), diff(6), diff(5), diff(4));
  for (int w = 0; w < 16; ++w) {
    auto* base = reinterpret_cast<const int*>(p[0] + off + 4 * w);
    m[w] = _mm256_set_m128i(_mm256_i64gather_epi32(base, hi, 1), _mm256_i64gather_epi32(base, lo, 1));
  }
}

#define ADD(x, y) _mm256_add_epi32(x, y)
#define K(i) _mm256_set1_epi32(static_cast<int>(sines[i]))

template <bool Gather>
KVS_AVX2 void avx2_kernel(uint32_t* state, const unsigned char* const* p, size_t blocks) {
#define ROTL(x, s) _mm256_or_si256(_mm256_slli_epi32(x, s), _mm256_srli_epi32(x, 32 - (s)))
#define FF(x, y, z) _mm256_xor_si256(z, _mm256_and_si256(x, _mm256_xor_si256(y, z)))
#define GG(x, y, z) _mm256_xor_si256(y, _mm256_and_si256(z, _mm256_xor_si256(x, y)))
#define HH(x, y, z) _mm256_xor_si256(_mm256_xor_si256(x, y), z)
#define II(x, y, z) _mm256_xor_si256(y, _mm256_or_si256(x, _mm256_xor_si256(z, ones)))
  const __m256i ones = _mm256_set1_epi32(-1);
  KVS_MD5_KERNEL(__m256i, _mm256_loadu_si256, _mm256_storeu_si256,
                 (Gather ? avx2_gather_words : avx2_words))
#undef ROTL
#undef FF
#undef GG
#undef HH
#undef II
}

// AVX-512VL: the same 8 lanes with AVX-512's rotate (vprold) and
// three-input logic (vpternlogd, truth tables with (x, y, z) as its
// (A, B, C): F = x ? y : z, G = z ? x : y, H = x ^ y ^ z, I = y ^ (x | ~z)).
// For 8 streams or fewer (a `lmcache bench server` request has 8 chunks) it
// beats 16 lanes half empty (BENCHMARKS.md, "MD5 in SIMD lanes").
#define FF(x, y, z) TERNLOG(x, y, z, 0xca)
#define GG(x, y, z) TERNLOG(x, y, z, 0xe4)
#define HH(x, y, z) TERNLOG(x, y, z, 0x96)
#define II(x, y, z) TERNLOG(x, y, z, 0x39)

__attribute__((target("avx2,avx512f,avx512vl"))) void
avx512vl_kernel(uint32_t* state, const unsigned char* const* p, size_t blocks) {
#define ROTL(x, s) _mm256_rol_epi32(x, s)
#define TERNLOG _mm256_ternarylogic_epi32
  KVS_MD5_KERNEL(__m256i, _mm256_loadu_si256, _mm256_storeu_si256, avx2_words)
#undef ROTL
#undef TERNLOG
}

#undef ADD
#undef K

// -- AVX-512: 16 lanes in 512-bit vectors ------------------------------------------

#define KVS_AVX512 __attribute__((target("avx512f")))

/// As avx2_words, with each 512-bit row holding lanes q, q+4, q+8, q+12.
KVS_AVX512 __attribute__((always_inline)) inline void
avx512_words(__m512i* m, const unsigned char* const* p, size_t off) {
  for (int g = 0; g < 4; ++g) {
    __m512i r[4];
    for (int q = 0; q < 4; ++q) {
      auto row = [p, off](int lane) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[lane] + off));
      };
      __m512i z = _mm512_castsi128_si512(row(q));
      z = _mm512_inserti32x4(z, row(q + 4), 1);
      z = _mm512_inserti32x4(z, row(q + 8), 2);
      r[q] = _mm512_inserti32x4(z, row(q + 12), 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    m[4 * g] = _mm512_unpacklo_epi64(t0, t2);
    m[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
    m[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
    m[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    off += 16;
  }
}

/// As avx2_gather_words, eight lanes a gather.
KVS_AVX512 __attribute__((always_inline)) inline void
avx512_gather_words(__m512i* m, const unsigned char* const* p, size_t off) {
  long long diff[16];
  for (int i = 0; i < 16; ++i)
    diff[i] = static_cast<long long>(p[i] - p[0]);
  const __m512i lo = _mm512_loadu_si512(diff), hi = _mm512_loadu_si512(diff + 8);
  for (int w = 0; w < 16; ++w) {
    const void* base = p[0] + off + 4 * w;
    m[w] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_i64gather_epi32(lo, base, 1)),
                              _mm512_i64gather_epi32(hi, base, 1), 1);
  }
}

template <bool Gather>
KVS_AVX512 void avx512_kernel(uint32_t* state, const unsigned char* const* p, size_t blocks) {
#define ADD(x, y) _mm512_add_epi32(x, y)
#define K(i) _mm512_set1_epi32(static_cast<int>(sines[i]))
#define ROTL(x, s) _mm512_rol_epi32(x, s)
#define TERNLOG _mm512_ternarylogic_epi32
  KVS_MD5_KERNEL(__m512i, _mm512_loadu_si512, _mm512_storeu_si512,
                 (Gather ? avx512_gather_words : avx512_words))
#undef ADD
#undef K
#undef ROTL
#undef TERNLOG
}

#undef FF
#undef GG
#undef HH
#undef II

#endif // KVS_MD5_X86

/// A stretch of a lane's message the kernel can read: `blocks` blocks at `p`.
struct block_run {
  const unsigned char* p;
  size_t blocks;
};

/// One stream in a lane: where it is in its source, and the bytes of a
/// block that straddles pieces (or the padded end) gathered in `buf`.
struct lane {
  size_t job = 0;
  bool busy = false;
  const unsigned char* p = nullptr; ///< the rest of the current piece
  size_t left = 0;
  uint64_t total = 0;
  unsigned char buf[128];
  size_t buffered = 0;
  size_t tail_len = 0; ///< > 0 once the source ended: the padded end is in buf
  size_t tail_at = 0;
};

/// The lane's next blocks: a whole stretch of the current piece when a
/// block starts there, else one block assembled in `buf` (across pieces, or
/// the padded end once the source has ended).
block_run next_run(lane& l, md5_source& src) {
  if (l.tail_len > 0)
    return {l.buf + l.tail_at, 1};
  for (;;) {
    if (l.left == 0) {
      md5_piece piece = src();
      if (piece.size == 0) {
        unsigned char rest[64];
        std::memcpy(rest, l.buf, l.buffered);
        l.tail_len = md5_detail::pad_tail(l.buf, rest, l.buffered, l.total);
        l.tail_at = 0;
        return {l.buf, 1};
      }
      l.p = static_cast<const unsigned char*>(piece.data);
      l.left = piece.size;
      l.total += piece.size;
    }
    if (l.buffered == 0 && l.left >= 64)
      return {l.p, l.left / 64};
    size_t take = std::min(l.left, 64 - l.buffered);
    std::memcpy(l.buf + l.buffered, l.p, take);
    l.p += take;
    l.left -= take;
    l.buffered += take;
    if (l.buffered == 64) {
      l.buffered = 0;
      return {l.buf, 1};
    }
  }
}

/// After the kernel ran `blocks` of `r`: true when the stream is done.
bool advance(lane& l, const block_run& r, size_t blocks) {
  if (l.tail_len > 0) {
    l.tail_at += 64;
    return l.tail_at == l.tail_len;
  }
  if (r.p != l.buf) {
    l.p += 64 * blocks;
    l.left -= 64 * blocks;
  }
  return false;
}

std::vector<std::string> scalar_hex(std::vector<md5_source>& sources) {
  std::vector<std::string> out;
  out.reserve(sources.size());
  for (auto& src : sources) {
    md5_stream s;
    for (md5_piece piece = src(); piece.size > 0; piece = src())
      s.update(piece.data, piece.size);
    out.push_back(s.hex());
  }
  return out;
}

/// Runs `sources` through `lanes` lanes of `kernel`; a lane takes the next
/// source when its stream ends, idle lanes repeat a busy lane's blocks
/// (their state is thrown away), and the last stream left finishes scalar.
std::vector<std::string> lanes_hex(std::vector<md5_source>& sources, kernel_fn kernel,
                                   size_t lanes) {
  std::vector<std::string> out(sources.size());
  std::vector<uint32_t> state(4 * lanes);
  std::vector<lane> ls(lanes);
  std::vector<block_run> runs(lanes);
  std::vector<const unsigned char*> ptrs(lanes);
  size_t next = 0, busy = 0;
  auto start = [&](size_t i) {
    ls[i] = lane{};
    if (next == sources.size())
      return;
    ls[i].job = next++;
    ls[i].busy = true;
    ++busy;
    for (size_t w = 0; w < 4; ++w)
      state[w * lanes + i] = md5_detail::iv[w];
  };
  auto digest = [&](size_t i, const uint32_t h[4]) {
    out[ls[i].job] = md5_detail::hex(h);
    --busy;
    start(i);
  };
  for (size_t i = 0; i < lanes; ++i)
    start(i);
  while (busy > 1) {
    size_t blocks = SIZE_MAX, some = 0;
    for (size_t i = 0; i < lanes; ++i)
      if (ls[i].busy) {
        runs[i] = next_run(ls[i], sources[ls[i].job]);
        blocks = std::min(blocks, runs[i].blocks);
        some = i;
      }
    for (size_t i = 0; i < lanes; ++i)
      ptrs[i] = ls[i].busy ? runs[i].p : runs[some].p;
    kernel(state.data(), ptrs.data(), blocks);
    for (size_t i = 0; i < lanes; ++i)
      if (ls[i].busy && advance(ls[i], runs[i], blocks)) {
        uint32_t h[4];
        for (size_t w = 0; w < 4; ++w)
          h[w] = state[w * lanes + i];
        digest(i, h);
      }
  }
  for (size_t i = 0; i < lanes && busy > 0; ++i) {
    if (!ls[i].busy)
      continue;
    uint32_t h[4];
    for (size_t w = 0; w < 4; ++w)
      h[w] = state[w * lanes + i];
    for (;;) {
      block_run r = next_run(ls[i], sources[ls[i].job]);
      md5_detail::compress(h, r.p, r.blocks);
      if (advance(ls[i], r, r.blocks))
        break;
    }
    digest(i, h);
  }
  return out;
}

bool cpu_has(md5_path path) {
#if KVS_MD5_X86
  switch (path) {
  case md5_path::avx2:
  case md5_path::avx2_gather:
    return __builtin_cpu_supports("avx2");
  case md5_path::avx512vl:
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  case md5_path::avx512:
  case md5_path::avx512_gather:
    return __builtin_cpu_supports("avx512f");
  default:
    return true;
  }
#else
  return path == md5_path::best || path == md5_path::scalar;
#endif
}

} // namespace

bool md5_path_available(md5_path path) {
  return cpu_has(path);
}

md5_path md5_best_path() {
  static const md5_path best = cpu_has(md5_path::avx512) ? md5_path::avx512
                               : cpu_has(md5_path::avx2) ? md5_path::avx2
                                                         : md5_path::scalar;
  return best;
}

size_t md5_lanes_of(md5_path path) {
  switch (path) {
  case md5_path::best:
    return md5_lanes_of(md5_best_path());
  case md5_path::scalar:
    return 1;
  case md5_path::avx2:
  case md5_path::avx2_gather:
  case md5_path::avx512vl:
    return 8;
  case md5_path::avx512:
  case md5_path::avx512_gather:
    return 16;
  }
  return 1;
}

const char* md5_path_name(md5_path path) {
  switch (path) {
  case md5_path::best:
    return "best";
  case md5_path::scalar:
    return "scalar";
  case md5_path::avx2:
    return "avx2";
  case md5_path::avx2_gather:
    return "avx2_gather";
  case md5_path::avx512vl:
    return "avx512vl";
  case md5_path::avx512:
    return "avx512";
  case md5_path::avx512_gather:
    return "avx512_gather";
  }
  return "?";
}

md5_source md5_pieces(std::vector<md5_piece> pieces) {
  return [pieces = std::move(pieces), at = size_t{0}]() mutable {
    // Empty pieces are skipped: only the end reads as size 0.
    while (at < pieces.size() && pieces[at].size == 0)
      ++at;
    return at < pieces.size() ? pieces[at++] : md5_piece{};
  };
}

std::vector<std::string> md5_hex_lanes(std::vector<md5_source> sources, md5_path path) {
  if (path == md5_path::best) {
    path = md5_best_path();
    // 16 lanes with half or more idle lose to 8 full ones (BENCHMARKS.md).
    if (path == md5_path::avx512 && sources.size() <= 8 && cpu_has(md5_path::avx512vl))
      path = md5_path::avx512vl;
  }
  if (!md5_path_available(path))
    throw std::invalid_argument(std::string("md5_hex_lanes: this CPU cannot run the ") +
                                md5_path_name(path) + " path");
  switch (path) {
#if KVS_MD5_X86
  case md5_path::avx2:
    return lanes_hex(sources, avx2_kernel<false>, 8);
  case md5_path::avx2_gather:
    return lanes_hex(sources, avx2_kernel<true>, 8);
  case md5_path::avx512vl:
    return lanes_hex(sources, avx512vl_kernel, 8);
  case md5_path::avx512:
    return lanes_hex(sources, avx512_kernel<false>, 16);
  case md5_path::avx512_gather:
    return lanes_hex(sources, avx512_kernel<true>, 16);
#endif
  default:
    return scalar_hex(sources);
  }
}

} // namespace kvs
