// Launcher of the Hopper FA2 forward: dtype x head dim x causal dispatch, one traits configuration per
// head dim, dynamic shared-memory attribute, launch, cudaGetLastError. Compiled for every target; the
// kernels have bodies only in the sm_90a pass (flash_fwd_sm90_kernel.cuh), and flash_fwd_sm90_built()
// tells the dispatcher whether that pass was part of the build.
//
// Configurations (keys per tile kBlockN, warpgroups of 64 query rows, K/V stages, thread blocks per SM),
// chosen by timing alternatives side by side (test/native/flash_fwd_check.cu; H200, bf16, B*S = 16k,
// H*D = 2048; d64 rows: 20 launches queued back to back, TFLOP/s at seqlen 512 / 1k / 2k / 8k; d128 and
// d256 rows: median of 20, at 2k / 8k; non-causal | causal):
//   d64  n64 w2 s3 b2:  327 / 369 / 392 / 407 | 215 / 287 / 343 / 402   <- shipped for head dim <= 64
//        n64 w2 s4 b2:  331 / 372 / 395 / 405 | 214 / 285 / 340 / 399
//        n64 w1 s4 b3:  331 / 372 / 397 / 393 | 231 / 296 / 342 / 378
//        n128 w1 s3 b2: 301 / 362 / 396 / 401 | 193 / 269 / 338 / 405
//        n128 w3 s3 b1: 245 / 289 / 343 / 389 | 138 / 186 / 261 / 338   (shipped before: 192-row tiles)
//        n128 w2 s3 b1: 243 / 296 / 331 / 361 | 157 / 222 / 277 / 342
//     Two blocks per SM win because one block's prologue (Q load, first K/V tiles) and epilogue overlap
//     the other's MMAs; with one block of 2-3 warpgroups the SM idles at both ends of every tile.
//     ptxas caps b2 at 128 registers (65536 / 512 threads): 0 spills.
//   d128 n128 w2 s3 b1: 493 / 555 at 2k / 8k | 392 / 505   <- shipped
//        n96 w2 s3: 453 / 517 | 374 / 488;  n64 w3 s4: 455 / 503 | 351 / 454;  n64 w2 s4: 447 / 497 | 361 / 455
//        n128 w1 s3: 266 / 332 at 512 / 1k (shipped: 346 at 512). Two d128 blocks do not fit: 186
//        registers x 256 threads, and Q + 3 stages of 64-key K/V tiles is 64 bytes over half the SM.
//   d256 n32 w2 s3: 421 / 461 | 338 / 415    (n64 spilled at 255 registers before TMA loads)
// Without the intra-warpgroup overlap and with cp.async loads d128 ran at 344 / 370 | 287 / 342.
// The warp-specialized kernel (flash_fwd_sm90_ws_kernel.cuh; H100, bf16, same shapes, median of 20,
// TFLOP/s at 512 / 1k / 2k / 8k, each beside the n128 w2 s3 row in the same run):
//   d128 non-causal, ws n176 s2: 420 / 531 / 598 / 661
//                    ws n128 s2: 425 / 523 / 585 / 633;  ws n128 s3: 394 / 512 / 579 / 635
//                 n128 w2 s3 b1: 341 / 432 / 490 / 553
//     With two Q buffers and O stored through TMA (the 176-key tile leaves room for one), n128 s2 ran at
//     least as fast as n176 at every length (H200, bf16, queued, the variants in turns, 2026-11-28, two
//     runs; TFLOP/s at 512 / 1k / 2k / 4k / 8k / 16k):
//                    ws n128 s2: 507 / 534 / 538 / 573 / 589 / 592   <- shipped (kFwdSm90WsConfigs)
//                    ws n176 s2: 411 / 465 / 496 / 540 / 568 / 575   (consumers at 240 registers: 415 / 487 /
//                                525 / 559 / 577 / 597)
//                    ws n128 s3 with one Q buffer (the stages of cuDNN 9.19's d128 kernel): 421 / 473 / 499 /
//                                553 / 576 / 573
//   Causal, every head dim: flash_configs.h kFwdSm90WsCausalConfigs (the warp-specialized kernel with its
//   work items from a counter, against the two-warpgroup one; ws n176 causal at d128 spills 220 bytes).
//   d64 non-causal,  ws n192 s2: 301 / 352 / 410 / 449;  ws n128 s2: 320 / 374 / 398 / 417
//                 n64 w2 s3 b2: 317 / 372 / 402 / 428
//     three consumer warpgroups (192-row tiles; setmaxnreg 32 / 160, no spills; queued, 2026-11-27,
//     at 512 / 1k / 2k / 4k / 8k / 16k):
//                 ws n128 s3 c3: 348 / 391 / 455 / 459 / 489 / 495   <- shipped (kFwdSm90WsConfigs)
//                 ws n128 s2 c3: 347 / 391 / 453 / 467 / 488 / 495
//                 n64 w2 s3 b2:  324 / 377 / 406 / 417 / 419 / 432
//     Each warpgroup's softmax of a 64 x 128 tile (8192 exp2) costs about as many cycles of the SM's
//     MUFU units as its two GEMMs (2 x 64 x 128 x 64 MACs) cost of the tensor cores: with two
//     consumers one softmax hides behind the other warpgroup's GEMMs at best; with three the tensor
//     cores have two other warpgroups' GEMMs to run during each softmax.
//   d96 non-causal (queued, 2026-11-27, at 512 / 1k / 2k / 4k / 8k / 16k):
//                    ws n128 s2: 383 / 462 / 507 / 501 / 491 / 508   <- shipped (kFwdSm90WsConfigs)
//                    ws n176 s2: 380 / 454 / 505 / 481 / 506 / 519;  ws n192 s2: 361 / 427 / 494 / 524 / 516 / 515
//                 n128 w2 s3 b1: 291 / 373 / 425 / 444 / 445 / 460
//   d192 non-causal, ws n112 s2: 416 / 530 / 629 / 713   <- shipped (kFwdSm90WsConfigs)
//                    ws n96 s2:  395 / 541 / 616 / 695
//                 n64 w2 s3 b1: 325 / 433 / 507 / 573
//   d256 non-causal, ws n80 s2:  396 / 543 / 630 / 711   <- shipped (kFwdSm90WsConfigs)
//                    ws n64 s2:  418 / 529 / 605 / 662
//                 n32 w2 s3 b1: 295 / 365 / 408 / 451
//   Consumers at 240 registers and the producer at 24 without a causal mask (kWideConsumers; H200, bf16,
//   queued, in turns with 232 / 40, 2026-11-28, 512 / 1k / 2k / 4k / 8k / 16k): d256 n80 471 / 571 / 611 /
//   636 / 648 / 659 against 462 / 562 / 596 / 623 / 640 / 649 (taken); d128 n128 1.00x; d96 n128 0.98-1.00x
//   and d192 n112 0.98-1.01x (not taken).
// The epilogue stores O through TMA (each warpgroup stages its rows in its part of the Q tile; the
// warp-specialized kernel keeps two Q buffers where they fit and frees one only once its store has
// read it). Against every thread storing its fragments from registers, queued, H100, bf16,
// 2026-11-27, TFLOP/s at 512 / 1k / 2k (from 4k the difference is within the run-to-run spread):
//   ws d128 n128 s2 non-causal: 470 / 530 / 554 (registers: one Q buffer 378 / 470 / 521, two 386 / 505 / 531)
//   ws d128 n176 s2 non-causal: 396 / 509 / 522 (registers 369 / 483 / 514)
//   ws d64 n128 s3 c3 non-causal: 350 / 380 / 417 (registers: one Q buffer 275 / 363 / 417, two 300 / 362 / 417)
//   ws d96 n128 s2 non-causal: 401 / 389 / 439 (registers: one Q buffer 309 / 402 / 422)
//   ws d192 n112 s2 non-causal: 420 / 540 / 593 (registers 333 / 503 / 549); d256 n80: 443 / 568 / 586 (343 /
//     473 / 604)
//   n128 w2 s3 d128 causal: 225 / 317 / 378 (registers 197 / 284 / 344); n64 w2 s3 d192 causal: 221 / 321 /
//     382 (201 / 291 / 358)
// ptxas -v (CUDA 13.0, sm_90a; fp16 = bf16; non-causal / causal registers), 0 spills, shared memory
// Q + 3 stages of K and V + barriers:
//   d32 90, d64 106/109 (2 blocks per SM: launch bound 128; 65 KiB smem each), d96 189/175, d128 186/195 (224 KiB smem),
//   d192 170/213, d256 182/215. Warp-specialized (setmaxnreg: producer 40, consumers 232; d256 non-causal
//   24 / 240): no spills at d128 n176, d192 n112 and d256 n80 non-causal; causal d128 n176 spills 244 bytes, d192 n112 532,
//   d256 n80 612, d192 n96 32 (O stored through TMA; with fragments stored from registers 220, 412, 468
//   and none).
#include "cuda/flash/hopper/flash_fwd_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/flash/flash_configs.h"
#include "cuda/flash/hopper/flash_fwd_sm90_launch.cuh"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

