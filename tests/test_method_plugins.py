"""Methods are plug-ins (issue 36): nothing outside ``themis/methods/`` names one, and what a
method declares (keys, ranges, checks, hooks) reaches the config, ``--help``, the checks and
the learner without another module knowing it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_PENDULUM
from themis.methods.base import Method, MethodContext, choose_augmentation, overrides
from themis.methods.registry import (
    REGISTRY,
    build_methods,
    check_methods,
    method_names,
    method_title,
    numeric_keys,
)
from themis.utils import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def documentation_strings(tree: ast.AST) -> set[tuple[int, int]]:
    """Positions ``(line, column)`` of the strings that are documentation: a bare string
    statement (module, class and function docstrings, and the docstrings under fields)."""
    return {(node.value.lineno, node.value.col_offset) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def method_mentions(path: Path, names: list[str]) -> list[str]:
    """Where code in ``path`` names a method: an identifier or attribute (``cfg.qpa``,
    ``QPAConfig``) or a string that is not documentation (``"qpa"``, ``"method=qpa"``);
    comments and docstrings may cite the papers."""
    text = path.read_text(encoding="utf-8")
    docs = documentation_strings(ast.parse(text))
    spellings = [w for n in names for w in (n, n.upper(), n.capitalize())]
    word = re.compile(r"(?<![A-Za-z])(" + "|".join(spellings) + r")(?![a-z])")
    where = path.relative_to(ROOT) if ROOT in path.parents else path.name
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME and word.search(tok.string):
            found.append(f"{where}:{tok.start[0]}: {tok.string}")
        elif tok.type == tokenize.STRING and tok.start not in docs and word.search(tok.string):
            found.append(f"{where}:{tok.start[0]}: {tok.string[:60]}")
    return found


def test_no_module_outside_the_methods_package_names_a_method():
    names = method_names()
    assert {"surf", "rune", "qpa", "rime", "mrn"} <= set(names)
    paths = [p for folder in ("themis", "lib") for p in sorted((ROOT / folder).rglob("*.py"))
             if (ROOT / "themis" / "methods") not in p.parents]
    mentions = [m for p in paths for m in method_mentions(p, names)]
    assert not mentions, "\n".join(mentions)


def test_the_name_check_sees_code_and_ignores_documentation(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Cites RIME (ICML 2024)."""\n'
                      "x = 1  # RIME's rule\n"
                      "def f(cfg):\n"
                      '    """RIME again."""\n'
                      '    return cfg.rime.enabled or "method=qpa" or QPAConfig\n')
    found = method_mentions(module, ["rime", "qpa"])
    assert len(found) == 3 and all(":5:" in f for f in found)


def test_registry_orders_methods_by_first_publication():
    published = [cls.published for cls in REGISTRY.values()]
    assert published == sorted(published) and all(re.fullmatch(r"\d{4}-\d{2}", p)
                                                   for p in published)
    assert list(REGISTRY)[:2] == ["surf", "rune"]


def test_each_method_declares_documented_keys_and_ranges_the_config_checks(compose):
    cfg = compose([])
    keys = numeric_keys()
    for name, cls in REGISTRY.items():
        assert cls.title and cls.name == name and cls.__doc__
        fields = list(cls.Config.__dataclass_fields__)
        assert fields[0] == "enabled" and getattr(cfg, name).enabled is False
        assert set(cls.RANGES) <= set(fields)
        assert all(f"{name}.{k}" in keys for k in cls.RANGES)
    from themis.run.validation import validate

    with pytest.raises(ConfigError, match=r"surf\.mu=0 must be positive"):
        validate(compose(["method=surf", "surf.mu=0"]))


def test_help_lists_every_registered_method_and_its_keys(compose):
    from themis.run.config_help import help_text, key_descriptions

    text = help_text(compose([]))
    assert "method=pebble|" + "|".join(method_names()) in text
    described = key_descriptions()
    for name, cls in REGISTRY.items():
        for key in cls.Config.__dataclass_fields__:
            assert described.get(f"{name}.{key}"), f"{name}.{key} has no docstring"


def test_methods_refuse_what_they_cannot_run_with_one_line(compose):
    with pytest.raises(ConfigError, match="method=qpa mixes recent episodes"):
        check_methods(compose(["method=qpa"]), agent="ppo")
    with pytest.raises(ConfigError, match="wrapper cannot reach it; use "):
        check_methods(compose(["method=mrn"]), where="wrapper")
    with pytest.raises(ConfigError, match="reward_training=async: method=qpa"):
        check_methods(compose(["method=qpa"]), where="async")
    check_methods(compose(["method=[surf,rune,rime]"]), agent="sac", where="wrapper")
    assert method_title(compose(["method=[rune,surf]"])) == "SURF+RUNE"


def test_hooks_compose_where_the_papers_compose_them(compose):
    cfg = compose(["method=[surf,qpa,rune]"])
    methods = build_methods(cfg, MethodContext(segment=cfg.segment))
    assert [m.name for m in methods] == ["surf", "rune", "qpa"]
    assert choose_augmentation(methods).copies == cfg.qpa.data_aug_ratio  # QPA's crops win
    bonus = [m for m in methods if overrides(m, "reward_bonus")]
    assert [m.name for m in bonus] == ["rune"]
    members = np.array([[0.0, 1.0], [2.0, 1.0]], np.float32)
    assert bonus[0].reward_bonus(members) == pytest.approx(
        cfg.rune.beta_init * members.std(0))


def test_a_method_only_needs_its_hooks(compose, tmp_path, monkeypatch):
    """A method registered at run time (as a module of the package would be) changes the
    agent's reward through its hook, with nothing else edited."""
    from dataclasses import dataclass

    from themis.builder import make_workspace
    from themis.methods import registry

    @dataclass
    class PlusOneConfig:
        """``plusone.*``."""

        enabled: bool = True
        """Always on here."""

    class PlusOne(Method):
        """Adds 1 to r̂."""

        name, title, published = "plusone", "PLUSONE", "2099-01"
        Config = PlusOneConfig

        def reward_bonus(self, members):
            return np.ones(members.shape[1], np.float32)

    ws = make_workspace(compose([*TINY_PENDULUM]), tmp_path)
    ws.run(until=ws.cfg.pretrain_end + 1)  # a trained reward model
    obs = ws.buffer.obs[:8].reshape(8, -1)
    act = ws.buffer.actions[:8]
    before = ws.learner.reward(obs, act)
    ws.learner.methods = [PlusOne(PlusOneConfig(), MethodContext())]
    monkeypatch.setitem(registry.REGISTRY, "plusone", PlusOne)
    np.testing.assert_allclose(ws.learner.reward(obs, act), before + 1, rtol=1e-6)
