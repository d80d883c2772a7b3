// Compiles a tile header once per instruction set, in the including translation unit:
//
//   #define FA_TILE_BODY "cpu/tile_fwd.h"
//   #include "cpu/tile_variants.h"
//
// defines isa_generic::, isa_avx2:: and isa_avx512:: copies of tile_kernels.h and FA_TILE_BODY
// (each in an anonymous namespace, the x86 ones inside FA_CPU_TARGET_* regions, see cpu_isa.h).
// The entry point then picks one at run time. No include guard: meant to be included once per .cc.
#ifndef FA_TILE_BODY
#error "define FA_TILE_BODY as the tile header to instantiate before including cpu/tile_variants.h"
#endif

namespace isa_generic {
namespace {
#define FA_TILE_LANES 4  // SSE2 baseline: 4 x fp32
#define FA_TILE_LEVEL 0
#include "cpu/tile_kernels.h"
#include FA_TILE_BODY
#undef FA_TILE_LANES
#undef FA_TILE_LEVEL
}  // namespace
}  // namespace isa_generic

#if FA_CPU_X86
FA_CPU_TARGET_AVX2_BEGIN
namespace isa_avx2 {
namespace {
#define FA_TILE_LANES 8  // AVX2: 8 x fp32
#define FA_TILE_LEVEL 1
#include "cpu/tile_kernels.h"
#include FA_TILE_BODY
#undef FA_TILE_LANES
#undef FA_TILE_LEVEL
}  // namespace
}  // namespace isa_avx2
FA_CPU_TARGET_END

FA_CPU_TARGET_AVX512_BEGIN
namespace isa_avx512 {
namespace {
#define FA_TILE_LANES 16  // AVX-512: 16 x fp32
#define FA_TILE_LEVEL 2
#include "cpu/tile_kernels.h"
#include FA_TILE_BODY
#undef FA_TILE_LANES
#undef FA_TILE_LEVEL
}  // namespace
}  // namespace isa_avx512
FA_CPU_TARGET_END
#endif

#undef FA_TILE_BODY
