"""torch_xla 2.9's XLA:CPU sums a float16 convolution in float16 when it
rewrites the convolution into a matrix-vector dot (a 1x1 kernel over a 1x1
input: the squeeze-excitation convolutions of MobileNetV3 and EfficientNet
under the cuda rules' float16), seen in the zoo's float16 runs;
docs/upstream/xla_cpu_f16_conv_as_dot.md. Fails once the defect is
gone (JAX 0.10.2's XLA:CPU gives 5000 for the same convolution)."""
import torch
import torch.nn.functional as F


def test_float16_conv_as_dot_sums_in_float16(device):
    ones = torch.ones(1, 5000, 1, 1, dtype=torch.float16)
    got = F.conv2d(ones.to(device), ones.to(device)).cpu().item()
    # float16 steps are 2 from 2048 on: 2048 + 1 rounds back to 2048
    assert got == 2048.0
    assert F.conv2d(ones.float(), ones.float()).item() == 5000.0  # exact in float16 too
    # a larger input stays a convolution, summed in float32
    wide = torch.ones(1, 5000, 2, 2, dtype=torch.float16)
    assert F.conv2d(wide.to(device), ones.to(device)).cpu()[0, 0, 0, 0].item() == 5000.0
    # and a float16 matmul of the same shape is summed in float32
    row = torch.ones(1, 5000, dtype=torch.float16, device=device)
    assert (row @ row.T).cpu().item() == 5000.0
