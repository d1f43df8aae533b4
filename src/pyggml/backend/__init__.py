"""ggml-backend: buffer types, buffers, backends, devices and registries (see base.py, api.py)."""
