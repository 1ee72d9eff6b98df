"""Install and ship psrv like a package, as README's "Running on a cluster" says.

Once per test session: psrv's wheel is built from a copy of the source tree, installed with its ``torch``
extra into a fresh virtual environment (torch from the local disk or pip's cache, the rest from pip's
cache or the package registries), and that environment is packed with venv-pack. The test then runs
README's first-screen example by ``spark-submit --master local-cluster[2,1,1024] --archives
env.tar.gz#environment --conf spark.pyspark.python=./environment/bin/python`` from a folder outside the
source tree, with no PYTHONPATH: the driver runs the fresh environment's Python, the executors the
unpacked archive's (in client mode the driver's Python is named by spark.pyspark.driver.python, since
spark.pyspark.python would name it too). Tasks report where ``psrv`` and ``torch`` came from.

Why not ``--system-site-packages`` for torch: the base interpreter has no torch to share, and an
environment that borrows packages from outside itself is exactly what a packed archive cannot carry to
a cluster; the fresh environment is complete, and the pack leaves out only pyspark's jars (the cluster's
JVM has its own), torch's C++ headers and torch's C++ test programs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
STEP_DEADLINE_S = 600
IGNORED = (".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
           ".ruff_cache", "out", "spark-warehouse", "metastore_db")
# as README's "Running on a cluster": pyspark's jars (the cluster's JVM has its own), torch's C++ headers
# (only for building extensions; 9,000 files) and torch's own C++ test programs stay out of the archive
PACK_EXCLUDES = ("--exclude", "lib/python*/site-packages/pyspark/jars/*",
                 "--exclude", "lib/python*/site-packages/torch/include/*",
                 "--exclude", "lib/python*/site-packages/torch/test/*",
                 "--exclude", "lib/python*/site-packages/torch/bin/test_*",
                 "--exclude", "lib/python*/site-packages/torch/bin/*Test")
# what the executors report from inside a task (appended to README's example)
EPILOGUE = '''

# --- appended by tests/spark/test_packaged.py ---
import json as _json
import os as _os
import sys as _sys


def _where(_):
    import psrv
    import torch
    return {"psrv": psrv.__file__, "version": psrv.__version__, "torch": torch.__file__,
            "prefix": _sys.prefix, "cwd": _os.getcwd()}


_places = spark.sparkContext.parallelize(range(4), 4).map(_where).collect()
_rows = model.transform(df).select("label", "prediction").collect()
_accuracy = sum(int(r.label) == int(r.prediction) for r in _rows) / len(_rows)
with open(_sys.argv[1], "w") as _out:
    _json.dump({"places": _places, "accuracy": _accuracy, "rows": len(_rows),
                "driver_psrv": __import__("psrv").__file__}, _out)
spark.stop()
'''


def _run(command: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=STEP_DEADLINE_S)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {done.returncode}:\n"
                    f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}", pytrace=False)
    return done.stdout


def _outside_env() -> dict[str, str]:
    """The environment of a user's shell: nothing pointing into the source tree or the tests' venv."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON",
               "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    tests_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != tests_bin)
    return env


