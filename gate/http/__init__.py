"""HTTP plumbing shared by the API (gate/api) and the pages (gate/web): the service context,
the caller's scopes (deps) and the rules every request meets before a route runs (guards).

Below both, so neither imports the other for it; `gate/api/app.py` composes the two."""
