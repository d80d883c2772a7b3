// Shared by the standalone CUDA checks (test/native/*.cu): any CUDA error is fatal for the whole
// program (it may be sticky), so it is reported as a FAIL line and the program exits 1.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(expr)                                                                                  \
  do {                                                                                                    \
    const cudaError_t check_cuda_err_ = (expr);                                                           \
    if (check_cuda_err_ != cudaSuccess) {                                                                 \
      std::printf("FAIL cuda: %s returned %s (%s) at %s:%d\n", #expr, cudaGetErrorName(check_cuda_err_), \
                  cudaGetErrorString(check_cuda_err_), __FILE__, __LINE__);                               \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)
