"""The absl entry point of `experiments/main.py` and the `primal-train` console script.

Flags are defined inside `run()`, not at import, so importing the library never
touches absl's global flag registry.

A mistake on the command line or in what it names (a config, a field, a value, a
data file, the workdir) ends in one line on stderr naming the argument and what
it accepts, with exit status 2. The resolved config (overrides applied) passes one
validation pass (`primal_jax.training.config_schema.check_config`) before the
workdir is created, so a bad value leaves no run behind. The flags parser's errors and every
`primal_jax.errors.ConfigError` are caught here, at the boundary, and nowhere
else. `--debug` prints the traceback above that line. Any other exception is a
bug and keeps its traceback.
"""

from __future__ import annotations

import re
import sys
import tempfile
import traceback
from pathlib import Path

from primal_jax.errors import ConfigError

EXIT_USAGE = 2  # a user error, as argparse and absl use it
HELP_ARGS = frozenset({"--help", "-help", "-h", "--helpshort", "-helpshort", "-?"})
OWN_FLAGS = ("config", "workdir", "allocator", "list_configs", "debug")
USAGE = """\
usage: {prog} --config=CONFIG[:ARGS] --workdir=DIR [--config.FIELD=VALUE ...] [--debug]
       {prog} --list_configs

Train and evaluate one config in DIR (created if missing); run the same command again to resume.
Also run as `primal-train` or `python -m experiments.main`.

Naming a config:
  --config=uea                          a packaged config, by name ({names})
  --config=uea:smoke,model=softmax      with arguments after the colon (each config's docstring lists them)
  --config=path/to/my_config.py[:ARGS]  any Python file that defines get_config(arg)
  --config.optimizer.learning_rate=3e-4 then override any field of it (after --config)

Flags:
{flags}
  --helpfull: every flag, absl's included."""


def _program(argv0: str) -> str:
  return "primal-train" if Path(argv0).name == "primal-train" else "python -m experiments.main"


def _wants_debug(args: list[str]) -> bool:
  """--debug read before parsing, so that an error while parsing can show its traceback too."""
  setting = False
  for arg in args:
    if arg in ("--debug", "-debug", "--debug=true", "--debug=1"):
      setting = True
    elif arg in ("--nodebug", "-nodebug", "--debug=false", "--debug=0"):
      setting = False
  return setting


def _fail(prog: str, message: str, debug: bool) -> None:
  """One line on stderr, exit status 2; with --debug the traceback of the exception being handled first."""
  if debug and sys.exc_info()[0] is not None:
    traceback.print_exc()
  line = " ".join(str(message).split())  # one line, whatever the message held
  sys.stderr.write(f"{prog}: error: {line}\n")
  sys.exit(EXIT_USAGE)


def _describe_flag_error(err: Exception, loaded) -> str:
  """absl's message, plus the type and default of a `--config.FIELD=VALUE` that did not parse, or the fields
  there are when FIELD does not exist."""
  message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)  # KeyError quotes its text
  message = message.replace("\\n", " ").removeprefix("flag ")
  bad_value = re.match(r"--config\.([\w.]+)=", message)
  if bad_value and loaded is not None:
    value = _field(loaded, bad_value.group(1))
    if value is not _ABSENT:
      return f"{message}; --config.{bad_value.group(1)} takes a {type(value).__name__} (default {value!r})"
  if re.match(r"Unknown command line flag", message):
    return f"{message}; {', '.join('--' + name for name in OWN_FLAGS)} and --config.FIELD=VALUE are accepted (--help)"
  return message


_ABSENT = object()


def _field(config, dotted: str):
  node = config
  for part in dotted.split("."):
    if not hasattr(node, "keys") or part not in node:
      return _ABSENT
    node = node[part]
  return node


