"""synthq's version, in a module of its own: every layer may read it, and importing it loads
nothing else (``synthq/__init__`` re-exports it with the Python API)."""

__version__ = "0.2.0"
