"""A module for tests/suite/test_served.py to serve: main(argv) prints its
argv, raises on "raise", ends the process on "die"."""
import os
import sys


def main(argv):
    if argv == ["raise"]:
        raise ValueError("asked to raise")
    if argv == ["die"]:
        sys.stdout.flush()
        os._exit(3)
    print(" ".join(argv), os.getpid())
