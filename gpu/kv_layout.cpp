#include "gpu/kv_layout.hpp"

#include <sstream>

namespace kvs {

const char* to_string(kv_layout_kind k) {
  switch (k) {
    case kv_layout_kind::sglang_mha: return "sglang_mha";
    case kv_layout_kind::vllm_flash_attn: return "vllm_flash_attn";
    case kv_layout_kind::vllm_flashinfer: return "vllm_flashinfer";
    case kv_layout_kind::vllm_cpu: return "vllm_cpu";
  }
  return "?";
}

uint64_t kv_layout::blocks_per_chunk(uint64_t chunk_tokens) const {
  if (block_size == 0 || chunk_tokens == 0 || chunk_tokens % block_size != 0) return 0;
  return chunk_tokens / block_size;
}

uint64_t kv_layout::chunk_bytes(uint64_t chunk_tokens) const {
  return 2ull * num_layers * chunk_tokens * token_bytes;
}

namespace {

// Registration sizes come from the wire: every product is checked.
constexpr uint64_t max_reasonable = uint64_t{1} << 52;

bool mul(uint64_t a, uint64_t b, uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out) && out <= max_reasonable;
}
bool add(uint64_t a, uint64_t b, uint64_t& out) {
  return !__builtin_add_overflow(a, b, &out) && out <= max_reasonable;
}

std::string dims(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

std::string where(size_t i, const tensor_desc& t) {
  return "tensor " + std::to_string(i) + " (shape " + dims(t.shape) + ", stride " +
         dims(t.stride) + ")";
}

error layout_err(std::string detail) { return make_error("layout", std::move(detail)); }
error unsupported(std::string detail) {
  return make_error("unsupported", std::move(detail));
}

/// Checks what every layout needs from each tensor and computes how far
/// into its storage each view reaches.
expected<std::vector<uint64_t>> check_tensors(const std::vector<tensor_desc>& ts) {
  if (ts.empty()) return layout_err("registration has no KV tensors");
  if (ts.size() > 16384) return layout_err("registration has " + std::to_string(ts.size()) +
                                           " tensors; more than any model has layers");
  const tensor_desc& first = ts.front();
  std::vector<uint64_t> ends;
  ends.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const tensor_desc& t = ts[i];
    if (t.kind != first.kind)
      return layout_err(where(i, t) + ": mixes CUDA IPC and host shared-memory tensors");
    if (t.kind == tensor_desc::memory_kind::cuda_ipc && t.device_uuid != first.device_uuid)
      return layout_err(where(i, t) + ": on device '" + t.device_uuid + "', tensor 0 on '" +
                        first.device_uuid + "'; one registration must use one device");
    if (t.dtype != first.dtype || t.element_size != first.element_size)
      return layout_err(where(i, t) + ": dtype " + t.dtype + " differs from tensor 0's " +
                        first.dtype);
    if (t.element_size != 1 && t.element_size != 2 && t.element_size != 4 &&
        t.element_size != 8)
      return layout_err(where(i, t) + ": element size " + std::to_string(t.element_size) +
                        " bytes is not 1, 2, 4 or 8");
    if (t.shape.empty() || t.shape.size() != t.stride.size())
      return layout_err(where(i, t) + ": shape and stride must have the same, nonzero rank");
    if (t.storage_offset < 0) return layout_err(where(i, t) + ": negative storage offset");
    // Exclusive end of the view in elements: offset + 1 + sum((size-1)*stride).
    uint64_t end = static_cast<uint64_t>(t.storage_offset) + 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] <= 0)
        return layout_err(where(i, t) + ": dimension " + std::to_string(d) + " is empty");
      if (t.stride[d] < 0)
        return layout_err(where(i, t) + ": negative stride in dimension " + std::to_string(d));
      uint64_t reach = 0;
      if (!mul(static_cast<uint64_t>(t.shape[d] - 1), static_cast<uint64_t>(t.stride[d]),
               reach) ||
          !add(end, reach, end))
        return layout_err(where(i, t) + ": size overflows");
    }
    uint64_t end_bytes = 0;
    if (!mul(end, t.element_size, end_bytes)) return layout_err(where(i, t) + ": size overflows");
    if (t.kind == tensor_desc::memory_kind::cuda_ipc && end_bytes > t.storage_size_bytes)
      return layout_err(where(i, t) + ": view reaches byte " + std::to_string(end_bytes) +
                        " of a " + std::to_string(t.storage_size_bytes) + "-byte CUDA storage");
    ends.push_back(end_bytes);
  }
  for (size_t i = 1; i < ts.size(); ++i)
    if (ts[i].shape != first.shape || ts[i].stride != first.stride)
      return layout_err(where(i, ts[i]) + ": differs from " + where(0, first) +
                        "; all layers must share one geometry");
  return ends;
}

