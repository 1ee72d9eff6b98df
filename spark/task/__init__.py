"""What runs inside a Spark task: the per-executor network, device choice, prefetching."""
