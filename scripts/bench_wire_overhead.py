"""What an update costs on the wire beside its payload, against a dense exchange of the same model.

The quality benchmarks (``bench_quality.py``, ``bench_quality_spark.py``) and a fit's ``bytes_sent``
count the encoded messages, packed as they travel. On the wire each update also carries its header
fields (``origin``, ``seq``, ``iteration``, ``epoch``, and the message's version and sender: varints
of the compact frame, ``psrv.encoding.update_frame``, which in turn drops the payload's own 16-byte
header) and the node's heartbeats share the link. For a small model that fixed cost is a large part
of what a step sends.

This starts a real controller and node on loopback, submits ``--updates`` packed updates per model
size as the shipped default threshold makes them (``psrv.encoding.shared_training_threshold``: 3 % of
the elements, ``--sparsity``, fewer where a message would take over 1 % of a dense update) with ``--gap-ms``
between them (a training step), waits for the controller's acknowledgement, and prints per update:
the payload, the node's ``bytes_out`` (every frame it sent, heartbeats included) and the heartbeats'
share of it, and against a dense update of the model (4 bytes a parameter, what synchronous
averaging sends per worker and step) the payload, the wire and the wire less the heartbeats (which
go once a second, whatever the updates). Model sizes default to those of the quality harness's tasks.

    .venv/bin/python scripts/bench_wire_overhead.py
    .venv/bin/python scripts/bench_wire_overhead.py --params 788,100000 --updates 100 --gap-ms 0
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from psrv.encoding import compact, encode, shared_training_threshold
from psrv.server import Controller, Node
from psrv.transport import TransportConfig

#: the quality harness's models: seq, cnn, mlp, mlp1m (parameters)
TASK_PARAMS = {788: "seq", 9802: "cnn", 13764: "mlp", 1058058: "mlp1m"}
ACK_DEADLINE_S = 30.0


def measure(params: int, sparsity: float, updates: int, gap_s: float, seed: int = 0) -> dict[str, float]:
    """One controller and one node on loopback; the node's bytes out per update against the payload's."""
    config = TransportConfig(network_mask="127.0.0.0/8")
    controller = Controller(config, np.zeros(params, np.float32)).start()
    node = Node(config, np.zeros(params, np.float32), controller.address)
    try:
        node.start()
        rng = np.random.default_rng(seed)
        before = node.counters()
        payload = 0
        threshold = shared_training_threshold(sparsity)  # the default's τ, its byte budget included
        for step in range(updates):
            residual = rng.standard_normal(params).astype(np.float32)
            threshold.prepare(residual)
            tau = threshold.threshold
            message = compact(encode(residual, tau))
            payload += int(message.nbytes)
            node.submit(message, iteration=step, epoch=0, apply_locally=True)
            if gap_s:
                time.sleep(gap_s)
        if not node.wait_acknowledged(ACK_DEADLINE_S):
            raise RuntimeError(f"the controller did not acknowledge {updates} updates within "
                               f"{ACK_DEADLINE_S} s")
        after = node.counters()
        wire = after.get("bytes_out", 0) - before.get("bytes_out", 0)
        beats = after.get("heartbeat_bytes_out", 0) - before.get("heartbeat_bytes_out", 0)
    finally:
        node.stop()
        controller.stop()
    dense = 4 * params
    return {"params": params, "payload": payload / updates, "wire": wire / updates,
            "heartbeats": beats / updates, "payload_ratio": payload / updates / dense,
            "wire_ratio": wire / updates / dense, "updates_ratio": (wire - beats) / updates / dense}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--params", default=",".join(map(str, TASK_PARAMS)),
                        help="comma-separated model sizes (default: the quality harness's four tasks)")
    parser.add_argument("--sparsity", type=float, default=0.03,
                        help="fraction of the elements per update, within the default's byte budget")
    parser.add_argument("--updates", type=int, default=200, help="updates per model size")
    parser.add_argument("--gap-ms", type=float, default=10.0, help="pause between two updates (a step)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (the table shows medians)")
    args = parser.parse_args(argv)
    try:
        sizes = [int(p) for p in args.params.split(",") if p]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 16:
        parser.error(f"--params: expected model sizes of at least 16 parameters, got {args.params!r}")
    if not 0.0 < args.sparsity < 0.25:
        parser.error(f"--sparsity: expected a fraction in (0, 0.25) (a packed sparse update), "
                     f"got {args.sparsity}")
    if args.updates < 1 or args.repeats < 1 or args.gap_ms < 0:
        parser.error("--updates and --repeats must be >= 1 and --gap-ms >= 0")
    print(f"# {args.updates} updates per run, {args.repeats} runs per size, {args.gap_ms:g} ms apart, "
          f"{args.sparsity:g} of the elements; medians")
    print("| model | parameters | payload B / update | wire B / update | of it, heartbeats | payload / dense "
          "| wire / dense | wire less heartbeats / dense |")
    print("|---|---|---|---|---|---|---|---|")
    for params in sizes:
        runs = []
        for repeat in range(args.repeats):
            runs.append(measure(params, args.sparsity, args.updates, args.gap_ms / 1000.0, seed=repeat))
            print(f"# {params} parameters, run {repeat + 1}: {runs[-1]['wire']:.0f} B/update on the wire",
                  file=sys.stderr, flush=True)
        med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"| {TASK_PARAMS.get(params, '-')} | {params:,} | {med['payload']:.0f} | {med['wire']:.0f} | "
              f"{med['heartbeats']:.0f} | {100 * med['payload_ratio']:.2f} % | "
              f"{100 * med['wire_ratio']:.2f} % | {100 * med['updates_ratio']:.2f} % |")


if __name__ == "__main__":
    main()
