"""The worker protocol: what travels between DeepSpec's gateway, its workers and the models export writes.

One package, imported by every stage that speaks the protocol (service's gateway and worker, export's Triton
repository, the load tester's gRPC client) and importing nothing else of DeepSpec, so no stage imports another to
reach it and the gateway image needs no engine:

- `triton_contract`: the Triton models' tensor names, datatypes and dims (both TensorRT-LLM dialects), the one table
  of input names and finish reasons. Standard library only: export copies the file next to the LLM-API model.
- `worker`: DeepSpec's worker dialect of that contract: its extra outputs, parameters, error codes and records
  (`RequestStats`, `WorkerLoad`, `Constraint`).
- `tensors`: the KServe v2 tensor codec both ends use (needs tritonclient's protobufs).
- `token_scores`: the scored-token tables the worker writes and the gateway renders logprobs from.
- `protos/deepspec/v1`: the gateway's public gRPC API (`completions.proto`) and its generated stubs
  (`make protos` regenerates them).

Nothing is imported here: `import deepspec_protocol.worker` loads no tritonclient.
"""
