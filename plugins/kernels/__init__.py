"""OpenAI Triton kernels of the ops (CUDA; TRITON_INTERPRET=1 runs them on CPU for tests). `launch` holds the
launchers torch.ops.deepspec.* calls on CUDA; `plugins.aot` compiles the same kernels ahead of time."""
