"""Deployment templates (Dockerfiles, the Postgres instance config, RBAC, a secrets template),
shipped with the package so `envsched deploy render` works from an installed wheel too."""

from importlib.resources import files


def template(name: str) -> str:
    return (files(__name__) / name).read_text()
