// MLA decode segment, AVX2 + FMA + F16C path: pages widened to f32, 8-lane FMAs with register
// tiles of at most 12 accumulators (16 ymm registers). See mla_decode_simd.h for the algorithm.
#include "kernels/mla_decode_simd.h"

namespace fathom::internal {

void mla_segment_avx2(const MlaSegmentArgs& args, MlaScratch& scratch) {
  mla_segment_simd<MlaF32Isa<V256, 12, 3, 12>>(args, scratch);
}

}  // namespace fathom::internal
