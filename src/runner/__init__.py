"""tensor-runner: one declarative config -> a timed, tracked run on torch, tensorflow, numpy or tnp."""

__version__ = "0.1.0"