def _unknown_override(config, args: list[str]) -> str | None:
  """The message for the first `--config.FIELD=...` whose FIELD the loaded config lacks, naming what it has."""
  for arg in args:
    match = re.match(r"-{1,2}(?:no)?config\.([\w.]+)", arg)
    if not match:
      continue
    node, path = config, []
    for part in match.group(1).split("."):
      if not hasattr(node, "keys"):
        return f"--config.{match.group(1)}: {'.'.join(path)} is a {type(node).__name__}, it has no fields"
      if part not in node:
        where = ".".join(path) or "the config"
        return f"--config.{match.group(1)}: {where} has no field {part!r}; its fields: {', '.join(sorted(node))}"
      node, path = node[part], [*path, part]
  return None


def _check_workdir(workdir: str) -> Path:
  """Creates `workdir` and writes a file in it now, so that a wrong path fails in one line before any data or
  model is built, not in the middle of the first checkpoint."""
  path = Path(workdir).expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as err:
    raise ConfigError(
      f"--workdir={workdir}: cannot write there ({err.strerror or err}); pass a writable directory"
    ) from err
  return path


def _usage(prog: str) -> str:
  from absl import flags

  from primal_jax.cli.config_lookup import list_configs

  lines = []
  for name in OWN_FLAGS:
    flag = flags.FLAGS[name]
    default = "" if flag.default in (None, False) else f" (default {flag.default!r})"
    lines.append(f"  --{name}: {flag.help}{default}")
  return USAGE.format(prog=prog, names=", ".join(list_configs()), flags="\n".join(lines))


def define_config_flag(help_text: str, flag_values=None, sys_argv: list[str] | None = None):
  """Defines absl's `--config` (with `--config.FIELD=VALUE` overrides) resolved by name or path through
  `config_lookup.load_config`; returns (the flag holder, the parser class, whose `loaded` is the last config).

  The stock parser only reads files, turns a config's error into a traceback inside the message and defers a
  missing file's OSError; every binary that takes a config uses this one (`experiments/pretrained_run.py` too).
  `flag_values` (default: absl's global FLAGS) and `sys_argv` (the arguments whose `--config.FIELD` overrides
  are defined; default sys.argv) let a caller parse a command line of its own (`parse_command_line`).
  """
  from absl import flags
  from ml_collections import config_flags

  from primal_jax.cli import config_lookup

  flag_values = flags.FLAGS if flag_values is None else flag_values

  class ConfigLookupParser(flags.ArgumentParser):
    loaded = None

    def parse(self, argument):
      ConfigLookupParser.loaded = config_lookup.load_config(argument, lock=True)
      return ConfigLookupParser.loaded

    def flag_type(self):
      return "config object"

  holder = config_flags.DEFINE_config_file(
    "config", None, help_text, flag_values=flag_values, lock_config=True, sys_argv=sys_argv
  )
  flag_values["config"].parser = ConfigLookupParser()
  return holder, ConfigLookupParser


def define_flags(flag_values=None, sys_argv: list[str] | None = None):
  """The binary's own flags (`OWN_FLAGS`) on `flag_values` (default: absl's global FLAGS); returns their holders
  (config, workdir, allocator, list_configs) and the config parser class (`define_config_flag`)."""
  from absl import flags

  from primal_jax.launch import host_allocator

  flag_values = flags.FLAGS if flag_values is None else flag_values
  config_flag, parser_class = define_config_flag(
    "a packaged config's name or a config file, with optional ':ARGS' (uea:smoke)", flag_values, sys_argv
  )
  on = {"flag_values": flag_values}
  workdir_flag = flags.DEFINE_string("workdir", None, "directory for checkpoints, metrics and config.json", **on)
  allocator_flag = flags.DEFINE_enum(
    "allocator", "auto", list(host_allocator.CHOICES),
    "host malloc (CPU runs): auto = tcmalloc where installed, else glibc's; tcmalloc or jemalloc re-execute "
    "the command with that library preloaded (an error if it is missing); system = as the process started", **on,
  )  # fmt: skip
  list_flag = flags.DEFINE_bool("list_configs", False, "print the packaged configs, one a line, and exit", **on)
  flags.DEFINE_bool("debug", False, "print the traceback above a one-line error", **on)
  return (config_flag, workdir_flag, allocator_flag, list_flag), parser_class


