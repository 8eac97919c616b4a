"""`python -m benchmarks.device_suite [...]`: the prepared device benchmark (see the package)."""

from benchmarks.device_suite.cli import main

if __name__ == "__main__":
  main()
