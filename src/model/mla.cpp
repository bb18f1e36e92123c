// MLA attention of one layer for a batch: projections, RoPE, cache writes, then the absorbed
// form (few new tokens: FlashMLA-style decode over the latent cache) or the naive form (prefill:
// K/V decompressed per key block, tiled online-softmax attention).
#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "model/attention.h"
#include "model/model_impl.h"

namespace fathom {

Result<MlaDecoder*> Model::Impl::decoder_for(const MlaKvFormat& format) {
  auto it = decoders.find(static_cast<int>(format.dtype));
  if (it != decoders.end() && it->second->options().format == format) return it->second.get();
  MlaDecoderOptions o;
  o.format = format;
  o.max_batch = static_cast<int>(absorbed_entries(options.max_sequences));
  o.max_rows = static_cast<int>(kAbsorbThreshold * w->config.num_attention_heads);
  auto d = TRY(MlaDecoder::create(o));
  MlaDecoder* raw = d.get();
  decoders[static_cast<int>(format.dtype)] = std::move(d);
  return raw;
}

// kv: [T, kv_lora | rope] from s.xn; the latent normalised, the rope key rotated (one head shared
// by all). What attention() writes into the cache and write_kv() alone.
void Model::Impl::project_kv(const LayerWeights& L, int64_t T) {
  const ModelConfig& c = w->config;
  const int64_t kvl = c.kv_lora_rank, kvw = kvl + c.qk_rope_head_dim;
  mm(L.kv_a, s.xn.data(), T, s.kv.data());
  rms_norm({.n_rows = T,
            .dim = kvl,
            .eps = static_cast<float>(c.rms_norm_eps),
            .x_stride = kvw,
            .y_stride = kvw,
            .weight_dtype = L.kv_a_norm.dtype},
           s.kv.data(), L.kv_a_norm.data, s.kv.data(), default_pool());
  rope_apply(*rope, {.n_tokens = T, .n_heads = 1, .token_stride = kvw, .head_stride = kvw},
             s.positions.data(), s.kv.data() + kvl);
}

// Every new token's [latent | rope key] row of s.kv into this layer's cache pages.
Status Model::Impl::write_kv_rows(int64_t layer, std::span<const SeqBatch> batch, KvCache& cache) {
  const int64_t kvw = w->config.kv_lora_rank + w->config.qk_rope_head_dim;
  int64_t row = 0;
  for (const SeqBatch& b : batch) {
    TRY(cache.write(b.seq, static_cast<int>(layer), b.pos,
                    std::span<const float>(s.kv.data() + row * kvw, static_cast<size_t>(b.n_new * kvw))));
    row += b.n_new;
  }
  return {};
}

Status Model::Impl::write_kv(int64_t layer, std::span<const SeqBatch> batch, int64_t T, KvCache& cache) {
  const LayerWeights& L = w->layers[static_cast<size_t>(layer)];
  attn_norm(L, T);
  current_layer = layer;
  project_kv(L, T);
  return write_kv_rows(layer, batch, cache);
}

Status Model::Impl::attention(int64_t layer, std::span<const SeqBatch> batch, int64_t T, KvCache& cache) {
  const ModelConfig& c = w->config;
  const LayerWeights& L = w->layers[static_cast<size_t>(layer)];
  const int64_t H = c.num_attention_heads, qk = c.qk_head_dim();
  ThreadPool& pool = default_pool();
  // q: [T, H, nope + rope]
  if (c.q_lora_rank > 0) {
    mm(L.q_a, s.xn.data(), T, s.q_a.data());
    rms_norm({.n_rows = T, .dim = c.q_lora_rank, .eps = static_cast<float>(c.rms_norm_eps), .weight_dtype = L.q_a_norm.dtype},
             s.q_a.data(), L.q_a_norm.data, s.q_a.data(), pool);
    mm(L.q_b, s.q_a.data(), T, s.q.data());
  } else {
    mm(L.q, s.xn.data(), T, s.q.data());
  }
  project_kv(L, T);
  rope_apply(*rope, {.n_tokens = T, .n_heads = H, .token_stride = H * qk, .head_stride = qk}, s.positions.data(),
             s.q.data() + c.qk_nope_head_dim);
  // Write every new token's latent into this layer's cache pages, then run each sequence's naive
  // attention (it reads only its own pages) or queue it for the absorbed form: decodes, and short
  // suffixes after a cached context at least as long (BF16/FP8 models) as pieces of up to
  // kAbsorbThreshold tokens, each seeing the keys up to its own last token. Every sequence has
  // an entry of the absorbed scratch; the pieces beyond each suffix's first take the
  // kAbsorbSpareEntries spare ones (absorbed_entries).
  TRY(write_kv_rows(layer, batch, cache));
  std::vector<SeqBatch> absorbed;
  std::vector<int64_t> absorbed_rows;
  int64_t row = 0, spare = kAbsorbSpareEntries;
  for (const SeqBatch& b : batch) {
    const int64_t pieces = (b.n_new + kAbsorbThreshold - 1) / kAbsorbThreshold;
    if (b.n_new <= kAbsorbThreshold || (fathom::attention_in_bf16(L) && b.n_new <= kAbsorbMaxSuffix &&
                                        b.pos >= b.n_new && pieces - 1 <= spare)) {
      spare -= pieces - 1;
      for (int64_t off = 0; off < b.n_new; off += kAbsorbThreshold) {
        const int64_t n = std::min(kAbsorbThreshold, b.n_new - off);
        absorbed.push_back(SeqBatch{b.seq, b.pos + off, n, b.all_logits});
        for (int64_t j = 0; j < n; ++j) absorbed_rows.push_back(row + off + j);
      }
    } else {
      TRY(attention_naive(L, layer, b, row, cache));
    }
    row += b.n_new;
  }
  if (!absorbed.empty()) TRY(attention_absorbed(L, layer, absorbed, absorbed_rows, cache));
  return {};
}

// Head h's rows [h * rows, (h + 1) * rows) of `w` times its slice of every token's x (at
// x + h * x_head, stride x_stride) into y + h * y_head (stride y_stride), one pool task per head:
// each head's matrix (W_UK^T, W_UV: 128 KiB in BF16 for V2/V3) is too small for matmul to split, so
// head after head ran on the calling thread while the others waited (a twelfth of a V2-Lite decode
// step).
Status Model::Impl::per_head_matmul(const WeightView& w, int64_t rows, const float* x, int64_t x_head,
                                    int64_t x_stride, int64_t m, float* y, int64_t y_head, int64_t y_stride) {
  const int64_t H = w.rows / rows;
  std::vector<WeightView>& heads = s.head_views;
  heads.resize(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) heads[static_cast<size_t>(h)] = TRY(slice_rows(w, h * rows, (h + 1) * rows));
  count_linear(w, m);
  ThreadPool& pool = default_pool();
  pool.run(H, [&](int64_t h, int) {  // matmul runs inline inside a pool task
    matmul(heads[static_cast<size_t>(h)], x + h * x_head, m, y + h * y_head, pool,
           {.x_stride = x_stride, .y_stride = y_stride});
  });
  return {};
}

// Absorbed form: q_lat = W_UK^T q_nope per head, attention over the latent cache, W_UV after.
Status Model::Impl::attention_absorbed(const LayerWeights& L, int64_t layer, std::span<const SeqBatch> batch,
                                       std::span<const int64_t> rows, KvCache& cache) {
  const ModelConfig& c = w->config;
  const int64_t H = c.num_attention_heads, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t kvl = c.kv_lora_rank, dqk = kvl + c.qk_rope_head_dim, vd = c.v_head_dim;
  MlaDecoder* decoder = TRY(decoder_for(cache.format()));
  const int64_t max_pages = cache.max_pages_per_sequence();
  // Group sequences by their number of new tokens (the kernel takes one s_q per call).
  size_t first_row = 0;
  std::vector<size_t> order(batch.size());
  std::vector<size_t> row_start(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    order[i] = i;
    row_start[i] = first_row;
    first_row += static_cast<size_t>(batch[i].n_new);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return batch[a].n_new < batch[b].n_new; });
  for (size_t g0 = 0; g0 < order.size();) {
    size_t g1 = g0;
    const int64_t s_q = batch[order[g0]].n_new;
    while (g1 < order.size() && batch[order[g1]].n_new == s_q) ++g1;
    const int64_t B = static_cast<int64_t>(g1 - g0);
    const int64_t M = B * s_q;
    std::vector<SeqId> seqs;
    for (size_t k = g0; k < g1; ++k) {
      const SeqBatch& b = batch[order[k]];
      seqs.push_back(b.seq);
      for (int64_t i = 0; i < s_q; ++i) {
        const int64_t src = rows[row_start[order[k]] + static_cast<size_t>(i)];
        std::memcpy(s.dq.data() + ((k - g0) * static_cast<size_t>(s_q) + static_cast<size_t>(i)) * static_cast<size_t>(H * qk),
                    s.q.data() + src * H * qk, static_cast<size_t>(H * qk) * 4);
      }
    }
    TRY(per_head_matmul(L.w_uk_t, kvl, s.dq.data(), qk, H * qk, M, s.dq_abs.data(), dqk, H * dqk));
    for (int64_t t = 0; t < M; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(s.dq_abs.data() + (t * H + h) * dqk + kvl, s.dq.data() + t * H * qk + h * qk + nope,
                    static_cast<size_t>(c.qk_rope_head_dim) * 4);
      }
    }
    TRY(cache.fill_batch(seqs, max_pages, s.block_tables.data(), s.seqlens.data()));
    for (size_t k = g0; k < g1; ++k) {
      const SeqBatch& b = batch[order[k]];
      s.seqlens[k - g0] = static_cast<int32_t>(b.pos + b.n_new);  // the MTP layer lags the main ones
    }
    MlaDecodeParams p;
    p.q = s.dq_abs.data();
    p.batch = B;
    p.s_q = static_cast<int>(s_q);
    p.heads = static_cast<int>(H);
    p.d_qk = static_cast<int>(dqk);
    p.cache = cache.layer_view(static_cast<int>(layer));
    p.block_table = s.block_tables.data();
    p.max_pages = max_pages;
    p.cache_seqlens = s.seqlens.data();
    p.softmax_scale = softmax_scale;
    p.causal = s_q > 1;
    p.out = s.d_olat.data();
    p.lse = s.d_lse.data();
    TRY(decoder->decode(p));
    for (size_t k = g0; k < g1; ++k) {
      const double keys = static_cast<double>(s.seqlens[k - g0]);
      stats.attention_flops += 2.0 * static_cast<double>(s_q * H) * keys * static_cast<double>(dqk + kvl);
      stats.kv_bytes += keys * static_cast<double>(cache.format().token_bytes());
    }
    TRY(per_head_matmul(L.w_v, vd, s.d_olat.data(), kvl, H * kvl, M, s.d_out.data(), vd, H * vd));
    for (size_t k = g0; k < g1; ++k) {
      for (int64_t i = 0; i < s_q; ++i) {
        const int64_t dst = rows[row_start[order[k]] + static_cast<size_t>(i)];
        std::memcpy(s.attn_v.data() + dst * H * vd,
                    s.d_out.data() + ((k - g0) * static_cast<size_t>(s_q) + static_cast<size_t>(i)) * static_cast<size_t>(H * vd),
                    static_cast<size_t>(H * vd) * 4);
      }
    }
    g0 = g1;
  }
  return {};
}

