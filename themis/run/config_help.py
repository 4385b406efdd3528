"""``--help``: every config key with its value and the one-line description under its field.
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig

from themis.agents.a2c import A2CConfig
from themis.agents.ppo import PPOConfig
from themis.agents.sac import SACConfig
from themis.core.run_keys import RunKeys
from themis.methods.registry import BASE, config_groups, method_names
from themis.run.config import BaseTrainConfig
from themis.tracking.settings import LoggerConfig

GROUPS: dict[str, type] = {"sac": SACConfig, "ppo": PPOConfig, "a2c": A2CConfig, **config_groups(),
                           "logger": LoggerConfig}
"""The nested key groups (``sac.*``, ``ppo.*``, each method's keys) and their dataclasses."""


def key_descriptions() -> dict[str, str]:
    """Each config key's one-line description, read from the docstrings under the fields of
    :class:`~themis.core.run_keys.RunKeys` (the flat keys), of
    :class:`~themis.run.config.BaseTrainConfig` (the groups) and of each of :data:`GROUPS`
    (``sac.*`` ...)."""
    out: dict[str, str] = {}
    for prefix, cls in [("", RunKeys), ("", BaseTrainConfig),
                        *((f"{k}.", c) for k, c in GROUPS.items())]:
        out.update(field_descriptions(cls, prefix))
    return out


def field_descriptions(cls: type, prefix: str = "") -> dict[str, str]:
    """The docstring under each field of the dataclass ``cls``, on one line, keyed
    ``prefix + field`` (fields without one are left out)."""
    import ast
    import inspect

    out: dict[str, str] = {}
    body = ast.parse(inspect.getsource(sys.modules[cls.__module__])).body
    node = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    for field_node, doc in zip(node.body, [*node.body[1:], None], strict=True):
        if isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name) \
                and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) \
                and isinstance(doc.value.value, str):
            out[prefix + field_node.target.id] = " ".join(doc.value.value.split())
    return out


def help_text(cfg: DictConfig) -> str:
    """``--help``: every key with its value in ``cfg`` and its description."""
    from omegaconf import OmegaConf

    described = key_descriptions()
    lines = ["Themis: every key is an override, e.g. ./themis_train.sh env=Hopper-v5 seed=1",
             "Groups: domain=ALE|BabyAI|Box2d|Classic|Control|DMC|Minigrid|MetaWorld|"
             "MovingDot|Gym|seals, "
             "teacher=oracle|mistake|noisy|skip|myopic|equal, "
             f"method={'|'.join([BASE, *method_names()])} (several: method=[a,b]), "
             "logger=csv|tensorboard|wandb|mlflow (several: logger=[wandb,mlflow]); "
             "-m sweeps (Hydra's flags: --hydra-help).", ""]
    flat = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(flat, dict)

    def walk(node: dict[Any, Any], prefix: str = "") -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value and prefix + key in GROUPS:
                walk(value, f"{prefix}{key}.")
                continue
            name = prefix + key
            text = described.get(name, "")
            lines.append(f"  {name} = {value}" + (f"\n      {text}" if text else ""))

    walk(flat)
    return "\n".join(lines)
