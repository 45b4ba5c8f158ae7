"""Helpers shared by test modules (not tests themselves)."""
import math

import torch


def assert_same(a, b, where="state"):
    """a and b are equal to the bit, recursively (tensors by bits and dtype,
    NaNs included; dicts, lists, tuples by structure; the rest by ==)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        bits = lambda t: t.reshape(-1).view(torch.uint8) if t.dtype.is_floating_point else t
        assert torch.equal(bits(a.cpu()), bits(b.cpu())), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def host_copy(obj):
    """`obj` (tensors in nested dicts, lists, tuples) with every tensor
    replaced by a host copy of it: a state_dict kept across later steps."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(v) for v in obj)
    return obj


def device_scalar(value: float, device) -> torch.Tensor:
    """A 0-dim float32 tensor on `device` that is device data from the
    start: ``torch.tensor(1.0).to(xla)`` is a constant of the next graph
    (xla_amp/_upload.py), and a training step that multiplies by it a graph
    of its own, compiled once more."""
    from xla_amp._upload import upload
    return upload(torch.tensor(float(value)), device)


def clear_metrics():
    """Reset torch_xla's metrics once earlier executions have landed
    (executions are counted when they finish)."""
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    xm.wait_device_ops()
    met.clear_all()


def count(metric: str) -> int:
    """How often `metric` (ExecuteTime, CompileTime, TransferFromDeviceTime)
    was recorded since the last clear, after pending executions finished."""
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    xm.wait_device_ops()
    data = met.metric_data(metric)
    return 0 if data is None else data[0]


def hlo(*tensors) -> str:
    """The HLO text of the graph that computes `tensors`."""
    import torch_xla
    return torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))


def materialize(tensors) -> None:
    """Computes exactly `tensors`, in one graph, and waits for it: the graph
    `hlo(*tensors)` shows. (A sync of every live tensor adds whatever else is
    pending, and XLA may fuse a reduction differently: a GRU's float16 bias
    gradient came out one float16 step apart from a manual cast that way.)"""
    import torch_xla
    torch_xla._XLAC._xla_sync_multi(list(tensors), devices=[], wait=True)
