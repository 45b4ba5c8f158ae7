"""With TorchTPU 0.2.0 loaded (no TPU here), in a network namespace of its
own: prints one JSON line of what xla_amp's registration did. Run by
tests/privateuse1/test_torchtpu.py with TORCH_DEVICE_BACKEND_AUTOLOAD=1, so
`import torch` loads torch_tpu as it does for its users."""
import json
import logging
import sys
import time

start = time.monotonic()
import torch  # noqa: E402  (autoloads torch_tpu)

loaded = time.monotonic() - start
assert "torch_tpu" in sys.modules, "torch did not autoload torch_tpu"
KEY = "AutocastPrivateUse1"
theirs = sorted(op for op in set(torch._C._dispatch_get_all_op_names())
                if torch._C._dispatch_has_kernel_for_dispatch_key(op, KEY))
records = []
logging.getLogger("xla_amp").addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, r: records.append(r.getMessage())})())
import xla_amp  # noqa: E402

out = {"seconds_to_load": round(loaded, 2), "backend": torch._C._get_privateuse1_backend_name(),
       "theirs": theirs, "displaced": xla_amp.privateuse1.displaced(), "log": records,
       "kernels": xla_amp.privateuse1.kernels(),
       "mm_kernel": [line for line in torch._C._dispatch_dump("aten::mm").splitlines()
                     if line.startswith(KEY)]}
for name, call in (("xla_amp", lambda: xla_amp.autocast("tpu")),
                   ("torch", lambda: torch.autocast("tpu").__enter__())):
    try:
        call()
        out[name] = "entered"
    except Exception as e:  # noqa: BLE001
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
