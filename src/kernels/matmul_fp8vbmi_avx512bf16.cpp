// FP8 weights on CPUs with AVX-512 VBMI (compiled with -mavx512vbmi, see CMakeLists.txt; chosen
// at run time by fp8_use_vbmi): e4m3 -> bf16 with two vpermi2b byte-table lookups (low and high
// byte of the 128 magnitudes) and an unpack, 5 instructions per 64 weights. The unpack
// interleaves within 128-bit lanes, so the activations are prepared in the matching order
// (ActView::bf16_perm64) and no weight shuffle is needed.
//
// For 2-4 activation rows and K a multiple of 128 (every checkpoint's shapes) the row-wise
// product runs through fp8_pair_kernel below, written in inline assembly: GCC 12 keeps the
// intrinsics version's converted weights and block sums in too few registers and spills them
// (one thread, cache-resident, 4 rows: 18-24 GB/s of weights against 50 GB/s for the same
// instruction stream with fixed registers; `fathom bench gemm --dtype fp8 --m 4 --ceiling`).
//
// At 12-32 and 62-64 rows on CPUs without usable AMX, fp8_lanes_rows (intrinsics: GCC keeps its
// loop's 24 accumulators and operands in registers) puts the activation rows across the lanes.
#include "base/check.h"
#include "kernels/matmul_fp8_impl.h"
#include "kernels/matmul_fp8vbmi_conv.h"

