"""``python -m psrv.server.cli``: the `psrv` command without its console script."""

from __future__ import annotations

import sys

from psrv.server.cli import main

sys.exit(main())