/// Fills the fields shared by all layouts once heads/head_dim/block size
/// and (for strided pages) the engine's head and token strides are known.
expected<kv_layout> finish(kv_layout l, const tensor_desc& t) {
  l.element_size = t.element_size;
  l.dtype = t.dtype;
  if (!mul(uint64_t{l.num_heads} * l.head_dim, l.element_size, l.token_bytes) ||
      !mul(l.token_bytes, l.block_size, l.page_bytes) ||
      !mul(l.head_dim, l.element_size, l.head_bytes))
    return layout_err("page size overflows");
  if (l.page_contiguous) {
    l.head_stride_bytes = l.head_bytes;
    l.token_stride_bytes = l.token_bytes;
    l.page_span_bytes = l.page_bytes;
  } else {
    uint64_t heads_reach = 0, tokens_reach = 0, span = 0;
    if (!mul(l.num_heads - 1, l.head_stride_bytes, heads_reach) ||
        !mul(l.block_size - 1, l.token_stride_bytes, tokens_reach) ||
        !add(heads_reach, tokens_reach, span) || !add(span, l.head_bytes, span))
      return layout_err("page size overflows");
    l.page_span_bytes = span;
  }
  if (l.block_stride_bytes < l.page_span_bytes)
    return layout_err("blocks overlap: block stride " + std::to_string(l.block_stride_bytes) +
                      " bytes < page " + std::to_string(l.page_span_bytes) + " bytes");
  return l;
}

bool fits_u32(int64_t v) { return v > 0 && v <= static_cast<int64_t>(UINT32_MAX); }

expected<kv_layout> detect_sglang(const std::vector<tensor_desc>& ts, const kv_layout_hints& h);

/// LMCache 0.5.7's SGLang adapter (UnifiedLMCacheMPConnector) registers
/// `kv_list_layout = "unified"`: one tensor per component, each a view
/// [num_pages, page_size, heads, head_dim] (LMCache's NL_X_NB_BS_NH_HS). For
/// an MHA pool those are the K layers then the V layers, the same memory as
/// the 'k_v' list [num_pages*page_size, heads, head_dim] with the page axis
/// split: folded back into that view, the pages copy exactly as 'k_v' ones
/// and a chunk is byte for byte the one a 0.5.6 'k_v' engine stores. MLA
/// components ([num_pages, page_size, dim]), DSA indexers and sliding-window
/// or Mamba groups (more than one engine group) are refused by name.
expected<kv_layout> detect_sglang_unified(const std::vector<tensor_desc>& ts,
                                          const kv_layout_hints& h) {
  const tensor_desc& t0 = ts.front();
  if (t0.shape.size() == 3)
    return unsupported("SGLang kv_list_layout 'unified' MLA components [num_pages, page_size, "
                       "dim] (" + where(0, t0) + ") are not supported; only MHA pools");
  std::vector<tensor_desc> folded = ts;
  for (size_t i = 0; i < ts.size(); ++i) {
    const tensor_desc& t = ts[i];
    if (t.shape.size() != 4 || t.shape != t0.shape || t.stride != t0.stride)
      return unsupported("SGLang kv_list_layout 'unified' components must all be "
                         "[num_pages, page_size, heads, head_dim] with the same shape and strides "
                         "(MHA; DSA indexers are not supported); got " + where(i, t));
    // Checked products: the shapes and strides are the client's (check_tensors
    // bounds each dimension's reach, not these products, e.g. with stride 0).
    uint64_t page_stride = 0, rows = 0;
    if (!mul(static_cast<uint64_t>(t.shape[1]), static_cast<uint64_t>(t.stride[1]), page_stride) ||
        page_stride != static_cast<uint64_t>(t.stride[0]))
      return unsupported("SGLang kv_list_layout 'unified' pages are not back to back: " +
                         where(i, t) + "; expected stride[0] = page_size * stride[1]");
    if (!mul(static_cast<uint64_t>(t.shape[0]), static_cast<uint64_t>(t.shape[1]), rows) ||
        rows > static_cast<uint64_t>(INT64_MAX))
      return layout_err("SGLang kv_list_layout 'unified': num_pages * page_size overflows in " +
                        where(i, t));
    folded[i].shape = {static_cast<int64_t>(rows), t.shape[2], t.shape[3]};
    folded[i].stride = {t.stride[1], t.stride[2], t.stride[3]};
  }
  if (h.tokens_per_block > 0 && h.tokens_per_block != t0.shape[1])
    return layout_err("SGLang kv_list_layout 'unified': tokens_per_block " +
                      std::to_string(h.tokens_per_block) + " but pages of " +
                      std::to_string(t0.shape[1]) + " tokens in " + where(0, t0));
  kv_layout_hints k_v = h;
  k_v.kv_list_layout = sglang_kv_list_layout::k_v;
  k_v.tokens_per_block = t0.shape[1];
  return detect_sglang(folded, k_v);
}