namespace fathom::matmul_internal {
namespace {

struct Fp8VbmiConv : Fp8VbmiConvert {
  // Two consecutive weight rows (w0, w0 + K; both in one 128-row scale group, so one scale row)
  // against M (1..4) activation rows x + m * xs (bf16, perm64 order): tot[i][m] (16 lanes each,
  // [2][4][16]) receives, per 128-column block, the block's dot products times its scale, summed in
  // fp32 in block order; the caller reduces the lanes. K % 128 == 0. pf, pf + K: the rows to
  // prefetch into L1 (the next pair, or these rows again); far, far + K: two rows to request into
  // L2; two lines of each pair per 64 columns. With address_order (the caller's address_order_wanted:
  // AMD CPUs) the two rows' lines are requested one after the other, as one run of addresses: `bench gemm
  // --ab` at m = 2 / 3 1.15x, `bench serve --ab` 1.022-1.055x at 16 and 32 clients (Zen 5). Elsewhere at the
  // columns being read: walking them one after the other read m = 2 at 0.66-0.69 of the bandwidth against
  // 0.69-0.72 there, m = 3 alike (`bench gemm`, model-167 Xeon VM, FATHOM_FP8_F16=0); the fp16 kernel
  // gained 1.05-1.15x from the same change.
  static constexpr bool kPairKernel = true;
  static void pair_kernel(int m, const uint8_t* w0, int64_t K, const uint16_t* x, int64_t xs,
                          const float* scale, const uint8_t* pf, const uint8_t* far, bool address_order,
                          float* tot);
  // The same for exactly five activation rows (kPairRows5 of them): tot is [2][5][16].
  static constexpr int kPairRows5 = 5;
  static void pair_kernel5(const uint8_t* w0, int64_t K, const uint16_t* x, int64_t xs, const float* scale,
                           const uint8_t* pf, const uint8_t* far, bool address_order, float* tot);
};

// Register plan of fp8_pair_kernel: zmm0-7 the current block's sums, zmm(4i + m) for weight row i
// and activation row m; zmm8-15 the scaled totals in the same order; zmm16-19 the converted halves
// (a0 b0 a1 b1); zmm21/22 one activation row's a and b parts; zmm24 the block scale, zmm25 the 0x80
// sign mask, zmm26/27 scratch, zmm28-31 the byte tables (lo0 lo1 hi0 hi1). %[k] runs from -K to 0
// over the weight bytes; every pointer is the end of its row. The sign mask comes from memory (a
// register operand more than the 15 the far rows' second pointer leaves).
//
// Per 128-column block at 4 activation rows: 32 vdpbf16ps and 8 vfmadd231ps on the two FMA pipes,
// 20 cycles, the measured time of the loop with the data in L1 (41 GB/s of weights per thread at
// 3.2 GHz). Tried and slower: a and b parts in separate sums with the totals kept in L1 (the 8
// stores per block cost 24.5 cycles), activations as memory operands of vdpbf16ps (twice the loads;
// from DRAM the weight loads then wait behind them and ran at half the speed).
#define F8_CONV(W, A, B)                         \
  "vmovdqu8 " W ", %%zmm26\n\t"                  \
  "vmovdqa64 %%zmm26, %%zmm27\n\t"               \
  "vpermi2b %%zmm29, %%zmm28, %%zmm26\n\t"       \
  "vpermi2b %%zmm31, %%zmm30, %%zmm27\n\t"       \
  "vpternlogd $0xf8, " W ", %%zmm25, %%zmm27\n\t" \
  "vpunpcklbw %%zmm27, %%zmm26, %%" A "\n\t"     \
  "vpunpckhbw %%zmm27, %%zmm26, %%" B "\n\t"
// One activation row (pointer operand XP, sums ACC0 for weight row 0 and ACC1 for row 1) at half H
// ("0" or "128" bytes into the block's activations).
#define F8_DP(H, XP, ACC0, ACC1)                          \
  "vmovdqu16 " H "(%[" XP "],%[k],2), %%zmm21\n\t"        \
  "vmovdqu16 " H "+64(%[" XP "],%[k],2), %%zmm22\n\t"     \
  "vdpbf16ps %%zmm21, %%zmm16, %%" ACC0 "\n\t"            \
  "vdpbf16ps %%zmm21, %%zmm18, %%" ACC1 "\n\t"            \
  "vdpbf16ps %%zmm22, %%zmm17, %%" ACC0 "\n\t"            \
  "vdpbf16ps %%zmm22, %%zmm19, %%" ACC1 "\n\t"
#define F8_DP1(H) F8_DP(H, "x0", "zmm0", "zmm4")
#define F8_DP2(H) F8_DP1(H) F8_DP(H, "x1", "zmm1", "zmm5")
#define F8_DP3(H) F8_DP2(H) F8_DP(H, "x2", "zmm2", "zmm6")
#define F8_DP4(H) F8_DP3(H) F8_DP(H, "x3", "zmm3", "zmm7")
#define F8_FMA(ACC, TOT) "vfmadd231ps %%zmm24, %%" ACC ", %%" TOT "\n\t"
#define F8_FMA1 F8_FMA("zmm0", "zmm8") F8_FMA("zmm4", "zmm12")
#define F8_FMA2 F8_FMA1 F8_FMA("zmm1", "zmm9") F8_FMA("zmm5", "zmm13")
#define F8_FMA3 F8_FMA2 F8_FMA("zmm2", "zmm10") F8_FMA("zmm6", "zmm14")
#define F8_FMA4 F8_FMA3 F8_FMA("zmm3", "zmm11") F8_FMA("zmm7", "zmm15")
#define F8_ZERO(R) "vpxord %%" R ", %%" R ", %%" R "\n\t"
#define F8_ZERO8(A, B, C, D, E, F, G, H) \
  F8_ZERO(A) F8_ZERO(B) F8_ZERO(C) F8_ZERO(D) F8_ZERO(E) F8_ZERO(F) F8_ZERO(G) F8_ZERO(H)
#define F8_STORE(R, O) "vmovaps %%" R ", %[" O "]\n\t"
// The requests of a 64-column half: the same two lines of the next rows into L1 and of the far rows
// into L2, at byte offset OFF (columns order); or (address order, ADDR) the next two lines of the
// next rows' joint run [pf, pf + 2K) into L1 and of the far rows' into L2, indexed by 2k from its
// end (p1 = pf + 2K, f1 = far + 2K), O0 and O1 their offsets: a pair consumes 128 bytes a half.
// clang-format off
#define F8_PREFETCH(OFF)                    \
  "prefetcht0 " OFF "(%[p0],%[k])\n\t"      \
  "prefetcht0 " OFF "(%[p1],%[k])\n\t"      \
  "prefetcht1 " OFF "(%[f0],%[k])\n\t"      \
  "prefetcht1 " OFF "(%[f1],%[k])\n\t"
#define F8_PREFETCH_ADDR(O0, O1)            \
  "prefetcht0 " O0 "(%[p1],%[k],2)\n\t"   \
  "prefetcht0 " O1 "(%[p1],%[k],2)\n\t"   \
  "prefetcht1 " O0 "(%[f1],%[k],2)\n\t"   \
  "prefetcht1 " O1 "(%[f1],%[k],2)\n\t"
// A 128-column block's requests (PF0, PF1: one set per half), conversions (CONV into A0 B0 for
// weight row 0, A1 B1 for row 1) and products (DP), a 64-column half at a time; shared by both pair
// kernels, in either request order.
#define F8_BLOCK_WITH(PF0, PF1, CONV, DP, A0, B0, A1, B1)                          \
  PF0 CONV("(%[w0],%[k])", A0, B0) CONV("(%[w1],%[k])", A1, B1) DP("0")            \
  PF1 CONV("64(%[w0],%[k])", A0, B0) CONV("64(%[w1],%[k])", A1, B1) DP("128")
#define F8_BLOCK(CONV, DP, A0, B0, A1, B1) \
  F8_BLOCK_WITH(F8_PREFETCH(""), F8_PREFETCH("64"), CONV, DP, A0, B0, A1, B1)
#define F8_BLOCK_ADDR(CONV, DP, A0, B0, A1, B1) \
  F8_BLOCK_WITH(F8_PREFETCH_ADDR("", "64"), F8_PREFETCH_ADDR("128", "192"), CONV, DP, A0, B0, A1, B1)
// One 128-column block per iteration (BLOCK: F8_BLOCK or F8_BLOCK_ADDR): request the rows ahead,
// convert and dot each 64-column half, then add the block's sums times its scale to the totals.
#define F8_PAIR_LOOP_B(BLOCK, DP, FMA)                                                 \
  "vmovdqa64 %[t0], %%zmm28\n\t"                                                      \
  "vmovdqa64 %[t1], %%zmm29\n\t"                                                      \
  "vmovdqa64 %[t2], %%zmm30\n\t"                                                      \
  "vmovdqa64 %[t3], %%zmm31\n\t"                                                      \
  "vpbroadcastd %[sign], %%zmm25\n\t"                                                 \
  F8_ZERO8("zmm8", "zmm9", "zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15")       \
  "1:\n\t"                                                                             \
  F8_ZERO8("zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7")             \
  BLOCK(F8_CONV, DP, "zmm16", "zmm17", "zmm18", "zmm19")                                \
  "vbroadcastss (%[s]), %%zmm24\n\t" FMA                                               \
  "add $4, %[s]\n\t"                                                                   \
  "add $128, %[k]\n\t"                                                                 \
  "jnz 1b\n\t"                                                                         \
  F8_STORE("zmm8", "o0") F8_STORE("zmm9", "o1") F8_STORE("zmm10", "o2") F8_STORE("zmm11", "o3") \
  F8_STORE("zmm12", "o4") F8_STORE("zmm13", "o5") F8_STORE("zmm14", "o6") F8_STORE("zmm15", "o7")
#define F8_PAIR_LOOP(DP, FMA) F8_PAIR_LOOP_B(F8_BLOCK, DP, FMA)
#define F8_PAIR_LOOP_ADDR(DP, FMA) F8_PAIR_LOOP_B(F8_BLOCK_ADDR, DP, FMA)
// clang-format on

#define F8_CLOBBERS                                                                                  \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",   \
      "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm21", "xmm22",       \
      "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc", "memory"

void Fp8VbmiConv::pair_kernel(int m, const uint8_t* w0, int64_t K, const uint16_t* x, int64_t xs,
                              const float* scale, const uint8_t* pf, const uint8_t* far, bool address_order,
                              float* tot) {
  int64_t k = -K;
  const Fp8PairEnds e(m, w0, K, x, xs, pf, far);  // bf16 rows are indexed by 2 * k bytes
  const float* s = scale;
  const uint32_t sign = 0x80808080u;
  // The byte tables and the totals as memory operands: twelve pointers in registers leave room for
  // a frame pointer (the ASan build's -fno-omit-frame-pointer), which fourteen did not.
  const auto* t = reinterpret_cast<const __m512i*>(kByteTables.lo);  // lo[128] then hi[128]
  auto* o = reinterpret_cast<__m512*>(tot);                          // [2][4] totals
#define F8_PAIR_ASM(LOOP, DP, FMA)                                                                   \
  asm volatile(LOOP(DP, FMA)                                                                         \
               : [k] "+r"(k), [s] "+r"(s), [o0] "=m"(o[0]), [o1] "=m"(o[1]), [o2] "=m"(o[2]),        \
                 [o3] "=m"(o[3]), [o4] "=m"(o[4]), [o5] "=m"(o[5]), [o6] "=m"(o[6]), [o7] "=m"(o[7]) \
               : [w0] "r"(e.w0), [w1] "r"(e.w1), [p0] "r"(e.p0), [p1] "r"(e.p1), [x0] "r"(e.x0),     \
                 [x1] "r"(e.x1), [x2] "r"(e.x2), [x3] "r"(e.x3), [t0] "m"(t[0]), [t1] "m"(t[1]),     \
                 [t2] "m"(t[2]), [t3] "m"(t[3]), [sign] "m"(sign), [f0] "r"(e.f0), [f1] "r"(e.f1)    \
               : F8_CLOBBERS)
#define F8_PAIR_ASM_EITHER(DP, FMA)          \
  if (address_order) {                       \
    F8_PAIR_ASM(F8_PAIR_LOOP_ADDR, DP, FMA); \
  } else {                                   \
    F8_PAIR_ASM(F8_PAIR_LOOP, DP, FMA);      \
  }
  switch (m) {
    case 1:
      F8_PAIR_ASM_EITHER(F8_DP1, F8_FMA1);
      return;
    case 2:
      F8_PAIR_ASM_EITHER(F8_DP2, F8_FMA2);
      return;
    case 3:
      F8_PAIR_ASM_EITHER(F8_DP3, F8_FMA3);
      return;
    default:
      F8_PAIR_ASM_EITHER(F8_DP4, F8_FMA4);
      return;
  }
#undef F8_PAIR_ASM_EITHER
#undef F8_PAIR_ASM
}

// Register plan of pair_kernel5: zmm0-4 the current block's sums of weight row 0 against
// activation rows 0-4, zmm5-9 those of row 1, zmm10-19 the scaled totals in the same order,
// zmm20-23 the converted halves (a0 b0 a1 b1), zmm24/25 one activation row's a and b parts,
// zmm26/27 scratch, zmm28-31 the byte tables: all 32 registers, so the sign mask and the block
// scale are broadcast from memory operands. Five rows in one chunk, instead of chunks of two and
// three, convert each weight once instead of twice and keep ten product chains in flight instead
// of four and six (docs/PERFORMANCE.md, "Five activation rows per fp8 pair").
// clang-format off
#define F8_CONV5(W, A, B)                                 \
  "vmovdqu8 " W ", %%zmm26\n\t"                           \
  "vmovdqa64 %%zmm26, %%zmm27\n\t"                        \
  "vpermi2b %%zmm31, %%zmm30, %%zmm27\n\t"                \
  "vpternlogd $0xf8, %[sign]%{1to16%}, %%zmm26, %%zmm27\n\t" \
  "vpermi2b %%zmm29, %%zmm28, %%zmm26\n\t"                \
  "vpunpcklbw %%zmm27, %%zmm26, %%" A "\n\t"              \
  "vpunpckhbw %%zmm27, %%zmm26, %%" B "\n\t"
#define F8_DP5ROW(H, XP, ACC0, ACC1)                      \
  "vmovdqu16 " H "(%[" XP "],%[k],2), %%zmm24\n\t"        \
  "vmovdqu16 " H "+64(%[" XP "],%[k],2), %%zmm25\n\t"     \
  "vdpbf16ps %%zmm24, %%zmm20, %%" ACC0 "\n\t"            \
  "vdpbf16ps %%zmm24, %%zmm22, %%" ACC1 "\n\t"            \
  "vdpbf16ps %%zmm25, %%zmm21, %%" ACC0 "\n\t"            \
  "vdpbf16ps %%zmm25, %%zmm23, %%" ACC1 "\n\t"
#define F8_DP5(H)                                                                                          \
  F8_DP5ROW(H, "x0", "zmm0", "zmm5") F8_DP5ROW(H, "x1", "zmm1", "zmm6") F8_DP5ROW(H, "x2", "zmm2", "zmm7") \
      F8_DP5ROW(H, "x3", "zmm3", "zmm8") F8_DP5ROW(H, "x4", "zmm4", "zmm9")
#define F8_SFMA(A, T) "vfmadd231ps (%[s])%{1to16%}, %%" A ", %%" T "\n\t"
#define F8_SFMA5                                                                                        \
  F8_SFMA("zmm0", "zmm10") F8_SFMA("zmm1", "zmm11") F8_SFMA("zmm2", "zmm12") F8_SFMA("zmm3", "zmm13")   \
      F8_SFMA("zmm4", "zmm14") F8_SFMA("zmm5", "zmm15") F8_SFMA("zmm6", "zmm16") F8_SFMA("zmm7", "zmm17") \
          F8_SFMA("zmm8", "zmm18") F8_SFMA("zmm9", "zmm19")
#define F8_PAIR5_LOOP_B(BLOCK)                                                                          \
  "vmovdqa64 %[t0], %%zmm28\n\t"                                                                       \
  "vmovdqa64 %[t1], %%zmm29\n\t"                                                                       \
  "vmovdqa64 %[t2], %%zmm30\n\t"                                                                       \
  "vmovdqa64 %[t3], %%zmm31\n\t"                                                                       \
  F8_ZERO8("zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15", "zmm16", "zmm17")                      \
  F8_ZERO("zmm18") F8_ZERO("zmm19")                                                                    \
  "1:\n\t"                                                                                             \
  F8_ZERO8("zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7") F8_ZERO("zmm8") F8_ZERO("zmm9") \
  BLOCK(F8_CONV5, F8_DP5, "zmm20", "zmm21", "zmm22", "zmm23")                                         \
  F8_SFMA5                                                                                             \
  "add $4, %[s]\n\t"                                                                                   \
  "add $128, %[k]\n\t"                                                                                 \
  "jnz 1b\n\t"                                                                                         \
  "vmovaps %%zmm10, %[o0]\n\t"                                                                         \
  "vmovaps %%zmm11, %[o1]\n\t"                                                                         \
  "vmovaps %%zmm12, %[o2]\n\t"                                                                         \
  "vmovaps %%zmm13, %[o3]\n\t"                                                                         \
  "vmovaps %%zmm14, %[o4]\n\t"                                                                         \
  "vmovaps %%zmm15, %[o5]\n\t"                                                                         \
  "vmovaps %%zmm16, %[o6]\n\t"                                                                         \
  "vmovaps %%zmm17, %[o7]\n\t"                                                                         \
  "vmovaps %%zmm18, %[o8]\n\t"                                                                         \
  "vmovaps %%zmm19, %[o9]\n\t"
#define F8_PAIR5_LOOP F8_PAIR5_LOOP_B(F8_BLOCK)
#define F8_PAIR5_LOOP_ADDR F8_PAIR5_LOOP_B(F8_BLOCK_ADDR)
// clang-format on

void Fp8VbmiConv::pair_kernel5(const uint8_t* w0, int64_t K, const uint16_t* x, int64_t xs,
                               const float* scale, const uint8_t* pf, const uint8_t* far, bool address_order,
                               float* tot) {
  int64_t k = -K;
  const Fp8PairEnds e(4, w0, K, x, xs, pf, far);  // bf16 rows are indexed by 2 * k bytes
  const uint16_t* x4 = e.x0 + 4 * xs;
  const float* s = scale;
  static const uint32_t sign = 0x80808080u;
  const auto* t = reinterpret_cast<const __m512i*>(kByteTables.lo);  // lo[128] then hi[128]
  auto* o = reinterpret_cast<__m512*>(tot);                          // [2][5] totals
#define F8_PAIR5_ASM(LOOP)                                                                                   \
  asm volatile(                                                                                              \
      LOOP                                                                                                   \
      : [k] "+r"(k), [s] "+r"(s), [o0] "=m"(o[0]), [o1] "=m"(o[1]), [o2] "=m"(o[2]), [o3] "=m"(o[3]),        \
        [o4] "=m"(o[4]), [o5] "=m"(o[5]), [o6] "=m"(o[6]), [o7] "=m"(o[7]), [o8] "=m"(o[8]), [o9] "=m"(o[9]) \
      : [w0] "r"(e.w0), [w1] "r"(e.w1), [p0] "r"(e.p0), [p1] "r"(e.p1), [x0] "r"(e.x0), [x1] "r"(e.x1),      \
        [x2] "r"(e.x2), [x3] "r"(e.x3), [x4] "r"(x4), [f0] "r"(e.f0), [f1] "r"(e.f1), [t0] "m"(t[0]),        \
        [t1] "m"(t[1]), [t2] "m"(t[2]), [t3] "m"(t[3]), [sign] "m"(sign)                                     \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",    \
        "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",   \
        "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc", "memory");
  if (address_order) {
    F8_PAIR5_ASM(F8_PAIR5_LOOP_ADDR);
  } else {
    F8_PAIR5_ASM(F8_PAIR5_LOOP);
  }
#undef F8_PAIR5_ASM
}

// fp8 weights against 12-32 or 62-64 activation rows (the batched decode's dense projections;
// fp8_lanes_m): the activation rows lie across the lanes (ActView::xt, the transposed pairs), 16
// or 32 at a time, and each weight pair is broadcast, so one vdpbf16ps does one weight pair for 16
// rows, with no reduction across lanes and no transposed weights. R weight rows at a time (8
// against up to 16 rows, 4 against up to 32; lanes past x's rows hold zeros): each 128-column
// block of them is converted once into an L1 buffer while the block before is multiplied (a
// half-row every 16 / (2R) steps of four column pairs), then 64 column pairs x R rows x H lane
// groups of products in two chains each (even and odd pairs: 16 chains against the ~6.5-cycle
// latency), and the block's sums times its scale into the totals: the exact per-block numerics of
// the other paths. The pair kernels convert each weight once per chunk of four or five rows, the
// GEMM transposes its converted panels. One thread, [1408 x 2048] from L3: 0.74 of the bf16 peak
// at 16 rows against 0.50 for the pair kernels, from memory 1.28x / 1.34x the pair kernels / GEMM
// at 16 / 32 rows (docs/PERFORMANCE.md, "Activation rows across the lanes").
//
// How many 128-column blocks ahead LanesBlock requests its rows into L1: one thread, [1408 x 2048]
// at 16 rows from memory, 12 blocks ran at 0.67 of the peak, 8 at 0.63, 4 at 0.56, 2 at 0.49
// (`bench gemm`, Zen 5).
constexpr int64_t kLanesAhead = 12;

template <int R, int H>
struct LanesBlock {
  static_assert((R == 8 && H == 1) || (R == 4 && H == 2));
  static constexpr int kStepsPerHalfRow = 16 / (2 * R);
  // Weight rows w0 + i * K (i < R, one 128-row scale group: scale is its row) against the 16 * H
  // lane rows of xt (stride xts): tot[i][h] lane l = row i's dot product with activation row
  // 16h + l. next: the rows after these (with addr requested in address order while these are
  // multiplied, one line per half-row converted: a block converts 2R half-rows, the next rows hold
  // 2R lines per block; otherwise their first blocks at the end), or null.
  static void run(const Fp8VbmiConvert& conv, const uint8_t* w0, int64_t K, const uint32_t* xt, int64_t xts,
                  const float* scale, const uint8_t* next, bool addr, __m512 (&tot)[R][H]) {
    alignas(64) uint32_t buf[2][R * 64];  // one block of the R rows as bf16 pairs, in their stored order
    const int64_t nb = K / 128;
    // half-row j (row j / 2, columns 64 * (j % 2) of the block) of block b, converted into dst
    const auto convert_half = [&](int64_t b, int j, uint32_t* dst) {
      const int i = j >> 1, h = j & 1;
      __m512i a, c;
      conv.convert64(w0 + i * K + 128 * b + 64 * h, ~__mmask64{0}, a, c);
      _mm512_store_si512(dst + i * 64 + 32 * h, a);
      _mm512_store_si512(dst + i * 64 + 32 * h + 16, c);
    };
    FATHOM_UNROLL
    for (int j = 0; j < 2 * R; ++j) convert_half(0, j, buf[0]);
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      FATHOM_UNROLL
      for (int h = 0; h < H; ++h) tot[i][h] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
      const uint32_t* cur = buf[b & 1];
      uint32_t* nxt = buf[(b + 1) & 1];
      // the block kLanesAhead ahead, whose half-rows are requested one per conversion (the next
      // rows' first blocks at the end)
      const int64_t ba = b + kLanesAhead;
      const uint8_t* ahead = ba < nb                          ? w0 + 128 * ba
                             : next != nullptr && ba < 2 * nb ? next + 128 * (ba - nb)
                                                              : nullptr;
      __m512 acc[R][H][2];
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) {
        FATHOM_UNROLL
        for (int h = 0; h < H; ++h) acc[i][h][0] = acc[i][h][1] = _mm512_setzero_ps();
      }
      const uint32_t* xb = xt + b * 64 * xts;
      for (int step = 0; step < 16; ++step) {  // four column pairs per step
        const int kp = 4 * step;
        FATHOM_UNROLL
        for (int u = 0; u < 4; ++u) {
          __m512bh xv[H];
          FATHOM_UNROLL
          for (int h = 0; h < H; ++h) xv[h] = (__m512bh)_mm512_loadu_si512(xb + (kp + u) * xts + 16 * h);
          FATHOM_UNROLL
          for (int i = 0; i < R; ++i) {
            const __m512bh wv = (__m512bh)_mm512_set1_epi32(static_cast<int>(cur[i * 64 + kp + u]));
            FATHOM_UNROLL
            for (int h = 0; h < H; ++h) acc[i][h][u & 1] = _mm512_dpbf16_ps(acc[i][h][u & 1], xv[h], wv);
          }
        }
        if (step % kStepsPerHalfRow == 0) {
          const int j = step / kStepsPerHalfRow;
          if (b + 1 < nb) convert_half(b + 1, j, nxt);
          if (addr) {
            if (next != nullptr)
              _mm_prefetch(reinterpret_cast<const char*>(next + (b * 2 * R + j) * 64), _MM_HINT_T0);
          } else if (ahead != nullptr) {
            _mm_prefetch(reinterpret_cast<const char*>(ahead + (j >> 1) * K + 64 * (j & 1)), _MM_HINT_T0);
          }
        }
      }
      const __m512 sc = _mm512_set1_ps(scale[b]);
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) {
        FATHOM_UNROLL
        for (int h = 0; h < H; ++h)
          tot[i][h] = _mm512_fmadd_ps(_mm512_add_ps(acc[i][h][0], acc[i][h][1]), sc, tot[i][h]);
      }
    }
  }
};

