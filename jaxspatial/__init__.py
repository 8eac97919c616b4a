"""jaxspatial: vision-language agents that reason about 3D space by acting in it, in JAX."""

__version__ = "0.1.0"
