"""`python -m phalanx` is the `phalanx` command."""

from phalanx.cli.main import main

raise SystemExit(main())
