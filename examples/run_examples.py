"""Run several examples in one Spark session (one application start instead of one per example): what
the test suite submits, and a quick way to try them all.

    spark-submit --master local-cluster[2,1,1024] examples/run_examples.py --work /tmp/ex --json results.json
    python examples/run_examples.py csv_records sequences      # local[2], two of them

Each example runs with its own defaults (and ``--work <work>/<name>``); ``--json`` collects every
example's result under its name. The example modules travel to the executors with ``sc.addPyFile``
(their torch modules are classes of those modules, imported there by name).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import spark_session  # noqa: E402

EXAMPLES = ("lenet_images", "csv_records", "sequences", "nn_vs_torch")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"examples to run (default all: {', '.join(EXAMPLES)})")
    p.add_argument("--work", default=None, help="folder for their data and outputs (default: temporary)")
    p.add_argument("--json", default=None, help="write every example's result to this file")
    args = p.parse_args(argv)
    unknown = sorted(set(args.names) - set(EXAMPLES))
    if unknown:
        p.error(f"unknown example(s) {', '.join(unknown)}: expected some of {', '.join(EXAMPLES)}")
    work = args.work or tempfile.mkdtemp(prefix="psrv-examples-")
    spark = spark_session("psrv-examples")
    for name in ("common", *EXAMPLES):
        spark.sparkContext.addPyFile(os.path.join(HERE, f"{name}.py"))
    results = {}
    for name in args.names or EXAMPLES:
        module = importlib.import_module(name)
        options = module.arguments(["--work", os.path.join(work, name)])
        os.makedirs(options.work, exist_ok=True)
        results[name] = module.run(spark, options)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
