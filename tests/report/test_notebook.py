"""notebooks/analysis.ipynb executed headless (nbclient, kernel python3) against the committed reference run:
no cell errors, at least one figure (image/png) and one table (a DataFrame's text/html), nothing written into
results/, and the notebook is committed with its outputs stripped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_notebook_is_committed_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)


def test_notebook_runs_headless_on_the_reference_run(monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    run = next(line for c in nb.cells if c.cell_type == "code" for line in c.source.splitlines()
               if line.startswith("RUN = "))
    run_dir = ROOT / run.split('"')[1]
    assert (run_dir / "rows.csv").is_file(), f"{run_dir}: the notebook's reference run is not committed"
    before = _snapshot(ROOT / "results")
    # the kernel starts in the repository root (python -m puts it first on sys.path: this checkout's
    # experiments package) with the interpreter off and a non-interactive matplotlib backend
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=180,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()                      # raises CellExecutionError on the first cell that fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    html = [o for o in outputs if "<table" in o.get("data", {}).get("text/html", "")]
    assert len(figures) >= 6, f"{len(figures)} figures: Figs. 6-11 missing"
    assert len(html) >= 6, f"{len(html)} tables"
    assert _snapshot(ROOT / "results") == before, "the notebook wrote into results/"
