"""The REAL SGLang server on CPU: its environment, a tiny local model, and the flags it needs.

Recipe and measurements: shared/reference/cpu-sglang.md. `env.server_env(version)` builds (once,
cached) what `python -m sglang.launch_server` of a release needs on this machine; `model.tiny_model()`
writes a small Llama with random weights and a locally trained tokenizer (nothing comes from a model
hub); `kvgate.deploy.launch` starts workers with `device="cpu"`. Nothing here imports sglang into kvgate.
"""
