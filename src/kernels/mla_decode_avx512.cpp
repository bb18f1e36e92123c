// MLA decode segment, AVX-512F path (no BF16 dot products): pages widened to f32, 16-lane FMAs
// with 6x4 register tiles. See mla_decode_simd.h for the algorithm.
#include "kernels/mla_decode_simd.h"

namespace fathom::internal {

void mla_segment_avx512(const MlaSegmentArgs& args, MlaScratch& scratch) {
  mla_segment_simd<MlaF32Isa<V512, 12, 4, 24>>(args, scratch);
}

}  // namespace fathom::internal
