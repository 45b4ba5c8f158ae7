#include "autocast_kernel.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "cast_category.h"
#include "policy_table.h"
#include "recorder.h"
#include "registration.h"

namespace xla_amp {
namespace {

bool eligible(const c10::IValue& v, c10::DeviceType dev) {
  return v.isTensor() && at::autocast::is_eligible(v.toTensor(), dev);
}

// Casts every eligible tensor held by one argument (Tensor, Tensor?,
// Tensor[], Tensor?[]) to `to`; ATen's cast cache serves weights.
c10::IValue cast_argument(at::ScalarType to, c10::IValue v, c10::DeviceType dev) {
  if (v.isTensor()) {
    return at::autocast::cached_cast(to, v.toTensor(), dev);
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> in = v.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(in.size());
    for (const at::Tensor& t : in) {
      out.push_back(at::autocast::cached_cast(to, t, dev));
    }
    return out;
  }
  if (v.isList()) {  // Tensor?[] (e.g. index_put's indices)
    c10::impl::GenericList in = v.toList();
    if (!in.elementType()->isSubtypeOf(*c10::OptionalType::ofTensor())) {
      return v;
    }
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : in) {
      out.push_back(e.isTensor() ? c10::IValue(at::autocast::cached_cast(
                                       to, e.toTensor(), dev))
                                 : e);
    }
    return out;
  }
  return v;
}

void cast_all(at::ScalarType to, torch::jit::Stack* stack, size_t first,
              size_t count, c10::DeviceType dev) {
  for (size_t i = first; i < first + count; ++i) {
    (*stack)[i] = cast_argument(to, std::move((*stack)[i]), dev);
  }
}

// Widest floating type among the eligible inputs, starting from the autocast
// dtype (ATen's own prioritize rule: float32 wins, float64 is ignored).
at::ScalarType widest_type(const torch::jit::Stack& stack, size_t first,
                           size_t count, c10::DeviceType dev) {
  at::ScalarType widest = at::autocast::get_autocast_dtype(dev);
  for (size_t i = first; i < first + count; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      widest = at::autocast::prioritize(widest, v.toTensor(), dev);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        widest = at::autocast::prioritize(widest, t, dev);
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toList()) {
        if (e.isTensor()) {
          widest = at::autocast::prioritize(widest, e.toTensor(), dev);
        }
      }
    }
  }
  return widest;
}

// The floating XLA tensors among the arguments (Tensor and Tensor? only:
// the ops with adaptations take no tensor lists), with argument indices.
std::vector<std::pair<size_t, at::ScalarType>> floating_inputs(
    const torch::jit::Stack& stack, size_t first, size_t count, c10::DeviceType dev) {
  std::vector<std::pair<size_t, at::ScalarType>> found;
  for (size_t i = 0; i < count; ++i) {
    if (eligible(stack[first + i], dev)) {
      found.emplace_back(i, stack[first + i].toTensor().scalar_type());
    }
  }
  return found;
}

// The dtypes of every tensor an argument holds (lists flattened), in order.
void tensor_dtypes(const c10::IValue& v, std::vector<at::ScalarType>* out) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) out->push_back(v.toTensor().scalar_type());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) out->push_back(t.scalar_type());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) tensor_dtypes(e, out);
  }
}

// The kernel whose call is running on this thread while recording, set for
// the duration of one call (restored on exceptions too).
thread_local const AutocastKernel* tls_passing_through = nullptr;

class PassingThrough {
 public:
  explicit PassingThrough(const AutocastKernel* kernel) : outer_(tls_passing_through) {
    tls_passing_through = kernel;
  }
  ~PassingThrough() { tls_passing_through = outer_; }

 private:
  const AutocastKernel* outer_;
};

std::string qualified_name(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.schema().operator_name();
  return name.overload_name.empty() ? name.name
                                    : name.name + "." + name.overload_name;
}

}  // namespace

