// CPU backend of the strided copy-and-cast engine (csrc/common/copy_params.h): runs on the calling
// thread (the CPU executor) and fans out over the thread pool. Throws nothing for params that meet
// copy_params.h's invariants.
#pragma once

#include "common/copy_params.h"

namespace fa::cpu {

class ThreadPool;  // csrc/cpu/thread_pool.h

// dst view = convert(src view). `p` need not be coalesced (this does it on a copy).
void copy(const CopyParams& p, ThreadPool& pool);
// dst view = convert(p.value).
void fill(const CopyParams& p, ThreadPool& pool);

}  // namespace fa::cpu
