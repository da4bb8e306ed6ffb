"""`python -m deepspec <command>`: the `deepspec` console script (deepspec/cli.py)."""

from deepspec.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
