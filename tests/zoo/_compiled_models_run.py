"""One real model, lazy against compiled (forward + loss through
torch.compile(backend="openxla"), backward after it), under no autocast and
the tpu and cpu rules; run as a script, or by the test worker's served
process (tests/support/served.py), one per XLA_FLAGS setting:

    python -m tests.zoo._compiled_models_run resnet18 tpu   # one JSON line
    python -m tests.zoo._compiled_models_run resnet18 cuda rules

("none": no autocast; "rules": the model's RULES installed with
xla_amp.module_policies). The line holds the loss of both runs, their dtypes,
how many gradients are bit-equal, the largest difference, and how many
graphs the lazy backward ran (its gradients fetched);
tests/zoo/test_compiled_models.py asserts on it.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402

import xla_amp  # noqa: E402

from tests.support import count  # noqa: E402
from tests.support.models import mnist_cnn  # noqa: E402


# Module policies a user would give each model: norms (and the classifier)
# in float32, attention under the cuda rules.
RULES = {
    "mnist_cnn": {nn.BatchNorm2d: "fp32", "10": "fp32"},
    "resnet18": {nn.BatchNorm2d: "fp32", "fc": "fp32"},
    "transformer_layer": {nn.LayerNorm: "fp32", "*self_attn": "cuda"},
}


def build(name):
    """(model, input, targets) on the CPU, deterministic."""
    if name == "mnist_cnn":
        torch.manual_seed(0)
        x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
        torch.manual_seed(1)
        return mnist_cnn(), x, y
    from tests.support.zoo_models import build as zoo_build
    return zoo_build(name, batch=2, image=32)


def loss_and_grads(name, policy, compiled, cut=False, rules=False):
    device = torch_xla.device()
    model, x, y = build(name)
    model, x, y = model.to(device), x.to(device), y.to(device)
    if rules:
        xla_amp.module_policies(model, RULES[name])

    def loss_fn(x, y):
        with xla_amp.autocast(device, policy=policy or "tpu", enabled=policy is not None):
            return F.cross_entropy(model(x), y)
    if compiled:
        torch._dynamo.reset()
        loss_fn = torch.compile(loss_fn, backend="openxla")
    loss = loss_fn(x, y)
    if cut:  # the forward as a graph of its own, as a compiled forward is
        torch_xla.sync()
    runs = count("ExecuteTime")
    loss.backward()
    # the backward as one graph (as the compiled backward is), not a graph
    # per gradient: fetched one by one, each `.cpu()` would compile and run
    # the backward up to that gradient (ResNet-18: 57 compilations, 9 s)
    torch_xla.sync()
    grads = [p.grad.cpu() for p in model.parameters()]
    return loss.detach().cpu(), grads, count("ExecuteTime") - runs


def compare(name, policy, rules=False):
    """Compiled against lazy with the forward as a graph of its own: that is
    the graph cut a compiled forward makes, and where bf16 values are rounded
    depends on the cut (XLA's excess precision, docs/engine.md)."""
    loss, grads, backward_graphs = loss_and_grads(name, policy, False, cut=True, rules=rules)
    loss_c, grads_c, _ = loss_and_grads(name, policy, True, rules=rules)
    return {
        "lazy_backward_graphs": backward_graphs,
        "loss": loss.item(), "loss_compiled": loss_c.item(),
        "loss_dtypes": [str(loss.dtype), str(loss_c.dtype)],
        "grads": len(grads),
        "grads_equal": sum(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(grads, grads_c)),
        "grad_gap": max((a - b).abs().max().item() for a, b in zip(grads, grads_c)),
    }


def main(argv):
    """argv: model, policy ("none": no autocast)[, "rules"]; prints one JSON line."""
    print(json.dumps(compare(argv[0], None if argv[1] == "none" else argv[1],
                             rules=argv[2:] == ["rules"])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
