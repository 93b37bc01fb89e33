"""Deprecated: ``python -m gate.engines.sim`` runs ``python -m simengine``."""

from gate.engines.sim import forward

if __name__ == "__main__":
    forward("gate.engines.sim", "simengine")
