// MLA decode driver: validation at the boundary, the (sequence, page range) scheduler, the
// parallel run over the pool and the log-sum-exp merge of split sequences. The arithmetic lives
// in the per-ISA segment kernels (mla_decode_<isa>.cpp, mla_decode_ref.cpp).
#include "kernels/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/check.h"
#include "base/cpu.h"
#include "kernels/mla_decode_impl.h"
#include "tensor/tensor.h"

namespace fathom {

using internal::MlaSchedule;
using internal::MlaScratch;
using internal::MlaSegmentArgs;

namespace {

constexpr int kMaxSq = 64;
constexpr int kMaxRows = 1 << 16;
constexpr float kInf = std::numeric_limits<float>::infinity();

int64_t round64(int64_t n) {
  return (n + 63) / 64 * 64;
}

internal::MlaSegmentFn segment_fn(SimdLevel level, const MlaKvFormat& format) {
  switch (level) {
    case SimdLevel::kAvx512Bf16:
      if (mla_decode_uses_amx(format)) return internal::mla_segment_amx_avx512bf16;
      return internal::mla_segment_avx512bf16;
    case SimdLevel::kAvx512:
      return internal::mla_segment_avx512;
    case SimdLevel::kAvx2:
      return internal::mla_segment_avx2;
    case SimdLevel::kScalar:
      break;
  }
  return internal::mla_segment_ref;
}

// Final lse layout is [batch, heads, s_q]; rows are r = i * heads + h. A row that saw no key
// (internal -inf) is reported as +inf, FlashMLA's convention.
void scatter_lse(const float* row_lse, int s_q, int heads, float* lse_seq) {
  for (int i = 0; i < s_q; ++i) {
    for (int h = 0; h < heads; ++h) {
      const float v = row_lse[i * heads + h];
      lse_seq[h * s_q + i] = v == -kInf ? kInf : v;
    }
  }
}

void merge_split_sequence(const MlaDecodeParams& p, const MlaSchedule& sched, int64_t b,
                          const float* partial_out, const float* partial_lse, int64_t rows) {
  const int64_t dl = p.cache.format.d_latent;
  const int32_t first = sched.seq_first_slot[static_cast<size_t>(b)];
  const int32_t n = sched.seq_n_slots[static_cast<size_t>(b)];
  float* out = p.out + b * rows * dl;
  float* lse_seq = p.lse + b * rows;
  for (int64_t r = 0; r < rows; ++r) {
    float m = -kInf;
    for (int32_t j = 0; j < n; ++j) m = std::max(m, partial_lse[(first + j) * rows + r]);
    float* o = out + r * dl;
    const int64_t i = r / p.heads, h = r % p.heads;
    if (m == -kInf) {
      std::fill(o, o + dl, 0.0f);
      lse_seq[h * p.s_q + i] = kInf;
      continue;
    }
    double total = 0;
    for (int32_t j = 0; j < n; ++j)
      total += std::exp(static_cast<double>(partial_lse[(first + j) * rows + r] - m));
    std::fill(o, o + dl, 0.0f);
    for (int32_t j = 0; j < n; ++j) {
      const float w =
          static_cast<float>(std::exp(static_cast<double>(partial_lse[(first + j) * rows + r] - m)) / total);
      if (w == 0.0f) continue;
      const float* src = partial_out + ((first + j) * rows + r) * dl;
      for (int64_t c = 0; c < dl; ++c) o[c] += w * src[c];
    }
    lse_seq[h * p.s_q + i] = m + static_cast<float>(std::log(total));
  }
}

}  // namespace

Status validate_mla_decode(const MlaDecodeParams& p) {
  const MlaKvFormat& f = p.cache.format;
  if (Status st = f.validate(); !st.ok()) return st.with_context("mla_decode");
  if (p.batch < 0) return invalid_argument("mla_decode: batch is {}, expected >= 0", p.batch);
  if (p.s_q < 1 || p.s_q > kMaxSq)
    return invalid_argument("mla_decode: s_q is {}, expected 1..{}", p.s_q, kMaxSq);
  if (p.heads < 1 || int64_t{p.heads} * p.s_q > kMaxRows) {
    return invalid_argument("mla_decode: heads is {} (s_q {}), expected 1..{} rows per sequence", p.heads,
                            p.s_q, kMaxRows);
  }
  if (p.d_qk != f.d_qk()) {
    return invalid_argument("mla_decode: q has head dim {}, the cache holds d_latent {} + d_rope {} = {}",
                            p.d_qk, f.d_latent, f.d_rope, f.d_qk());
  }
  if (!(std::isfinite(p.softmax_scale) && p.softmax_scale > 0)) {
    return invalid_argument("mla_decode: softmax_scale is {}, expected a finite positive number",
                            p.softmax_scale);
  }
  if (p.batch == 0) return {};
  if (!p.q || !p.out || !p.lse || !p.cache_seqlens || !p.block_table) {
    return invalid_argument("mla_decode: q, out, lse, cache_seqlens and block_table must all be set");
  }
  if (p.cache.n_pages < 0 || p.cache.page_stride_bytes < f.page_bytes()) {
    return invalid_argument("mla_decode: cache has {} pages with stride {} B, expected a stride >= {} B",
                            p.cache.n_pages, p.cache.page_stride_bytes, f.page_bytes());
  }
  if (p.max_pages < 0) return invalid_argument("mla_decode: max_pages is {}", p.max_pages);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = p.cache_seqlens[b];
    if (len < 0) return invalid_argument("mla_decode: cache_seqlens[{}] is {}", b, len);
    const int64_t need = (len + f.page_tokens - 1) / f.page_tokens;
    if (need > p.max_pages) {
      return out_of_range(
          "mla_decode: sequence {} has {} tokens, which needs {} pages of {}, but block_table has {}", b, len,
          need, f.page_tokens, p.max_pages);
    }
    if (need > 0 && !p.cache.data) return invalid_argument("mla_decode: cache data is null");
    for (int64_t j = 0; j < need; ++j) {
      const int64_t id = p.block_table[b * p.max_pages + j];
      if (id < 0 || id >= p.cache.n_pages) {
        return out_of_range("mla_decode: block_table[{}][{}] is {}, outside the pool of {} pages", b, j, id,
                            p.cache.n_pages);
      }
    }
  }
  return {};
}

