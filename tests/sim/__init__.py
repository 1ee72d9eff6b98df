"""The deterministic simulation of the parameter-server roles (issue 10): see README, "Simulation"."""
