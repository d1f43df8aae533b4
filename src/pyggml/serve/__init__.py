"""``pyggml serve``: an OpenAI-compatible HTTP server with parallel slots (llama.cpp's llama-server).

- :mod:`.engine`: the slots and the one decode per step that serves them all (continuous batching)
- :mod:`.app`: the starlette routes, authentication, server-sent events
- :mod:`.schemas`: pydantic request bodies, :mod:`.oai`: response bodies, :mod:`.errors`: error objects
- :mod:`.metrics`: the Prometheus text of ``/metrics``
"""
