// Registration of AutocastKernel under AutocastXLA, separate from the
// casting logic. Each op overload gets one slot, registered once and kept
// for the life of the process; policies say what a slot does.
#pragma once

#include <string>
#include <vector>

namespace xla_amp {

struct RegistrationResult {
  std::vector<int> slots;  // one per requested name, in order
  int replaced = 0;        // how many displaced an existing AutocastXLA kernel
};

// `names` are "ns::op" or "ns::op.overload". Already registered names keep
// their slot. The dispatcher's "Overriding a previously registered kernel"
// warnings are counted, not printed.
RegistrationResult register_ops(const std::vector<std::string>& names);

std::vector<std::string> registered_ops();

}  // namespace xla_amp
