// CPU backend of embedding, cross-entropy, AdamW and the reductions (ops_cpu.h).
#include "cpu/ops/ops_cpu.h"
