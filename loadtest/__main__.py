"""`python -m loadtest` — see loadtest/cli.py (or `--help`) for the runbook."""

from loadtest.cli import main

raise SystemExit(main())