// The warp-specialized kernel of a row of flash_configs.h (its tile, warps and stages); the consumers
// take 240 registers at head dim 256 (measured above).
template <typename Elem, int kHeadDim, bool kIsCausal, int kBlockM, int kBlockN, int kWarps, int kStages>
cudaError_t launch_ws_row(const AttentionFwdParams& p, cudaStream_t stream) {
  using Default = flash::sm90::FlashFwdSm90WsTraits<kHeadDim, kBlockN, kStages, Elem, kWarps / 4 - 1>;
  using Traits = flash::sm90::FlashFwdSm90WsTraits<kHeadDim, kBlockN, kStages, Elem, kWarps / 4 - 1,
                                                   Default::kL2SectionKiB, 0, Default::kStagedO,
                                                   Default::kL2SectionMaxHeads, kHeadDim == 256>;
  static_assert(flash::row_matches<Traits>(flash::FlashConfig{kHeadDim, kBlockM, kBlockN, kWarps, kStages, 1, false}),
                "the row reports the traits' tile");
  return launch_flash_fwd_sm90_ws<Traits, kIsCausal>(p, stream);
}

// Per head dim, the row of flash::kFwdSm90Configs or, for the non-causal calls of the head dims it
// has, of flash::kFwdSm90WsConfigs; causal calls from
// flash::fwd_sm90_ws_causal_min_seqlen on, the row of flash::kFwdSm90WsCausalConfigs (flash_configs.h
// fwd_sm90_config).
template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch(const AttentionFwdParams& p, cudaStream_t stream) {
  if constexpr (kIsCausal && flash::config_for(flash::kFwdSm90WsCausalConfigs, kHeadDim).head_dim == kHeadDim) {
    constexpr flash::FlashConfig kW = flash::config_for(flash::kFwdSm90WsCausalConfigs, kHeadDim);
    if (flash::fwd_sm90_ws_causal(kHeadDim, p.seqlen_q, p.seqlen_k))
      return launch_ws_row<Elem, kHeadDim, true, kW.block_m, kW.block_n, kW.warps, kW.stages>(p, stream);
  }
  constexpr flash::FlashConfig kC = flash::fwd_sm90_config(kHeadDim, kIsCausal);
  static_assert(kC.head_dim == kHeadDim && kC.warps % 4 == 0, "every compiled head dim has a row of warpgroups");
  if constexpr (flash::fwd_sm90_warp_specialized(kHeadDim, kIsCausal)) {
    return launch_ws_row<Elem, kHeadDim, kIsCausal, kC.block_m, kC.block_n, kC.warps, kC.stages>(p, stream);
  } else {
    using Traits =
        flash::sm90::FlashFwdSm90Traits<kHeadDim, kC.block_n, kC.warps / 4, kC.stages, Elem, kC.blocks_per_sm>;
    static_assert(flash::row_matches<Traits>(kC), "the row reports the traits' tile");
    return launch_flash_fwd_sm90<Traits, kIsCausal>(p, stream);
  }
}

}  // namespace

bool flash_fwd_sm90_built() {
#ifdef FA_HAS_SM90A
  return true;
#else
  return false;
#endif
}

cudaError_t flash_fwd_sm90(const AttentionFwdParams& p, cudaStream_t stream) {
  return FA_HEADDIM_SWITCH(p.head_dim, kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.dtype == DType::kFloat16) return launch<__half, kHeadDim, kIsCausal>(p, stream);
      return launch<__nv_bfloat16, kHeadDim, kIsCausal>(p, stream);
    });
  });
}

}  // namespace fa::cuda
