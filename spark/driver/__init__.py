"""What runs on the Spark driver: masters, SparkNetwork, epochs, the live controller, preflight checks."""
