// Registration of AutocastKernel under an engine's autocast key (AutocastXLA
// or AutocastPrivateUse1), separate from the casting logic. Each op overload
// gets one slot, shared by the engines, and is registered once per engine and
// kept for the life of the process; policies say what a slot does.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <vector>

#include "engine_key.h"

namespace xla_amp {

struct RegistrationResult {
  std::vector<int> slots;  // one per requested name, in order
  int replaced = 0;        // how many displaced an existing kernel under the key
};

// `names` are "ns::op" or "ns::op.overload". Already registered names keep
// their slot. The dispatcher's "Overriding a previously registered kernel"
// warnings are counted, not printed.
RegistrationResult register_ops(Engine engine, const std::vector<std::string>& names);

// The names registered for `engine`, in registration order.
std::vector<std::string> registered_ops(Engine engine);

// `impl` ("ns::op", the same schema as `op`) computes `op` where a kernel
// casts it to a low dtype (float16/bfloat16): scaled_dot_product_attention,
// whose math path would convert its cast inputs back to float32
// (xla_amp/policies/_attention.py). Shared by the engines; set before the op's first
// call (a kernel reads it once).
void set_lower_precision_impl(const std::string& op, const std::string& impl);

// The operator `impl` registered for `op` ("ns::op[.overload]"), or none.
std::optional<c10::OperatorHandle> lower_precision_impl(const std::string& op);

}  // namespace xla_amp
