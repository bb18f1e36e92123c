// Internals of the MLA decode kernel shared by the driver (mla_decode.cpp), the scheduler and the
// per-ISA segment kernels (mla_decode_ref.cpp, mla_decode_avx2.cpp, mla_decode_avx512.cpp,
// mla_decode_avx512bf16.cpp). Not part of the public contract; tests include it to check the
// scheduler and each path on its own.
//
// A segment is one sequence's pages [page_begin, page_end) processed by one thread for all of the
// sequence's rows (s_q * heads); it writes normalised output rows and a per-row log-sum-exp.
// Declarations only: ISA files are compiled with different -m flags, so no inline code here may
// be shared between them.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/mla_decode.h"

namespace fathom::internal {

// Paths that group pages (the AMX tiles) run QK over up to this many tokens of consecutive pages,
// one softmax over them, then one PV: each O tile is loaded and stored once per group instead of
// once per page. The scratch's score, V and P areas hold a whole group.
constexpr int kMlaGroupTokens = 128;
int mla_group_pages(int page_tokens);  // max(1, kMlaGroupTokens / page_tokens)

// Per-thread scratch, carved from one allocation sized once by MlaDecoder (or the reference).
// Rows are padded to a multiple of 16 (rpad); layouts of q/k/v/p belong to each ISA path.
struct MlaScratch {
  int64_t rpad = 0;        // padded row capacity
  float* q = nullptr;      // packed query: rpad * d_qk f32
  float* s = nullptr;      // scores then probabilities: [group tokens][rpad] f32
  uint8_t* k = nullptr;    // one page converted for the GEMMs: page_tokens * d_qk f32, or the
                           // AMX path's group of pages as bf16 (max(2, mla_group_pages) pages), or
                           // the bf16 path's page with its fp8 group biases in the second page's room
  uint8_t* v = nullptr;    // packed V (bf16 pairs): group tokens * d_latent * 2 bytes
  uint32_t* p = nullptr;   // packed P (bf16 pairs): (group tokens / 2) * rpad
  float* o = nullptr;      // unnormalised output: [rpad][d_latent] f32
  float* m = nullptr;      // running max (log2 units of scaled scores) [rpad]
  float* l = nullptr;      // running sum [rpad]
  float* alpha = nullptr;  // this page's rescale factor [rpad]
  int32_t* lim = nullptr;  // last key index each row may see (inclusive) [rpad]
};

// Bytes one scratch needs for `rows` rows of `format`.
int64_t mla_scratch_bytes(const MlaKvFormat& format, int64_t rows);
// Points `scratch` into `memory` (mla_scratch_bytes long, 64-byte aligned).
void mla_scratch_carve(const MlaKvFormat& format, int64_t rows, uint8_t* memory, MlaScratch* scratch);

struct MlaSegmentArgs {
  const MlaDecodeParams* params = nullptr;
  int64_t seq = 0;
  int64_t page_begin = 0, page_end = 0;
  float* out = nullptr;  // [rows, d_latent] normalised output (0 for a row that saw no key)
  float* lse = nullptr;  // [rows] natural-log lse, -inf for a row that saw no key
};

using MlaSegmentFn = void (*)(const MlaSegmentArgs& args, MlaScratch& scratch);

void mla_segment_ref(const MlaSegmentArgs& args, MlaScratch& scratch);
void mla_segment_avx2(const MlaSegmentArgs& args, MlaScratch& scratch);
void mla_segment_avx512(const MlaSegmentArgs& args, MlaScratch& scratch);
void mla_segment_avx512bf16(const MlaSegmentArgs& args, MlaScratch& scratch);
// AMX tiles for both GEMMs (mla_decode_avx512bf16.cpp); only where amx_bf16_usable() and
// mla_amx_shape_ok(format): d_qk and d_latent multiples of 32, pages of a multiple of 32 tokens.
void mla_segment_amx_avx512bf16(const MlaSegmentArgs& args, MlaScratch& scratch);
bool mla_amx_shape_ok(const MlaKvFormat& format);

// The schedule of one call: segments grouped by part; a part runs on one thread.
struct MlaSegmentPlan {
  int32_t seq = 0;
  int32_t page_begin = 0, page_end = 0;
  int32_t slot = -1;  // partial-result slot of a split sequence; -1: writes the final output
};

struct MlaSchedule {
  std::vector<MlaSegmentPlan> segments;  // ordered by part
  std::vector<int32_t> part_begin;       // n_parts + 1 offsets into segments
  std::vector<int32_t> split_seqs;       // sequences cut into several segments
  std::vector<int32_t> seq_first_slot;   // [batch]: first slot of a split sequence, else -1
  std::vector<int32_t> seq_n_slots;      // [batch]: slots of a split sequence, else 0
  int32_t n_slots = 0;
};

struct MlaScheduleOptions {
  int n_parts = 1;
  int page_tokens = 64;
  int fixed_cost_pages = 1;  // per-segment overhead (packing q, finishing) in page units
  int min_split_pages = 2;   // never cut off a piece smaller than this (unless the sequence is)
};

// Splits the pages of all sequences into n_parts contiguous runs of nearly equal cost (pages plus
// a fixed cost per segment), cutting sequences at page boundaries; numbers the partial slots.
// At most 2 * (n_parts - 1) slots are used. `schedule` keeps its capacity between calls.
void plan_mla_schedule(const int32_t* cache_seqlens, int64_t batch, const MlaScheduleOptions& options,
                       MlaSchedule* schedule);

}  // namespace fathom::internal
