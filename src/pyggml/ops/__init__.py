"""ggml's ops: enums and builder functions. Builders record nodes; they compute nothing."""
