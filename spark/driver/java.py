"""Is there a Java for Spark? One clear line before Spark's own trace when there is none."""

from __future__ import annotations

import os
import shutil


def java_problem() -> str | None:
    """None when Spark will find Java (``JAVA_HOME`` or ``java`` on PATH), else what to fix."""
    home = os.environ.get("JAVA_HOME", "").strip()
    if home:
        java = os.path.join(home, "bin", "java")
        if os.path.isfile(java) and os.access(java, os.X_OK):
            return None
        return (f"JAVA_HOME={home!r} holds no bin/java: Spark needs Java 17 or 21; point JAVA_HOME at a "
                "JDK (e.g. /usr/lib/jvm/java-17-openjdk-amd64) or unset it to use java on PATH")
    if shutil.which("java"):
        return None
    return ("Java not found (no JAVA_HOME, no java on PATH): Spark needs Java 17 or 21; install a JDK "
            "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME")


__all__ = ["java_problem"]