def parse_command_line(argv: list[str]):
  """Parses `argv` (argv[0] the program) as the binary does, on flags of its own (absl's global FLAGS are left
  alone), and trains nothing: returns (the config, the workdir). A mistake raises what `run` reports in one line
  (`flags.Error`, `ConfigError`, or ml_collections' AttributeError / KeyError / TypeError / ValueError); a
  `--config.FIELD` the config lacks is a ConfigError naming the fields it has. Used by tests/test_records.py to
  check that every recorded command is still a command of this binary."""
  from absl import flags

  argv = list(argv)
  values = flags.FlagValues()
  (config_flag, workdir_flag, _, _), parser_class = define_flags(values, sys_argv=argv)
  try:
    values(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as err:
    unknown = _unknown_override(parser_class.loaded, argv[1:]) if parser_class.loaded is not None else None
    if unknown:
      raise ConfigError(unknown) from err
    raise
  return config_flag.value, workdir_flag.value


def run(argv: list[str] | None = None) -> None:
  """Parse `--config=NAME|FILE[:arg]`, `--config.x=y` overrides and `--workdir`, then train."""
  from absl import app, flags, logging

  from primal_jax.cli import config_lookup
  from primal_jax.launch import host_allocator
  from primal_jax.training.config_schema import check_config
  from primal_jax.training.loop import train_and_evaluate

  (config_flag, workdir_flag, allocator_flag, list_flag), ConfigLookupParser = define_flags()

  from_command_line = argv is None
  argv = list(sys.argv if argv is None else argv)
  prog, debug = _program(argv[0]), _wants_debug(argv[1:])
  if HELP_ARGS.intersection(argv[1:]):  # before parsing: help works whatever else the command line holds
    print(_usage(prog))
    sys.exit(0)
  app.define_help_flags()  # --helpfull, --helpxml
  try:  # a bad --config.x=y raises AttributeError/KeyError/TypeError inside ml_collections, not a flags.Error
    remaining = flags.FLAGS(argv)
  except (flags.Error, ConfigError, AttributeError, KeyError, TypeError, ValueError) as err:
    loaded = ConfigLookupParser.loaded
    unknown = _unknown_override(loaded, argv[1:]) if loaded is not None else None
    _fail(prog, unknown or _describe_flag_error(err, loaded), debug)

  def main(args: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO; -v 0 brings it back
    try:
      if list_flag.value:
        for name, summary in config_lookup.list_configs().items():
          print(f"{name:6s} {summary}")
        return
      if len(args) > 1:
        raise ConfigError(f"unexpected positional arguments {args[1:]}; every argument is a --flag (--help)")
      if config_flag.value is None:
        names = ", ".join(config_lookup.list_configs())
        raise ConfigError(f"--config is required: a packaged config ({names}) or a config file (--help)")
      if not workdir_flag.value:
        raise ConfigError("--workdir is required: the directory for checkpoints and metrics (created if missing)")
      check_config(config_flag.value)  # every section, before the workdir is created or anything written in it
      allocator = allocator_flag.value
      if not from_command_line and allocator not in ("auto", "system", host_allocator.loaded_allocator()):
        raise ConfigError(f"--allocator={allocator} needs a fresh process (run(argv) cannot re-execute)")
      try:  # re-executes the command unless nothing has to change; run(argv) keeps what is loaded
        host_allocator.ensure_allocator(allocator if from_command_line else "system")
      except ValueError as err:
        raise ConfigError(f"--allocator={allocator}: {err}") from err
      workdir = _check_workdir(workdir_flag.value)
      summary = train_and_evaluate(config_flag.value, workdir)
    except ConfigError as err:
      _fail(prog, str(err), debug)
    if summary.get("preempted"):
      sys.exit(143)  # 128 + SIGTERM: the state was saved; rerunning resumes

  app.run(main, argv=argv, flags_parser=lambda _: remaining)  # parsed once: overrides define flags


if __name__ == "__main__":  # `python -m primal_jax.cli.train`: the sweep runner's child processes
  run()
