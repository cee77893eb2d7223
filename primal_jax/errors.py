"""The one exception type for a mistake in what the user asked for, not in the code.

A training run fails for two kinds of reasons: a setting, a file or a directory the user chose cannot work
(an unknown dataset, a learning rate of NaN, a `.ts` file with a syntax error, a workdir that cannot be
written), or the code itself is wrong. The first kind deserves one line saying which argument is wrong and
what it accepts; the second deserves the whole traceback. Library code raises `ConfigError` for the first
kind so that the command-line binaries (`primal-train`, `python -m primal_jax.convert`) can tell them apart:
they print a `ConfigError` as one line and exit with status 2 (`--debug` shows the traceback), and let every
other exception through.

`ConfigError` is a `ValueError`, so code that already catches `ValueError` keeps working; `MissingFileError`,
its one subclass, is also a `FileNotFoundError` for the same reason.
"""

from __future__ import annotations


class ConfigError(ValueError):
  """A config value, a file it names or a command-line argument cannot work; the message names it and what is
  accepted, on one line."""


class MissingFileError(ConfigError, FileNotFoundError):
  """A file or directory that a setting names does not exist; the message names the setting and the path."""
