// Registration of AutocastKernel under an engine's autocast key (AutocastXLA
// or AutocastPrivateUse1), separate from the casting logic. Each op overload
// gets one slot, shared by the engines, and is registered once per engine and
// kept for the life of the process; policies say what a slot does.
#pragma once

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

}  // namespace xla_amp
