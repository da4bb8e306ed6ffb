"""One module per --format, each exposing `FORMAT` (export/job.py); registered in export/registry.py."""
