"""The index of the schema that the launchers' quick check reads (:mod:`themis.cli.key_check`,
which imports only the standard library): every key, the config groups and their options, the
domains, the removed keys and the numeric keys' ranges, built from the modules that define them
by the full check of any launch."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from themis.environments.domains import DOMAINS
from themis.run.config import CONFIG_DIR, REMOVED_KEYS, TrainConfig, schema_keys
from themis.run.hints import OPEN_KEYS
from themis.run.validation import NUMERIC_KEYS


def key_index() -> dict[str, Any]:
    """What :mod:`themis.cli.key_check` needs to refuse a typo or a value out of range without
    importing PyTorch: ``keys`` (:func:`~themis.run.config.schema_keys` and the config groups,
    the folders of :data:`~themis.run.config.CONFIG_DIR`), ``groups`` (keys that hold keys, but
    not :data:`~themis.run.hints.OPEN_KEYS`), ``removed``
    (:data:`~themis.run.config.REMOVED_KEYS`), ``options`` (the options of the config groups in
    ``train_themis.yaml``'s defaults list: ``method``, ``teacher``, ``logger``), ``domains``
    (:data:`themis.environments.domains.DOMAINS`, in order), ``default_domain`` (the
    defaults list's) and ``ranges`` (:data:`themis.run.validation.NUMERIC_KEYS`' integer and
    float keys, in its order, with their type and :class:`~themis.core.ranges.Range`)."""
    schema = OmegaConf.structured(TrainConfig)
    keys = schema_keys()
    groups = [k for k in keys if k not in OPEN_KEYS
              and isinstance(OmegaConf.select(schema, k), DictConfig)]
    folders = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())
    defaults = OmegaConf.load(CONFIG_DIR / "train_themis.yaml").defaults
    chosen = [next(iter(d)) for d in defaults if isinstance(d, DictConfig)]
    options = {group: sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
               for group in chosen if group in folders and group != "domain"}
    ranges = []  # [key, "int" | "float", lo, hi, lo_open, hi_open, text, cap], in order
    for key, allowed in NUMERIC_KEYS.items():
        node: Any = schema
        for part in key.split("."):
            node = node._get_node(part)
        kind = {"IntegerNode": "int", "FloatNode": "float"}.get(type(node).__name__)
        if kind is not None:
            ranges.append([key, kind, allowed.lo, allowed.hi, allowed.lo_open, allowed.hi_open,
                           allowed.text, allowed.cap])
    return {"keys": keys + [f for f in folders if f not in keys], "groups": groups,
            "ranges": ranges,
            "removed": dict(REMOVED_KEYS), "options": options, "domains": list(DOMAINS),
            "default_domain": next((d["domain"] for d in defaults
                                    if isinstance(d, DictConfig) and "domain" in d), "")}
