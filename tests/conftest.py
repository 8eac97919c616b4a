"""Test defaults: float32 everywhere, CPU, no 64-bit mode."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