expected<kv_layout> detect_sglang(const std::vector<tensor_desc>& ts, const kv_layout_hints& h) {
  if (h.group_layer_indices.size() > 1)
    return unsupported("SGLang registration with " + std::to_string(h.group_layer_indices.size()) +
                       " engine groups; SGLang MHA has one");
  const tensor_desc& t = ts.front();
  if (t.shape.size() != 3)
    return unsupported("SGLang tensors must be [num_pages*page_size, heads, head_dim]; got " +
                       where(0, t));
  if (ts.size() % 2 != 0)
    return layout_err("SGLang MHA registers K layers then V layers, so an even number of "
                      "tensors; got " + std::to_string(ts.size()));
  if (h.tokens_per_block <= 0)
    return layout_err("SGLang registration without kv_layout_hints.tokens_per_block; the page "
                      "size cannot be derived from [num_pages*page_size, heads, head_dim]");
  if (!fits_u32(h.tokens_per_block) || !fits_u32(t.shape[1]) || !fits_u32(t.shape[2]))
    return layout_err("SGLang page size, heads or head_dim out of range in " + where(0, t));

  const uint64_t pbs = static_cast<uint64_t>(t.shape[0]);
  const uint64_t nh = static_cast<uint64_t>(t.shape[1]);
  const uint64_t hd = static_cast<uint64_t>(t.shape[2]);
  const uint64_t bs = static_cast<uint64_t>(h.tokens_per_block);
  if (t.stride[2] != 1 || static_cast<uint64_t>(t.stride[1]) != hd ||
      static_cast<uint64_t>(t.stride[0]) != nh * hd)
    return unsupported("SGLang tensor is not token-major contiguous: " + where(0, t) +
                       "; expected stride [heads*head_dim, head_dim, 1]");
  if (pbs % bs != 0)
    return layout_err("SGLang page_buffer_size " + std::to_string(pbs) +
                      " is not a multiple of tokens_per_block " + std::to_string(bs));

  kv_layout l;
  l.kind = kv_layout_kind::sglang_mha;
  l.num_layers = static_cast<uint32_t>(ts.size() / 2);
  l.num_blocks = pbs / bs;
  l.block_size = static_cast<uint32_t>(bs);
  l.num_heads = static_cast<uint32_t>(nh);
  l.head_dim = static_cast<uint32_t>(hd);
  l.block_stride_bytes = bs * nh * hd * t.element_size;
  l.planes.resize(ts.size());
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      const uint32_t i = kv * l.num_layers + layer;
      l.planes[i].tensor = i;
      l.planes[i].offset_bytes = static_cast<uint64_t>(ts[i].storage_offset) * t.element_size;
    }
  l.layer_group.assign(l.num_layers, 0);
  l.num_groups = 1;
  if (nh == 1 && !h.kv_list_layout)
    l.note = "single-head SGLang registration without kv_list_layout='k_v': read as MHA "
             "(K layers then V layers); LMCache 0.5.6 would read it as MLA";
  return finish(std::move(l), t);
}

