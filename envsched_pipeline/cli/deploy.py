"""``envsched deploy render``: Kubernetes, Docker or Dagster+ files from the current config."""

from __future__ import annotations

from envsched_pipeline.cli.common import HelpFormatter, writable_dir
from envsched_pipeline.deploy import TARGETS, render


def add_parser(sub) -> None:
    d = sub.add_parser("deploy", help="run it on a cluster")
    dsub = d.add_subparsers(dest="deploy_command", required=True)
    r = dsub.add_parser(
        "render",
        help="write the deployment files of a target",
        formatter_class=HelpFormatter,
    )
    r.add_argument("--target", required=True, choices=TARGETS, help="where it runs")
    r.add_argument("--out", required=True, help="output folder")
    r.set_defaults(func=cmd_render)


def cmd_render(args) -> int:
    for path in render(args.target, writable_dir("--out", args.out)):
        print(path)
    return 0
