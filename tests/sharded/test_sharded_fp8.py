"""xla_amp.fp8 under FSDPv2 (xla_amp.sharded): the GPT-2 LM with its Conv1D
layers in fp8 (delayed scaling; the 1000-way head kept, 1000 % 16 != 0) and
bf16 autocast on 2 devices (1-D mesh) and 4 (2-D), against the same fp8 run
on one device (tests.support.sharded.assert_sharded_run: the loss within
tolerance at every step, an overflow on one gradient shard skipped
everywhere bit-identically, 1 execution and 0 transfers per step, state
sharded as its parameter). The amax of a sharded operand is the whole
tensor's: XLA's partitioner reduces it across the shards inside the step.
`make sharded`."""
import pytest

from tests.support.sharded import assert_sharded_run, reference, run

pytestmark = pytest.mark.sharded


@pytest.mark.parametrize("mesh,devices", [("1d", 2), ("2d", 4)])
def test_fp8_lm_trains_sharded_like_one_device(mesh, devices):
    assert_sharded_run(run("lm", mesh, devices, "fp8"), reference("lm", "fp8"),
                       reference("lm", "fp32"))