namespace internal {

int mla_group_pages(int page_tokens) {
  return page_tokens >= kMlaGroupTokens ? 1 : kMlaGroupTokens / page_tokens;
}

// Lays the scratch out from address `base` and returns its size in bytes; mla_scratch_bytes runs it
// from 0 (pointers never used), so the sizes are written once.
static int64_t scratch_layout(const MlaKvFormat& f, int64_t rows, uintptr_t base, MlaScratch* s) {
  const int64_t rpad = (rows + 15) / 16 * 16, T = f.page_tokens, D = f.d_qk(), dl = f.d_latent;
  const int64_t G = mla_group_pages(f.page_tokens), GT = G * T;
  uintptr_t at = base;
  auto take = [&](int64_t bytes) {
    uint8_t* p = reinterpret_cast<uint8_t*>(at);
    at += static_cast<uintptr_t>(round64(bytes));
    return p;
  };
  s->rpad = rpad;
  s->q = reinterpret_cast<float*>(take(rpad * D * 4));
  s->s = reinterpret_cast<float*>(take(GT * rpad * 4));
  s->k = take(std::max<int64_t>(2, G) * T * D * 2);  // one page of f32, or the group's pages of bf16
  s->v = take(GT * dl * 2);
  s->p = reinterpret_cast<uint32_t*>(take(GT / 2 * rpad * 4));
  s->o = reinterpret_cast<float*>(take(rpad * dl * 4));
  s->m = reinterpret_cast<float*>(take(rpad * 4));
  s->l = reinterpret_cast<float*>(take(rpad * 4));
  s->alpha = reinterpret_cast<float*>(take(rpad * 4));
  s->lim = reinterpret_cast<int32_t*>(take(rpad * 4));
  return static_cast<int64_t>(at - base);
}

int64_t mla_scratch_bytes(const MlaKvFormat& f, int64_t rows) {
  MlaScratch dry;
  return scratch_layout(f, rows, 0, &dry);
}

void mla_scratch_carve(const MlaKvFormat& f, int64_t rows, uint8_t* mem, MlaScratch* s) {
  scratch_layout(f, rows, reinterpret_cast<uintptr_t>(mem), s);
}

void plan_mla_schedule(const int32_t* seqlens, int64_t batch, const MlaScheduleOptions& o, MlaSchedule* s) {
  CHECK(o.n_parts >= 1 && o.page_tokens >= 1);
  const int64_t T = o.page_tokens, fixed = o.fixed_cost_pages, min_split = std::max(1, o.min_split_pages);
  s->segments.clear();
  s->part_begin.clear();
  s->split_seqs.clear();
  int64_t total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = (seqlens[b] + T - 1) / T;
    if (pages > 0) total += pages + fixed;
  }
  // Part k ends at cost position (k + 1) * total / n_parts: absolute boundaries, so rounding does
  // not pile up on the last part. Each boundary may cut a sequence, whose continuation costs
  // another `fixed`: counted in advance so the last part does not absorb them.
  if (total > 0) total += fixed * (o.n_parts - 1);
  const int last = o.n_parts - 1;
  int part = 0;
  int64_t pos = 0;
  auto boundary = [&](int k) { return (static_cast<int64_t>(k) + 1) * total / o.n_parts; };
  auto next_part = [&] {
    s->part_begin.push_back(static_cast<int32_t>(s->segments.size()));
    ++part;
  };
  s->part_begin.push_back(0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = (seqlens[b] + T - 1) / T;
    int64_t p = 0;
    while (p < pages) {
      while (part < last && pos + fixed >= boundary(part)) next_part();  // no room for even a start
      const int64_t left = pages - p;
      int64_t take = part == last ? left : std::clamp<int64_t>(boundary(part) - pos - fixed, 0, left);
      if (left - take < min_split) take = left;  // never leave a sliver behind
      if (take < std::min(min_split, left)) {    // nor start one: move on to the next part
        next_part();
        continue;
      }
      s->segments.push_back({static_cast<int32_t>(b), static_cast<int32_t>(p), static_cast<int32_t>(p + take), -1});
      pos += fixed + take;
      p += take;
    }
  }
  while (static_cast<int>(s->part_begin.size()) < o.n_parts + 1) {
    s->part_begin.push_back(static_cast<int32_t>(s->segments.size()));
  }
  // Partial slots for sequences cut into several segments, numbered in segment order.
  s->seq_first_slot.assign(static_cast<size_t>(batch), -1);
  s->seq_n_slots.assign(static_cast<size_t>(batch), 0);
  for (const auto& seg : s->segments) ++s->seq_n_slots[static_cast<size_t>(seg.seq)];
  s->n_slots = 0;
  for (auto& seg : s->segments) {
    const auto b = static_cast<size_t>(seg.seq);
    if (s->seq_n_slots[b] < 2) {
      s->seq_n_slots[b] = 0;
      continue;
    }
    if (s->seq_first_slot[b] < 0) {
      s->seq_first_slot[b] = s->n_slots;
      s->split_seqs.push_back(seg.seq);
    }
    seg.slot = s->n_slots++;
  }
}

}  // namespace internal

