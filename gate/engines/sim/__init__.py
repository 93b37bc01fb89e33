"""Sim engine: an OpenAI-compatible server that imitates vLLM with a toy model.

It is the engine every other part of the gate is tested against, so it speaks vLLM's wire
format exactly and its timing is configurable. Run it with ``python -m gate.engines.sim``.
Importing this package stays cheap (no numpy); the modules are imported where used.
"""
