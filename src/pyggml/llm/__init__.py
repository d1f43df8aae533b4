"""The llama.cpp-style runner on top of pyggml: vocabularies, tokenizers and (later) model graphs.

Everything here reads its configuration from GGUF metadata the way llama.cpp's ``src/llama-*``
files do, so that a model file behaves the same in pyggml as under llama.cpp.
"""
