"""Cases for the overloads of the tables' ops that no case of
tests.support.conformance_cases calls (the torchax parity sweep runs every
overload of every op the policy tables name, not only the
overloads an entry names). Kept apart from CASES so the torch_xla
conformance tests keep their own keys. Each call reaches exactly the
overload of its key (F.interpolate with scale_factor reaches the ``.vec``
overloads; padding="same" the ``.padding`` ones).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.support.op_cases import Case


def _r(*shape):
    return torch.randn(*shape)


def _pos(*shape):
    return torch.rand(*shape) + 0.5


def _up(shape, mode, antialias=False):
    return Case(lambda: [_r(*shape)],
                lambda x: F.interpolate(x, scale_factor=2.0, mode=mode, antialias=antialias))


OVERLOAD_CASES: dict[str, Case] = {
    "aten::conv2d.padding": Case(lambda: [_r(1, 2, 6, 6), _r(3, 2, 3, 3)],
                                 lambda x, w: F.conv2d(x, w, padding="same")),
    "aten::conv3d.padding": Case(lambda: [_r(1, 2, 4, 4, 4), _r(3, 2, 3, 3, 3)],
                                 lambda x, w: F.conv3d(x, w, padding="same")),
    "aten::conv_transpose2d.input": Case(lambda: [_r(1, 2, 4, 4), _r(2, 3, 3, 3)],
                                         F.conv_transpose2d),
    "aten::conv_transpose3d.input": Case(lambda: [_r(1, 2, 3, 3, 3), _r(2, 3, 2, 2, 2)],
                                         F.conv_transpose3d),
    "aten::div.Scalar_mode": Case(lambda: [_r(3, 4)],
                                  lambda x: torch.div(x, 3.0, rounding_mode="floor")),
    "aten::divide.Scalar": Case(lambda: [_r(3, 4)], lambda x: torch.divide(x, 3.0)),
    "aten::divide.Scalar_mode": Case(lambda: [_r(3, 4)],
                                     lambda x: torch.divide(x, 3.0, rounding_mode="trunc")),
    "aten::divide.Tensor_mode": Case(lambda: [_r(3, 4), _pos(3, 4)],
                                     lambda a, b: torch.divide(a, b, rounding_mode="floor")),
    "aten::true_divide.Scalar": Case(lambda: [_r(3, 4)], lambda x: torch.true_divide(x, 3.0)),
    "aten::softmax.int": Case(lambda: [_r(3, 5)], lambda x: torch.softmax(x, 1)),
    "aten::log_softmax.int": Case(lambda: [_r(3, 5)], lambda x: torch.log_softmax(x, 1)),
    "aten::upsample_linear1d.vec": _up((1, 2, 3), "linear"),
    "aten::upsample_bicubic2d.vec": _up((1, 2, 3, 3), "bicubic"),
    "aten::upsample_nearest3d.vec": _up((1, 1, 2, 2, 2), "nearest"),
    "aten::upsample_trilinear3d.vec": _up((1, 1, 2, 2, 2), "trilinear"),
    "aten::_upsample_nearest_exact1d.vec": _up((1, 2, 3), "nearest-exact"),
    "aten::_upsample_nearest_exact2d.vec": _up((1, 2, 3, 3), "nearest-exact"),
    "aten::_upsample_nearest_exact3d.vec": _up((1, 1, 2, 2, 2), "nearest-exact"),
    "aten::_upsample_bilinear2d_aa.vec": _up((1, 2, 4, 4), "bilinear", antialias=True),
    "aten::_upsample_bicubic2d_aa.vec": _up((1, 2, 4, 4), "bicubic", antialias=True),
    "aten::ctc_loss.IntList": Case(
        lambda: [torch.log_softmax(_r(6, 2, 4), 2)],
        lambda lp, tg: F.ctc_loss(lp, tg, [6, 6], [2, 3]),
        lambda: [torch.tensor([[1, 2, 0], [1, 2, 3]])]),
    "aten::fake_quantize_per_tensor_affine.tensor_qparams": Case(
        lambda: [_r(3, 4)],
        lambda x, s, z: torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255),
        lambda: [torch.tensor(0.1), torch.tensor(0, dtype=torch.int32)]),
    "aten::frobenius_norm.dim": Case(lambda: [_r(3, 4)],
                                     lambda x: torch.ops.aten.frobenius_norm.dim(x, [0, 1])),
}

# Overloads no call reaches on either backend, with the reason.
NAMED = "a named-tensor overload: torch_xla and torchax run no named tensors"
UNREACHABLE = {
    "aten::index_put.hacked_twin": "TorchScript's own overload: a Python call reaches "
                                   "index_put.default",
    "aten::einsum.sublist": "TorchScript's sublist form: torch.einsum turns a sublist call "
                            "into einsum.default",
}


def named(overload: str) -> bool:
    """A named-tensor overload (its overload name says so: ``.dimname``,
    ``.Dimname_Scalar``, ``.names_dim``)."""
    name = overload.partition(".")[2].lower()
    return "dimname" in name or name.startswith("names")
