"""Entry point: ``python -m gate.engines.sim --port P [flags]``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from gate.engines.sim.config import parse_args
from gate.engines.sim.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