void AutocastKernel::operator()(const c10::OperatorHandle& op,
                                c10::DispatchKeySet ks,
                                torch::jit::Stack* stack) {
  Recorder* recorder = active_recorder();
  if (C10_LIKELY(recorder == nullptr) || tls_passing_through == this) {
    run(op, ks, stack);
    return;
  }
  const size_t nargs = op.schema().arguments().size();
  std::vector<at::ScalarType> in;
  for (size_t i = stack->size() - nargs; i < stack->size(); ++i) {
    tensor_dtypes((*stack)[i], &in);
  }
  // An op left uncast runs below autocast with the key still included;
  // XLA's functionalization re-issues it from the top, reaching this kernel
  // again: that second call is the same decision, not counted twice.
  Applied applied;
  {
    PassingThrough guard(this);
    applied = run(op, ks, stack);
  }
  at::ScalarType ran_in = applied.computed;
  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret;
       i < stack->size() && ran_in == at::ScalarType::Undefined; ++i) {
    std::vector<at::ScalarType> out;
    tensor_dtypes((*stack)[i], &out);
    if (!out.empty()) ran_in = out.front();
  }
  recorder->add(current_module(), qualified_name(op), applied.category,
                std::move(in), ran_in);
}

bool AutocastKernel::adapt_mixed(const c10::OperatorHandle& op,
                                 CastCategory category,
                                 torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  const auto inputs = floating_inputs(*stack, first, args.size(), device_);
  bool mixed = false;
  for (const auto& in : inputs) mixed |= in.second != inputs.front().second;
  if (!mixed) return false;

  if (category == CastCategory::kPromoteMixed) {
    cast_all(at::kFloat, stack, first, args.size(), device_);
    op.callBoxed(stack);
    return true;
  }
  // kFp32Compute: the one mix cuDNN's mixed batch norm accepts, a float16 or
  // bfloat16 input (the first tensor argument) with float32 parameters and
  // buffers. Anything else CUDA refuses too; here it would fail at XLA
  // compile time with no name attached, so refuse it now.
  const auto input = inputs.front();
  bool accepted = input.first == 0 && input.second != at::kFloat;
  for (size_t k = 1; k < inputs.size(); ++k) {
    accepted &= inputs[k].second == at::kFloat;
  }
  if (!accepted) {
    std::string got;
    for (const auto& in : inputs) {
      got += (got.empty() ? "" : ", ") + args[in.first].name() + " " + dtype_name(in.second);
    }
    TORCH_CHECK(false, "xla_amp: ", op.schema().operator_name(),
                " got floating inputs of mixed precision (", got,
                "). XLA cannot compile this mix and CUDA refuses it too; "
                "the mix autocast can run is a float16/bfloat16 input with "
                "float32 parameters and buffers (keep the module in float32, "
                "e.g. xla_amp.cast_module(..., keep=(nn.BatchNorm2d,)))");
  }
  (*stack)[first] = (*stack)[first].toTensor().to(at::kFloat);
  op.callBoxed(stack);
  const size_t nret = op.schema().returns().size();
  c10::IValue& out = (*stack)[stack->size() - nret];
  if (out.isTensor() && out.toTensor().scalar_type() == at::kFloat) {
    out = out.toTensor().to(input.second);
  }
  return true;
}

const AutocastKernel::SchemaInfo& AutocastKernel::schema_info(
    const c10::OperatorHandle& op) {
  if (!info_ready_.load(std::memory_order_acquire)) {
    // Racing threads compute the same value; the store is idempotent.
    const c10::FunctionSchema& schema = op.schema();
    SchemaInfo info;
    info.mutates = schema.is_mutable();
    const auto& args = schema.arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].name() == "dtype") info.dtype_arg = static_cast<int>(i);
    }
    info.lower_impl = lower_precision_impl(qualified_name(op));
    info_ = info;
    info_ready_.store(true, std::memory_order_release);
  }
  return info_;
}

