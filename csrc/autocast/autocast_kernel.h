// The boxed autocast kernel: one instance per registered op overload and
// engine (AutocastXLA or AutocastPrivateUse1, engine_key.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <optional>

#include "cast_category.h"
#include "engine_key.h"

namespace xla_amp {

// Redispatch target of a [decompose] op: PyTorch's composite kernel.
inline const c10::DispatchKeySet kDecomposition({c10::DispatchKey::AutogradCPU,
                                                 c10::DispatchKey::CPU});

// Registered for an op under its engine's autocast key (AutocastXLA or
// AutocastPrivateUse1). On each call it looks up the op's category in the
// thread's active policy for that engine, casts the arguments on the stack
// accordingly and calls the op again with the key excluded, so ops the
// target calls internally are not autocast a second time. "XLA inputs"
// below means tensors on the engine's device type (XLA or PrivateUse1).
//
//   category = active_policy.category(slot)
//   if op mutates an argument (in-place, out=) or dtype= was given: no cast
//   lower_precision_fp: floating XLA inputs -> autocast dtype (weights cached);
//                       an op with a lower-precision implementation
//                       (scaled_dot_product_attention) runs that instead
//   fp32:               floating XLA inputs -> float32
//   fp32_set_opt_dtype: first input eligible -> set dtype=float32
//   fp32_append_dtype:  first input eligible -> call the dtype overload with float32
//   promote:            floating XLA inputs -> widest of (autocast dtype, inputs);
//                       the lower-precision implementation where that is low
//   banned:             raise the policy's explanation
//   fp32_compute:       floating inputs of one dtype -> as none; a lower-
//                       precision input with float32 parameters -> input to
//                       float32, run, first output back to the input's dtype;
//                       any other mix -> raise, naming the arguments
//   promote_mixed:      floating inputs of one dtype -> as none; else all
//                       floating inputs -> float32 (eager's type promotion)
//   decompose:          run PyTorch's composite kernel instead of torch_xla's
//                       own (autocast stays on for the ops inside)
//   run the op below autocast
class AutocastKernel final : public c10::OperatorKernel {
 public:
  AutocastKernel(int slot, Engine engine)
      : slot_(slot),
        engine_(engine),
        key_(autocast_key(engine)),
        device_(device_type(engine)),
        below_(below_autocast(engine)) {}

  // Runs the op as described above; with a recorder active on the thread
  // (recorder.h) also counts what was decided.
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                  torch::jit::Stack* stack);

 private:
  // What a call did: the category applied (kNone when the op ran untouched:
  // not listed, in-place/out=, dtype= given, nothing eligible, inputs of one
  // dtype under an adaptation) and, where it differs from the first output's
  // dtype, the dtype it computed in (fp32_compute casts its output back).
  struct Applied {
    CastCategory category = CastCategory::kNone;
    at::ScalarType computed = at::ScalarType::Undefined;
  };
  Applied run(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
              torch::jit::Stack* stack);
  struct SchemaInfo {
    bool mutates = false;  // in-place or out= overload: never autocast
    int dtype_arg = -1;    // index of an argument named "dtype", or -1
    // what computes the op once cast to a low dtype, if not the op itself
    // (registration.h: set_lower_precision_impl)
    std::optional<c10::OperatorHandle> lower_impl;
  };
  const SchemaInfo& schema_info(const c10::OperatorHandle& op);
  // fp32_compute / promote_mixed; returns false if the inputs share one
  // dtype (nothing to adapt: the caller runs the op as for `none`).
  bool adapt_mixed(const c10::OperatorHandle& op, CastCategory category,
                   torch::jit::Stack* stack);

  const int slot_;
  const Engine engine_;
  const c10::DispatchKey key_;     // the autocast key this instance serves
  const c10::DeviceType device_;   // whose tensors it casts, whose dtype it reads
  const c10::DispatchKeySet below_;  // everything below key_
  std::atomic<bool> info_ready_{false};
  SchemaInfo info_;
};

}  // namespace xla_amp
