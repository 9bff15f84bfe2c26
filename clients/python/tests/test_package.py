"""The package as `pip install ./clients/python` builds it: standard library only, typed
(py.typed shipped), and importing it (or its integrations) imports neither torch nor
onnxruntime."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import require

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_has_no_dependencies_and_ships_py_typed(tmp_path: Path) -> None:
    setuptools = require("setuptools", "setuptools")
    if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (70, 1):
        require("wheel", "wheel")  # older setuptools builds wheels through it
    # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "dist"), str(src)],
        check=True,
        cwd=tmp_path,
    )
    [wheel] = (tmp_path / "dist").glob("edgewatch-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "edgewatch/py.typed" in names
    assert {"edgewatch/torch.py", "edgewatch/onnxruntime.py", "edgewatch/openai.py",
            "edgewatch/transformers.py", "edgewatch/__init__.py"} <= names
    requires = [l for l in meta.splitlines() if l.startswith("Requires-Dist:")]
    assert all("extra ==" in l for l in requires), requires
    assert "Requires-Python: >=3.9" in meta


def test_import_pulls_in_no_framework() -> None:
    code = (
        "import sys, edgewatch, edgewatch.torch, edgewatch.onnxruntime, edgewatch.openai, edgewatch.transformers\n"
        "bad = [m for m in ('torch', 'onnxruntime', 'numpy', 'openai', 'transformers', 'httpx') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(edgewatch.__version__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "0.1.0"
