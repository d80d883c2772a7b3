// CPU GEMM (csrc/common/gemm_params.h): float32 FMA for every dtype, multithreaded over the pool.
#pragma once
#include "common/gemm_params.h"
#include "cpu/cpu_isa.h"

namespace fa::cpu {

class ThreadPool;

// Throws std::invalid_argument (message naming the field) when p breaks the contract. Every C
// element is one fp32 fma chain over k in order, so results do not depend on the thread count.
void gemm(const GemmParams& p, ThreadPool& pool);
// The same with the instruction-set variant chosen (clamped to what the CPU runs; tests and
// benchmarks). Variants round differently only where one lacks FMA (generic).
void gemm(const GemmParams& p, ThreadPool& pool, Isa isa);

}  // namespace fa::cpu
