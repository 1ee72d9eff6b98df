"""The code base stays ruff clean: a lint error fails the suite, as CI runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    result = subprocess.run(
        [ruff, "check", "--no-cache", str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_psrv_installed_each_folder_mapped() -> None:
    """The editable install maps the top-level package to top/ and each subpackage to its own folder."""
    import psrv
    import psrv.encoding
    import psrv.server.cli

    assert psrv.encoding.__name__ == "psrv.encoding"
    assert Path(psrv.__file__).resolve().parent == ROOT / "top"
    assert Path(psrv.server.cli.__file__).resolve().parent == ROOT / "server" / "cli"