/// Engine groups: each layer in exactly one group; the group picks the block ids.
status assign_groups(kv_layout& l, const kv_layout_hints& h) {
  l.layer_group.assign(l.num_layers, 0);
  l.num_groups = 1;
  if (h.group_layer_indices.empty()) return {};
  l.num_groups = static_cast<uint32_t>(h.group_layer_indices.size());
  std::vector<int> seen(l.num_layers, 0);
  for (size_t g = 0; g < h.group_layer_indices.size(); ++g)
    for (int64_t layer : h.group_layer_indices[g]) {
      if (layer < 0 || layer >= static_cast<int64_t>(l.num_layers))
        return layout_err("engine group " + std::to_string(g) + " names layer " +
                          std::to_string(layer) + " of " + std::to_string(l.num_layers));
      if (seen[static_cast<size_t>(layer)]++)
        return layout_err("layer " + std::to_string(layer) + " is in more than one engine group");
      l.layer_group[static_cast<size_t>(layer)] = static_cast<uint32_t>(g);
    }
  for (uint32_t layer = 0; layer < l.num_layers; ++layer)
    if (!seen[layer])
      return unsupported("layer " + std::to_string(layer) +
                         " is in no engine group (cross-layer KV sharing is not supported)");
  return {};
}

/// One plane per layer and K/V: tensor `layer`, at its storage offset plus
/// `kv * kv_offset_elems`.
void layer_planes(kv_layout& l, const std::vector<tensor_desc>& ts, uint64_t kv_offset_elems,
                  uint32_t element_size) {
  l.planes.resize(2 * ts.size());
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      kv_plane& p = l.planes[static_cast<size_t>(kv) * l.num_layers + layer];
      p.tensor = layer;
      p.offset_bytes =
          (static_cast<uint64_t>(ts[layer].storage_offset) + kv * kv_offset_elems) * element_size;
    }
}

/// The geometry every per-layer vLLM layout shares; `elem` converts the
/// element strides to bytes.
void set_geometry(kv_layout& l, size_t layers, uint64_t nb, uint64_t bs, uint64_t nh, uint64_t hd,
                  uint64_t block_stride, uint32_t elem) {
  l.num_layers = static_cast<uint32_t>(layers);
  l.num_blocks = nb;
  l.block_size = static_cast<uint32_t>(bs);
  l.num_heads = static_cast<uint32_t>(nh);
  l.head_dim = static_cast<uint32_t>(hd);
  l.block_stride_bytes = block_stride * elem;
}

