// The per-step argument pass of the sync-free optimizers, in C++: it runs
// once per parameter on every step, and in Python it cost about as much as
// building the fused update itself.
#include "optimizer_inputs.h"

#include <torch/csrc/autograd/python_variable.h>

namespace xla_amp {

namespace py = pybind11;

py::tuple collect_grads(const py::list& params, const at::Device& device) {
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
        g.sizes() != p.sizes()) {
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
