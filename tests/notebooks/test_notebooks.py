"""Every notebook runs top to bottom (CI executes them; GPU cells skip themselves without CUDA)."""

from pathlib import Path

import pytest

# the GPU image runs `pytest -m gpu` without the notebook tools: skip, not a collection error
jupytext = pytest.importorskip("jupytext")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.py"))


def test_the_docs_list_every_notebook():
    """Both READMEs name each notebook, and the way they say to run one needs only the `dev`
    extra (jupytext's --execute would need nbconvert, which no extra installs)."""
    root = Path(__file__).parents[2]
    table = (root / "notebooks" / "README.md").read_text(encoding="utf-8")
    listed = (root / "README.md").read_text(encoding="utf-8").split("Notebooks (`notebooks/`")[1]
    for p in NOTEBOOKS:
        assert f"`{p.name}`" in table and f"`{p.stem}`" in listed.split("\n\n")[0], p.stem
    assert "pytest tests/notebooks -k NAME" in table and "--execute NAME" not in table


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = jupytext.read(path)
    # run from the notebooks directory, as a user would (committed traces live in notebooks/data)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors
