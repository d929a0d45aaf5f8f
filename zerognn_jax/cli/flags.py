"""The one flag builder: argparse flags from a config dataclass's fields.

Every field becomes `--field-name` with its help text, its type (booleans as
`--x/--no-x`, int tuples as comma-separated lists, dicts of them as
`name=N,N;name=N`), the dataclass default (or the one
given) and, for closed sets, `choices=`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys


def int_tuple(text: str) -> tuple[int, ...]:
    """argparse type: "15,10,5" -> (15, 10, 5); "" -> ()."""
    parts = [p.strip() for p in text.split(",")]
    try:
        if text.strip() and not all(parts):
            raise ValueError
        return tuple(int(p) for p in parts if p)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


_NEGATIVE_LIST = re.compile(r"-\d+(,\s*-?\d+)*")


def glue_negative_lists(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with `--fanouts -1,-1` given as `--fanouts=-1,-1`: argparse takes a value
    that starts with "-" for a flag unless it is one negative number, and said only
    "expected one argument". Applies to the int-list flags of `parser` and its
    subcommands."""
    flags = {flag for action in _option_actions(parser) if action.type is int_tuple
             for flag in action.option_strings}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in flags and i + 1 < len(argv) and _NEGATIVE_LIST.fullmatch(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """`parser.parse_args(argv)` (the process's arguments for None), a list of negative
    ints taken as `--fanouts -1,-1` (`glue_negative_lists`)."""
    return parser.parse_args(glue_negative_lists(parser, sys.argv[1:] if argv is None
                                                 else list(argv)))


def run_main(main) -> None:
    """Runs an example's `main()` as its script: bad input that the library names (a
    ValueError or FileNotFoundError, a failed download) ends the process with one line,
    `<folder>/<script>: error: <message>` (examples/<folder>/main.py), and exit status
    2, as `zerognn` ends it, rather than a traceback."""
    try:
        main()
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        script = os.path.abspath(sys.argv[0])
        named = os.path.join(os.path.basename(os.path.dirname(script)),
                             os.path.basename(script))
        print(f"{named}: error: {err}", file=sys.stderr)
        sys.exit(2)


def whole_number(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def run_seed(text: str) -> int:
    """argparse type: a seed as `TrainConfig.seed` takes it, in [0, 2**31) (a preset
    generated with another seed is one no training run could name)."""
    value = whole_number(text)
    if value >= 2**31:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**31), got {text!r}")
    return value


def path_text(text: str) -> str:
    """argparse type: a path, refused when empty or blank (Python reads "" as the
    current folder), with a leading `~` read as the home folder (the shell leaves the
    `~` of `--out=~/x` as it is)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    return os.path.expanduser(text)


def add_compile_cache_flag(parser: argparse.ArgumentParser) -> None:
    """`--compile-cache DIR|none`, read by `use_compile_cache_flag`."""
    parser.add_argument(
        "--compile-cache", type=path_text, metavar="DIR",
        default=os.environ.get("ZEROGNN_COMPILE_CACHE", "").strip() or None,
        help="keep compiled programs in DIR and read them back in later runs of the same "
             "configuration instead of compiling them again; 'none': keep no folder of "
             "the command's own (one JAX was given in $JAX_COMPILATION_CACHE_DIR is still "
             "used) (default: $ZEROGNN_COMPILE_CACHE, else $JAX_COMPILATION_CACHE_DIR, "
             "else $XDG_CACHE_HOME/zerognn-jax/xla or, without it, "
             "~/.cache/zerognn-jax/xla, at most 4 GiB)")


def use_compile_cache_flag(args: argparse.Namespace):
    """Turns on the compile cache `--compile-cache` names (the command's process keeps
    it); a command without the flag, or given 'none', changes nothing."""
    if not hasattr(args, "compile_cache"):
        return None
    value = args.compile_cache
    if value is not None and value.strip().lower() == "none":
        return None
    from zerognn_jax._src.training.compile_cache import use_compile_cache

    return use_compile_cache(value)


def name_tuple(text: str) -> tuple[str, ...]:
    """argparse type: "a, b" -> ("a", "b")."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def fanout_dict(text: str) -> dict[str, tuple[int, ...]]:
    """argparse type: "cites=25,20; writes=10,5" -> {"cites": (25, 20), "writes": (10, 5)}."""
    out = {}
    for part in (p for p in text.split(";") if p.strip()):
        name, sep, values = part.partition("=")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(
                f"expected name=N,N,... entries separated by ';', got {part.strip()!r}")
        if name.strip() in out:
            raise argparse.ArgumentTypeError(
                f"relation {name.strip()!r} is given twice in {text!r}: give it once")
        if not values.strip():
            raise argparse.ArgumentTypeError(
                f"relation {name.strip()!r} has no fanouts in {text!r}: give "
                f"{name.strip()}=N,N,... (one number per hop)")
        out[name.strip()] = int_tuple(values)
    if not out:
        raise argparse.ArgumentTypeError(
            f"expected name=N,N,... entries separated by ';', got {text!r}")
    return out


def _caster(kind: str):
    base = kind.split("|")[0].strip()
    return {"int": int, "float": float}.get(base, str)


# How a help text says what leaving its option out (None) does: no "(default: None)" then.
UNSET_SAID = ("default:", "unset:", "omitted:", "optional when")


class _LayersUnset(int):
    """`--layers`' default, told apart from the same number given: without `--layers`
    the layers are as many as `--fanouts` gives (`config_from_args`)."""


def add_config_flags(parser: argparse.ArgumentParser, config, *, help: dict,
                     choices: dict | None = None, skip: tuple[str, ...] = ()) -> None:
    """Adds a flag per field of the dataclass instance `config` (its values are the
    defaults), but for the fields named in `skip` (a command that does not use them).

    Raises ValueError for a field without help text, so a new option cannot ship without.
    """
    choices = choices or {}
    for field in dataclasses.fields(config):
        if field.name in skip:
            continue
        if field.name not in help:
            raise ValueError(f"no help text for option {field.name!r}")
        flag = "--" + field.name.replace("_", "-")
        default = getattr(config, field.name)
        kind = field.type if isinstance(field.type, str) else field.type.__name__
        text = help[field.name]
        if default is not None or not any(w in text for w in UNSET_SAID):
            # (a help text that says what unset means already shows no "None")
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            text = f"{text} (default: {shown})"
        if field.name == "layers":
            default = _LayersUnset(default)
        kwargs = dict(dest=field.name, default=default, help=text)
        if kind.startswith("bool"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        elif kind.startswith("dict"):
            parser.add_argument(flag, type=fanout_dict, metavar="NAME=N,N;...", **kwargs)
        elif kind.startswith("tuple"):
            parser.add_argument(flag, type=int_tuple, metavar="N,N,...", **kwargs)
        else:
            parser.add_argument(flag, type=_caster(kind), choices=choices.get(field.name),
                                **kwargs)


def config_from_args(config_cls, args: argparse.Namespace, **overrides):
    """`config_cls` built from the parsed flags that name its fields.

    Raises:
      ValueError: the config's own, with a leading field name spelled as its flag
        ("seed must be in ..." -> "--seed must be in ..."); a field of a config given in
        `overrides` too ("train.epochs must be ..." -> "--epochs must be ...").
    """
    names = {f.name for f in dataclasses.fields(config_cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if isinstance(values.get("layers"), _LayersUnset):
        # (a graph task samples no hops: its fanouts set nothing)
        fanouts = values.get("fanouts")
        values["layers"] = (len(fanouts) if fanouts and values.get("task") != "graph"
                            else int(values["layers"]))
    nested = {f"{key}.{f.name}" for key, value in overrides.items()
              if dataclasses.is_dataclass(value) for f in dataclasses.fields(value)}
    try:
        return config_cls(**{**values, **overrides})
    except ValueError as err:  # the same error, its type and notes kept
        err.args = (_as_flag(str(err), names | nested),)
        raise


def _as_flag(message: str, names: set[str]) -> str:
    """`message` with the field name it starts with written as that field's flag, unless
    the message names the flag already."""
    field = message.split(" ", 1)[0]
    flag = "--" + field.rpartition(".")[2].replace("_", "-")
    if field not in names or flag in message:
        return message
    return flag + message[len(field):]


def _option_actions(parser: argparse.ArgumentParser):
    """The actions of `parser` and of the subcommands below it, subcommands first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _option_actions(sub)
        elif action.dest != "help":
            yield action


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    """{option name (dest): its flag} of `parser` and the subcommands below it (None for
    a positional argument: a name no flag spells)."""
    names = {}
    for action in _option_actions(parser):
        long = [o for o in action.option_strings if o.startswith("--")]
        names.setdefault(action.dest, long[0] if long else None)
    return names


def given_names(parser: argparse.ArgumentParser, argv) -> set[str]:
    """The option names (dests) whose flags `argv` holds (a flag that sets no option of
    its own, such as `zerognn bench`'s hidden ones, names none)."""
    by_flag = {o: a.dest for a in _option_actions(parser) for o in a.option_strings
               if a.dest != argparse.SUPPRESS}
    return {by_flag[t.split("=", 1)[0]] for t in argv if t.split("=", 1)[0] in by_flag}


def spelled_as_flags(text: str, flags: dict[str, str | None], given=frozenset()) -> str:
    """`text` (a message of the library, which names options as fields) with the option
    names of `flags` it holds written as the command line's flags, where the name is
    the option's: one `given` (set on the command line) with an underscore, or that
    starts the text or a clause, or that a value follows ("epochs 3", "heads=4"); one
    not given with an underscore where a value follows or a hint names it ("set
    checkpoint_dir", "drop flat_outer", "give max_nodes", "lower batch_size"). A name
    whose flag the text holds already, a
    word right after a flag (its value) and a name followed by "." (a record's key,
    "dataset.name") stay."""
    for name, flag in flags.items():
        if flag is None or re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
            continue
        pieces = re.split(rf"(?<![\w./'\"-]){re.escape(name)}(?![\w./'\"-])", text)
        out = pieces[0]
        for piece in pieces[1:]:
            valued = re.match(r" ['\"\d-]|=", piece)
            starts = out in ("", "error: ") or out.endswith(("; ", ": "))
            hinted = out.endswith(("set ", "drop ", "another ", "give ", "lower "))
            after_flag = re.search(r"(?<![\w-])--[\w-]+ $", out)
            swap = not after_flag and (
                (name in given and ("_" in name or valued or starts))
                or ("_" in name and (valued or hinted)))
            out += (flag if swap else name) + piece
        text = out
    return text
