"""tensor-runner: one declarative config -> a timed, tracked run on numpy, torch, tensorflow, tnp or jax."""

from functools import cache


@cache
def version() -> str:
    """The installed tensor-runner's version (pyproject.toml's, through the package metadata), 'unknown' where
    the package is not installed (run.py from a bare checkout). Looked up on first use, not at import."""
    from importlib import metadata

    try:
        return metadata.version("tensor-runner")
    except metadata.PackageNotFoundError:
        return "unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return version()
    raise AttributeError(f"module 'runner' has no attribute {name!r}")
