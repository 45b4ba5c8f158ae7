#include "typed_kernels.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/batch_norm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/conv1d_ops.h>
#include <ATen/ops/conv2d_ops.h>
#include <ATen/ops/conv3d_ops.h>
#include <ATen/ops/layer_norm_ops.h>
#include <ATen/ops/linear_ops.h>
#include <ATen/ops/log_softmax_ops.h>
#include <ATen/ops/matmul_ops.h>
#include <ATen/ops/max_pool2d_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/nll_loss_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/softmax_ops.h>
#include <ATen/ops/stack_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "autocast_kernel.h"
#include "policy_table.h"
#include "recorder.h"

namespace xla_amp {
namespace {

// -- per-argument helpers, overloaded on the argument's C++ type ----------

using Dev = c10::DeviceType;

at::Tensor cast(at::ScalarType to, Dev dev, const at::Tensor& t) {
  return at::autocast::cached_cast(to, t, dev);
}
std::optional<at::Tensor> cast(at::ScalarType to, Dev dev, const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(cast(to, dev, *t)) : t;
}
std::vector<at::Tensor> cast(at::ScalarType to, Dev dev, at::TensorList list) {
  std::vector<at::Tensor> out;
  out.reserve(list.size());
  for (const at::Tensor& t : list) out.push_back(cast(to, dev, t));
  return out;
}
std::vector<at::Tensor> cast(at::ScalarType to, Dev dev, const at::ITensorListRef& list) {
  std::vector<at::Tensor> out;
  out.reserve(list.size());
  for (const at::Tensor& t : list) out.push_back(cast(to, dev, t));
  return out;
}
template <class T>
const T& cast(at::ScalarType, Dev, const T& other) {
  return other;
}

at::ScalarType widen(at::ScalarType w, Dev dev, const at::Tensor& t) {
  return at::autocast::prioritize(w, t, dev);
}
at::ScalarType widen(at::ScalarType w, Dev dev, const std::optional<at::Tensor>& t) {
  return t.has_value() ? widen(w, dev, *t) : w;
}
at::ScalarType widen(at::ScalarType w, Dev dev, at::TensorList list) {
  for (const at::Tensor& t : list) w = widen(w, dev, t);
  return w;
}
at::ScalarType widen(at::ScalarType w, Dev dev, const at::ITensorListRef& list) {
  for (const at::Tensor& t : list) w = widen(w, dev, t);
  return w;
}
template <class T>
at::ScalarType widen(at::ScalarType w, Dev, const T&) {
  return w;
}

bool explicit_dtype(const std::optional<at::ScalarType>& d) { return d.has_value(); }
template <class T>
bool explicit_dtype(const T&) {
  return false;
}

// -- the typed kernel -----------------------------------------------------

template <class Sig>
struct Typed;

template <class Ret, class... Args>
struct Typed<Ret(Args...)> {
  static void impl(torch::Library& lib, const std::string& name,
                   const c10::OperatorHandle& op, int slot, Engine engine) {
    auto typed = op.typed<Ret(Args...)>();
    // The boxed kernel handles what this one does not (shared ownership:
    // the lambda is copied into the dispatcher).
    auto boxed = std::make_shared<c10::BoxedKernel>(c10::BoxedKernel::makeFromFunctor(
        std::make_unique<AutocastKernel>(slot, engine)));
    const c10::DispatchKey key = autocast_key(engine);
    const Dev dev = device_type(engine);
    const c10::DispatchKeySet below = below_autocast(engine);
    lib.impl(name.c_str(),
             torch::CppFunction([slot, engine, key, dev, below, typed, op, boxed](
                                    c10::DispatchKeySet ks, Args... args) -> Ret {
      const PolicyTable* policy = active_policy(engine);
      const CastCategory category =
          policy ? policy->category(slot) : CastCategory::kNone;
      if (C10_UNLIKELY(active_recorder() != nullptr)) {  // the boxed kernel records
        return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(*boxed, op, ks, args...);
      }
      if (category == CastCategory::kNone) {
        return typed.redispatch(ks & below, args...);
      }
      if (category == CastCategory::kLowerPrecisionFp ||
          category == CastCategory::kFp32 || category == CastCategory::kPromote) {
        c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
        if ((explicit_dtype(args) || ...)) return typed.call(args...);
        at::ScalarType to = at::kFloat;
        if (category == CastCategory::kLowerPrecisionFp) {
          to = at::autocast::get_autocast_dtype(dev);
        } else if (category == CastCategory::kPromote) {
          to = at::autocast::get_autocast_dtype(dev);
          ((to = widen(to, dev, args)), ...);
        }
        return typed.call(cast(to, dev, args)...);
      }
      return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(*boxed, op, ks, args...);
    }));
  }
};

using Registrar = std::function<void(torch::Library&, const std::string&,
                                     const c10::OperatorHandle&, int, Engine)>;

template <class Op>
std::pair<std::string, Registrar> entry(const char* name) {
  return {name, &Typed<typename Op::schema>::impl};
}

const std::unordered_map<std::string, Registrar>& registrars() {
  static const auto* table = new std::unordered_map<std::string, Registrar>{
      entry<at::_ops::conv1d>("aten::conv1d"),
      entry<at::_ops::conv2d>("aten::conv2d"),
      entry<at::_ops::conv3d>("aten::conv3d"),
      entry<at::_ops::linear>("aten::linear"),
      entry<at::_ops::matmul>("aten::matmul"),
      entry<at::_ops::mm>("aten::mm"),
      entry<at::_ops::addmm>("aten::addmm"),
      entry<at::_ops::bmm>("aten::bmm"),
      entry<at::_ops::relu>("aten::relu"),
      entry<at::_ops::max_pool2d>("aten::max_pool2d"),
      entry<at::_ops::batch_norm>("aten::batch_norm"),
      entry<at::_ops::layer_norm>("aten::layer_norm"),
      entry<at::_ops::log_softmax_int>("aten::log_softmax.int"),
      entry<at::_ops::softmax_int>("aten::softmax.int"),
      entry<at::_ops::nll_loss>("aten::nll_loss"),
      entry<at::_ops::cat>("aten::cat"),
      entry<at::_ops::stack>("aten::stack"),
  };
  return *table;
}

}  // namespace

bool register_typed_kernel(torch::Library& lib, const OpName& name, int slot,
                           Engine engine) {
  auto it = registrars().find(name.ns + "::" + name.name_and_overload());
  if (it == registrars().end()) return false;
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(
      name.qualified().c_str(), name.overload.c_str());
  it->second(lib, name.name_and_overload(), handle, slot, engine);
  return true;
}

}  // namespace xla_amp
