"""One engine's override table (tests/support/override_sweep.py) as JSON to
argv[2]; argv[1]: torch_xla | standin | torchax. A process per engine: the
stand-in names PrivateUse1 "tpu", torchax names it "jax"."""
import json
import sys

import torch

engine, out = sys.argv[1], sys.argv[2]
torch.set_grad_enabled(False)
if engine == "torchax":
    from tests.support import torchax_current  # noqa: F401  (the shim first: torch 2.15)
    from tests.support.torchax_env import ENV, to_jax
    import xla_amp.torchax as xt
    from tests.support import override_sweep
    rows = override_sweep.sample()  # on the CPU, outside the environment
    with ENV:
        result = override_sweep.table(lambda p: xt.autocast("jax", policy=p),
                                      lambda t: to_jax([t])[0], rows)
else:
    import xla_amp
    from tests.support import override_sweep
    if engine == "torch_xla":
        import torch_xla
        device = torch_xla.device()
        result = override_sweep.table(lambda p: xla_amp.autocast(device, policy=p),
                                      lambda t: t.to(device))
    else:
        from tests.support import standin_tpu
        standin_tpu.install()
        result = override_sweep.table(lambda p: xla_amp.autocast("tpu", policy=p),
                                      standin_tpu.to_device)
with open(out, "w") as f:
    json.dump(result, f, indent=1)
