"""``envsched`` command line: a thin ``main()`` over one module per command group.

    envsched train --pool synthetic --policy simulated --steps 20     the Dagster loop, in-process
    envsched sql "select env_id, avg(reward) from rollouts group by 1"
    envsched pool list | create | import;  envsched env run
    envsched step select | ingest | eval | status                   the external-trainer protocol
    envsched rollouts show --step T [--task ID]                      what a rollout did
    envsched status;  envsched resume;  envsched rewind;  envsched report;  envsched bench ...
    envsched evaluate [--step K | --best] [--samples N]              a checkpoint's held-out, again

Every command takes the global ``--lake DIR`` (default ``$ENVSCHED_LAKE`` or ``warehouse/lake``).
A user error (any :class:`envsched_pipeline.errors.EnvschedError`) prints one line on stderr and
exits with code 2, as does a write the machine refuses (a read-only place, a full disk: the path and
the system's reason); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import warnings

from envsched_pipeline import __version__
from envsched_pipeline.cli import analyze, deploy, pool, rollouts, sql, step, sweep, train
from envsched_pipeline.cli.common import HelpFormatter, Parser, stop_with_parent
from envsched_pipeline.errors import EnvschedError
from envsched_pipeline.lake import store_endpoint

MACHINE_REFUSALS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="envsched",
        description="Environment-aware rollout scheduling for agent RL.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--lake", default=None, help="lake root (default: $ENVSCHED_LAKE, else warehouse/lake)")
    p.add_argument("--version", action="version", version=f"envsched {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for module in (train, sweep, sql, pool, step, rollouts, analyze, deploy):
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=".*is currently in (preview|beta).*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        stop_with_parent()
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except EnvschedError as exc:
        print(f"envsched: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `envsched sql ... | head`: the reader left; end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("envsched: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # an s3:// lake's store that cannot be used (its client's error, or s3fs's OSError for it),
        # or where the machine refuses a write (a read-only place, a full disk): one line
        if (store := object_store_problem(exc)) is not None:
            print(f"envsched: error: {store}", file=sys.stderr)
            return 2
        if not isinstance(exc, OSError) or exc.errno not in MACHINE_REFUSALS:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"envsched: error: {where}{exc.strerror}", file=sys.stderr)
        return 2


def object_store_problem(exc: BaseException) -> str | None:
    """One line for an ``s3://`` lake's store that cannot be reached or refuses the request (its
    client's error, or s3fs's translation of it); None for any other error."""
    seen = exc
    while seen is not None:
        if type(seen).__module__.split(".")[0] in ("botocore", "aiobotocore"):
            endpoint = store_endpoint()
            first = str(seen).strip().splitlines()[0] if str(seen).strip() else type(seen).__name__
            return (
                f"the lake's object store ({endpoint}) could not be used: {first} (the endpoint comes from "
                "$AWS_ENDPOINT_URL, the credentials from $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY; "
                "docs/deployment.md, 'The lake on object storage')"
            )
        seen = seen.__cause__ or seen.__context__
    return None


if __name__ == "__main__":
    sys.exit(main())
