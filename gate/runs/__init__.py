"""The gate run: its state machine and the service that drives one run end to end."""
