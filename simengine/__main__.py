"""Entry point: ``python -m simengine --port P [flags]``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from simengine.cli import parse_args
from simengine.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
