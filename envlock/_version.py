"""The version of envlock, apart from the package so that any module can quote it without
importing the public API (which would tie every module to every other)."""

__version__ = "0.1.0"
