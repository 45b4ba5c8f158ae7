"""Small valid calls for autocast op tests, keyed by policy op name.

Each case builds fresh inputs on the given device with a fixed seed and a
function that calls the op. The floating inputs are what autocast casts; the
tests cast them by hand for the control run (autocast disabled).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

from tests.support.attention_reference import reference

aten = torch.ops.aten


@dataclasses.dataclass
class Case:
    inputs: Callable[[], list]          # floating tensors autocast may cast
    call: Callable[..., object]         # call(*inputs) -> tensor or tuple
    extra: Callable[[], list] = lambda: []   # non-float args (indices, targets)
    # the hand-written control where the inputs are cast to a low dtype, if
    # not `call` on them (attention: tests/support/attention_reference.py)
    low_control: Callable[..., object] | None = None

    def control(self, dtype):
        """What a hand cast to `dtype` is compared with: call(*cast inputs)."""
        low = dtype in (torch.bfloat16, torch.float16) and self.low_control is not None
        return self.low_control if low else self.call


def _r(*shape):
    return torch.randn(*shape)


def _spd(n=4):
    a = torch.randn(n, n)
    return a @ a.t() + n * torch.eye(n)


def _well_conditioned(n=4):
    return torch.randn(n, n) + n * torch.eye(n)


CASES: dict[str, Case] = {
    # lower precision candidates -------------------------------------------
    "aten::matmul": Case(lambda: [_r(4, 5), _r(5, 3)], lambda a, b: a @ b),
    "aten::addbmm": Case(lambda: [_r(3, 5), _r(2, 3, 4), _r(2, 4, 5)], torch.addbmm),
    "aten::addmm": Case(lambda: [_r(3, 5), _r(3, 4), _r(4, 5)], torch.addmm),
    "aten::addmv": Case(lambda: [_r(3), _r(3, 4), _r(4)], torch.addmv),
    "aten::addr": Case(lambda: [_r(3, 4), _r(3), _r(4)], torch.addr),
    "aten::baddbmm": Case(lambda: [_r(2, 3, 5), _r(2, 3, 4), _r(2, 4, 5)], torch.baddbmm),
    "aten::bmm": Case(lambda: [_r(2, 3, 4), _r(2, 4, 5)], torch.bmm),
    "aten::conv1d": Case(lambda: [_r(1, 2, 8), _r(3, 2, 3), _r(3)], F.conv1d),
    "aten::conv2d": Case(lambda: [_r(1, 2, 6, 6), _r(3, 2, 3, 3), _r(3)], F.conv2d),
    "aten::conv3d": Case(lambda: [_r(1, 2, 4, 4, 4), _r(3, 2, 3, 3, 3)], F.conv3d),
    "aten::conv_transpose1d": Case(lambda: [_r(1, 2, 5), _r(2, 3, 3)], F.conv_transpose1d),
    "aten::conv_transpose2d": Case(lambda: [_r(1, 2, 4, 4), _r(2, 3, 3, 3)], F.conv_transpose2d),
    "aten::conv_transpose3d": Case(lambda: [_r(1, 2, 3, 3, 3), _r(2, 3, 2, 2, 2)], F.conv_transpose3d),
    "aten::linear": Case(lambda: [_r(3, 4), _r(5, 4), _r(5)], F.linear),
    "aten::mm": Case(lambda: [_r(3, 4), _r(4, 5)], torch.mm),
    "aten::relu": Case(lambda: [_r(3, 4)], torch.relu),
    "aten::prelu": Case(lambda: [_r(2, 3, 4), torch.rand(3)], F.prelu),
    "aten::max_pool2d": Case(lambda: [_r(1, 2, 6, 6)], lambda x: F.max_pool2d(x, 2)),
    "aten::conv_tbc": Case(lambda: [_r(3, 2, 4), _r(1, 4, 5), _r(5)], torch.conv_tbc),
    "aten::einsum": Case(lambda: [_r(3, 4), _r(4, 5)], lambda a, b: torch.einsum("ij,jk->ik", a, b)),
    "aten::scaled_dot_product_attention": Case(
        lambda: [_r(2, 2, 4, 8), _r(2, 2, 4, 8), _r(2, 2, 4, 8)],
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        low_control=lambda q, k, v: reference(q, k, v, q.dtype, is_causal=True)),
    # float32 candidates -----------------------------------------------------
    "aten::batch_norm": Case(
        lambda: [_r(4, 3), torch.zeros(3), torch.ones(3), torch.rand(3), _r(3)],
        lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False)),
    "aten::log_softmax": Case(lambda: [_r(3, 5)], lambda x: torch.log_softmax(x, 1)),
    "aten::softmax": Case(lambda: [_r(3, 5)], lambda x: torch.softmax(x, 1)),
    "aten::_softmax": Case(lambda: [_r(3, 5)], lambda x: aten._softmax(x, 1, False)),
    "aten::_safe_softmax": Case(lambda: [_r(3, 5)], lambda x: aten._safe_softmax(x, 1)),
    "aten::binary_cross_entropy": Case(
        lambda: [torch.rand(3, 4) * 0.8 + 0.1, torch.rand(3, 4)], F.binary_cross_entropy),
    "aten::binary_cross_entropy_with_logits": Case(
        lambda: [_r(3, 4), torch.rand(3, 4)], F.binary_cross_entropy_with_logits),
    "aten::prod": Case(lambda: [torch.rand(3, 4) + 0.5], lambda x: torch.prod(x, 1)),
    "aten::cdist": Case(lambda: [_r(3, 4), _r(5, 4)], torch.cdist),
    "aten::trace": Case(lambda: [_r(4, 4)], torch.trace),
    "aten::cholesky": Case(lambda: [_spd()], torch.cholesky),
    "aten::inverse": Case(lambda: [_well_conditioned()], torch.inverse),
    "aten::reflection_pad1d": Case(lambda: [_r(1, 2, 5)], lambda x: aten.reflection_pad1d(x, [2, 1])),
    "aten::reflection_pad2d": Case(lambda: [_r(1, 2, 4, 4)], lambda x: aten.reflection_pad2d(x, [1, 1, 2, 0])),
    "aten::reflection_pad3d": Case(lambda: [_r(1, 1, 3, 3, 3)], lambda x: aten.reflection_pad3d(x, [1, 1, 1, 1, 1, 1])),
    "aten::replication_pad1d": Case(lambda: [_r(1, 2, 5)], lambda x: aten.replication_pad1d(x, [2, 1])),
    "aten::replication_pad2d": Case(lambda: [_r(1, 2, 4, 4)], lambda x: aten.replication_pad2d(x, [1, 1, 2, 0])),
    "aten::replication_pad3d": Case(lambda: [_r(1, 1, 3, 3, 3)], lambda x: aten.replication_pad3d(x, [1, 0, 1, 0, 1, 0])),
    "aten::mse_loss": Case(lambda: [_r(3, 4), _r(3, 4)], F.mse_loss),
    "aten::cosine_embedding_loss": Case(
        lambda: [_r(3, 4), _r(3, 4)], lambda a, b, y: F.cosine_embedding_loss(a, b, y),
        extra=lambda: [torch.tensor([1.0, -1.0, 1.0])]),
    "aten::nll_loss": Case(lambda: [torch.log_softmax(_r(3, 5), 1)], F.nll_loss,
                           extra=lambda: [torch.tensor([0, 4, 2])]),
    "aten::nll_loss2d": Case(lambda: [torch.log_softmax(_r(2, 3, 2, 2), 1)], F.nll_loss,
                             extra=lambda: [torch.randint(0, 3, (2, 2, 2))]),
    "aten::multilabel_margin_loss": Case(
        lambda: [_r(2, 4)], F.multilabel_margin_loss,
        extra=lambda: [torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]])]),
    "aten::multilabel_margin_loss_forward": Case(
        lambda: [_r(2, 4)], lambda x, t: aten.multilabel_margin_loss_forward(x, t, 1),
        extra=lambda: [torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]])]),
    "aten::qr": Case(lambda: [_well_conditioned()], torch.qr),
    "aten::svd": Case(lambda: [_well_conditioned()], lambda x: torch.svd(x)[1]),
    "aten::linalg_svd": Case(lambda: [_well_conditioned()], lambda x: torch.linalg.svd(x)[1]),
    "aten::triangular_solve": Case(
        lambda: [_r(4, 2), torch.triu(_well_conditioned())],
        lambda b, a: torch.triangular_solve(b, a)),
    "aten::linalg_inv_ex": Case(lambda: [_well_conditioned()], lambda x: torch.linalg.inv_ex(x)[0]),
    "aten::cholesky_inverse": Case(lambda: [torch.linalg.cholesky(_spd())], torch.cholesky_inverse),
    "aten::cholesky_solve": Case(lambda: [_r(4, 2), torch.linalg.cholesky(_spd())], torch.cholesky_solve),
    "aten::cross_entropy_loss": Case(lambda: [_r(3, 5)], F.cross_entropy,
                                     extra=lambda: [torch.tensor([1, 0, 4])]),
    "aten::ctc_loss": Case(
        lambda: [torch.log_softmax(_r(6, 2, 4), 2)],
        lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl),
        extra=lambda: [torch.tensor([[1, 2], [3, 1]]), torch.tensor([6, 6]), torch.tensor([2, 2])]),
    "aten::hinge_embedding_loss": Case(lambda: [_r(3, 4)], F.hinge_embedding_loss,
                                       extra=lambda: [torch.tensor([1.0, -1.0, 1.0, -1.0])]),
    "aten::kl_div": Case(lambda: [torch.log_softmax(_r(3, 4), 1), torch.softmax(_r(3, 4), 1)],
                         lambda a, b: F.kl_div(a, b, reduction="batchmean")),
    "aten::l1_loss": Case(lambda: [_r(3, 4), _r(3, 4)], F.l1_loss),
    "aten::smooth_l1_loss": Case(lambda: [_r(3, 4), _r(3, 4)], F.smooth_l1_loss),
    "aten::margin_ranking_loss": Case(lambda: [_r(4), _r(4)], F.margin_ranking_loss,
                                      extra=lambda: [torch.tensor([1.0, -1.0, 1.0, 1.0])]),
    "aten::soft_margin_loss": Case(lambda: [_r(3, 4)], F.soft_margin_loss,
                                   extra=lambda: [torch.tensor([[1.0, -1, 1, -1]] * 3)]),
    "aten::triplet_margin_loss": Case(lambda: [_r(3, 4), _r(3, 4), _r(3, 4)], F.triplet_margin_loss),
    "aten::multi_margin_loss": Case(lambda: [_r(3, 5)], F.multi_margin_loss,
                                    extra=lambda: [torch.tensor([1, 0, 4])]),
    "aten::pow.Tensor_Scalar": Case(lambda: [torch.rand(3, 4) + 0.5], lambda x: torch.pow(x, 3)),
    # promote ----------------------------------------------------------------
    "aten::stack": Case(lambda: [_r(3, 4), _r(3, 4)], lambda a, b: torch.stack([a, b])),
    "aten::cat": Case(lambda: [_r(3, 4), _r(2, 4)], lambda a, b: torch.cat([a, b])),
    "aten::index_copy": Case(lambda: [_r(5, 3), _r(2, 3)], lambda x, s, i: torch.index_copy(x, 0, i, s),
                             extra=lambda: [torch.tensor([4, 1])]),
}


def build(name: str, device, seed: int = 0):
    """(float inputs, extra args) on `device` for the case of op `name`."""
    case = CASES[name]
    torch.manual_seed(seed)
    floats = [t.to(device) for t in case.inputs()]
    extra = [t.to(device) for t in case.extra()]
    return floats, extra


def outputs(result) -> list[torch.Tensor]:
    """The floating tensors of an op's result, flattened."""
    if isinstance(result, torch.Tensor):
        return [result] if result.is_floating_point() else []
    out = []
    for r in result:
        out.extend(outputs(r))
    return out
