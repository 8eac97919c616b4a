"""Starts the kernel: `python -I -S -B <episode>/kernel_program <config JSON>`.

Run as a folder, this file is a script and the package is not imported yet: the folder's
parent (the episode folder) stands in for the folder on sys.path while `kernel_program`
imports as a package (its modules import each other relatively, all at once), then leaves
it, so the model's code finds on sys.path what it found with the single-file program."""

import os
import sys

if __package__:  # python -m jaxspatial.agents.kernel_program
  from .runtime import main
else:
  sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))
  from kernel_program.runtime import main  # pylint: disable=import-error
  del sys.path[0]

if __name__ == "__main__":
  sys.exit(main(sys.argv))
