"""TF32 on the ranks' GPUs, through the switches the installed torch has.

PyTorch 2.9 replaced the `allow_tf32` flags with `fp32_precision` settings ("ieee" or "tf32", per
backend and operation) and deprecates the old flags ("Old settings, e.g,
torch.backends.cuda.matmul.allow_tf32 = True, torch.backends.cudnn.allow_tf32 = True ... will be
deprecated after Pytorch 2.9": its UserWarning; CUDA semantics notes, "TensorFloat-32 (TF32) on
Ampere (and later) devices", https://docs.pytorch.org/docs/2.9/notes/cuda.html). The new settings
are asked first, the flags only on a torch without them, and the two are never mixed.
"""

from __future__ import annotations

from typing import Any


def _has_new_api(torch: Any) -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.backends.cudnn, "conv")


def exact_fp32(torch: Any) -> None:
    """FP32 matmuls and convolutions in full precision: the ranks compare results exactly."""
    if _has_new_api(torch):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def tf32_convolutions(torch: Any) -> None:
    """cuDNN convolutions back to PyTorch's default, TF32 allowed (the scaling benchmark's models)."""
    if _has_new_api(torch):
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cudnn.allow_tf32 = True