/// vLLM's CPU attention: per layer [NB, NH, BS, 2*HD], LMCache's
/// NL_X_NB_NH_BS_CS. The kernel (vllm/v1/attention/backends/cpu_attn.py)
/// views each [BS, 2*HD] head block as [2*BS, HD] and splits it: rows
/// 0..BS-1 are K, BS..2BS-1 are V. So K of (block, head, token) is at
/// block*s0 + head*s1 + token*HD and V BS*HD after it; that needs the head
/// block itself contiguous (s2 == 2*HD, s3 == 1).
expected<kv_layout> detect_vllm_cpu(const std::vector<tensor_desc>& ts,
                                    const kv_layout_hints& h) {
  const tensor_desc& t = ts.front();
  if (!fits_u32(t.shape[1]) || !fits_u32(t.shape[2]) || !fits_u32(t.shape[3]))
    return layout_err("vLLM CPU heads, block size or head size out of range in " + where(0, t));
  const uint64_t nb = static_cast<uint64_t>(t.shape[0]);
  const uint64_t nh = static_cast<uint64_t>(t.shape[1]);
  const uint64_t bs = static_cast<uint64_t>(t.shape[2]);
  const uint64_t cs = static_cast<uint64_t>(t.shape[3]);
  if (cs % 2 != 0)
    return layout_err("vLLM CPU fused K/V rows of " + std::to_string(cs) +
                      " elements cannot hold K and V of one head size in " + where(0, t));
  const uint64_t hd = cs / 2;
  if (t.stride[3] != 1 || static_cast<uint64_t>(t.stride[2]) != cs)
    return unsupported("vLLM CPU head block [block_size, 2*head_size] is not contiguous: " +
                       where(0, t) + "; expected stride [.., .., 2*head_size, 1]");
  const uint64_t head_stride = static_cast<uint64_t>(t.stride[1]);
  const uint64_t block_stride = static_cast<uint64_t>(t.stride[0]);
  uint64_t head_block = 0, heads_min = 0;
  if (!mul(bs, cs, head_block) || !mul(nh - 1, head_stride, heads_min) ||
      !add(heads_min, head_block, heads_min))
    return layout_err("size overflows in " + where(0, t));
  if (head_stride < head_block)
    return layout_err("vLLM CPU heads overlap in " + where(0, t));
  if (block_stride < heads_min) return layout_err("vLLM CPU blocks overlap in " + where(0, t));

  kv_layout l;
  l.kind = kv_layout_kind::vllm_cpu;
  set_geometry(l, ts.size(), nb, bs, nh, hd, block_stride, t.element_size);
  l.page_contiguous = nh == 1;  // one head: BS rows of HD, token-major already
  l.head_stride_bytes = head_stride * t.element_size;
  l.token_stride_bytes = hd * t.element_size;
  layer_planes(l, ts, bs * hd, t.element_size);
  if (auto st = assign_groups(l, h); !st) return st.error_value();
  return finish(std::move(l), t);
}

