// CPU backend of the training ops (csrc/common/op_params.h): each function runs the whole op on
// the calling thread (the CPU executor) and fans out over the thread pool. float32 compute for
// every dtype. Throws fa::Error only for conditions the params struct's invariants exclude.
#pragma once
#include <cstddef>

#include "common/op_params.h"

namespace fa::cpu {

class ThreadPool;

void embedding_fwd(const EmbeddingParams& p, ThreadPool& pool);
void embedding_bwd(const EmbeddingParams& p, ThreadPool& pool);
void norm_fwd(const NormParams& p, ThreadPool& pool);  // RMSNorm or LayerNorm (p.layer_norm)
void norm_bwd(const NormParams& p, ThreadPool& pool);
void rope(const RopeParams& p, ThreadPool& pool);
void gelu_fwd(const GeluParams& p, ThreadPool& pool);
void gelu_bwd(const GeluParams& p, ThreadPool& pool);
void swiglu_fwd(const SwigluParams& p, ThreadPool& pool);
void swiglu_bwd(const SwigluParams& p, ThreadPool& pool);
void add(const AddParams& p, ThreadPool& pool);
size_t cross_entropy_workspace_bytes(const CrossEntropyParams& p);
void cross_entropy(const CrossEntropyParams& p, ThreadPool& pool);
void adamw(const AdamWParams& p, ThreadPool& pool);
size_t norm_of_workspace_bytes(const NormOfParams& p);
void norm_of(const NormOfParams& p, ThreadPool& pool);
size_t column_sum_workspace_bytes(const ColumnSumParams& p);
void column_sum(const ColumnSumParams& p, ThreadPool& pool);
size_t sum_workspace_bytes(const SumParams& p);
void sum(const SumParams& p, ThreadPool& pool);

}  // namespace fa::cpu
