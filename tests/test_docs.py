"""The documentation: a short README, commands that run, links that resolve, a site that builds.

The README is the front page (at most 300 lines, as Stable-Baselines3's and imitation's); the
manual is the MkDocs site in ``docs/`` (``mkdocs.yml``). Every shell command of the
getting-started page is classified here — run quickly, run as a slow end-to-end test, or not run
(with the reason) — so a command added to the page without a check fails
:func:`test_every_getting_started_command_is_checked`.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"

QUICK = {
    "scripts/setup.sh --help": 0,
    "./themis_train.sh --help": 0,
    "./themis_train.sh num_train_step=1000": 2,  # a typo: one line, exit 2
}
"""Commands of the getting-started page that take a few seconds, and their exit codes."""
SLOW = [
    "./themis_train.sh domain=Classic env=Pendulum-v1 num_train_steps=1000 num_seed_steps=200 "
    "num_unsup_steps=200 num_interact=200 max_feedback=20 segment=25 eval_frequency=500 "
    "hydra.run.dir=runs/first",
    "ls runs/first",
    "head -3 runs/first/eval.csv runs/first/reward.csv",
    "python scripts/inspect_reward.py runs/first",
    "./themis_train.sh resume=runs/first num_train_steps=1400",
]
"""The page's tiny run, reading its folder and resuming it, in the page's order (each exit 0)."""
NOT_RUN = {
    "bash scripts/setup.sh": "installs packages (CI runs it first)",
    "./themis_train.sh": "the main job: about 7 minutes on 2 cores (results/main_job.csv)",
    "scripts/test.sh": "the whole suite",
    'scripts/test.sh -m "not slow"': "the quick suite",
}


def shell_commands(markdown: str) -> list[str]:
    """The commands of ``markdown``'s ```` ```bash ```` blocks, continuation lines joined."""
    commands: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def localized(command: str) -> str:
    """``command`` as it runs from another folder: the repository's launchers and interpreter."""
    for prefix, local in (("./themis_train.sh", f"{ROOT}/themis_train.sh"),
                          ("bash scripts/", f"bash {ROOT}/scripts/"),
                          ("scripts/", f"{ROOT}/scripts/"),
                          ("python scripts/", f"{sys.executable} {ROOT}/scripts/")):
        if command.startswith(prefix):
            return f"{local}{command[len(prefix):]}"
    return command


def run(command: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one page command in ``cwd`` with one thread and the repository on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "THEMIS_THREADS": "1", "OMP_NUM_THREADS": "1",
           "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(["bash", "-c", localized(command)], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


def test_readme_is_at_most_300_lines():
    assert len(README.read_text().splitlines()) <= 300


def test_every_getting_started_command_is_checked():
    commands = shell_commands(GETTING_STARTED.read_text())
    assert len(commands) == len(set(commands)), "a command appears twice on the page"
    assert set(commands) == set(QUICK) | set(SLOW) | set(NOT_RUN)
    assert [c for c in commands if c in SLOW] == SLOW, "the slow commands depend on their order"


def test_shell_commands_join_continuations_and_drop_comments():
    page = "```bash\n./a.sh x=1 \\\n    y=2   # why\n# a comment\nls\n```\n```python\nno\n```\n"
    assert shell_commands(page) == ["./a.sh x=1 y=2", "ls"]


@pytest.mark.parametrize("command", sorted(QUICK))
def test_quick_getting_started_commands_run(command, tmp_path):
    result = run(command, tmp_path, timeout=60)
    assert result.returncode == QUICK[command], result.stdout + result.stderr
    if QUICK[command] == 2:  # bad input: one line naming the key meant, no traceback
        assert "Traceback" not in result.stderr
        assert "did you mean num_train_steps" in result.stderr


@pytest.mark.slow
def test_the_getting_started_run_writes_its_folder_and_resumes(tmp_path):
    for command in SLOW:
        result = run(command, tmp_path, timeout=300)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    run_dir = tmp_path / "runs" / "first"
    for name in ("config.yaml", "train.csv", "eval.csv", "reward.csv", "learning_curve.png",
                 "preferences/labels.csv", "report/report.md"):
        assert (run_dir / name).is_file(), name
    last_eval = (run_dir / "eval.csv").read_text().strip().splitlines()[-1]
    assert last_eval.split(",")[0] == "1400"  # the resumed run went on to its new budget


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs' ``toc`` extension makes it (its default ``slugify``)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def readme_links() -> list[str]:
    """Relative link targets of the README (images included), without web addresses."""
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_readme_links_into_the_site_resolve():
    links = readme_links()
    assert any(t.startswith("docs/") and t.endswith(".md") for t in links)
    for target in links:
        path, _, anchor = target.partition("#")
        file = ROOT / path
        assert file.is_file(), f"README links to {target}, which is not there"
        if path.startswith("docs/") and path.endswith(".md"):
            assert not path.startswith("docs/_incoming/"), "notes in docs/_incoming are not built"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"no heading for {target}"


def test_slugs_follow_mkdocs():
    assert slug("Asynchronous reward training in Themis's own loops") == \
        "asynchronous-reward-training-in-themiss-own-loops"
    assert slug("Rendering clips headless (2026-11-29)") == "rendering-clips-headless-2026-11-29"


def test_readme_python_example_compiles_and_its_imports_exist():
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    assert blocks
    for block in blocks:
        tree = ast.parse(block)
        assert "torch.set_num_threads(1)" in block
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("themis"):
                assert node.module is not None
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert getattr(module, alias.name, None) is not None, alias.name


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_page_the_readme_links(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                            cwd=ROOT, text=True, capture_output=True, timeout=600,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    for target in readme_links():
        path = target.partition("#")[0]
        if path.startswith("docs/") and path.endswith(".md"):
            page = Path(path).relative_to("docs").with_suffix("")
            built = site / ("index.html" if page.name == "index" and page.parent == Path(".")
                            else page.parent / "index.html" if page.name == "index"
                            else page / "index.html")
            assert built.is_file(), f"{target} was not built ({built})"
    assert not (site / "_incoming").exists()


def test_the_sites_front_page_is_generated_from_the_readme():
    """Issue 84 item 3: docs/index.md was a hand copy of README.md (five places differed)."""
    from tests.conftest import load_file

    index = load_file("scripts/docs_index.py")
    readme = (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "index.md").read_text() == index.site_index(readme), \
        "docs/index.md is out of date: python scripts/docs_index.py"
    assert "](docs/" not in index.site_index(readme)
    assert index.main(["--check"]) == 0
