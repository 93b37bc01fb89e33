"""Sim engine: an OpenAI-compatible server that imitates vLLM with a toy model.

It is the engine every other part of the gate is tested against, so it speaks vLLM's wire
format exactly, schedules like a continuous-batching engine (named performance profiles, every
figure a flag) and fails on demand. Run it with ``python -m simengine``; README.md in this
directory lists the flags, profiles, faults and the ground-truth log. A product of its own: it
imports nothing from ``gate`` or ``loadgen`` (tests/test_architecture.py), and the gate starts
it only as a process. Importing this package stays cheap (no numpy); the modules are imported
where used.
"""
