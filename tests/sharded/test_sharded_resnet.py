"""A ResNet (torchvision, one BasicBlock per stage; BatchNorm buffers
sharded with the parameters) under FSDPv2 with xla_amp.sharded, the checks
of tests/sharded/test_sharded_lm.py against the same run on one device.
`make sharded`."""
import pytest

from tests.support.sharded import assert_sharded_run, reference, run

pytestmark = pytest.mark.sharded


@pytest.mark.parametrize("mode,mesh,devices", [("master", "2d", 4), ("sr", "1d", 2),
                                               ("amp", "1d", 4)])
def test_resnet_trains_sharded_like_one_device(mode, mesh, devices):
    assert_sharded_run(run("resnet", mesh, devices, mode), reference("resnet", mode),
                       reference("resnet", "fp32"))
