// The per-step argument pass of the sync-free optimizers, in C++: it runs
// once per parameter on every step, and in Python it cost about as much as
// building the fused update itself.
#include "optimizer_inputs.h"

#include <torch/csrc/autograd/python_variable.h>

namespace xla_amp {

namespace py = pybind11;

namespace {

// Whether every state tensor of `param` named in `keys` has its shape and
// device. Looks up without inserting (the state is a defaultdict).
bool state_fits(const at::Tensor& param, PyObject* param_obj, const py::dict& state,
                const std::vector<std::string>& keys, const at::Device& device) {
  if (keys.empty()) return true;
  PyObject* st = PyDict_GetItem(state.ptr(), param_obj);  // borrowed
  if (st == nullptr || !PyDict_Check(st)) return true;
  for (const std::string& key : keys) {
    PyObject* v = PyDict_GetItemString(st, key.c_str());  // borrowed
    if (v == nullptr || v == Py_None) continue;
    if (!THPVariable_Check(v)) return false;
    const at::Tensor& t = THPVariable_Unpack(v);
    if (t.device() != device || t.sizes() != param.sizes()) return false;
  }
  return true;
}

}  // namespace

py::tuple collect_grads(const py::list& params, const at::Device& device,
                        const py::dict& state, const std::vector<std::string>& state_keys) {
  py::list fp32_params, fp32_grads, other_params, other_grads;
  int64_t bad = -1;
  int64_t first_other = -1;
  const auto n = static_cast<int64_t>(py::len(params));
  for (int64_t i = 0; i < n; ++i) {
    PyObject* obj = PyList_GET_ITEM(params.ptr(), i);
    if (!THPVariable_Check(obj)) {
      bad = i;
      break;
    }
    const at::Tensor& p = THPVariable_Unpack(obj);
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (p.device() != device || g.device() != device || g.is_sparse() ||
        g.sizes() != p.sizes() || !state_fits(p, obj, state, state_keys, device)) {
      bad = i;
      break;
    }
    auto grad = py::reinterpret_steal<py::object>(THPVariable_Wrap(g));
    if (p.scalar_type() == at::kFloat && g.scalar_type() == at::kFloat) {
      fp32_params.append(py::handle(obj));
      fp32_grads.append(grad);
    } else {
      if (first_other < 0) first_other = i;
      other_params.append(py::handle(obj));
      other_grads.append(grad);
    }
  }
  return py::make_tuple(fp32_params, fp32_grads, other_params, other_grads, bad,
                        first_other);
}

}  // namespace xla_amp
