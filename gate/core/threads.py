"""One BLAS thread per gate process.

The judge's linear algebra is small (bootstrap replicates of a few thousand samples), and a gate
process shares its host with engines, load generators and other gates. OpenBLAS's worker threads
spin while they wait for each other; on a host whose cores are busy they wait for a core, and a
call that takes milliseconds takes seconds: the bootstrap coverage test ran in 0.62 s alone and
65 s beside three busy processes (2 cores, the test at nice 10; docs/performance.md, "BLAS
threads"). One thread costs nothing measurable on an idle host. Only this process's libraries are
limited (threadpoolctl), not the environment: engines the gate launches keep their own threads.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def one_blas_thread() -> None:
    """Limit the BLAS libraries loaded in this process (numpy's, scipy's) to one thread, from now
    on. Idempotent; loads numpy first so that its BLAS is among them."""
    import numpy  # noqa: F401  (its BLAS must be loaded to be limited)

    threadpool_limits(limits=1, user_api="blas")