struct MlaDecoder::State {
  ThreadPool* pool = nullptr;
  int n_parts = 1;
  int32_t max_slots = 0;
  Buffer scratch_memory;
  std::vector<MlaScratch> scratch;  // one per pool thread
  Buffer thread_lse;                // [threads][max_rows]
  Buffer partial_out;               // [max_slots][max_rows][d_latent]
  Buffer partial_lse;               // [max_slots][max_rows]
  MlaSchedule schedule;
};

MlaDecoder::MlaDecoder(const MlaDecoderOptions& options, std::unique_ptr<State> state)
    : options_(options), state_(std::move(state)) {}
MlaDecoder::~MlaDecoder() = default;

Result<std::unique_ptr<MlaDecoder>> MlaDecoder::create(const MlaDecoderOptions& options) {
  TRY(options.format.validate());
  if (options.max_batch < 1)
    return invalid_argument("mla decoder: max_batch is {}, expected >= 1", options.max_batch);
  if (options.max_rows < 1 || options.max_rows > kMaxRows) {
    return invalid_argument("mla decoder: max_rows is {}, expected 1..{}", options.max_rows, kMaxRows);
  }
  if (options.parts_per_thread < 1 || options.parts_per_thread > 64) {
    return invalid_argument("mla decoder: parts_per_thread is {}, expected 1..64", options.parts_per_thread);
  }
  auto st = std::make_unique<State>();
  st->pool = options.pool ? options.pool : &default_pool();
  const int threads = st->pool->size();
  st->n_parts = threads == 1 ? 1 : threads * options.parts_per_thread;
  st->max_slots = 2 * (st->n_parts - 1);
  const MlaKvFormat& f = options.format;
  const int64_t per_thread = internal::mla_scratch_bytes(f, options.max_rows);
  st->scratch_memory = Buffer::allocate(static_cast<size_t>(per_thread * threads));
  st->scratch.resize(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    internal::mla_scratch_carve(f, options.max_rows, st->scratch_memory.data() + per_thread * t,
                                &st->scratch[static_cast<size_t>(t)]);
  }
  st->thread_lse = Buffer::allocate(static_cast<size_t>(threads) * options.max_rows * 4);
  const auto slot_rows = static_cast<size_t>(st->max_slots) * options.max_rows;
  st->partial_out = Buffer::allocate(slot_rows * f.d_latent * 4);
  st->partial_lse = Buffer::allocate(slot_rows * 4);
  const auto batch = static_cast<size_t>(options.max_batch);
  st->schedule.segments.reserve(batch + static_cast<size_t>(st->n_parts));
  st->schedule.part_begin.reserve(static_cast<size_t>(st->n_parts) + 1);
  st->schedule.split_seqs.reserve(batch);
  st->schedule.seq_first_slot.reserve(batch);
  st->schedule.seq_n_slots.reserve(batch);
  return std::unique_ptr<MlaDecoder>(new MlaDecoder(options, std::move(st)));
}

