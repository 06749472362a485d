"""The errors a user can act on. The CLI prints any :class:`EnvschedError` as one line on stderr
and exits with code 2; every other exception is a bug and keeps its traceback."""

from __future__ import annotations

# set by `envsched train`'s driver, which prints one line per failed step: the trainer process it
# starts (inheriting it) then leaves that line to the driver instead of printing its own as well
DRIVER_REPORTS_FAILURES = "ENVSCHED_DRIVER_REPORTS_FAILURES"


class EnvschedError(Exception):
    """Base of every user-facing error: the message names the input (file, field, step) and what
    to do about it."""


class ConfigError(EnvschedError):
    """An invalid setting: unknown key, wrong type, out-of-range value."""


class LakeError(EnvschedError):
    """A problem with lake contents (names the file or table)."""


class StepError(EnvschedError):
    """A step cannot run yet, or its inputs are wrong; says which step and why."""


class PoolError(EnvschedError):
    """A pool that cannot be imported or used (unknown name, bad file, empty)."""
