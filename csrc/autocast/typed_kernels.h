// Unboxed fast path for the hottest autocast ops.
//
// The boxed AutocastKernel serves every op, at the price of boxing its
// arguments. For the ops that dominate real models (convolutions, matmuls,
// relu, pooling, batch_norm, softmax, nll_loss, cat/stack) a typed kernel
// with the op's exact C++ signature does the common categories without
// boxing; anything else (banned, fp32_set_opt_dtype, fp32_append_dtype,
// the XLA adaptations; every call while a recorder is active) falls back to
// the boxed kernel. Both read the same compiled policy table.
#pragma once

#include <torch/library.h>

#include "engine_key.h"
#include "op_name.h"

namespace xla_amp {

// Registers the typed kernel for `name` (e.g. aten::conv2d,
// aten::log_softmax.int) of `engine` in `lib` (a library for the engine's
// key) if one exists; returns whether it did.
bool register_typed_kernel(torch::Library& lib, const OpName& name, int slot,
                           Engine engine);

}  // namespace xla_amp
