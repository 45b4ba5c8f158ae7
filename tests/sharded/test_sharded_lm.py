"""A transformer LM (Hugging Face GPT-2, small config) under FSDPv2 with
xla_amp.sharded on 2 and 4 virtual XLA:CPU devices, 1-D (fsdp) and 2-D
(data x fsdp) meshes: bf16 parameters with an fp32 master shard, with
stochastic rounding, and AMP on fp32 parameters, each against the same run
on one device (tests.support.sharded.assert_sharded_run: 20 steps within 1 %
-- or twice what bf16 itself moves the one-device loss from fp32 --,
an overflow on one shard skipped everywhere bit-identically, 1 execution
and 0 transfers per step, state sharded as its parameter); a sharded
checkpoint restored in a fresh process continues bit-identically.
`make sharded`."""
import pytest

from tests.support.sharded import STEPS, assert_sharded_run, reference, run

pytestmark = pytest.mark.sharded

CASES = [("master", "1d", 2), ("sr", "2d", 4), ("amp", "1d", 4)]


@pytest.mark.parametrize("mode,mesh,devices", CASES)
def test_lm_trains_sharded_like_one_device(mode, mesh, devices):
    assert_sharded_run(run("lm", mesh, devices, mode), reference("lm", mode),
                       reference("lm", "fp32"))


@pytest.mark.parametrize("mode,mesh,devices", [("master", "1d", 2), ("sr", "2d", 4),
                                               ("fp8", "1d", 2)])
def test_lm_checkpoint_restores_in_a_fresh_process_bit_identically(tmp_path, mode, mesh, devices):
    k, ckpt = 10, str(tmp_path / "ckpt")
    whole = run("lm", mesh, devices, mode, "--save-at", str(k), "--ckpt", ckpt)
    assert whole["saved_at"] == k
    resumed = run("lm", mesh, devices, mode, "--load", ckpt, "--start", str(k))
    assert resumed["losses"] == whole["losses"][k:], (resumed["losses"], whole["losses"])
    assert resumed["digest"] == whole["digest"] and resumed["scale"] == whole["scale"]
    assert resumed["sharding_mismatches"] == []
    plain = run("lm", mesh, devices, mode)  # saving changes nothing in the run
    assert len(whole["losses"]) == STEPS
    assert whole["losses"] == plain["losses"] and whole["digest"] == plain["digest"]