// Weight rows [r, r + R) against activation rows [g, g + 16H) of x (xt lanes from g).
template <int R, int H>
void fp8_lanes(const Fp8VbmiConvert& conv, const WeightView& w, const ActView& x, float* y, int64_t ldy,
               bool accumulate, int64_t r, int64_t g, const uint8_t* next, bool addr) {
  __m512 tot[R][H];
  LanesBlock<R, H>::run(conv, fp8_row(w, r), w.cols, x.xt + g, x.xt_stride, fp8_scale_row(w, r), next, addr,
                        tot);
  store_lanes<R, H>(tot, y, ldy, accumulate, r, g, std::min<int64_t>(16 * H, x.m - g));
}

// Rows [r0, r1) (r0 and r1 - r0 multiples of 8) against x's rows (fp8_lanes_m): up to 16 through
// LanesBlock<8, 1>, more through LanesBlock<4, 2>, 32 at a time.
//
// Where address_order_wanted holds, up to 16 rows request the next eight rows in address order
// while these are multiplied (LanesBlock's addr), and the call's first eight rows at its start: two
// threads from memory, `bench gemm --dtype fp8 --n 2816|3072|11264 --k 2048 --ab` 0.99-1.07x at 12
// and 16 rows, 1.04 median of eight (Zen 5). Four rows against 17-32 read 0.92-1.00x that way and
// keep their requests kLanesAhead blocks ahead in the same rows.
void fp8_lanes_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                    int64_t r1) {
  CHECK(fp8_lanes_m(x.m));
  const Fp8VbmiConvert conv;
  const bool addr = x.m <= 16 && address_order_wanted();
  if (addr) prefetch_range_l1(fp8_row(w, r0), std::min<int64_t>(8, r1 - r0) * w.cols);
  for (int64_t r = r0; r < r1; r += 8) {
    const uint8_t* next8 = r + 8 < r1 ? fp8_row(w, r + 8) : nullptr;
    if (x.m <= 16) {
      fp8_lanes<8, 1>(conv, w, x, y, ldy, accumulate, r, 0, next8, addr);
      continue;
    }
    for (int64_t g = 0; g < x.m; g += 32) {
      fp8_lanes<4, 2>(conv, w, x, y, ldy, accumulate, r, g, fp8_row(w, r + 4), false);
      fp8_lanes<4, 2>(conv, w, x, y, ldy, accumulate, r + 4, g, next8, false);
    }
  }
}

}  // namespace

void rows_fp8_vbmi_avx512bf16(const WeightView& w, const ActView& x, float* y, int64_t y_stride,
                              bool accumulate, int64_t r0, int64_t r1) {
  CHECK(x.kind == ActKind::kBF16 && x.bf16_perm64 && w.dtype == DType::kF8E4M3);
  if (x.xt != nullptr && fp8_lanes_m(x.m) && w.cols % 128 == 0 && r0 % 8 == 0) {
    const int64_t r8 = r0 + (r1 - r0) / 8 * 8;  // the last few rows take the pair kernels
    fp8_lanes_rows(w, x, y, y_stride, accumulate, r0, r8);
    r0 = r8;
    if (r0 == r1) return;
  }
  rows_fp8<Fp8VbmiConv>(w, x, y, y_stride, accumulate, r0, r1);
}

}  // namespace fathom::matmul_internal
