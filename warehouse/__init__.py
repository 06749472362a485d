"""The warehouse: the documented DuckDB views over the lake (``views.sql``, shipped with the package)
and, by default, the lake itself (``warehouse/lake``, never committed or packaged)."""

from importlib.resources import files


def views_sql() -> str:
    """Text of the documented derived views."""
    return (files(__name__) / "views.sql").read_text()
