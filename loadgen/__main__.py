"""``python -m loadgen``."""

from loadgen.cli import main

raise SystemExit(main())
