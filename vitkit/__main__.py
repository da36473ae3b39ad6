"""`python -m vitkit` is the `vitkit` command (also what torchrun launches)."""

import sys

from vitkit.cli import main

sys.exit(main())
