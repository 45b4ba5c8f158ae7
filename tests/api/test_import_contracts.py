"""The layers of docs/architecture.md hold: import-linter (.importlinter)
finds no import, function-level ones included, from a lower layer into a
higher one, nor between the three engines (torch_xla's autocast/,
privateuse1/, torchax/)."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_no_lower_layer_imports_a_higher_one_and_no_engine_another():
    linter = pathlib.Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(linter), "--no-cache", str(ROOT / ".importlinter")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in proc.stdout, proc.stdout[-2000:]


def test_the_layers_name_every_subpackage():
    """A new folder of xla_amp joins a layer (or the check would not see it)."""
    text = (ROOT / ".importlinter").read_text()
    folders = sorted(p.parent.name for p in (ROOT / "xla_amp").glob("*/__init__.py"))
    missing = [f for f in folders if f"xla_amp.{f}" not in text]
    assert not missing, missing
