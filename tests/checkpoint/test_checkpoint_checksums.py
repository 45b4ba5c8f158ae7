"""The checksums in xla_amp.checkpoint's files (make test): every tensor of a
saved state (model, optimizer, extra) has one, found by walking the state;
bytes flipped in place anywhere in a real file are refused in one line
naming the file and the first damaged tensor, or load exactly what was
saved (a flip in bytes nothing reads); files from before checksums load
unverified. The launchers' fallback on damage: test_faults_damage.py."""
import os
import random
import struct
import zipfile

import pytest
import torch

from xla_amp import checkpoint as ckpt
from xla_amp.checkpoint import _integrity
from xla_amp.checkpoint._checksum import tensor_digest

from tests.support import assert_same


def _model_and_optimizer():
    torch.manual_seed(43)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters())
    for p in model.parameters():      # gradients set, not computed: no CPU autograd run
        p.grad = torch.randn_like(p)  # before the XLA tests of this process
    opt.step()
    return model, opt


@pytest.fixture
def saved(tmp_path):
    """A checkpoint written by ckpt.save: its path and the state it holds.
    `extra` holds a tensor, a view into it and a transposed (non-contiguous)
    one, so storages shared between tensors are covered too."""
    model, opt = _model_and_optimizer()
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    extra = {"position": {"step": 7}, "ema": {"w": base, "rows": base[1:3], "t": base.t()}}
    path = tmp_path / "ck.pt"
    ckpt.save(path, model=model, optimizer=opt, extra=extra)
    return path, ckpt.snapshot(model, opt, extra=extra)


def _tensors(obj, path=""):
    """The tensors of `obj` by path, found independently of xla_amp's walk."""
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    items = (obj.items() if isinstance(obj, dict) else
             enumerate(obj) if isinstance(obj, (list, tuple)) else ())
    out = {}
    for k, v in items:
        out.update(_tensors(v, f"{path}/{k}" if path else str(k)))
    return out


def _records(path) -> dict:
    """{zip record name: (offset of its first data byte in the file, size)}."""
    raw = open(path, "rb").read()
    out = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            nlen, xlen = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
            out[info.filename] = (info.header_offset + 30 + nlen + xlen, info.file_size)
    return out


def _record_of(path, tensor) -> tuple[int, int]:
    """Where in the file `tensor`'s bytes are (its storage's record)."""
    want = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    raw = open(path, "rb").read()
    hits = [(o, n) for name, (o, n) in _records(path).items()
            if "/data/" in name and raw[o:o + n] == want]
    assert len(hits) == 1, hits
    return hits[0]


def _flip(path, offset: int, n: int, out=None):
    """Invert `n` bytes of the file at `offset` (same length: a disk or copy
    fault); into `out` when given, else in place."""
    raw = bytearray(open(path, "rb").read())
    for i in range(offset, min(offset + n, len(raw))):
        raw[i] ^= 0xFF
    with open(out or path, "wb") as f:
        f.write(raw)


def _refused(path, *needles) -> str:
    with pytest.raises(ckpt.CheckpointDamaged) as e:
        ckpt.load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "not loaded" in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


@pytest.mark.parametrize("threads", [1, 2])
def test_save_writes_a_checksum_of_every_tensor_in_the_state(tmp_path, saved, monkeypatch,
                                                            threads):
    """threads 2: hashed by two threads, as a state of 64 MB or more is."""
    path, state = saved
    if threads == 2:
        monkeypatch.setattr(_integrity, "_TWO_THREADS_FROM", 0)
        path = tmp_path / "two.pt"
        model, opt = _model_and_optimizer()
        ckpt.save(path, model=model, optimizer=opt,
                  extra={k: state[k] for k in ("position", "ema")})
    raw = torch.load(path, weights_only=True)
    sums = raw.pop("checksums")
    assert sums["algorithm"] == "xxh3_64"
    expected = _tensors(raw)
    assert list(sums["tensors"]) == list(expected)
    assert {"model/0.weight", "optimizer/state/0/exp_avg", "optimizer/state/3/exp_avg_sq",
            "ema/w", "ema/rows", "ema/t"} <= set(expected)
    for p, t in expected.items():
        assert sums["tensors"][p] == tensor_digest(t), p
    loaded = ckpt.load(path)                 # verified, returned without the entry
    assert "checksums" not in loaded
    assert_same(loaded, state)
    assert_same(ckpt.read(path), state)


@pytest.mark.parametrize("where, damaged", [("model/0.weight", 1),
                                            ("optimizer/state/2/exp_avg_sq", 1),
                                            ("ema/w", 3)])   # its two views share its bytes
