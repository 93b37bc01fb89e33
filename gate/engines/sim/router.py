"""Deprecated: ``python -m gate.engines.sim.router`` runs ``python -m simengine.router``."""

from gate.engines.sim import forward

if __name__ == "__main__":
    forward("gate.engines.sim.router", "simengine.router")
