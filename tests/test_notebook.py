"""docs/tutorial.ipynb, executed headless: a model, client and strategy defined in the notebook train in two
process workers (sent by value) and match the serial executor bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat, nbclient and ipykernel")
nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbformat, nbclient and ipykernel")

NOTEBOOK = Path(__file__).parents[1] / "docs" / "tutorial.ipynb"


def _stdout(cell) -> str:  # type: ignore[no-untyped-def]
    return "".join(
        output.get("text", "") for output in cell.get("outputs", []) if output.get("output_type") == "stream"
    )


@pytest.mark.slow
def test_tutorial_notebook_runs_process_workers_and_matches_serial(tmp_path: Path) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    printed = "\n".join(_stdout(cell) for cell in notebook.cells if cell.cell_type == "code")
    assert "process == serial, bitwise: True" in printed
    assert "workers used: ['w0', 'w1']" in printed
    assert (
        "cannot send the model factory to worker processes (TypeError: cannot pickle '_thread.lock' object)" in printed
    )
