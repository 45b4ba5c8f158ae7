// The one place that defines the autocast cast categories.
//
// Python mirrors these names (xla_amp.policy.CATEGORIES) through
// xla_amp._C.categories(); the numeric values cross the binding.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace xla_amp {

enum class CastCategory : uint8_t {
  kNone = 0,           // not autocast: run in the inputs' types
  kLowerPrecisionFp,   // cast floating inputs to the autocast dtype
  kFp32,               // cast floating inputs to float32
  kFp32SetOptDtype,    // no dtype= given: run with dtype=float32
  kFp32AppendDtype,    // redispatch to the overload that takes a dtype, float32
  kPromote,            // cast floating inputs to the widest floating input type
  kBanned,             // raise, with the policy's explanation
  // XLA adaptations (xla_amp/policies/_xla_adaptations.toml): for ops the
  // policy leaves uncast whose PyTorch/XLA lowering cannot take floating
  // inputs of mixed precision. Inputs of one dtype run untouched.
  kFp32Compute,        // mixed: compute in float32, first output in the input's dtype
  kPromoteMixed,       // mixed: cast floating inputs to float32 (eager's promotion)
  // A composite torch_xla lowers itself, under a policy whose system runs
  // PyTorch's decomposition (a policy file's [decompose]): run that
  // decomposition, so the ops inside it meet the policy.
  kDecompose,
};

inline constexpr std::array<std::string_view, 10> kCategoryNames = {
    "none",          "lower_precision_fp", "fp32",   "fp32_set_opt_dtype",
    "fp32_append_dtype", "promote",        "banned", "fp32_compute",
    "promote_mixed", "decompose",
};

}  // namespace xla_amp
