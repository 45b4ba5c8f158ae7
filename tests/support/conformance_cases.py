"""Small valid calls for every op the cuda, cpu, xpu and hpu policies name.

Extends tests/support/op_cases.py (the TPU cases) with the ops the other policies
list. Keys are policy entry names or single overloads (``aten::pow.Scalar``);
a policy entry is tested through every overload that has a case, or through
its base name's case. Inputs are tiny: fp16/bf16 compute on XLA:CPU is slow.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.support.attention_reference import reference
from tests.support.op_cases import CASES as TPU_CASES, Case
from tests.support.recurrent_cases import CASES as RECURRENT_CASES

aten = torch.ops.aten


def _r(*shape):
    return torch.randn(*shape)


def _pos(*shape):
    return torch.rand(*shape) + 0.5


def _unit(*shape):  # in (-0.9, 0.9): acos, asin, erfinv
    return torch.rand(*shape) * 1.8 - 0.9


def _spd(n=4):
    a = torch.randn(n, n)
    return a @ a.t() + n * torch.eye(n)


def _wc(n=4):
    return torch.randn(n, n) + n * torch.eye(n)


def _idx(*values):
    return torch.tensor(values)


def _conv_args(transposed=False):
    return dict(stride=[1], padding=[0], dilation=[1], transposed=transposed,
                output_padding=[0], groups=1, benchmark=False, deterministic=False,
                cudnn_enabled=False)


_CELL_W = lambda gates: [_r(2, 3), _r(2, 4), _r(gates * 4, 3), _r(gates * 4, 4),  # noqa: E731
                         _r(gates * 4), _r(gates * 4)]

CASES: dict[str, Case] = dict(TPU_CASES)
CASES.update({
    # ---- matmuls, convolutions, cells -----------------------------------
    "aten::mv": Case(lambda: [_r(3, 4), _r(4)], torch.mv),
    "aten::chain_matmul": Case(lambda: [_r(3, 4), _r(4, 5), _r(5, 2)], torch.chain_matmul),
    "aten::linalg_multi_dot": Case(lambda: [_r(3, 4), _r(4, 5), _r(5, 2)],
                                   lambda a, b, c: torch.linalg.multi_dot([a, b, c])),
    "aten::linalg_vecdot": Case(lambda: [_r(3, 4), _r(3, 4)], torch.linalg.vecdot),
    "aten::conv1d.padding": Case(lambda: [_r(1, 2, 8), _r(3, 2, 3)],
                                 lambda x, w: F.conv1d(x, w, padding="same")),
    "aten::_convolution": Case(lambda: [_r(1, 2, 8), _r(3, 2, 3), _r(3)],
                               lambda x, w, b: aten._convolution(
                                   x, w, b, [1], [0], [1], False, [0], 1, False, False,
                                   False, False)),
    "aten::_convolution.deprecated": Case(
        lambda: [_r(1, 2, 8), _r(3, 2, 3), _r(3)],
        lambda x, w, b: aten._convolution.deprecated(
            x, w, b, [1], [0], [1], False, [0], 1, False, False, False)),
    "aten::convolution": Case(lambda: [_r(1, 2, 8), _r(3, 2, 3), _r(3)],
                              lambda x, w, b: aten.convolution(x, w, b, [1], [0], [1], False,
                                                               [0], 1)),
    "aten::_addmm_activation": Case(lambda: [_r(3, 5), _r(3, 4), _r(4, 5)],
                                    lambda b, m1, m2: aten._addmm_activation(b, m1, m2)),
    "aten::gru_cell": Case(lambda: _CELL_W(3)[:2] + _CELL_W(3)[2:],
                           lambda x, h, wi, wh, bi, bh: torch.gru_cell(x, h, wi, wh, bi, bh)),
    "aten::rnn_tanh_cell": Case(lambda: _CELL_W(1)[:2] + [_r(4, 3), _r(4, 4), _r(4), _r(4)],
                                lambda x, h, wi, wh, bi, bh: torch.rnn_tanh_cell(
                                    x, h, wi, wh, bi, bh)),
    "aten::rnn_relu_cell": Case(lambda: _CELL_W(1)[:2] + [_r(4, 3), _r(4, 4), _r(4), _r(4)],
                                lambda x, h, wi, wh, bi, bh: torch.rnn_relu_cell(
                                    x, h, wi, wh, bi, bh)),
    "aten::lstm_cell": Case(lambda: [_r(2, 3), _r(2, 4), _r(2, 4), _r(16, 3), _r(16, 4),
                                     _r(16), _r(16)],
                            lambda x, h, c, wi, wh, bi, bh: torch.lstm_cell(
                                x, [h, c], wi, wh, bi, bh)),
    "aten::_thnn_fused_gru_cell": Case(
        lambda: [_r(2, 12), _r(2, 12), _r(2, 4), _r(12), _r(12)],
        lambda ig, hg, hx, ib, hb: aten._thnn_fused_gru_cell(ig, hg, hx, ib, hb)),
    "aten::_thnn_fused_lstm_cell": Case(
        lambda: [_r(2, 16), _r(2, 16), _r(2, 4), _r(16), _r(16)],
        lambda ig, hg, cx, ib, hb: aten._thnn_fused_lstm_cell(ig, hg, cx, ib, hb)),
    "aten::mkldnn_rnn_layer": Case(
        lambda: [_r(3, 1, 2), _r(16, 2), _r(16, 4), _r(16), _r(16), _r(1, 4), _r(1, 4)],
        lambda x, w0, w1, w2, w3, h, c: aten.mkldnn_rnn_layer(
            x, w0, w1, w2, w3, h, c, False, [], 2, 4, 1, True, False, False, False)[:3]),
    # (its fourth output is an uninitialised workspace)
    "aten::scaled_dot_product_attention": Case(
        lambda: [_r(1, 2, 3, 4), _r(1, 2, 3, 4), _r(1, 2, 3, 4)],
        F.scaled_dot_product_attention,
        low_control=lambda q, k, v: reference(q, k, v, q.dtype)),
    "aten::_native_multi_head_attention": Case(
        lambda: [_r(1, 3, 4), _r(1, 3, 4), _r(1, 3, 4), _r(12, 4), _r(12), _r(4, 4), _r(4)],
        lambda q, k, v, wqkv, bqkv, wp, bp: aten._native_multi_head_attention(
            q, k, v, 4, 2, wqkv, bqkv, wp, bp)),
    # ---- pointwise transcendentals -------------------------------------
    "aten::acos": Case(lambda: [_unit(3, 4)], torch.acos),
    "aten::asin": Case(lambda: [_unit(3, 4)], torch.asin),
    "aten::cosh": Case(lambda: [_r(3, 4)], torch.cosh),
    "aten::sinh": Case(lambda: [_r(3, 4)], torch.sinh),
    "aten::tan": Case(lambda: [_unit(3, 4)], torch.tan),
    "aten::erfinv": Case(lambda: [_unit(3, 4)], torch.erfinv),
    "aten::exp": Case(lambda: [_r(3, 4)], torch.exp),
    "aten::expm1": Case(lambda: [_r(3, 4)], torch.expm1),
    "aten::log": Case(lambda: [_pos(3, 4)], torch.log),
    "aten::log10": Case(lambda: [_pos(3, 4)], torch.log10),
    "aten::log1p": Case(lambda: [_pos(3, 4)], torch.log1p),
    "aten::log2": Case(lambda: [_pos(3, 4)], torch.log2),
    "aten::reciprocal": Case(lambda: [_pos(3, 4)], torch.reciprocal),
    "aten::rsqrt": Case(lambda: [_pos(3, 4)], torch.rsqrt),
    "aten::softplus": Case(lambda: [_r(3, 4)], F.softplus),
    "aten::pow.Tensor_Tensor": Case(lambda: [_pos(3, 4), _r(3, 4)], lambda a, b: a ** b),
    "aten::pow.Scalar": Case(lambda: [_r(3, 4)], lambda x: 2.0 ** x),  # __rpow__
    # ---- reductions, softmax, norms -------------------------------------
    "aten::sum": Case(lambda: [_r(3, 4)], torch.sum),
    "aten::sum.dim_IntList": Case(lambda: [_r(3, 4)], lambda x: x.sum(1)),
    "aten::prod.dim_int": Case(lambda: [_pos(3, 4)], lambda x: x.prod(0)),
    "aten::cumsum": Case(lambda: [_r(3, 4)], lambda x: torch.cumsum(x, 1)),
    "aten::cumprod": Case(lambda: [_pos(3, 4)], lambda x: torch.cumprod(x, 1)),
    "aten::logsumexp": Case(lambda: [_r(3, 4)], lambda x: torch.logsumexp(x, 1)),
    "aten::linalg_vector_norm": Case(lambda: [_r(3, 4)], lambda x: torch.linalg.vector_norm(x)),
    "aten::linalg_matrix_norm": Case(lambda: [_r(3, 4)],
                                     lambda x: torch.linalg.matrix_norm(x, ord=1)),
    "aten::linalg_matrix_norm.str_ord": Case(lambda: [_r(3, 4)],
                                             lambda x: torch.linalg.matrix_norm(x, "fro")),
    "aten::norm.Scalar": Case(lambda: [_r(3, 4)], lambda x: aten.norm.Scalar(x, 2)),
    "aten::norm.ScalarOpt_dim": Case(lambda: [_r(3, 4)],
                                     lambda x: aten.norm.ScalarOpt_dim(x, 2, [1])),
    "aten::frobenius_norm": Case(lambda: [_r(3, 4)], lambda x: aten.frobenius_norm(x, [1])),
    "aten::nuclear_norm": Case(lambda: [_r(3, 4)], lambda x: aten.nuclear_norm(x)),
    "aten::nuclear_norm.dim": Case(lambda: [_r(3, 4)], lambda x: aten.nuclear_norm(x, [0, 1])),
    "aten::renorm": Case(lambda: [_r(3, 4)], lambda x: torch.renorm(x, 2, 0, 1.0)),
    "aten::dist": Case(lambda: [_r(3, 4), _r(3, 4)], torch.dist),
    "aten::pdist": Case(lambda: [_r(4, 3)], F.pdist),
    "aten::cosine_similarity": Case(lambda: [_r(3, 4), _r(3, 4)], F.cosine_similarity),
    "aten::mean": Case(lambda: [_r(3, 4)], torch.mean),
    "aten::mean.dim": Case(lambda: [_r(3, 4)], lambda x: x.mean(1)),
    "aten::topk": Case(lambda: [_r(3, 6)], lambda x: torch.topk(x, 2)[0]),
    # ---- norms and activations ------------------------------------------
    "aten::layer_norm": Case(lambda: [_r(3, 4), _r(4), _r(4)],
                             lambda x, w, b: F.layer_norm(x, [4], w, b)),
    "aten::native_layer_norm": Case(lambda: [_r(3, 4), _r(4), _r(4)],
                                    lambda x, w, b: aten.native_layer_norm(x, [4], w, b, 1e-5)),
    "aten::group_norm": Case(lambda: [_r(2, 4, 3), _r(4), _r(4)],
                             lambda x, w, b: F.group_norm(x, 2, w, b)),
    "aten::instance_norm": Case(lambda: [_r(2, 3, 4), _r(3), _r(3)],
                                lambda x, w, b: F.instance_norm(x, weight=w, bias=b)),
    "aten::dropout": Case(lambda: [_r(3, 4)], lambda x: F.dropout(x, 0.5, training=False)),
    "aten::feature_dropout": Case(lambda: [_r(2, 3, 4)],
                                  lambda x: aten.feature_dropout(x, 0.5, False)),
    "aten::leaky_relu": Case(lambda: [_r(3, 4)], F.leaky_relu),
    "aten::gelu": Case(lambda: [_r(3, 4)], F.gelu),
    "aten::elu": Case(lambda: [_r(3, 4)], F.elu),
    "aten::selu": Case(lambda: [_r(3, 4)], F.selu),
    "aten::celu": Case(lambda: [_r(3, 4)], F.celu),
    "aten::hardshrink": Case(lambda: [_r(3, 4)], F.hardshrink),
    "aten::softshrink": Case(lambda: [_r(3, 4)], F.softshrink),
    "aten::hardsigmoid": Case(lambda: [_r(3, 4)], F.hardsigmoid),
    "aten::hardswish": Case(lambda: [_r(3, 4)], F.hardswish),
    "aten::log_sigmoid": Case(lambda: [_r(3, 4)], F.logsigmoid),
    "aten::glu": Case(lambda: [_r(3, 4)], F.glu),
    # ---- arithmetic -----------------------------------------------------
    "aten::add.Tensor": Case(lambda: [_r(3, 4), _r(3, 4)], torch.add),
    "aten::add.Scalar": Case(lambda: [_r(3, 4)], lambda x: aten.add.Scalar(x, 2.0)),
    "aten::sub.Tensor": Case(lambda: [_r(3, 4), _r(3, 4)], torch.sub),
    "aten::sub.Scalar": Case(lambda: [_r(3, 4)], lambda x: aten.sub.Scalar(x, 2.0)),
    "aten::mul.Tensor": Case(lambda: [_r(3, 4), _r(3, 4)], torch.mul),
    "aten::mul.Scalar": Case(lambda: [_r(3, 4)], lambda x: aten.mul.Scalar(x, 3.0)),
    "aten::div.Tensor": Case(lambda: [_r(3, 4), _pos(3, 4)], lambda a, b: a / b),
    "aten::div.Scalar": Case(lambda: [_r(3, 4)], lambda x: aten.div.Scalar(x, 3.0)),
    "aten::div.Tensor_mode": Case(lambda: [_r(3, 4), _pos(3, 4)],
                                  lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "aten::divide.Tensor": Case(lambda: [_r(3, 4), _pos(3, 4)], torch.divide),
    "aten::true_divide.Tensor": Case(lambda: [_r(3, 4), _pos(3, 4)], torch.true_divide),
    "aten::fmod.Tensor": Case(lambda: [_r(3, 4), _pos(3, 4)], torch.fmod),
    "aten::fmod.Scalar": Case(lambda: [_r(3, 4)], lambda x: torch.fmod(x, 0.7)),
    "aten::addcdiv": Case(lambda: [_r(3, 4), _r(3, 4), _pos(3, 4)], torch.addcdiv),
    "aten::addcmul": Case(lambda: [_r(3, 4), _r(3, 4), _r(3, 4)], torch.addcmul),
    "aten::atan2": Case(lambda: [_r(3, 4), _r(3, 4)], torch.atan2),
    "aten::bilinear": Case(lambda: [_r(2, 3), _r(2, 4), _r(5, 3, 4), _r(5)], F.bilinear),
    "aten::cross": Case(lambda: [_r(4, 3), _r(4, 3)], lambda a, b: aten.cross(a, b, 1)),
    "aten::dot": Case(lambda: [_r(4), _r(4)], torch.dot),
    "aten::vdot": Case(lambda: [_r(4), _r(4)], torch.vdot),
    "aten::tensordot": Case(lambda: [_r(3, 4), _r(4, 5)], lambda a, b: torch.tensordot(a, b, 1)),
    "aten::index_put": Case(lambda: [_r(5, 3), _r(2, 3)],
                            lambda x, v, i: torch.index_put(x, (i,), v),
                            extra=lambda: [_idx(4, 1)]),
    "aten::scatter_add": Case(lambda: [_r(3, 4), _r(3, 4)],
                              lambda x, s, i: torch.scatter_add(x, 1, i, s),
                              extra=lambda: [torch.tensor([[0, 1, 2, 3]] * 3)]),
    "aten::grid_sampler": Case(lambda: [_r(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1],
                               lambda x, g: F.grid_sample(x, g, align_corners=False)),
    "aten::grid_sampler_2d": Case(lambda: [_r(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1],
                                  lambda x, g: aten.grid_sampler_2d(x, g, 0, 0, False)[0]),
    "aten::grid_sampler_3d": Case(lambda: [_r(1, 2, 3, 3, 3), torch.rand(1, 2, 2, 2, 3) * 2 - 1],
                                  lambda x, g: aten.grid_sampler_3d(x, g, 0, 0, False)),
    "aten::_grid_sampler_2d_cpu_fallback": Case(
        lambda: [_r(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1],
        lambda x, g: aten._grid_sampler_2d_cpu_fallback(x, g, 0, 0, False)),
    "aten::embedding": Case(lambda: [_r(6, 3)], lambda w, i: F.embedding(i, w),
                            extra=lambda: [_idx(0, 5, 2)]),
    "aten::embedding_bag": Case(lambda: [_r(6, 3)],
                                lambda w, i, o: aten.embedding_bag(w, i, o)[0],
                                extra=lambda: [_idx(0, 5, 2, 1), _idx(0, 2)]),
    "aten::embedding_bag.padding_idx": Case(
        lambda: [_r(6, 3)],
        lambda w, i, o: F.embedding_bag(i, w, o, mode="sum", padding_idx=1),
        extra=lambda: [_idx(0, 5, 2, 1), _idx(0, 2)]),
    # ---- losses ---------------------------------------------------------
    "aten::huber_loss": Case(lambda: [_r(3, 4), _r(3, 4)], F.huber_loss),
    "aten::poisson_nll_loss": Case(lambda: [_r(3, 4), torch.rand(3, 4) * 3],
                                   F.poisson_nll_loss),
    "aten::nll_loss_nd": Case(lambda: [torch.log_softmax(_r(3, 5), 1)],
                              lambda x, t: aten.nll_loss_nd(x, t),
                              extra=lambda: [_idx(0, 4, 2)]),
    "aten::ctc_loss.Tensor": Case(
        lambda: [torch.log_softmax(_r(6, 2, 4), 2)],
        lambda lp, tg, il, tl: aten.ctc_loss.Tensor(lp, tg, il, tl),
        extra=lambda: [torch.tensor([[1, 2], [3, 1]]), torch.tensor([6, 6]),
                       torch.tensor([2, 2])]),
    # ---- pooling, padding, resampling -----------------------------------
    "aten::avg_pool1d": Case(lambda: [_r(1, 2, 6)], lambda x: F.avg_pool1d(x, 2)),
    "aten::avg_pool2d": Case(lambda: [_r(1, 2, 4, 4)], lambda x: F.avg_pool2d(x, 2)),
    "aten::avg_pool3d": Case(lambda: [_r(1, 1, 4, 4, 4)], lambda x: F.avg_pool3d(x, 2)),
    "aten::max_pool3d": Case(lambda: [_r(1, 1, 4, 4, 4)], lambda x: F.max_pool3d(x, 2)),
    "aten::adaptive_avg_pool3d": Case(lambda: [_r(1, 1, 4, 4, 4)],
                                      lambda x: F.adaptive_avg_pool3d(x, 2)),
    "aten::adaptive_max_pool1d": Case(lambda: [_r(1, 2, 6)], lambda x: F.adaptive_max_pool1d(x, 3)),
    "aten::adaptive_max_pool2d": Case(lambda: [_r(1, 2, 4, 4)],
                                      lambda x: F.adaptive_max_pool2d(x, 2)),
    "aten::adaptive_max_pool3d": Case(lambda: [_r(1, 1, 4, 4, 4)],
                                      lambda x: F.adaptive_max_pool3d(x, 2)),
    "aten::max_unpool2d": Case(lambda: [_r(1, 1, 2, 2)],
                               lambda x, i: F.max_unpool2d(x, i, 2, output_size=[4, 4]),
                               extra=lambda: [torch.tensor([[[[0, 3], [9, 14]]]])]),
    "aten::max_unpool3d": Case(lambda: [_r(1, 1, 1, 1, 2)],
                               lambda x, i: F.max_unpool3d(x, i, (1, 1, 2),
                                                           output_size=[1, 1, 4]),
                               extra=lambda: [torch.tensor([[[[[1, 2]]]]])]),
    "aten::fractional_max_pool2d": Case(
        lambda: [_r(1, 1, 5, 5), torch.full((1, 1, 2), 0.5)],
        lambda x, s: aten.fractional_max_pool2d(x, [2, 2], [3, 3], s)[0]),
    "aten::fractional_max_pool3d": Case(
        lambda: [_r(1, 1, 5, 5, 5), torch.full((1, 1, 3), 0.5)],
        lambda x, s: aten.fractional_max_pool3d(x, [2, 2, 2], [3, 3, 3], s)[0]),
    "aten::im2col": Case(lambda: [_r(1, 2, 4, 4)], lambda x: F.unfold(x, 2)),
    "aten::col2im": Case(lambda: [_r(1, 8, 9)], lambda x: F.fold(x, (4, 4), 2)),
    "aten::upsample_nearest1d": Case(lambda: [_r(1, 2, 3)],
                                     lambda x: aten.upsample_nearest1d(x, [6])),
    "aten::upsample_nearest1d.vec": Case(lambda: [_r(1, 2, 3)],
                                         lambda x: F.interpolate(x, scale_factor=2.0)),
    "aten::_upsample_nearest_exact1d": Case(lambda: [_r(1, 2, 3)],
                                            lambda x: aten._upsample_nearest_exact1d(x, [6])),
    "aten::upsample_nearest2d": Case(lambda: [_r(1, 2, 3, 3)],
                                     lambda x: aten.upsample_nearest2d(x, [6, 6])),
    "aten::upsample_nearest2d.vec": Case(lambda: [_r(1, 2, 3, 3)],
                                         lambda x: F.interpolate(x, size=(5, 5))),
    "aten::_upsample_nearest_exact2d": Case(
        lambda: [_r(1, 2, 3, 3)], lambda x: aten._upsample_nearest_exact2d(x, [6, 6])),
    "aten::upsample_nearest3d": Case(lambda: [_r(1, 1, 2, 2, 2)],
                                     lambda x: aten.upsample_nearest3d(x, [4, 4, 4])),
    "aten::_upsample_nearest_exact3d": Case(
        lambda: [_r(1, 1, 2, 2, 2)], lambda x: aten._upsample_nearest_exact3d(x, [4, 4, 4])),
    "aten::upsample_linear1d": Case(lambda: [_r(1, 2, 3)],
                                    lambda x: aten.upsample_linear1d(x, [6], False)),
    "aten::upsample_bilinear2d": Case(lambda: [_r(1, 2, 3, 3)],
                                      lambda x: aten.upsample_bilinear2d(x, [6, 6], False)),
    "aten::upsample_bilinear2d.vec": Case(
        lambda: [_r(1, 2, 3, 3)],
        lambda x: F.interpolate(x, scale_factor=2.0, mode="bilinear")),
    "aten::_upsample_bilinear2d_aa": Case(
        lambda: [_r(1, 2, 4, 4)], lambda x: aten._upsample_bilinear2d_aa(x, [2, 2], False)),
    "aten::upsample_trilinear3d": Case(
        lambda: [_r(1, 1, 2, 2, 2)], lambda x: aten.upsample_trilinear3d(x, [4, 4, 4], False)),
    "aten::upsample_bicubic2d": Case(lambda: [_r(1, 2, 3, 3)],
                                     lambda x: aten.upsample_bicubic2d(x, [6, 6], False)),
    "aten::_upsample_bicubic2d_aa": Case(
        lambda: [_r(1, 2, 4, 4)], lambda x: aten._upsample_bicubic2d_aa(x, [2, 2], False)),
    # ---- scans, sorting, statistics, shapes -----------------------------
    "aten::cummax": Case(lambda: [_r(3, 4)], lambda x: torch.cummax(x, 1)[0]),
    "aten::cummin": Case(lambda: [_r(3, 4)], lambda x: torch.cummin(x, 1)[0]),
    "aten::logcumsumexp": Case(lambda: [_r(3, 4)], lambda x: torch.logcumsumexp(x, 1)),
    "aten::histc": Case(lambda: [_r(8)], lambda x: torch.histc(x, 4, -2, 2)),
    "aten::searchsorted.Tensor": Case(lambda: [torch.sort(_r(6))[0], _r(3)],
                                      torch.searchsorted),
    "aten::searchsorted.Scalar": Case(lambda: [torch.sort(_r(6))[0]],
                                      lambda s: torch.searchsorted(s, 0.1)),
    "aten::quantile": Case(lambda: [_r(8), torch.tensor([0.25, 0.5])], torch.quantile),
    "aten::quantile.scalar": Case(lambda: [_r(8)], lambda x: torch.quantile(x, 0.3)),
    "aten::nanquantile": Case(lambda: [_r(8), torch.tensor([0.25, 0.5])], torch.nanquantile),
    "aten::nanquantile.scalar": Case(lambda: [_r(8)], lambda x: torch.nanquantile(x, 0.3)),
    "aten::diag": Case(lambda: [_r(4)], torch.diag),
    "aten::diagflat": Case(lambda: [_r(3)], torch.diagflat),
    "aten::tril": Case(lambda: [_r(4, 4)], torch.tril),
    "aten::triu": Case(lambda: [_r(4, 4)], torch.triu),
    "aten::vander": Case(lambda: [_r(4)], torch.vander),
    "aten::trace": Case(lambda: [_r(4, 4)], torch.trace),
    "aten::multinomial": Case(lambda: [torch.rand(2, 5) + 0.1],
                              lambda p: torch.multinomial(p, 3)),
    "aten::poisson": Case(lambda: [torch.rand(3, 4) * 3], torch.poisson),
    "aten::polar": Case(lambda: [_pos(3), _r(3)], torch.polar),
    "aten::view_as_complex": Case(lambda: [_r(3, 2)], torch.view_as_complex),
    "aten::fake_quantize_per_tensor_affine": Case(
        lambda: [_r(3, 4)], lambda x: torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127)),
    # ---- FFT ------------------------------------------------------------
    "aten::stft": Case(lambda: [_r(16), torch.hann_window(8)],
                       lambda x, w: aten.stft(x, 8, 4, 8, w, False, True, True)),
    "aten::stft.center": Case(lambda: [_r(16), torch.hann_window(8)],
                              lambda x, w: torch.stft(x, 8, 4, window=w, return_complex=True)),
    **{f"aten::fft_{n}": Case(lambda: [_r(4, 4)], lambda x, n=n: getattr(torch.fft, n)(x))
       for n in ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2",
                 "irfft2", "rfftn", "irfftn", "hfft", "ihfft")},
    # ---- linear algebra -------------------------------------------------
    "aten::linalg_cond": Case(lambda: [_wc()], torch.linalg.cond),
    "aten::linalg_cond.p_str": Case(lambda: [_wc()], lambda x: torch.linalg.cond(x, "fro")),
    "aten::linalg_matrix_rank": Case(lambda: [_wc()],
                                     lambda x: aten.linalg_matrix_rank(x, 1e-3)),
    "aten::linalg_matrix_rank.atol_rtol_float": Case(lambda: [_wc()], torch.linalg.matrix_rank),
    "aten::linalg_matrix_rank.atol_rtol_tensor": Case(
        lambda: [_wc(), torch.tensor(1e-3)],
        lambda x, t: aten.linalg_matrix_rank.atol_rtol_tensor(x, atol=t)),
    "aten::linalg_matrix_rank.tol_tensor": Case(
        lambda: [_wc(), torch.tensor(1e-3)],
        lambda x, t: aten.linalg_matrix_rank.tol_tensor(x, t)),
    "aten::linalg_solve": Case(lambda: [_wc(), _r(4, 2)], torch.linalg.solve),
    "aten::linalg_cholesky": Case(lambda: [_spd()], torch.linalg.cholesky),
    "aten::linalg_cholesky_ex": Case(lambda: [_spd()], lambda x: torch.linalg.cholesky_ex(x)[0]),
    "aten::linalg_svdvals": Case(lambda: [_wc()], torch.linalg.svdvals),
    "aten::linalg_eigvals": Case(lambda: [_spd()], lambda x: torch.linalg.eigvals(x).real),
    "aten::linalg_eigvalsh": Case(lambda: [_spd()], torch.linalg.eigvalsh),
    "aten::linalg_eig": Case(lambda: [_spd()], lambda x: torch.linalg.eig(x)[0].real),
    "aten::linalg_eigh": Case(lambda: [_spd()], lambda x: torch.linalg.eigh(x)[0]),
    "aten::linalg_inv": Case(lambda: [_wc()], torch.linalg.inv),
    "aten::linalg_householder_product": Case(lambda: [_r(4, 3), _r(3)],
                                             torch.linalg.householder_product),
    "aten::linalg_tensorinv": Case(lambda: [_wc()], lambda x: torch.linalg.tensorinv(x, 1)),
    "aten::linalg_tensorsolve": Case(lambda: [_wc(), _r(4)], torch.linalg.tensorsolve),
    "aten::linalg_qr": Case(lambda: [_wc()], lambda x: torch.linalg.qr(x)[1].abs()),
    "aten::linalg_lstsq": Case(lambda: [_wc(), _r(4, 2)],
                               lambda a, b: torch.linalg.lstsq(a, b)[0]),
    "aten::pinverse": Case(lambda: [_wc()], torch.pinverse),
    "aten::geqrf": Case(lambda: [_wc()], lambda x: torch.geqrf(x)[0].abs()),
    "aten::orgqr": Case(lambda: [_r(4, 3), _r(3)], torch.orgqr),
    "aten::ormqr": Case(lambda: [_r(4, 3), _r(3), _r(4, 2)], torch.ormqr),
    "aten::_lu_with_info": Case(lambda: [_wc()], lambda x: aten._lu_with_info(x)[0]),
    # LU factors are made in float32 before the call (linalg_lu_factor has no
    # bfloat16 kernel); the pivots are integer arguments
    "aten::lu_solve": Case(lambda: [_r(4, 2), _LU[0]], lambda b, lu, piv: torch.lu_solve(b, lu, piv),
                           extra=lambda: [_LU[1]]),
    "aten::lu_unpack": Case(lambda: [_LU[0]], lambda lu, piv: torch.lu_unpack(lu, piv)[1],
                            extra=lambda: [_LU[1]]),
    # Python-level names of the documents (not aten ops): what they reach
    "py::__rtruediv__": Case(lambda: [_pos(3, 4)], lambda x: 2.0 / x),
    "py::__rdiv__": Case(lambda: [_pos(3, 4)], lambda x: x.__rdiv__(2.0)),
    "py::__rpow__": Case(lambda: [_r(3, 4)], lambda x: 2.0 ** x),
    "py::__pow__": Case(lambda: [_pos(3, 4)], lambda x: x ** 2.5),
    "py::__matmul__": Case(lambda: [_r(3, 4), _r(4, 5)], lambda a, b: a @ b),
    "py::softmin": Case(lambda: [_r(3, 5)], lambda x: F.softmin(x, 1)),
    "py::normalize": Case(lambda: [_r(3, 4)], lambda x: F.normalize(x, dim=1)),
    "py::cross_entropy": Case(lambda: [_r(3, 5)], F.cross_entropy, extra=lambda: [_idx(1, 0, 4)]),
    "py::norm": Case(lambda: [_r(3, 4)], lambda x: torch.norm(x, dim=1)),
    "py::grid_sample": Case(lambda: [_r(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1],
                            lambda x, g: F.grid_sample(x, g, align_corners=False)),
    "py::nll_loss": Case(lambda: [torch.log_softmax(_r(3, 5), 1)], F.nll_loss,
                         extra=lambda: [_idx(0, 4, 2)]),
    # the aten op itself (tests.support.op_cases' nll_loss goes through F.nll_loss)
    "aten::nll_loss": Case(lambda: [torch.log_softmax(_r(3, 5), 1)],
                           lambda x, t: aten.nll_loss(x, t), extra=lambda: [_idx(0, 4, 2)]),
    "aten::nll_loss2d": Case(lambda: [torch.log_softmax(_r(2, 3, 2, 2), 1)],
                             lambda x, t: aten.nll_loss2d(x, t),
                             extra=lambda: [torch.randint(0, 3, (2, 2, 2))]),
    "py::truediv": Case(lambda: [_r(3, 4), _pos(3, 4)], lambda a, b: a / b),
})
CASES.update(RECURRENT_CASES)
torch.manual_seed(0)
_LU = torch.linalg.lu_factor(_wc())
