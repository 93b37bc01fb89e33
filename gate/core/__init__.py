"""Shared infrastructure: settings, database, errors, logging."""
