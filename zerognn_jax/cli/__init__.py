"""The `zerognn` command line: `train`, `data info`, `data generate`, `bench`, `export`,
`predict`."""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.metadata
import sys
import warnings

import zerognn_jax
from zerognn_jax._src.training.config import OTHER_NAMES
from zerognn_jax.cli.bench import add_bench_command
from zerognn_jax.cli.data import add_data_commands
from zerognn_jax.cli.export import add_export_command
from zerognn_jax.cli.flags import (
    flag_names,
    given_names,
    glue_negative_lists,
    spelled_as_flags,
    use_compile_cache_flag,
)
from zerognn_jax.cli.predict import add_predict_command
from zerognn_jax.cli.train import add_train_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerognn", description=__doc__, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=_versions())
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{train,data,bench,export,predict}")
    add_train_command(sub)
    add_data_commands(sub)
    add_bench_command(sub)
    add_export_command(sub)
    add_predict_command(sub)
    return parser


def _versions() -> str:
    """This package's version and the installed versions of the JAX, Flax and optax it
    runs on, for a bug report."""
    found = []
    for name in ("jax", "jaxlib", "flax", "optax"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"zerognn-jax {zerognn_jax.__version__} ({', '.join(found)})"


def main(argv=None) -> int:
    """Runs a command; every failure a user can cause ends in one line on stderr.

    Exit codes: 0 done; 1 training diverged, a file could not be written or the device
    ran out of memory; 2 bad arguments or data; 128 + N stopped by signal N (130 SIGINT,
    143 SIGTERM, 129 SIGHUP).
    """
    from zerognn_jax._src.training.interrupts import Interrupted
    from zerognn_jax._src.training.trainer import Diverged

    parser = build_parser()
    given = glue_negative_lists(parser, sys.argv[1:] if argv is None else list(argv))
    top = {o for a in parser._actions for o in a.option_strings}  # --help, --version
    if given and given[0].startswith("-") and given[0].split("=", 1)[0] not in top:
        # argparse would say only that a command is required
        hint = _meant({o: o for o in top if o.startswith("--")}, given[:1],
                      _elsewhere(parser, parser))
        parser.error(f"unrecognized arguments: {given[0]}{hint}; the command comes first: "
                     f"zerognn {{train,data,bench,export,predict}} ...")
    args, unknown = parser.parse_known_args(given)
    if unknown:  # as parse_args would refuse them, with the flags they may have meant
        leaf = _leaf(parser, args)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}"
                     f"{_meant(flag_names(leaf), unknown, _elsewhere(parser, leaf))}")
    fail = functools.partial(_fail, flags=_message_flags(parser, args.command, given),
                             exiting=argv is None)
    previous = warnings.formatwarning  # (put back: a process may call main more than once)
    warnings.formatwarning = functools.partial(_format_warning, flags=fail.keywords["flags"])
    try:
        use_compile_cache_flag(args)
        code = args.handler(args)
    except (ValueError, FileNotFoundError) as err:
        code = fail(err, f"error: {err}", 2)
    except ImportError as err:
        if "pip install" not in str(err):  # a broken install, not an option's extra
            raise
        code = fail(err, f"error: {err}", 2)  # it says what to install
    except (Diverged, OSError) as err:
        code = fail(err, f"error: {err}", 1)
    except Interrupted as err:
        code = fail(err, str(err), err.exit_code, "; run the same command again to resume")
    except KeyboardInterrupt as err:
        code = fail(err, "interrupted", 130)
    except MemoryError as err:  # the host's; a copy the library names says what it was
        said = _first_line(err)
        code = fail(err, f"error: {said}" if said.startswith("host memory") else
                    f"error: host memory ran out ({said})", 1)
    except Exception as err:
        from zerognn_jax._src.training.memory import is_out_of_memory

        if not is_out_of_memory(err):
            raise
        code = fail(err, f"error: the device ran out of memory ({_first_line(err)}); give "
                    f"it less to hold: {LESS_TO_HOLD[args.command]}", 1)
    finally:
        warnings.formatwarning = previous
    if argv is None:  # the command's process, about to exit
        _quiet_checkpoints()
    return code