bool mla_decode_uses_amx(const MlaKvFormat& format) {
  return simd_level() == SimdLevel::kAvx512Bf16 && amx_bf16_usable() && internal::mla_amx_shape_ok(format);
}

Status MlaDecoder::decode(const MlaDecodeParams& p) {
  TRY(validate_mla_decode(p));
  if (!(p.cache.format == options_.format)) {
    return invalid_argument(
        "mla decoder: the cache format (d_latent {}, d_rope {}, {}, page {}) differs from the "
        "decoder's (d_latent {}, d_rope {}, {}, page {})",
        p.cache.format.d_latent, p.cache.format.d_rope, mla_kv_dtype_name(p.cache.format.dtype),
        p.cache.format.page_tokens, options_.format.d_latent, options_.format.d_rope,
        mla_kv_dtype_name(options_.format.dtype), options_.format.page_tokens);
  }
  if (p.batch > options_.max_batch) {
    return out_of_range("mla decoder: batch {} exceeds max_batch {}", p.batch, options_.max_batch);
  }
  const int64_t rows = int64_t{p.s_q} * p.heads, dl = p.cache.format.d_latent;
  if (rows > options_.max_rows) {
    return out_of_range("mla decoder: s_q * heads = {} exceeds max_rows {}", rows, options_.max_rows);
  }
  if (p.batch == 0) return {};
  State& st = *state_;
  const internal::MlaSegmentFn fn = segment_fn(simd_level(), p.cache.format);
  internal::plan_mla_schedule(p.cache_seqlens, p.batch,
                              {.n_parts = st.n_parts, .page_tokens = p.cache.format.page_tokens},
                              &st.schedule);
  CHECK(st.schedule.n_slots <= st.max_slots);
  float* partial_out = st.partial_out.as<float>();
  float* partial_lse = st.partial_lse.as<float>();
  st.pool->run(st.n_parts, [&](int64_t part, int thread) {
    MlaScratch& scratch = st.scratch[static_cast<size_t>(thread)];
    float* row_lse = st.thread_lse.as<float>() + int64_t{thread} * options_.max_rows;
    const auto& sched = st.schedule;
    for (int32_t i = sched.part_begin[static_cast<size_t>(part)];
         i < sched.part_begin[static_cast<size_t>(part + 1)]; ++i) {
      const internal::MlaSegmentPlan& seg = sched.segments[static_cast<size_t>(i)];
      MlaSegmentArgs args{
          .params = &p, .seq = seg.seq, .page_begin = seg.page_begin, .page_end = seg.page_end};
      if (seg.slot < 0) {
        args.out = p.out + seg.seq * rows * dl;
        args.lse = row_lse;
      } else {
        args.out = partial_out + seg.slot * rows * dl;
        args.lse = partial_lse + seg.slot * rows;
      }
      fn(args, scratch);
      if (seg.slot < 0) scatter_lse(row_lse, p.s_q, p.heads, p.lse + seg.seq * rows);
    }
  });
  // Sequences with no cached token: out 0, lse +inf.
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.cache_seqlens[b] != 0) continue;
    std::fill(p.out + b * rows * dl, p.out + (b + 1) * rows * dl, 0.0f);
    std::fill(p.lse + b * rows, p.lse + (b + 1) * rows, kInf);
  }
  const auto& split = st.schedule.split_seqs;
  st.pool->run(static_cast<int64_t>(split.size()), [&](int64_t i, int) {
    merge_split_sequence(p, st.schedule, split[static_cast<size_t>(i)], partial_out, partial_lse, rows);
  });
  return {};
}

Status mla_decode_reference(const MlaDecodeParams& p) {
  TRY(validate_mla_decode(p));
  const MlaKvFormat& f = p.cache.format;
  const int64_t rows = int64_t{p.s_q} * p.heads, dl = f.d_latent;
  Buffer memory = Buffer::allocate(static_cast<size_t>(internal::mla_scratch_bytes(f, rows)));
  MlaScratch scratch;
  internal::mla_scratch_carve(f, rows, memory.data(), &scratch);
  std::vector<float> row_lse(static_cast<size_t>(rows));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t pages = (p.cache_seqlens[b] + f.page_tokens - 1) / f.page_tokens;
    MlaSegmentArgs args{.params = &p,
                        .seq = b,
                        .page_begin = 0,
                        .page_end = pages,
                        .out = p.out + b * rows * dl,
                        .lse = row_lse.data()};
    internal::mla_segment_ref(args, scratch);
    scatter_lse(row_lse.data(), p.s_q, p.heads, p.lse + b * rows);
  }
  return {};
}

}  // namespace fathom
