"""fwk: a command-line training launcher for PyTorch."""

__version__ = "0.1.0"
