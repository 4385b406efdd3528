"""The keys of an offline run (``./themis_train.sh mode=offline dataset=PATH ...``).

Hydra's schema is :class:`OfflineConfig` (``config/offline_themis.yaml`` holds the defaults and
lists the keys with a comment each); :func:`validate` refuses bad values with one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from omegaconf import MISSING

from themis.agents.iql import IQLConfig
from themis.core.precision import PRECISIONS
from themis.feedback.sampling import resolve_feed_type
from themis.feedback.teachers import PRESETS
from themis.utils import ConfigError

REWARDS = ("learned", "true")
REWARD_NETS = ("bpref", "pt")
REWARD_SCALES = ("return_range", "none")


@dataclass
class OfflineConfig:
    """An offline run: labels on a fixed dataset, a reward model, IQL on the relabelled data."""

    mode: str = "offline"
    """The launcher's switch (``./themis_train.sh mode=offline``); only ``offline`` here."""
    dataset: str = MISSING
    """A Minari dataset folder or ``minari:ID``, a Themis run folder (its replay buffer), or
    rollouts (a Themis rollouts folder, an imitation npz)."""
    env: str = ""
    """The env to evaluate in (gymnasium id); empty: the dataset's own, if it names one."""
    domain: str = "Gym"
    """The domain whose wrappers the evaluation env gets (``Gym``: any registered id)."""
    seed: int = 0
    """Seeds the labels' pairs, the teacher, the networks and IQL's batches."""
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:1``."""
    torch_threads: int = 1
    """Intra-op threads of this run (one run per core)."""
    precision: str = "fp32"
    """Matrix products of IQL's updates: ``fp32``, ``bf16``, or ``auto`` (bf16 on CPUs with
    bf16 instructions)."""
    # --- reward
    reward: str = "learned"
    """``learned``: IQL on r̂ from the labels; ``true``: IQL on the dataset's true rewards."""
    reward_net: str = "bpref"
    """``bpref``: Themis's Markovian ensemble r̂(s, a); ``pt``: Preference Transformer."""
    segment: int = 50
    """Steps per segment of a query (Preference Transformer's MuJoCo runs: 100)."""
    max_feedback: int = 500
    """Preference labels asked of the teacher."""
    reward_batch: int = 100
    """Queries per labelling round (the ensemble is trained after each round)."""
    feed_type: str = "0"
    """Query sampler: 0 uniform, 1 disagreement, 2 entropy, 3 kcenter, 4, 5 (ensemble only)."""
    large_batch: int = 10
    """Score-based samplers choose among reward_batch * large_batch candidates."""
    teacher: str = "oracle"
    """B-Pref teacher answering from the true rewards: oracle, noisy, mistake, skip, myopic,
    equal."""
    labels: str = ""
    """A Uni-RLHF-style label file (npz/json: indices_1, indices_2, labels) instead of a
    teacher."""
    heldout_queries: int = 500
    """Fresh uniform pairs labelled by their true returns to measure r̂'s held-out accuracy."""
    ensemble_size: int = 3
    """Members of the Markovian ensemble (reward_net=bpref)."""
    reward_hidden_dim: int = 256
    """Hidden width of each member."""
    reward_hidden_depth: int = 3
    """Hidden layers of each member."""
    reward_lr: float = 3e-4
    """Adam learning rate of the ensemble."""
    reward_batch_size: int = 128
    """Pairs per gradient step of the ensemble."""
    reward_epochs: int = 200
    """Epochs of the ensemble after each round, at most (stops above 97% train accuracy)."""
    pt_embed_dim: int = 256
    """Preference Transformer: token width (paper: 256)."""
    pt_layers: int = 1
    """Preference Transformer: causal transformer blocks (paper: 1)."""
    pt_heads: int = 4
    """Preference Transformer: attention heads per block (paper: 4)."""
    pt_pref_attn_dim: int = 256
    """Preference Transformer: query/key width of the preference attention."""
    pt_dropout: float = 0.1
    """Preference Transformer: dropout of embeddings, attention and residuals."""
    pt_lr: float = 1e-4
    """Preference Transformer: AdamW base learning rate (warm-up to 10x, cosine back)."""
    pt_weight_decay: float = 1e-4
    """Preference Transformer: AdamW weight decay."""
    pt_batch_size: int = 256
    """Preference Transformer: pairs per gradient step."""
    pt_epochs: int = 300
    """Preference Transformer: passes over the labels."""
    reward_scale: str = "return_range"
    """Rewards IQL sees: ``return_range`` scales by 1000 / (max - min episode return) (IQL's
    MuJoCo rule), ``none`` leaves them."""
    # --- agent and schedule
    iql: IQLConfig = field(default_factory=IQLConfig)
    """IQL's hyper-parameters (iql.expectile, iql.temperature, ...: themis/agents/iql.py)."""
    num_train_steps: int = 1_000_000
    """IQL gradient steps (the paper: 1M)."""
    eval_frequency: int = 5000
    """IQL steps between evaluations on the true reward."""
    num_eval_episodes: int = 10
    """Episodes per evaluation (0: none)."""
    log_frequency: int = 1000
    """IQL steps between train.csv rows."""
    checkpoint_frequency: int = 10000
    """IQL steps between checkpoints (and at the end)."""
    ref_min_score: float = math.nan
    """Return of a random policy, for the normalised return (default: the dataset's, if any)."""
    ref_max_score: float = math.nan
    """Return of an expert policy, for the normalised return."""
    resume: str = ""
    """A run dir to continue (the launcher's ``resume=RUN_DIR``)."""


