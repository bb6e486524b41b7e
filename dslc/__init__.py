"""dslc: a compiler for parallel training plans."""

__version__ = "0.1.0"