def readme_example() -> str:
    """The first python block after README's ``example: first-screen`` marker."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- example: first-screen.*?-->\s*```python\n(.*?)```", text, re.S)
    assert found, "README.md: no ```python block after <!-- example: first-screen -->"
    return found.group(1)


@pytest.fixture(scope="session")
def packed_environment(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """psrv's wheel installed with torch into a fresh venv, packed by venv-pack (built once per session)."""
    work = tmp_path_factory.mktemp("packaged")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*IGNORED))
    env = _outside_env()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", source],
         cwd=work, env=env)
    wheels = sorted((work / "dist").glob("psrv-*.whl"))
    assert len(wheels) == 1, wheels
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=work, env=env)
    # the torch the tests run with (pip's cache or the local CPU wheel), never a different build
    torch_pin = f"torch=={metadata.version('torch')}"
    # --no-compile: byte-compiling torch (and the rest) took two thirds of the install (83 s against 26 s);
    # the driver and executors compile only what they import, once, into the unpacked environment
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile",
          f"{wheels[0]}[torch,parquet,cluster]", torch_pin], cwd=work, env=env)
    archive = work / "psrv-env.tar.gz"
    venv_pack = venv / "bin" / "venv-pack"  # README's recipe: the environment's own (the `cluster` extra)
    _run([venv_pack, "-p", venv, "-o", archive, "--compress-level", "1", "-q", *PACK_EXCLUDES],
         cwd=work, env=env)
    try:
        yield {"wheel": wheels[0], "venv": venv, "archive": archive}
    finally:
        # about 2 GB in 50,000 files with local-cluster's work folder (the archive unpacked per executor):
        # removed by a detached rm, which took minutes in the foreground on a busy disk
        subprocess.Popen(["rm", "-rf", str(work)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)


def test_readme_packs_what_this_test_packs() -> None:
    """README's venv-pack line leaves out exactly what the archive tested here leaves out."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"psrv-env/bin/venv-pack -p psrv-env -o psrv-env.tar.gz((?:.|\\\n)*?)\n(?!\s*--)",
                     readme)
    assert line is not None, "README's venv-pack command is gone"
    named = re.findall(r"--exclude '([^']+)'", line.group(1))
    assert named == list(PACK_EXCLUDES[1::2])


def test_wheel_in_a_packed_environment_runs_the_readme_example_on_local_cluster(packed_environment,
                                                                                tmp_path) -> None:
    """The executors import psrv and torch from the unpacked archive only; README's example trains."""
    venv, archive = packed_environment["venv"], packed_environment["archive"]
    assert not tmp_path.resolve().is_relative_to(ROOT)
    script = tmp_path / "train.py"
    example = readme_example()
    assert example.endswith("spark.stop()\n")  # the checks below run before the session stops
    script.write_text(example[:-len("spark.stop()\n")] + EPILOGUE)
    results = tmp_path / "results.json"
    kernel_cache = tmp_path / "numba-cache"
    env = _outside_env()
    # as after `source venv/bin/activate` (spark-submit finds its SPARK_HOME through python3 on PATH)
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv),
               SPARK_LOCAL_IP="127.0.0.1", PSRV_NUMBA_CACHE_DIR=str(kernel_cache))
    _run([venv / "bin" / "spark-submit", "--master", "local-cluster[2,1,1024]",
          "--archives", f"{archive}#environment",
          "--conf", "spark.pyspark.python=./environment/bin/python",
          "--conf", f"spark.pyspark.driver.python={venv / 'bin' / 'python'}",  # client mode: the driver here
          "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
          "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
          "--conf", "spark.driver.memory=1g", "--conf", "spark.executor.memory=1g",
          "--conf", f"spark.executorEnv.PSRV_NUMBA_CACHE_DIR={kernel_cache}",
          script, results], cwd=tmp_path, env=env)
    report = json.loads(results.read_text())

    version = packed_environment["wheel"].name.split("-")[1]
    assert Path(report["driver_psrv"]).resolve().is_relative_to(venv.resolve())
    assert report["places"], "no task reported"
    for place in report["places"]:
        prefix = Path(place["prefix"]).resolve()
        # the archive, unpacked by Spark into this executor's own folder (local-cluster keeps executor
        # folders under SPARK_HOME/work, here inside the venv's pyspark: a different tree from the venv's)
        assert prefix.name == "environment" and prefix.parent == Path(place["cwd"]).resolve(), place
        assert prefix != venv.resolve() and not prefix.is_relative_to(ROOT), place
        for module in ("psrv", "torch"):
            location = Path(place[module]).resolve()
            assert location.is_relative_to(prefix), place
            assert not location.is_relative_to(ROOT), place
        assert place["version"] == version
    assert report["rows"] == 2000
    # the driver's venv and each executor's unpacked copy file psrv's kernels in one content-keyed folder
    folders = sorted(p.name for p in kernel_cache.iterdir())
    assert len(folders) == 1 and folders[0].startswith("psrv-encoding_"), folders
    assert report["accuracy"] > 0.8  # the two classes are linearly separable; chance is about 0.5
