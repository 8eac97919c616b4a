"""Name -> function tables that recipes extend with a decorator (losses, advantage
estimators): a name is registered once; registering another function under it fails."""

from __future__ import annotations

from typing import Callable


def registrar(table: dict[str, Callable], what: str) -> Callable:
  """The decorator factory `what(name)` that adds a function to `table` under `name`."""
  def register(name: str):
    def add(function):
      if name in table and table[name] is not function:
        raise ValueError(f"{what}: {name!r} is already registered "
                         f"({table[name].__module__}.{table[name].__qualname__})")
      table[name] = function
      return function
    return add
  register.__name__ = register.__qualname__ = what
  return register


__all__ = ["registrar"]
