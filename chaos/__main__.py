"""`python -m chaos` (see chaos/cli.py)."""

import sys

from chaos.cli import main

sys.exit(main())
