"""The run pipeline: one gate run as a state machine of typed stages (runner.py), wherever it
is asked to run (`gate run`, or the service's execution). It knows nothing of the service
(gate/service) that submits, dispatches and reaps gates; it writes only its own rows (rows.py)."""
