"""The version of a2a-secure, on a floor of its own so that any module may name it."""

__version__ = "0.1.0"
