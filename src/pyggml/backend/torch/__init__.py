"""A second real backend on PyTorch (``pip install pyggml[torch]``): device memory and torch ops.

Its buffers are torch ``uint8`` tensors on a torch device (cpu, cuda or mps) and report
``is_host() == False`` even on torch's cpu device, so the scheduler moves data in and out
through set/get exactly as it would for a GPU. Importing this package needs torch.
"""

from .backend import (
    TorchBackend,
    TorchDevice,
    TorchRegistry,
    backend_is_torch,
    backend_torch_init,
    backend_torch_reg,
)
from .buffer import TorchBuffer, TorchBufferType
from .kernels import SUPPORTED_OPS, supports_op
