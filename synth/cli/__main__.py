"""``python -m synth.cli``: the command line."""

import sys

from . import console

sys.exit(console())
