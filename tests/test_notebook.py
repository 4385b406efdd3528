"""The quick-start notebook (docs/quickstart.ipynb) runs from top to bottom with today's Themis:
a tiny run from Python, its curves, the learned reward's picture, the wrapper around SB3's SAC
(issue 85 item 20: a notebook the test suite executes, so that it never rots)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT


@pytest.mark.slow
def test_the_quickstart_notebook_runs_and_shows_its_run_curves_and_reward(tmp_path):
    notebook = nbformat.read(ROOT / "docs" / "quickstart.ipynb", as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code"
               for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    text = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert "final true return:" in text and "reward model versions: " in text
    figures = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(figures) == 2  # the curves and the reward picture
    correlation = float(text.split("over the grid: ")[1].split()[0])
    assert correlation > 0.3  # r̂ ranks Pendulum's states as the true reward does
    assert (tmp_path / "runs" / "notebook" / "pendulum" / "eval.csv").is_file()
    assert (tmp_path / "runs" / "notebook" / "sb3" / "reward.csv").is_file()
