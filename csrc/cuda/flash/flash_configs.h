// The configuration tables of the FlashAttention-2 kernel families, one row per compiled head dim:
// the launchers instantiate their traits from these rows (at compile time) and the planners
// (flash_plan.h) report and check them (at run time), so that a configuration is written once.
// Why each row is what it is (measurements, ptxas registers and spills) stays in the comment of the
// launcher that runs it. Shared-memory sizes are not in the rows: they come from the traits. The tile
// a row reports (block_m x block_n, warps, stages) is checked against the traits it instantiates, at
// compile time, by every launcher (row_matches): results report it as the call's plan.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/attention_params.h"

namespace fa::cuda::flash {

// One configuration. Fields a family does not use are 0 (false).
struct FlashConfig {
  int head_dim;           // the compiled (padded) head dim
  int block_m;            // query rows per thread block (backward: per step of a block's loop)
  int block_n;            // keys per K/V tile (backward: per thread block)
  int warps;              // warps of a thread block (sm90: 4 per warpgroup)
  int stages;             // K/V (backward: Q / dO) tiles in shared memory at once
  int blocks_per_sm;      // thread blocks one SM keeps (the launch bounds' minimum); 0: not set
  bool q_in_regs;         // Q held in registers for the whole pass, not re-read from shared memory
  int key_tiles = 0;      // backward, mma.sync: warps along the keys (16 keys each)
  int d_split = 0;        // backward, mma.sync: warps along the head dim
};

// Whether the traits a launcher instantiated from row `c` have the tile the row reports.
template <typename Traits>
constexpr bool row_matches(const FlashConfig& c) {
  return c.block_m == Traits::kBlockM && c.block_n == Traits::kBlockN && c.warps * 32 == Traits::kNThreads &&
         c.stages == Traits::kStages;
}

// Forward, mma.sync, fp16 / bf16 (flash_fwd.cu).
inline constexpr FlashConfig kFwdSm80Configs[] = {
    {32, 64, 64, 4, 2, 0, true},    {64, 64, 64, 4, 2, 0, true},     {96, 64, 64, 4, 2, 0, true},
    {128, 64, 64, 4, 2, 0, true},   {192, 128, 32, 8, 2, 0, false},  {256, 128, 32, 8, 2, 0, false},
};
// Forward, wgmma + TMA, fp16 / bf16 (hopper/flash_fwd_sm90.cu): two warpgroups, 3 stages.
inline constexpr FlashConfig kFwdSm90Configs[] = {
    {32, 128, 64, 8, 3, 2, false},   {64, 128, 64, 8, 3, 2, false},   {96, 128, 128, 8, 3, 1, false},
    {128, 128, 128, 8, 3, 1, false}, {192, 128, 64, 8, 3, 1, false},  {256, 128, 32, 8, 3, 1, false},
};
// Forward, warp-specialized wgmma + TMA (hopper/flash_fwd_sm90_ws_kernel.cuh): a producer warpgroup
// and consumer warpgroups of 64 query rows (warps / 4 - 1 of them: two, or three at head dim 64),
// persistent, K and V in `stages` buffers. It runs the non-causal calls of the head dims it has a row
// for; the causal ones run the row above (fwd_sm90_config).
inline constexpr FlashConfig kFwdSm90WsConfigs[] = {
    {64, 192, 128, 16, 3, 1, false},
    {96, 128, 128, 12, 2, 1, false},
    {128, 128, 128, 12, 2, 1, false},
    {192, 128, 112, 12, 2, 1, false},
    {256, 128, 80, 12, 2, 1, false},
};
// The same kernel for causal calls with at least fwd_sm90_ws_causal_min_seqlen queries and keys: its
// blocks take the query tiles from a global counter, heaviest first within sections of heads
// (query_tile_scheduler.h QueryTileScheduler); shorter causal calls run kFwdSm90Configs, one block per
// query tile, whose two blocks per SM (d64) or 64-key tiles (d192, d256) win there. H100, bf16, B*S =
// 16k, H*D = 2048, queued back to back, the variants of a shape timed in turns, two rounds
// (test/native/flash_fwd_check.cu), TFLOP/s at seqlen 512 / 1k / 2k / 4k / 8k / 16k, 2026-11-27:
//   d64  ws n128 s3 c3: 183 / 242 / 336 / 390 / 423 / 439   <- from 2k
//        two warpgroups n64 s3 b2: 209 / 265 / 307 / 340 / 373 / 386
//   d96  ws n128 s2: 222 / 302 / 354 / 398 / 421 / 434       <- from 512
//        two warpgroups n128 s3: 184 / 259 / 299 / 359 / 405 / 422
//   d128 ws n128 s2: 268 / 364 / 437 / 494 / 517 / 542       <- from 512
//        two warpgroups n128 s3: 224 / 310 / 380 / 414 / 467 / 514 (causal n176 spills 220 bytes)
//   d192 ws n96 s2: 219 / 339 / 428 / 520 / 546 / 577        <- from 1k
//        two warpgroups n64 s3: 241 / 322 / 368 / 401 / 478 / 514
//   d256 ws n80 s2: 203 / 315 / 426 / 495 / 527 / 529-567     <- from 1k
//        two warpgroups n32 s3: 211 / 274 / 308 / 351 / 395 / 453
// Handed out by a fixed walk over the blocks (heaviest first over all heads, the blocks in a snake)
// instead of by the counter, the same ws rows ran 186 / 234 / 320 / 344 / 397 / 433 (d64), 194 / 245 /
// 300 / 364 / 400 / 448 (d96), 206 / 268 / 338 / 443 / 472 / 524 (d128), 173 / 245 / 390 / 492 / 535 /
// 585 (d192) and 162 / 235 / 387 / 488 / 531 / 588 (d256): the counter wins up to 4k and matches the
// walk within the run-to-run spread (3-7%, the same kernel timed twice) from 8k.
// (Measured while ptxas spilled in the causal d192 n96 and d256 n80 consumers; with the epilogue's
// rare path out of line they spill nothing: flash_fwd_sm90_ws_kernel.cuh kNonfiniteVOutOfLine.)
inline constexpr FlashConfig kFwdSm90WsCausalConfigs[] = {
    {64, 192, 128, 16, 3, 1, false},
    {96, 128, 128, 12, 2, 1, false},
    {128, 128, 128, 12, 2, 1, false},
    {192, 128, 96, 12, 2, 1, false},
    {256, 128, 80, 12, 2, 1, false},
};
// The causal calls of that kernel take their work items from a counter of this size on the stream's
// memory pool (hopper/flash_fwd_sm90_launch.cuh).
inline constexpr size_t kFwdSm90ItemCounterBytes = sizeof(uint32_t);
// The shortest sequence (queries and keys) from which a causal call at compiled head dim head_dim runs
// its row of kFwdSm90WsCausalConfigs (the crossovers measured above).
constexpr int64_t fwd_sm90_ws_causal_min_seqlen(int head_dim) {
  switch (head_dim) {
    case 64:
      return 2048;
    case 192:
    case 256:
      return 1024;
    default:
      return 0;
  }
}
// Forward, mma.sync on TF32 and 3xTF32 (flash_fwd_fp32.cu): 4 warps of 16 query rows, one K and one
// V tile (K of the next tile loads during P V).
inline constexpr FlashConfig kFwdFp32Tf32Configs[] = {
    {32, 64, 64, 4, 1, 3, true},    {64, 64, 64, 4, 1, 2, true},     {96, 64, 32, 4, 1, 2, true},
    {128, 64, 32, 4, 1, 2, true},   {192, 64, 32, 4, 1, 2, false},   {256, 64, 16, 4, 1, 2, false},
};
inline constexpr FlashConfig kFwdFp32HighestConfigs[] = {
    {32, 64, 64, 4, 1, 3, true},    {64, 64, 32, 4, 1, 3, true},     {96, 64, 32, 4, 1, 2, false},
    {128, 64, 32, 4, 1, 2, false},  {192, 64, 32, 4, 1, 2, false},   {256, 64, 16, 4, 1, 2, false},
};

// Backward, mma.sync, fp16 / bf16 (flash_bwd.cu): 64 query rows per step; warps 8 x 1 (key tiles x
// head-dim split: 128 keys) up to head dim 128, then 4 x 2 (64 keys).
inline constexpr FlashConfig kBwdSm80Configs[] = {
    {32, 64, 128, 8, 2, 0, false, 8, 1},  {64, 64, 128, 8, 2, 0, false, 8, 1}, {96, 64, 128, 8, 2, 0, false, 8, 1},
    {128, 64, 128, 8, 2, 0, false, 8, 1}, {192, 64, 64, 8, 2, 0, false, 4, 2}, {256, 64, 64, 8, 2, 0, false, 4, 2},
};
// Backward, wgmma + TMA (hopper/flash_bwd_sm90.cu): the dK/dV (and single-kernel) main kernel, 64
// query rows per step, 128 keys (two warpgroups of 64), and the two-kernel backward's dQ kernel, 128
// query rows (two warpgroups of 64), 64-key tiles. The head dims with a row are the ones the Hopper
// backward has.
inline constexpr FlashConfig kBwdSm90Configs[] = {
    {32, 64, 128, 8, 2, 0, false}, {64, 64, 128, 8, 2, 0, false}, {128, 64, 128, 8, 2, 0, false},
};
// Backward, the warp-specialized single kernel (hopper/flash_bwd_ws_sm90_kernel.cuh) for head dims
// 33-128 (rows 64 and 128; 65-96 run the d128 row zero-padded), causal or not: a producer warpgroup
// (TMA, lse / D, dQ writer warps) and two consumer warpgroups of 64 keys; 64 query rows per step at
// head dim 128, 128 at 64. It replaces the main kernel there, and 'auto' takes it over the two kernels
// from kBwdWsMinSeqlen queries and keys. Head dim 128, H100, bf16, B*S =
// 16k, H*D = 2048, queued back to back (test/native/flash_bwd_check.cu), ms at seqlen 512 / 1k / 2k /
// 8k, each line one run:
//   2026-11-26, not causal: two kernels 0.670 / 1.057 / 1.872 / 6.974; this kernel (consumers in
//     lockstep) 0.666 / 0.968 / 1.570 / 5.421; the main single kernel (earlier) 0.680 / 1.018 / 1.671 /
//     5.722.
//   2026-11-27, causal: this kernel 0.553-0.566 / 0.725-0.734 / 1.078 / 3.21-3.27, two kernels
//     0.547-0.552 / 0.750-0.759 / 1.18 / 3.75-3.77, the main single kernel 0.611 / 0.806 / 1.19 /
//     3.50-3.57.
//   2026-11-27, deterministic (a turn per dQ column half, descending when causal), 512 / 1k / 2k: not
//     causal 0.695 / 1.032 / 1.70 against the two kernels' 0.664 / 1.078 / 1.89; causal 0.572 / 0.733 /
//     1.066 against 0.545 / 0.752 / 1.186.
//   2026-11-27, dK / dV through TMA, 512 / 1k / 2k / 4k, two runs: not causal 0.566 / 0.863-0.865 /
//     1.467-1.481 / 2.72 against 0.654-0.659 / 1.049-1.058 / 1.868-1.889 / 3.48-3.50; causal 0.504-0.508 /
//     0.665-0.668 / 1.004-1.009 / 1.74-1.80 against 0.534-0.535 / 0.745 / 1.20-1.22 / 2.04-2.08;
//     deterministic at 512 0.628-0.635, causal 0.531 (the bench's FA2 grid: 0.555 against 0.655 ms).
inline constexpr FlashConfig kBwdWsSm90Configs[] = {{64, 128, 128, 12, 2, 0, false}, {128, 64, 128, 12, 2, 0, false}};
// Head dim 64: 128 query rows per step (S^T and dP^T 64 keys x 128 queries per consumer, dQ split by
// rows). H200, bf16, B*S = 16k, H*D = 2048, queued TFLOP/s at 512 / 1k / 2k / 4k / 8k / 16k, two rounds
// in turns with the build of 64-row steps (dQ split by keys), 2026-11-28: not causal 258 / 348 / 390 /
// 438 / 465 / 479 against 232 / 301 / 322 / 356 / 374 / 386 (the two kernels 237 / 282 / 310 / 324 /
// 334 / 337); causal 163 / 242 / 323 / 370 / 408 / 435 against 151 / 219 / 288 / 318 / 358 / 379 (two
// kernels 146 / 203 / 249 / 292 / 314 / 331); deterministic not causal 254 / 331 / 382 / 410 / 425 /
// 429 against 227 / 281 / 313 / 326 / 333 / 354, causal 153 / 229 / 302 / 350 / 384 / 402 against 141 /
// 202 / 253 / 287 / 310 / 321.
// 'auto' takes the kernel over the two kernels from kBwdWsMinSeqlen queries and keys, at both head
// dims, causal or not, deterministic or not.
inline constexpr int64_t kBwdWsMinSeqlen = 512;
// Its deterministic mode: turn counters per query tile (one per consumer warpgroup's dQ columns).
inline constexpr int kBwdWsDqTurnsPerTile = 2;
inline constexpr FlashConfig kBwdDqSm90Configs[] = {
    {32, 128, 64, 8, 2, 0, false},  {64, 128, 64, 8, 2, 0, false},  {128, 128, 64, 8, 2, 0, false},
    {192, 128, 64, 8, 2, 0, false}, {256, 128, 32, 8, 2, 0, false},
};
// Backward, wgmma + TMA, head dims 192 and 256 (hopper/flash_bwd_wide_sm90_kernel.cuh): the dK/dV
// kernel of the two-kernel backward, 64 keys per block (both warpgroups), 64 query rows per step.
inline constexpr FlashConfig kBwdWideSm90Configs[] = {
    {192, 64, 64, 8, 2, 0, false},
    {256, 64, 64, 8, 2, 0, false},
};
// Backward, mma.sync on TF32 and 3xTF32 (flash_bwd_fp32.cu), both precisions: query rows per step,
// key tiles x head-dim split, Q / dO stages, blocks per SM.
inline constexpr FlashConfig kBwdFp32Configs[] = {
    {32, 32, 64, 4, 2, 2, false, 4, 1},  {64, 32, 64, 4, 2, 2, false, 4, 1},  {96, 32, 64, 8, 1, 1, false, 4, 2},
    {128, 16, 64, 8, 2, 1, false, 4, 2}, {192, 32, 32, 4, 1, 2, false, 2, 2}, {256, 16, 32, 4, 1, 2, false, 2, 2},
};

// The row of `head_dim` in a table (head_dim 0 when the table has none). Host constexpr: the
// launchers call it in template arguments, the planners at run time.
template <size_t N>
constexpr FlashConfig config_for(const FlashConfig (&table)[N], int head_dim) {
  for (size_t i = 0; i < N; ++i)
    if (table[i].head_dim == head_dim) return table[i];
  return FlashConfig{0, 0, 0, 0, 0, 0, false, 0, 0};
}
// The Hopper forward's row for a call: the warp-specialized kernel's where it has one.
constexpr bool fwd_sm90_warp_specialized(int head_dim, bool causal) {
  return !causal && config_for(kFwdSm90WsConfigs, head_dim).head_dim != 0;
}
constexpr FlashConfig fwd_sm90_config(int head_dim, bool causal) {
  return fwd_sm90_warp_specialized(head_dim, causal) ? config_for(kFwdSm90WsConfigs, head_dim)
                                                     : config_for(kFwdSm90Configs, head_dim);
}
// Whether a causal call at compiled head dim head_dim runs the warp-specialized kernel's causal row.
constexpr bool fwd_sm90_ws_causal(int head_dim, int64_t seqlen_q, int64_t seqlen_k) {
  const int64_t min_seqlen = fwd_sm90_ws_causal_min_seqlen(head_dim);
  return config_for(kFwdSm90WsCausalConfigs, head_dim).head_dim != 0 && seqlen_q >= min_seqlen &&
         seqlen_k >= min_seqlen;
}
// The Hopper forward's row for call p at compiled head dim head_dim (what the launcher runs).
constexpr FlashConfig fwd_sm90_config(int head_dim, const AttentionFwdParams& p) {
  if (p.causal)
    return fwd_sm90_ws_causal(head_dim, p.seqlen_q, p.seqlen_k) ? config_for(kFwdSm90WsCausalConfigs, head_dim)
                                                                : fwd_sm90_config(head_dim, true);
  return fwd_sm90_config(head_dim, false);
}
constexpr FlashConfig fwd_fp32_config(Fp32Precision precision, int head_dim) {
  return precision == Fp32Precision::kHighest ? config_for(kFwdFp32HighestConfigs, head_dim)
                                              : config_for(kFwdFp32Tf32Configs, head_dim);
}

}  // namespace fa::cuda::flash
