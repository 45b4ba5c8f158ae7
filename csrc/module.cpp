// Python bindings of xla_amp._C: the autocast engine (csrc/autocast/) and the
// sync-free optimizers' support (csrc/optimizer/). Bindings only.
//
// The engine functions take an `engine` code last (ENGINE_XLA, the default:
// AutocastXLA; ENGINE_PRIVATEUSE1: AutocastPrivateUse1), so one library
// serves torch_xla on torch 2.9 and PrivateUse1 devices on torch 2.9-2.15.
#include <torch/csrc/utils/pybind.h>

#include <torch/version.h>

#include "autocast/cast_category.h"
#include "autocast/engine_key.h"
#include "autocast/policy_table.h"
#include "autocast/recorder.h"
#include "autocast/region.h"
#include "autocast/registration.h"
#include "optimizer/optimizer_inputs.h"

namespace py = pybind11;
using xla_amp::CastCategory;
using xla_amp::PolicyTable;
using xla_amp::engine_from_code;


PYBIND11_MODULE(_C, m) {
  m.doc() = "xla_amp's native autocast engine (AutocastXLA, AutocastPrivateUse1)";
  m.attr("ENGINE_XLA") = static_cast<int>(xla_amp::Engine::kXla);
  m.attr("ENGINE_PRIVATEUSE1") = static_cast<int>(xla_amp::Engine::kPrivateUse1);
  m.attr("TORCH_VERSION") = TORCH_VERSION;  // the torch headers it was compiled with

  m.def("collect_grads", &xla_amp::collect_grads, py::arg("params"), py::arg("device"),
        py::arg("state"), py::arg("state_keys"),
        "(float32 params with a gradient, their gradients, other params with a "
        "gradient, their gradients, first unusable index or -1, first other "
        "index or -1) of a param group's parameter list.");

  m.def("categories", [] {
    std::vector<std::string> names;
    for (auto n : xla_amp::kCategoryNames) names.emplace_back(n);
    return names;
  }, "Category names, indexed by their numeric value.");

  m.def("register_ops", [](const std::vector<std::string>& names, int engine) {
    auto r = xla_amp::register_ops(engine_from_code(engine), names);
    return py::make_tuple(r.slots, r.replaced);
  }, py::arg("names"), py::arg("engine") = 0,
  "Registers the autocast kernel for op overloads; returns (slots, replaced).");

  m.def("set_lower_precision_impl", &xla_amp::set_lower_precision_impl, py::arg("op"),
        py::arg("impl"),
        "`impl` (same schema) computes `op` where a kernel casts it to float16/bfloat16.");

  m.def("registered_ops", [](int engine) {
    return xla_amp::registered_ops(engine_from_code(engine));
  }, py::arg("engine") = 0);

  py::class_<PolicyTable, std::shared_ptr<PolicyTable>>(m, "CompiledPolicy")
      .def_property_readonly("name", [](const PolicyTable& t) { return t.name; })
      .def("category", [](const PolicyTable& t, int slot) {
        return static_cast<int>(t.category(slot));
      });

  m.def("compile_policy", &xla_amp::compile_policy, py::arg("name"), py::arg("rows"));

  m.def("push_policy", [](std::shared_ptr<PolicyTable> t, int engine) {
    xla_amp::push_thread_policy(engine_from_code(engine), std::move(t));
  }, py::arg("table"), py::arg("engine") = 0);
  m.def("pop_policy", [](int engine) {
    xla_amp::pop_thread_policy(engine_from_code(engine));
  }, py::arg("engine") = 0);
  m.def("enter_region", [](std::shared_ptr<PolicyTable> t, bool enabled,
                           at::ScalarType dtype, bool cache_enabled, int engine) {
    xla_amp::enter_region(engine_from_code(engine), std::move(t), enabled, dtype,
                          cache_enabled);
  }, py::arg("table"), py::arg("enabled"), py::arg("dtype"), py::arg("cache_enabled"),
  py::arg("engine") = 0,
  "Policy push + the device's autocast state of torch.amp.autocast.__enter__, one call.");
  m.def("exit_region", [](int engine) {
    xla_amp::exit_region(engine_from_code(engine));
  }, py::arg("engine") = 0, "Undoes the calling thread's latest enter_region.");
  m.def("policy_depth", [](int engine) {
    return xla_amp::thread_policy_depth(engine_from_code(engine));
  }, py::arg("engine") = 0);

  py::class_<xla_amp::Recorder, std::shared_ptr<xla_amp::Recorder>>(m, "Recorder")
      .def(py::init<>())
      .def("merge_from", &xla_amp::Recorder::merge_from, py::arg("other"),
           "Adds another recorder's counts to this one's rows.")
      .def("rows", &xla_amp::Recorder::rows,
           "[(module, op, category, in_dtypes, dtype, count)], first seen first.");
  m.def("set_recorder", &xla_amp::set_recorder, py::arg("recorder").none(true),
        "Makes the recorder (or None) the calling thread's; returns the previous one.");
  m.def("push_module", &xla_amp::push_module, py::arg("name"));
  m.def("pop_module", &xla_amp::pop_module);
  m.def("set_default_policy", [](std::shared_ptr<PolicyTable> t, int engine) {
    xla_amp::set_default_policy(engine_from_code(engine), std::move(t));
  }, py::arg("table").none(true), py::arg("engine") = 0);
  m.def("set_default_resolver", [](py::function fn, int engine) {
    // Leaked on purpose: a py::function must not be destroyed without the
    // GIL, which interpreter shutdown does not guarantee.
    auto* held = new py::function(std::move(fn));
    xla_amp::set_default_resolver(engine_from_code(engine), [held]() -> xla_amp::PolicyPtr {
      py::gil_scoped_acquire gil;
      try {
        py::object table = (*held)();
        if (table.is_none()) return nullptr;
        return table.cast<std::shared_ptr<PolicyTable>>();
      } catch (py::error_already_set& e) {
        TORCH_CHECK(false, "xla_amp: choosing the default autocast policy failed: ",
                    e.what());
      }
    });
  }, py::arg("fn"), py::arg("engine") = 0,
  "fn() -> CompiledPolicy | None, called once when a default is first needed.");
  m.def("active_policy", [](int engine) -> std::shared_ptr<PolicyTable> {
    return std::const_pointer_cast<PolicyTable>(
        xla_amp::active_policy_shared(engine_from_code(engine)));
  }, py::arg("engine") = 0, "The calling thread's active compiled policy, or None.");
  m.def("active_policy_name", [](int engine) -> py::object {
    const PolicyTable* t = xla_amp::active_policy(engine_from_code(engine));
    if (t == nullptr) return py::none();
    return py::str(t->name);
  }, py::arg("engine") = 0);
}
