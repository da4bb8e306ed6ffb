"""`python -m export`: take a target and a trained draft to the engine that serves them.

One stage, one verb: every format (export/registry.py) writes an output directory with a manifest.json that says
what was exported from what (target fingerprint, draft, captured layers, files with sha256). The library
(`deepspec`) is only read; nothing here prints except the CLI (export/cli.py). See export/DESIGN.md.
"""
