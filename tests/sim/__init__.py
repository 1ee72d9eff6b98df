"""The deterministic simulation of the parameter-server roles: see README, "Simulation"."""
