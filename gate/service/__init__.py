"""The gate service: gates as a caller of the API, a CI system or a rollout controller sees
them, and the machinery that runs them (dispatch, execution, reapers, callbacks).

    schemas.py           what the service answers (the polled verdict summary, the callback)
    repository.py        its queries, over an open session
    service.py           its rules: submit (idempotency, quotas), cancel, claim, reap, summarise
    admission.py         a caller's request -> a spec, within what the operator allowed
    engine_templates.py  the engines a caller may ask for, as the operator wrote them
    dispatch.py          where gates run (threads here, or `gate worker` processes)
    execution.py         one stored gate, claimed and run to its end by the pipeline
    reaper.py            lost and stuck gates, owed callbacks, cluster sweeps
    notify.py            commit-status callbacks, delivered at least once
    process_marks.py     a process's mark, so that its successor can prove it dead
    rejudge.py           a finished gate's stored samples judged again
    sweep.py             the Kubernetes objects of lost gates

The run pipeline itself is gate/runs; it never imports this package.
"""