POSITIVE = ("segment", "max_feedback", "reward_batch", "large_batch", "ensemble_size",
            "reward_hidden_dim", "reward_hidden_depth", "reward_batch_size", "pt_embed_dim",
            "pt_layers", "pt_heads", "pt_pref_attn_dim", "pt_batch_size", "num_train_steps",
            "eval_frequency", "log_frequency", "checkpoint_frequency", "torch_threads")
NON_NEGATIVE = ("heldout_queries", "reward_epochs", "pt_epochs", "num_eval_episodes", "seed")


def key_names() -> list[str]:
    """Every top-level key of :class:`OfflineConfig`."""
    return [f.name for f in fields(OfflineConfig)]


def validate(cfg: OfflineConfig) -> None:
    """Refuse values an offline run cannot use, with one line.

    Raises:
        ConfigError: the line.
    """
    if cfg.mode != "offline":
        raise ConfigError(f"mode={cfg.mode}: this entry point runs mode=offline")
    for name in POSITIVE:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be at least 1")
    for name in NON_NEGATIVE:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be 0 or more")
    for name, value, options in (("reward", cfg.reward, REWARDS),
                                 ("reward_net", cfg.reward_net, REWARD_NETS),
                                 ("reward_scale", cfg.reward_scale, REWARD_SCALES),
                                 ("precision", cfg.precision, PRECISIONS)):
        if value not in options:
            raise ConfigError(f"{name}={value} is not one of {', '.join(options)}")
    if cfg.teacher not in PRESETS:
        raise ConfigError(f"teacher={cfg.teacher} is not one of {', '.join(PRESETS)}")
    try:
        sampler = resolve_feed_type(cfg.feed_type)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if sampler != "uniform" and cfg.reward_net == "pt":
        raise ConfigError(f"feed_type={cfg.feed_type} scores pairs with the Markovian ensemble; "
                          "reward_net=pt picks its queries uniformly (feed_type=0)")
    if cfg.pt_embed_dim % cfg.pt_heads:
        raise ConfigError(f"pt_embed_dim={cfg.pt_embed_dim} is not a multiple of "
                          f"pt_heads={cfg.pt_heads}")
    iql = cfg.iql
    if not 0 < iql.expectile < 1:
        raise ConfigError(f"iql.expectile={iql.expectile} must be inside (0, 1)")
    if not 0 <= iql.discount <= 1:
        raise ConfigError(f"iql.discount={iql.discount} must be inside [0, 1]")
    if iql.temperature < 0 or iql.max_weight <= 0 or iql.batch_size < 1:
        raise ConfigError("iql.temperature must be >= 0, iql.max_weight > 0 and "
                          "iql.batch_size >= 1")
    for name in ("reward_lr", "pt_lr"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be positive")
    if not 0 <= cfg.pt_dropout < 1:
        raise ConfigError(f"pt_dropout={cfg.pt_dropout} must be inside [0, 1)")


def register() -> None:
    """Register the schema with Hydra's ConfigStore (name ``offline_schema``)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="offline_schema", node=OfflineConfig)