# What each command can be given to use less device memory.
LESS_TO_HOLD = {
    "train": "a smaller --batch-size, --hidden or --embedding-dim, --dtype bfloat16, or the "
             "feature table in host memory (--feature-placement host)",
    "bench": "a smaller --batch-size or --hidden, or the feature table in host memory "
             "(--feature-placement host)",
    "data": "a smaller --scale",
    "export": "a smaller --batch-size",
    "predict": "a smaller --batch-size, or --mode sampled (exact inference holds every "
               "node's rows)",
}


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0][:300]


def _command(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of subcommand `command`."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


def _leaf(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The parser of the subcommand `args` ran (`data info`'s, not `data`'s)."""
    while True:
        below = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not below:
            return parser
        parser = below[0].choices[getattr(args, below[0].dest)]


def _elsewhere(parser: argparse.ArgumentParser, leaf: argparse.ArgumentParser,
               path: str = "zerognn") -> dict[str, list[str]]:
    """{flag: the commands that have it} for the flags of the commands other than
    `leaf`."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for flag, where in _elsewhere(sub, leaf, f"{path} {name}").items():
                    found.setdefault(flag, []).extend(where)
        elif parser is not leaf:
            for flag in action.option_strings:
                if flag.startswith("--") and path not in found.get(flag, []):
                    found.setdefault(flag, []).append(path)
    return found


def _message_flags(parser: argparse.ArgumentParser, command: str, argv) -> tuple:
    """What `spelled_as_flags` needs to name options as `command` spells them: its flags
    and the ones `argv` gave (read by `command`'s parser: another command may spell a
    flag of the same name for something else)."""
    own = _command(parser, command)
    return flag_names(own), given_names(own, argv)


def _meant(flags: dict[str, str | None], unknown, elsewhere=None) -> str:
    """" (--x: did you mean --y?; ...)" for the unknown flags that name one of `flags`
    as another library does (`OTHER_NAMES`: --learning-rate for --lr) or by a close
    spelling (--hiden), or that other commands have (`elsewhere`: {flag: commands}),
    else ""."""
    known = [flag for flag in flags.values() if flag]
    hints = []
    for token in unknown:
        if not token.startswith("--"):
            continue
        given = token.split("=", 1)[0]
        other = flags.get(OTHER_NAMES.get(given[2:].replace("-", "_")))
        close = [other] if other else difflib.get_close_matches(given, known, n=2, cutoff=0.8)
        if close:
            hints.append(f"{given}: did you mean {' or '.join(close)}?")
        elif given in (elsewhere or {}):
            where = [f"`{command}`" for command in elsewhere[given]]
            listed = " and ".join([", ".join(where[:-1]), where[-1]] if where[1:] else where)
            hints.append(f"{given} is an option of {listed}")
    return f" ({'; '.join(hints)})" if hints else ""


def _fail(err: BaseException, message: str, code: int, hint: str = "", *,
          flags=({}, ()), exiting: bool = False) -> int:
    """Prints `zerognn: message`, with `err`'s notes and then `hint` if it has any, on one
    line of stderr (written at once: another thread's output cannot split it), the
    options it names spelled as `flags` (`_message_flags`) spell them; returns `code`.
    `exiting`: the process ends after it, so a failed checkpoint read's leftovers are
    silenced first (they may come while the line is written)."""
    if exiting:
        _quiet_checkpoints()
    notes = [n for n in getattr(err, "__notes__", [])
             if "JAX_TRACEBACK_FILTERING" not in n]  # JAX's word on its own traceback
    line = "; ".join([message, *notes]) + (hint if notes else "")
    sys.stderr.write(f"zerognn: {spelled_as_flags(line, *flags)}\n")
    sys.stderr.flush()
    return code


def _quiet_checkpoints() -> None:
    """Silences the leftovers of orbax's reads for the rest of the process, where a
    checkpoint was read (`checkpoint.quiet_until_exit`; once)."""
    checkpoints = sys.modules.get("zerognn_jax._src.training.checkpoint")
    if checkpoints is not None:
        checkpoints.quiet_until_exit()


_default_format = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None, *,
                    flags=({}, ())) -> str:
    """The library's own warnings as `zerognn: warning: ...` (options spelled as their
    flags), and JAX's on the compile cache folder (an entry it could not read or write:
    the program is compiled instead), others as usual."""
    if category.__module__.startswith("zerognn_jax"):
        return f"zerognn: warning: {spelled_as_flags(str(message), *flags)}\n"
    if "persistent compilation cache" in str(message):
        return f"zerognn: warning: {_first_line(message)} (--compile-cache)\n"
    return _default_format(message, category, filename, lineno, line)
