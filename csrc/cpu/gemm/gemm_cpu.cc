// CPU GEMM (gemm_cpu.h).
#include "cpu/gemm/gemm_cpu.h"
