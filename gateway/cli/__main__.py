"""``python -m gateway.cli``: the same entry point as the ``chital`` script."""

from gateway.cli.main import main

raise SystemExit(main())
