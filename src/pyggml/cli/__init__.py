"""The ``pyggml`` command line."""