def test_flipped_tensor_bytes_are_refused_naming_the_tensor(saved, where, damaged):
    """100 bytes flipped in place inside one tensor's data (all of it when
    it is shorter): load and read refuse it in one line naming the file and
    that tensor; a second damaged tensor is counted."""
    path, state = saved
    n = len(_tensors(state))
    offset, size = _record_of(path, _tensors(state)[where])
    _flip(path, offset + max(0, min(16, size - 100)), min(100, size))
    _refused(path, f"tensor {where} does not match its checksum",
             f"({damaged} damaged of {n} tensors)")
    with pytest.raises(ckpt.CheckpointDamaged, match=f"tensor {where} "):
        ckpt.read(path)
    other = "model/2.weight"
    _flip(path, _record_of(path, _tensors(state)[other])[0], 4)
    _refused(path, f"({damaged + 1} damaged of {n} tensors)")


def test_flips_anywhere_in_the_file_never_load_silently(tmp_path, saved):
    """Flips of 1 and of 100 bytes at seeded offsets over the whole file --
    the pickle record, the tensor records, the zip's headers and directory:
    each is refused in one CheckpointDamaged line (never mistaken for a
    hostile file), or, where the flipped bytes are ones nothing reads (zip
    padding, the serialization id), loads exactly what was saved."""
    path, state = saved
    size = os.path.getsize(path)
    records = _records(path)
    pkl = next(v for k, v in records.items() if k.endswith("data.pkl"))
    data = [v for k, v in records.items() if "/data/" in k]
    rng = random.Random(43)
    offsets = ([rng.randrange(size) for _ in range(16)]
               + [pkl[0] - 20]                # the pickle's zip header and its first bytes
               + [pkl[0] + rng.randrange(pkl[1]) for _ in range(16)]
               + [o + rng.randrange(n) for o, n in rng.sample(data, 8)])
    refused = loaded_same = 0
    for i, offset in enumerate(offsets):
        bad = tmp_path / f"bad{i}.pt"
        _flip(path, offset, 100 if i % 2 == 0 else 1, out=bad)
        try:
            got = ckpt.load(bad)
        except ckpt.CheckpointDamaged as e:
            assert "\n" not in str(e) and str(bad) in str(e), str(e)
            refused += 1
            continue
        assert_same(got, state)
        loaded_same += 1
    assert refused >= len(offsets) - 8, (refused, loaded_same)
    for o, n in data:                         # inside any tensor's bytes: always refused
        _flip(path, o + n // 2, 1, out=tmp_path / "t.pt")
        _refused(tmp_path / "t.pt", "does not match its checksum")


def test_a_tensor_missing_added_reshaped_or_other_data_changed_is_damage(tmp_path, saved):
    """Files whose pickle was changed consistently (torch.load reads them):
    a tensor gone, one not in the list, one reinterpreted as another shape,
    a number changed."""
    path, _ = saved
    cases = {
        "missing": (lambda s: s["optimizer"]["state"][1].pop("exp_avg"),
                    "tensor optimizer/state/1/exp_avg is missing"),
        "added": (lambda s: s["ema"].__setitem__("new", torch.ones(3)),
                  "tensor ema/new is not in its checksum list"),
        "reshaped": (lambda s: s["model"].__setitem__("0.weight",
                                                       s["model"]["0.weight"].reshape(32, 64)),
                     "tensor model/0.weight does not match its checksum"),
        "number": (lambda s: s["position"].__setitem__("step", 8),
                   "its data besides the tensors"),
    }
    for name, (change, needle) in cases.items():
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, tmp_path / f"{name}.pt")
        _refused(tmp_path / f"{name}.pt", needle)


def test_a_file_without_checksums_loads_unverified(tmp_path, saved):
    """A file from before checksums (the same state, no entry) loads as it is."""
    path, state = saved
    raw = torch.load(path, weights_only=True)
    del raw["checksums"]
    old = tmp_path / "old.pt"
    torch.save(raw, old)
    assert_same(ckpt.load(old), state)


def test_a_torn_file_is_still_refused_as_damaged(saved):
    path, _ = saved
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    _refused(path, "not a readable torch checkpoint")


def test_extra_may_not_take_the_checksums_entry(tmp_path):
    model, opt = _model_and_optimizer()
    with pytest.raises(ValueError, match="'checksums'"):
        ckpt.save(tmp_path / "ck.pt", model=model, extra={"checksums": 1})
    assert not os.path.exists(tmp_path / "ck.pt")
