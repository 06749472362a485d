"""The project's shape: one-way dependencies, lazy imports only with a reason, a wheel that works
without the repository."""

import ast
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envsched_pipeline", "trainer", "envs", "warehouse")
BIN = Path(sys.executable).parent


def test_import_contracts_hold():
    out = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_loading_the_code_location_or_the_cli_imports_no_heavy_library():
    """What the contract above allows through a function-level import (the report asset's) is not
    loaded with the code location: the Dagster daemon and webserver stay free of torch. Neither
    they nor the `envsched` command load scikit-learn, the OpenAI client or scipy.stats at start
    (a second of every command's start between them): only the work that uses them does."""
    heavy = ("torch", "transformers", "vllm", "deepspeed", "sklearn", "openai", "scipy.stats")
    for module in ("envsched_pipeline.definitions", "envsched_pipeline.cli"):
        code = f"import sys, {module}; print([m for m in {heavy!r} if m in sys.modules])"
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert (module, out.stdout.strip()) == (module, "[]")


def test_function_level_imports_carry_a_reason():
    """Imports inside functions exist only to keep heavy or optional packages out of a process that
    does not need them; each says why on its first line."""
    bare = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            src = path.read_text()
            lines = src.split("\n")
            for fn in ast.walk(ast.parse(src)):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in ast.walk(fn):
                        if (
                            isinstance(node, (ast.Import, ast.ImportFrom))
                            and "#" not in lines[node.lineno - 1]
                        ):
                            bare.append(
                                f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                            )
    assert not bare, "function-level imports without a reason:\n" + "\n".join(sorted(set(bare)))


def test_every_test_module_belongs_to_a_layer():
    """`make test-unit|steps|dagster|e2e` select by layer: a module in none would run only in `make test`."""
    from tests.conftest import LAYERS  # the layers this test checks

    layered = [m for modules in LAYERS.values() for m in modules]
    modules = sorted(p.stem for p in (ROOT / "tests").glob("test_*.py"))
    assert [m for m in modules if m not in layered] == []
    assert sorted(set(layered)) == sorted(layered) and set(layered) <= set(modules)


def test_no_references_to_specs_outside_the_repository():
    hits = []
    paths = [p for d in (*PACKAGES, "docs", "bench", "examples") for p in (ROOT / d).rglob("*")]
    for path in paths + [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile"]:
        if path.suffix not in (".py", ".md", ".sql", ".toml", "") or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        for word in (
            "ALGORITHM.md",
            "DESIGN.md",
            "/".join(("..", "shared")),
        ):  # spelled so this guard is no hit
            if word in text:
                hits.append(f"{path.relative_to(ROOT)}: {word}")
    assert not hits, hits


def test_every_section_reference_resolves():
    """``docs/<file>.md#anchor``-style references in code point to files that exist."""
    import re

    missing = []
    sources = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "README.md"]
    for path in sources:
        text = path.read_text()
        assert (
            "§" not in text.replace("docs/algorithm.md §", "").replace("docs/architecture.md §", "")
            or path.name == "envsched.py"
        ), f"{path}: a § reference without its document"
        for ref in re.findall(r"docs/[A-Za-z0-9_\-]+\.md", text):
            if not (ROOT / ref).exists():
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, missing


@pytest.mark.e2e
def test_wheel_installs_and_runs_without_the_repository(tmp_path):
    """Build the wheel, install it (no editable install) into a fresh venv whose dependencies come
    from the test environment, then run one training step and a SQL query from outside the repo."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(wheels.glob("envsched-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # dependencies: the test environment's site-packages, appended after the venv's own (no .pth processing,
    # so the repository's editable install stays invisible)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENVSCHED_LAKE")}
    env["DAGSTER_HOME"] = str(tmp_path / "dh")
    py = str(venv / "bin" / "python")
    where = subprocess.run(
        [py, "-c", "import envsched_pipeline, warehouse; print(envsched_pipeline.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(site) in where, where
    run = [py, "-m", "envsched_pipeline.cli", "--lake", str(work / "lake")]
    pool = subprocess.run(
        run + ["pool", "create", "synthetic", "--name", "mini", "--envs", "4", "--tasks-per-env", "5"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert pool.returncode == 0, pool.stderr[-2000:]
    train = subprocess.run(
        run + ["train", "--pool", "mini", "--steps", "1", "--batch-size", "4", "--group-size", "2"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    sql = subprocess.run(
        run + ["sql", "select count(*) as n from step_summary", "--format", "csv"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert sql.returncode == 0 and sql.stdout.strip().splitlines()[-1] == "1", sql.stdout + sql.stderr
