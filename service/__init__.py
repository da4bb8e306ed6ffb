"""The inference service: KServe v2 worker, OpenAI-compatible HTTP + gRPC gateway, embedded default (see DESIGN.md)."""
