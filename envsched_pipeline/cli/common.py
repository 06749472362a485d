"""What every command shares: the lake, the Dagster home, output helpers, user errors."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from envsched_pipeline.errors import EnvschedError
from envsched_pipeline.lake import Lake, json_safe

REPO_ROOT = Path(__file__).resolve().parents[2]
# set by `envsched sweep` to its own pid for each run it starts: the run stops when the sweep dies
STOP_WITH_ENV = "ENVSCHED_STOP_WITH"
PR_SET_PDEATHSIG = 1  # prctl(2)


class UsageError(EnvschedError):
    """A command-line mistake: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """A command-line mistake (an unknown flag, a missing argument, a value out of bounds) is one
    line on stderr and exit code 2, like every other user error, not a usage block."""

    def error(self, message: str):
        raise UsageError(f"{message} (`{self.prog} --help` lists the options)")


def sql_error(exc: BaseException) -> UsageError:
    """A DuckDB error as one line: its message and hint (``Did you mean "rollouts"?``) joined, and
    where it points in the query (``LINE 1`` with its caret) as a line and column and the text there."""
    head, where = [], ""
    lines = str(exc).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("LINE ") and ": " in line:
            prefix, text = line.split(": ", 1)
            caret = lines[i + 1] if i + 1 < len(lines) else ""
            col = caret.find("^") - len(prefix) - 2
            if col >= 0:
                near = text[col : col + caret.count("^")]
                where = f" ({prefix.lower()}, column {col + 1}: {near!r})"
            else:
                where = f" ({prefix.lower()})"
            break
        if line.strip():
            head.append(line.strip())
    return UsageError(f"SQL error: {' '.join(head)}{where}")


def at_least(minimum: int):
    """An argparse type: an integer of at least ``minimum``; argparse names the option in the error
    (``argument --steps: must be >= 1, got -1``) before anything runs."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


COUNT, INDEX, GROUP = at_least(1), at_least(0), at_least(2)  # counts, seeds/steps/indices, G
EVALUATED = "evaluated"  # `envsched evaluate --steps evaluated`: every step the run evaluated


def step_list(text: str) -> list[int] | str:
    """``--steps``: steps as ``0,49,99`` (each >= 0, in the order given, none twice) or ``evaluated``."""
    if text.strip() == EVALUATED:
        return EVALUATED
    steps = [INDEX(part.strip()) for part in text.split(",") if part.strip()]
    if not steps:
        raise argparse.ArgumentTypeError(f"no step in {text!r}: give e.g. 0,49,99 or {EVALUATED}")
    if len(set(steps)) != len(steps):
        raise argparse.ArgumentTypeError(f"a step is named twice in {text!r}")
    return steps


def lake_of(args: argparse.Namespace) -> Lake:
    return Lake(args.lake)


def dagster_home() -> Path:
    """``$DAGSTER_HOME`` (default: ./dagster_home, else the repository's), created if missing."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        local = Path.cwd() / "dagster_home"
        home = str(local if local.exists() else REPO_ROOT / "dagster_home")
    path = Path(home).resolve()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(path)  # read by dagster.DagsterInstance.get()
    if not (path / "dagster.yaml").exists():
        (path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return path


def dumps(obj, **kw) -> str:
    return json.dumps(json_safe(obj), default=str, allow_nan=False, **kw)


def names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def json_source(text: str) -> str | None:
    """The file a JSON flag names (``@settings.json``, or a path ending in .json), as given, or
    None for inline JSON."""
    if text.startswith("@"):
        return text[1:]
    if not text.lstrip().startswith(("{", "[")) and text.lower().endswith(".json"):
        return text
    return None


def json_object(flag: str, text: str, example: str) -> dict:
    """A flag's JSON object (``--learner-config``, ``--scheduler-config``), given inline or as a
    file (``json_source``); a UsageError naming the flag (and the file) for a missing file, text
    that is not JSON, or JSON that is not an object."""
    source, where = json_source(text), f"{flag}:"
    if source is not None:
        text = read_text_file(flag, source, f" (or give the settings inline, e.g. '{example}')")
        where = f"{flag} {source}:"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = "" if source is not None else "; a file of settings is given as @FILE"
        raise UsageError(
            f"{where} not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}){hint}"
        ) from exc
    if not isinstance(value, dict):
        raise UsageError(f"{where} a JSON object of settings, e.g. '{example}'")
    return value


def not_a_url(flag: str, given: str | os.PathLike, what: str) -> None:
    """A UsageError naming the flag when what it names on this machine is given as a URL, which
    ``Path`` would fold into a local path named after the scheme (``s3:/bucket/...``)."""
    if "://" in str(given):
        raise UsageError(f"{flag}: {given} is a URL; name {what}")


def local_file(flag: str, given: str | os.PathLike, hint: str = "") -> Path:
    """The file on this machine a flag names; a UsageError naming the flag when it is a URL (which
    ``Path`` would fold into a local path named after the scheme), missing or a folder."""
    not_a_url(flag, given, "a file on this machine")
    path = Path(given)
    if not path.exists():
        raise UsageError(f"{flag} {path}: no such file{hint}")
    if path.is_dir():
        raise UsageError(f"{flag} {path}: a folder; name a file{hint}")
    return path


def read_text_file(flag: str, path: str | os.PathLike, hint: str = "") -> str:
    """A file a flag names, as UTF-8 text; a UsageError naming the flag and the file when it is a
    URL, missing, a folder, unreadable or not UTF-8 (with the byte offset)."""
    path = local_file(flag, path, hint)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{flag} {path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})"
        ) from exc
    except OSError as exc:
        raise UsageError(f"{flag} {path}: unreadable ({exc.strerror or exc})") from exc


