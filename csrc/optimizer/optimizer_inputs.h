// Argument collection for the sync-free optimizers (xla_amp/syncfree/_base.py).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace xla_amp {

// For one param group's parameter list, the parameters with a gradient
// split by dtype: (float32 parameters, their gradients, other parameters,
// their gradients, index of the first unusable entry or -1, index of the
// first "other" parameter or -1). A parameter is float32 when it and its
// gradient both are. Unusable: not a tensor, parameter or gradient off
// `device`, sparse gradient, gradient shape != parameter shape, or a state
// tensor under one of `state_keys` in `state` (the optimizer's per-parameter
// state) off `device` or not of the parameter's shape; collection stops
// there, and the caller raises naming that parameter.
pybind11::tuple collect_grads(const pybind11::list& params, const at::Device& device,
                              const pybind11::dict& state,
                              const std::vector<std::string>& state_keys);

}  // namespace xla_amp
