"""psrv.spark: training masters, SparkNetwork, data pipelines, distributed evaluation and inference, stats."""
