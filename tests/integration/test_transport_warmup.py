"""Warm-up: every kernel the I/O thread calls is loaded before a role starts,
so no first decode compiles inside it. Checked in a fresh interpreter (nothing loaded before)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json
import numpy as np
from psrv.encoding import _kernels
from psrv.server import Controller
from psrv.transport import TransportConfig
from psrv.server.warmup import DECODE_KERNELS

before = {name: getattr(_kernels, name).loaded for name in DECODE_KERNELS}
ctrl = Controller(TransportConfig(host="127.0.0.1"), np.zeros(100, np.float32)).start()
after = {name: getattr(_kernels, name).loaded for name in DECODE_KERNELS}
ctrl.stop()
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.timeout(300)
def test_every_decode_kernel_is_loaded_before_the_io_thread_runs() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr
    flags = json.loads(result.stdout.strip().splitlines()[-1])
    assert not any(flags["before"].values()), flags  # the check can fail: nothing was loaded at import
    assert all(flags["after"].values()), flags  # sparse kernels included
