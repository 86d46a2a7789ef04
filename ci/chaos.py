#!/usr/bin/env python3
"""The chaos run CI starts: `python3 ci/chaos.py --seconds N`. The run itself
is the package ci/chaoslib (see its __init__ for what it does and checks)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaoslib.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
