"""The whole stack in real containers: `make e2e` (tests/e2e/README.md)."""
