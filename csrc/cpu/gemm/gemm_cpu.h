// CPU GEMM (csrc/common/gemm_params.h): float32 FMA for every dtype, multithreaded over the pool.
#pragma once
#include "common/gemm_params.h"

namespace fa::cpu {

class ThreadPool;

void gemm(const GemmParams& p, ThreadPool& pool);

}  // namespace fa::cpu
