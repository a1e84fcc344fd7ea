"""gpudoctor: is this machine ready for multi-GPU PyTorch training, and is the run balanced?"""

__version__ = "0.1.0"