// Naive form for one sequence's n_new tokens (queries at rows [row0, row0 + n_new)).
Status Model::Impl::attention_naive(const LayerWeights& L, int64_t layer, const SeqBatch& b, int64_t row0,
                                    KvCache& cache) {
  const ModelConfig& c = w->config;
  const int64_t H = c.num_attention_heads, qk = c.qk_head_dim(), kvl = c.kv_lora_rank, vd = c.v_head_dim;
  const int64_t kvw = kvl + c.qk_rope_head_dim;
  ThreadPool& pool = default_pool();
  const int64_t n = b.n_new, total = b.pos + b.n_new;
  attention_state_init(n, static_cast<int>(H), static_cast<int>(vd), s.att_m.data(), s.att_l.data(), s.att_acc.data());
  for (int64_t k0 = 0; k0 < total; k0 += key_block) {
    const int64_t kb = std::min(key_block, total - k0);
    TRY(cache.read(b.seq, static_cast<int>(layer), k0, kb, std::span<float>(s.lat.data(), static_cast<size_t>(kb * kvw))));
    mm(L.w_k, s.lat.data(), kb, s.k_nope.data(), {.x_stride = kvw});
    mm(L.w_v, s.lat.data(), kb, s.v.data(), {.x_stride = kvw});
    PrefillAttentionParams p;
    p.n_q = n;
    p.q_pos0 = b.pos;
    p.heads = static_cast<int>(H);
    p.d_nope = static_cast<int>(c.qk_nope_head_dim);
    p.d_rope = static_cast<int>(c.qk_rope_head_dim);
    p.d_v = static_cast<int>(vd);
    p.q = s.q.data() + row0 * H * qk;
    p.k0 = k0;
    p.n_k = kb;
    p.k_nope = s.k_nope.data();
    p.k_pe = s.lat.data() + kvl;
    p.k_pe_stride = kvw;
    p.v = s.v.data();
    p.scale = softmax_scale;
    p.m = s.att_m.data();
    p.l = s.att_l.data();
    p.acc = s.att_acc.data();
    p.bf16_operands = fathom::attention_in_bf16(L);
    prefill_attention_block(p, pool);
    stats.attention_flops += 2.0 * static_cast<double>(n * kb * H) * static_cast<double>(qk + vd);
    stats.kv_bytes += static_cast<double>(kb) * static_cast<double>(cache.format().token_bytes());
  }
  attention_state_finish(n, static_cast<int>(H), static_cast<int>(vd), s.att_l.data(), s.att_acc.data(),
                         s.attn_v.data() + row0 * H * vd);
  return {};
}

}  // namespace fathom