def from_source(flag: str, text: str | None, exc: BaseException) -> UsageError:
    """A settings error as one line, naming the flag's file when the settings came from one."""
    source = json_source(text) if text else None
    return UsageError(f"{flag} {source}: {exc}" if source is not None else str(exc))


def writable_dir(flag: str, path: str | os.PathLike) -> Path:
    """``path`` as a folder this command can write into, checked before the command spends any
    work and without making it (so a command refused for another reason leaves nothing behind):
    a path that is a file, sits under one, or may not be written is a UsageError naming the flag.
    Whoever writes makes the folder (:func:`write_output`, or the writer's own ``mkdir``)."""
    not_a_url(flag, path, "a folder on this machine (lakes may be URLs, this may not)")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag}: {out} is a file; name a folder")
    base = out.absolute()
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise UsageError(f"{flag}: cannot write into {out}: {base} is a file")
    probe = base / f".envsched-write-test-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write into {out}: {exc.strerror or exc}") from exc
    return out


def writable_file(flag: str, path: str | os.PathLike) -> Path:
    """``path`` as a file this command can write when it is done (a folder in its place, or a file
    above it, refused), checked before any work and without making anything."""
    not_a_url(flag, path, "a file on this machine")
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{flag}: {out} is a folder; name a file")
    if out.parent.exists() and not out.parent.is_dir():
        raise UsageError(f"{flag}: cannot write {out}: {out.parent} is a file")
    writable_dir(flag, out.parent)
    return out


def write_output(path: Path, text: str) -> None:
    """Write a command's output file, making its folder (checked by :func:`writable_file`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every command's help: each flag's default, except where there is none to show (a None
    default means the flag's help says what stands in: a resumed run's own setting, a policy's)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def stop_with_parent() -> None:
    """For a command started by `envsched sweep` (``$ENVSCHED_STOP_WITH`` holds the sweep's pid):
    ask the kernel for SIGINT when the sweep dies, however it dies (``kill -9`` included), so the
    run stops after its step as on Ctrl-C instead of going on with nobody to wait for it; when the
    sweep is already gone, stop now. The variable is removed, so the processes this one starts do
    not take the sweep for their parent. Linux only (``prctl``); elsewhere the run goes on."""
    pid = os.environ.pop(STOP_WITH_ENV, None)
    if not pid or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(pid):  # the sweep died before the kernel was asked
        raise KeyboardInterrupt
