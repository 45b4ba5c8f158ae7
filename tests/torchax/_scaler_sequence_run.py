"""tests/support/scaler_sequence.py's rows for one engine, as JSON to
argv[2]; argv[1]: torch_xla | standin (a process each: the stand-in renames
PrivateUse1 "tpu", torchax names it "jax")."""
import json
import sys

import torch

engine, out = sys.argv[1], sys.argv[2]
import xla_amp  # noqa: E402
from tests.support import scaler_sequence  # noqa: E402

if engine == "torch_xla":
    import torch_xla
    device = torch_xla.device()
    make = lambda t: t.to(device)  # noqa: E731
else:
    from tests.support import standin_tpu
    standin_tpu.install()
    make = standin_tpu.to_device
result = {name: scaler_sequence.grad_scaler(make, xla_amp.GradScaler, config)
          for name, config in scaler_sequence.CONFIGS.items()}
with open(out, "w") as f:
    json.dump(result, f)
