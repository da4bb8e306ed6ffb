"""`python -m loadtest`: load-test an OpenAI-compatible HTTP server or DeepSpec's gRPC API.

Imports nothing of DeepSpec but the public gRPC stubs (`deepspec_protocol.protos.deepspec.v1`), so it can be pointed
at any OpenAI-compatible server (DeepSpec, vLLM, SGLang, ...). Run `python -m loadtest --help` for the runbook.
"""