expected<kv_layout> detect_vllm(const std::vector<tensor_desc>& ts, const kv_layout_hints& h) {
  const tensor_desc& t = ts.front();
  // Registrations without the hint: LMCache (detectors/vllm.py
  // resolve_vllm_kv_layout) assumes HND on CPU attention backends. The only
  // 4-D layout is the CPU backend's fused one, so a 4-D tensor is read as
  // HND; 5-D tensors stay NHD (every 0.5.6 vLLM adapter sends the hint, and
  // host shared memory also carries NHD pools of test and tool clients).
  const vllm_kv_layout hint =
      h.kv_layout ? *h.kv_layout
                  : (t.shape.size() == 4 ? vllm_kv_layout::hnd : vllm_kv_layout::nhd);
  const bool hnd = hint == vllm_kv_layout::hnd || hint == vllm_kv_layout::blhnc;
  const std::string hint_name = to_string(hint);
  if (t.shape.size() == 4) {
    if (hnd) return detect_vllm_cpu(ts, h);
    return unsupported("vLLM fused K/V layout NL_X_NB_BS_NH_CS (kv_layout " + hint_name +
                       ") " + where(0, t) + " is not supported; the HND one "
                       "(NL_X_NB_NH_BS_CS, vLLM's CPU attention) is");
  }
  if (t.shape.size() == 3)
    return unsupported("vLLM MLA layout NL_X_NB_BS_HS " + where(0, t) + " is not supported");
  if (t.shape.size() == 6)
    return unsupported("vLLM-RBLN layout NL_X_TWO_NB_NH_ONE_BS_HS " + where(0, t) +
                       " is not supported");
  if (t.shape.size() != 5)
    return unsupported("vLLM per-layer tensors must be 4-D or 5-D; got " + where(0, t));

  kv_layout l;
  int kv_axis = -1, block_axis = -1;
  if (t.shape[0] == 2) {
    l.kind = kv_layout_kind::vllm_flash_attn;  // [2, NB, BS|NH, NH|BS, HD]
    kv_axis = 0;
    block_axis = 1;
  } else if (t.shape[1] == 2) {
    l.kind = kv_layout_kind::vllm_flashinfer;  // [NB, 2, BS|NH, NH|BS, HD]
    kv_axis = 1;
    block_axis = 0;
  } else {
    return unsupported("vLLM tensor " + where(0, t) +
                       " has no K/V axis of size 2 in position 0 or 1");
  }
  // The two middle axes are [BS, NH] for NHD and [NH, BS] for HND (LMCache
  // reads them by the hint alone; the shapes cannot tell).
  const int token_axis = hnd ? 3 : 2;
  const int head_axis = hnd ? 2 : 3;
  if (!fits_u32(t.shape[2]) || !fits_u32(t.shape[3]) || !fits_u32(t.shape[4]))
    return layout_err("vLLM block size, heads or head_dim out of range in " + where(0, t));
  const uint64_t nb = static_cast<uint64_t>(t.shape[block_axis]);
  const uint64_t bs = static_cast<uint64_t>(t.shape[token_axis]);
  const uint64_t nh = static_cast<uint64_t>(t.shape[head_axis]);
  const uint64_t hd = static_cast<uint64_t>(t.shape[4]);
  const uint64_t ts_el = static_cast<uint64_t>(t.stride[token_axis]);
  const uint64_t hs_el = static_cast<uint64_t>(t.stride[head_axis]);
  const uint64_t kv_stride = static_cast<uint64_t>(t.stride[kv_axis]);
  const uint64_t block_stride = static_cast<uint64_t>(t.stride[block_axis]);
  if (t.stride[4] != 1)
    return unsupported("vLLM head_dim is not contiguous (stride " + std::to_string(t.stride[4]) +
                       ") in " + where(0, t));
  // Runs of head_dim must not overlap inside a page: heads outside tokens or
  // tokens outside heads.
  const bool contiguous = ts_el == nh * hd && hs_el == hd;
  const bool heads_inner = hs_el >= hd && ts_el >= nh * hs_el;
  const bool tokens_inner = ts_el >= hd && hs_el >= bs * ts_el;
  if (!contiguous && !heads_inner && !tokens_inner)
    return layout_err("vLLM page rows overlap (token stride " + std::to_string(ts_el) +
                      ", head stride " + std::to_string(hs_el) + ") in " + where(0, t));

  set_geometry(l, ts.size(), nb, bs, nh, hd, block_stride, t.element_size);
  l.page_contiguous = contiguous;
  l.heads_outer = hnd;
  l.head_stride_bytes = hs_el * t.element_size;
  l.token_stride_bytes = ts_el * t.element_size;
  auto done = finish(std::move(l), t);
  if (!done) return done;
  kv_layout& r = done.value();
  // K and V must not overlap: a whole plane (flash-attn) or a page (flashinfer) apart.
  const uint64_t span_el = r.page_span_bytes / t.element_size;
  if (r.kind == kv_layout_kind::vllm_flash_attn) {
    uint64_t kv_min = 0;
    if (!mul(nb - 1, block_stride, kv_min) || !add(kv_min, span_el, kv_min))
      return layout_err("size overflows in " + where(0, t));
    if (kv_stride < kv_min) return layout_err("vLLM K and V planes overlap in " + where(0, t));
  } else {
    if (kv_stride < span_el || block_stride < kv_stride + span_el)
      return layout_err("vLLM K and V pages overlap in " + where(0, t));
  }
  layer_planes(r, ts, kv_stride, t.element_size);
  if (auto st = assign_groups(r, h); !st) return st.error_value();
  return done;
}

} // namespace

expected<kv_layout> detect_kv_layout(const std::vector<tensor_desc>& tensors,
                                     const kv_layout_hints& hints) {
  if (hints.engine_type != engine_type::sglang && hints.engine_type != engine_type::vllm)
    return unsupported(std::string("engine_type '") + to_string(hints.engine_type) +
                       "' is not supported by the block copy (supported: sglang, vllm)");
  auto ends = check_tensors(tensors);
  if (!ends) return ends.error_value();
  auto l = hints.engine_type != engine_type::sglang ? detect_vllm(tensors, hints)
           : hints.kv_list_layout == sglang_kv_list_layout::unified
             ? detect_sglang_unified(tensors, hints)
             : detect_sglang(tensors, hints);
  if (l) l.value().tensor_end_bytes = std::move(ends.value());
  return l;
}

} // namespace kvs
