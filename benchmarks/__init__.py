"""The benchmarks, run as scripts (``python benchmarks/NAME.py``, each
finding its neighbours in its own folder); a package so that tests import
what they share with them (``from benchmarks.lm import corpus``,
``from benchmarks import _harness``) through the checkout on the path."""
