// The baseline of benchmarks/privateuse1_dispatch.py: torch's own C++
// autocast kernels under AutocastPrivateUse1, registered the way a
// PrivateUse1 backend (TorchTPU) registers them, with ATen's
// KERNEL_PRIVATEUSEONE (at::autocast::WrapFunction). Loaded with
// torch.ops.load_library, in a process where xla_amp does not take the key.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
}
