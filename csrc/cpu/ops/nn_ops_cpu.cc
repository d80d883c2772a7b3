// CPU backend of the norms, RoPE, activations and the residual add (ops_cpu.h).
#include "cpu/ops/ops_cpu.h"
