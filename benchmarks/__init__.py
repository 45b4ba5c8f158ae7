"""The benchmarks, run as scripts (``python benchmarks/NAME.py``, each
finding its neighbours in its own folder) or as modules (``python -m
benchmarks.NAME``). The models and data they share with the tests live in
tests/support/ (``from tests.support.byte_lm import corpus``), imported
through the checkout on the path."""
