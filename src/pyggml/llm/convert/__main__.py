"""``python -m pyggml.llm.convert MODEL_DIR -o OUT.gguf --outtype q8_0``."""

import sys

from .hf_to_gguf import main

sys.exit(main())