AutocastKernel::Applied AutocastKernel::run(const c10::OperatorHandle& op,
                                            c10::DispatchKeySet ks,
                                            torch::jit::Stack* stack) {
  const PolicyTable* policy = active_policy(engine_);
  const CastCategory category =
      policy ? policy->category(slot_) : CastCategory::kNone;
  const SchemaInfo& info = schema_info(op);
  if (category == CastCategory::kFp32Compute ||
      category == CastCategory::kPromoteMixed) {
    if (!info.mutates) {
      c10::impl::ExcludeDispatchKeyGuard no_autocast(key_);
      if (adapt_mixed(op, category, stack)) return {category, at::kFloat};
    }
    op.redispatchBoxed(ks & below_, stack);
    return {};
  }
  if (category == CastCategory::kDecompose && !info.mutates) {
    // PyTorch's decomposition: the kernel a backend without one of its own
    // runs (CompositeImplicitAutograd fills the AutogradCPU slot; for a
    // CompositeExplicitAutograd op that slot records autograd and hands on to
    // the CPU slot's composite). Checked when the policy loads
    // (policies/_decompose.py). Autocast stays on: the ops inside are cast.
    op.redispatchBoxed(kDecomposition, stack);
    return {category};
  }
  if (category == CastCategory::kNone && !info.mutates) {
    // Not autocast under this policy: behave as if no kernel were here, so
    // the ops a composite calls inside still meet autocast.
    op.redispatchBoxed(ks & below_, stack);
    return {};
  }
  // From here on the op is either cast or deliberately left alone (in-place,
  // out=, explicit dtype=): everything below, the casts included, runs with
  // the key excluded so nothing inside it is autocast again. For
  // in-place/out= that matters on XLA, where functionalization re-issues the
  // functional op from the top of the dispatcher.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key_);
  if (category == CastCategory::kBanned) {
    auto it = policy->banned_reason.find(slot_);
    TORCH_CHECK(false, "xla_amp: ", op.schema().operator_name(),
                " is banned in autocast regions under policy '", policy->name,
                "'. ",
                it == policy->banned_reason.end() ? std::string() : it->second);
  }

  const size_t nargs = op.schema().arguments().size();
  const size_t first = stack->size() - nargs;
  const bool explicit_dtype =
      info.dtype_arg >= 0 && !(*stack)[first + info.dtype_arg].isNone();
  if (info.mutates || explicit_dtype) {
    op.callBoxed(stack);
    return {};
  }
  Applied applied{category};
  at::ScalarType to = at::ScalarType::Undefined;  // the dtype of a plain cast

  switch (category) {
    case CastCategory::kLowerPrecisionFp:
      to = at::autocast::get_autocast_dtype(device_);
      break;
    case CastCategory::kFp32:
      to = at::kFloat;
      break;
    case CastCategory::kPromote:
      to = widest_type(*stack, first, nargs, device_);
      break;
    case CastCategory::kFp32SetOptDtype:
      if (info.dtype_arg >= 0 && nargs > 0 && eligible((*stack)[first], device_)) {
        (*stack)[first + info.dtype_arg] =
            c10::IValue(static_cast<int64_t>(at::kFloat));
      } else {
        applied = {};
      }
      break;
    case CastCategory::kFp32AppendDtype: {
      auto target = policy->append_target.find(slot_);
      if (target != policy->append_target.end() && nargs > 0 &&
          eligible((*stack)[first], device_)) {
        stack->emplace_back(static_cast<int64_t>(at::kFloat));
        target->second.callBoxed(stack);
        return applied;
      }
      applied = {};
      break;
    }
    default:
      break;
  }
  if (to != at::ScalarType::Undefined) {
    cast_all(to, stack, first, nargs, device_);
    if (info.lower_impl && (to == at::kHalf || to == at::kBFloat16)) {
      info.lower_impl->callBoxed(stack);
      return applied;
    }
  }
  op.callBoxed(stack);
  return applied;
}

}  // namespace xla_amp
