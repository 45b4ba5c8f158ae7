"""torch_xla 2.9's XLA:CPU swaps a convolution's operands when the kernel is
larger than the input (a 3x3 kernel over a 2x2 map: ResNet's last stage at
64 px) and then cannot run the swapped form -- a window with
``rhs_reversal`` -- through Eigen: its naive loop took 0.47 s for a
[8, 512, 2, 2] x [512, 512, 3, 3] convolution that takes 0.02 s over a 3x3
map (backend level 0, the tests' flags). tests/support/zoo_models.py's fitting_image
sizes the zoo's images so that no dense convolution meets it
(docs/upstream/xla_cpu_conv_operand_swap.md). Pinned: fails once XLA keeps
the operands (then fitting_image can go)."""
import glob
import json
import os
import re
import subprocess
import sys

from tests.support.launch import ROOT, launch_env

# fitting_image on three one-convolution models, then the first one's forward
# at 64 px and at its fitting size, each compiled with its optimized HLO dumped.
_RUN = """
import json, torch, torch_xla, torch.nn as nn
from tests.support import zoo_models as zoo
def net(groups=1):  # 64 px -> a 2x2 map under a 3x3 kernel; 96 px -> 3x3
    return nn.Sequential(nn.Conv2d(3, 8, 1), nn.AvgPool2d(32),
                         nn.Conv2d(8, 8, 3, padding=1, groups=groups))
fits = [zoo.fitting_image(lambda size: net(), 64), zoo.fitting_image(lambda size: net(), 96),
        zoo.fitting_image(lambda size: net(groups=8), 64)]
try:  # a map that no input size grows: refused, naming the kernel and map
    zoo.fitting_image(lambda size: nn.Sequential(nn.AdaptiveAvgPool2d(1), *net()[::2]), 64)
except ValueError as e:
    fits.append(str(e))
print(json.dumps(fits))
model = net().to(torch_xla.device())
for size in (64, fits[0]):
    model(torch.zeros(1, 3, size, size).to(torch_xla.device())).cpu()
"""


def test_xla_cpu_swaps_the_operands_of_a_kernel_larger_than_its_input(tmp_path):
    """fitting_image steps from 64 to 96 px for a dense 3x3 kernel over a 2x2
    map (not for a grouped one, which XLA:CPU's Eigen path does not take
    either way) and refuses a map no size grows. The optimized HLO of that
    convolution at 64 px has a reversed 2x2 window (the input became the
    kernel), and at 96 px the 3x3 window, padded, as written."""
    env = launch_env(XLA_FLAGS=f"--xla_dump_to={tmp_path} --xla_dump_hlo_as_text "
                     "--xla_backend_optimization_level=0")
    proc = subprocess.run([sys.executable, "-c", _RUN], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *fits, refused = json.loads(proc.stdout.splitlines()[-1])
    assert fits == [96, 96, 64]
    assert "kernel (3, 3) over a (1, 1) map at 256 px" in refused, refused
    convs = {}  # the 3x3 convolution's line by its map (its output's, NHWC)
    for path in glob.glob(os.path.join(tmp_path, "*after_optimizations.txt")):
        with open(path) as f:
            for line in f:
                m = re.search(r"= f32\[1,(\d),(\d),8\]\S* convolution\(", line)
                if m:
                    convs[f"{m[1]}x{m[2]}"] = line
    assert sorted(convs) == ["2x2", "3x3"], convs
    assert "size=2x2 rhs_reversal=1x1" in convs["2x2"], convs["2x2"]
    assert "rhs_reversal" not in convs["3x3"], convs["3x3"]
    assert "size=3x3 pad=1_1x1_1" in convs["3x3"], convs["3x3"]
