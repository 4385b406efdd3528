"""Typed configuration schema (Hydra structured configs) and validation.

Every knob of a Themis run is a field here, under BPref's key names, so that a typo
(``num_trian_steps=5``) or a wrong type (``num_train_steps=abc``) fails when Hydra composes the
config, before anything runs. :func:`validate` then checks values and combinations.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from themis.agents.ppo import PPOConfig
from themis.agents.sac import SACConfig
from themis.crowd import check_crowd
from themis.feedback.rating import check_rating
from themis.feedback.selector import resolve_reward_batch
from themis.intrinsic import SCALES
from themis.methods import check_methods
from themis.methods.mrn import MRNConfig
from themis.methods.qpa import QPAConfig
from themis.methods.rime import RIMEConfig
from themis.methods.rune import RUNEConfig
from themis.methods.surf import SURFConfig
from themis.sampling import resolve_feed_type
from themis.teachers import validate_teacher_params
from themis.threads import parse_threads
from themis.utils import ConfigError

AGENTS = ("auto", "sac", "ppo")


@dataclass
class TrainConfig:
    """Schema of ``config/train_themis.yaml`` and ``config/pretrain_themis.yaml``."""

    # --- experiment
    domain: str = "Control"
    """Environment family: Control (MuJoCo), DMC (DeepMind Control), MetaWorld, ALE (Atari),
    Box2d, Minigrid, BabyAI, Classic."""
    env: str = "HalfCheetah-v5"
    """Environment name within the domain (short or full gymnasium id)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra gym.make keyword arguments, e.g. ``+env_kwargs.continuous=false`` (CarRacing)."""
    seed: int = 0
    """Seed of every generator (envs, networks, samplers, teacher)."""
    device: str = "auto"
    """auto (CUDA when present), cpu or cuda."""
    torch_threads: Any = "auto"
    """PyTorch intra-op threads: ``auto`` (Themis's measured rule, :mod:`themis.threads`: one
    thread for small vector networks, more for CNNs and wide networks, one while other processes
    use the cores), ``0`` (PyTorch's default: all cores) or a fixed count. In a local ``-m``
    sweep ``auto`` and ``0`` mean ``cores // n_jobs``."""

    # --- schedule (environment steps)
    num_train_steps: int = 80_000
    """Total environment steps, pretraining included."""
    replay_buffer_capacity: int = 0
    """Replay buffer size; 0 means num_train_steps (SAC) or min(num_train_steps, 100000) for PPO,
    whose stored episodes only feed the queries."""
    num_seed_steps: int = 1000
    """Steps of uniformly random actions at the start."""
    num_unsup_steps: int = 5000
    """Steps of unsupervised pretraining on the state-entropy reward (PEBBLE)."""
    topK: int = 5
    """k of the k-NN state-entropy estimate."""
    entropy_pool_size: int = 10_000
    """Replay states sampled as k-NN references for each batch."""
    state_entropy_scale: str = "std"
    """Pretraining reward from the k-NN distance d: std (PEBBLE: d / running std) or centred
    (RIME: clip((d − mean) / 3 std, −1, 1); ``method=rime`` sets it)."""
    reset_update: int = 100
    """Gradient updates right after the critic reset that ends pretraining (BPref)."""

    # --- preference learning
    learn_reward: bool = True
    """Train SAC on the learned reward (true) or on the environment reward (false)."""
    num_interact: int = 5000
    """Environment steps between feedback rounds."""
    max_feedback: int = 1000
    """Total queries the teacher may be asked."""
    reward_batch: Any = "auto"
    """Queries per feedback round; ``auto``: ``max_feedback`` / 10 (themis.feedback.selector)."""
    segment: int = 50
    """Steps per segment of a query."""
    large_batch: int = 10
    """Candidate multiplier for the non-uniform samplers."""
    feed_type: Any = 0
    """Query sampler, 0-5 or its name (themis.sampling)."""
    query_pool_episodes: int = 100
    """Queries are cut from the most recent this-many episodes."""
    ensemble_size: int = 3
    """Reward-model ensemble members (B-Pref: 3)."""
    reward_lr: float = 3e-4
    """Learning rate of the reward ensemble (Adam)."""
    reward_update: int = 50
    """Maximum reward-model epochs per feedback round (stops early at 97 % train accuracy)."""
    reward_train_batch: int = 128
    """Preference pairs per reward-model minibatch."""
    reward_hidden_dim: int = 256
    """Width of the reward members' hidden layers."""
    reward_hidden_depth: int = 3
    """Hidden layers of each reward member."""

    # --- teacher (B-Pref)
    teacher_beta: float = -1.0
    """-1: perfectly rational; > 0: Bradley–Terry rationality."""
    teacher_gamma: float = 1.0
    """Myopia: step t of a segment weighs gamma^(H-1-t) (1 = no discount)."""
    teacher_eps_mistake: float = 0.0
    """Probability that a strict label is flipped."""
    teacher_eps_skip: float = 0.0
    """Skip a pair when neither return exceeds eps_skip * margin."""
    teacher_eps_equal: float = 0.0
    """Label 0.5 when the returns differ by less than eps_equal * margin."""
    teacher_thres_schedule: str = "themis"
    """Skip/equal thresholds: themis (eps * margin in every round, as the B-Pref paper) or
    bpref (eps * margin in the first round, eps² * margin later, as B-Pref's train_PEBBLE.py)."""
    human_teacher: bool = False
    """A person labels the queries in the terminal (lib/human_interface.py)."""
    teacher_ui: str = "terminal"
    """human_teacher: terminal (answer while the run waits) or web (a labeling page; training
    goes on and uses the answers that have arrived at each round)."""
    label_host: str = "127.0.0.1"
    """teacher_ui=web: address the labeling server binds (non-loopback needs labelers=N)."""
    label_port: int = 8765
    """teacher_ui=web: TCP port of the labeling server; 0 = any free port (the address is
    printed and written to RUN_DIR/web/server.json)."""
    labelers: int = 0
    """teacher_ui=web: labeler tokens to create (0: one anonymous labeler, loopback only)."""
    labels_per_query: int = 1
    """teacher_ui=web: different labelers asked per query."""
    feedback: str = "pairwise"
    """pairwise ("which of two clips is better?") or rating (one clip at a time, rated into
    rating_classes ordered classes; Rating-based RL, White et al. 2024; themis/reward/rating.py).
    A query is one answer either way, so max_feedback compares them at equal effort."""
    rating_classes: int = 4
    """feedback=rating: ordered classes (0 = worst; keys / buttons 1 … n)."""
    rating_k: float = 30.0
    """feedback=rating: sharpness k of the rating model's class probabilities."""
    label_aggregate: str = "each"
    """teacher_ui=web: each (every answer is a label) or majority (one label per query)."""
    min_labels_before_training: int = 0
    """teacher_ui=web: wait for this many labels before the reward model is first trained."""
    gold_fraction: float = 0.0
    """teacher_ui=web: gold queries (known answer) added per query posted, e.g. 0.1; they
    look like the others, score the labelers and are not training labels."""
    gold_path: str | None = None
    """teacher_ui=web: a preference dataset whose labels are the gold answers (default: pairs
    whose true returns differ most, answered by the env's reward)."""
    label_quality: str = "none"
    """teacher_ui=web: none, filter (drop the answers of labelers whose gold accuracy is
    below min_gold_accuracy after min_gold_answers gold answers, earlier ones too) or model
    (one label per query from a Dawid–Skene crowd model, crowd-kit, gold answers clamped;
    replaces label_aggregate)."""
    min_gold_accuracy: float = 0.7
    """label_quality=filter: gold accuracy a labeler needs to keep counting."""
    min_gold_answers: int = 5
    """label_quality=filter: gold answers before a labeler can be flagged."""
    human_piped: bool = False
    """human_teacher: read answers line by line from a pipe instead of keys from a terminal."""
    human_labeler: str = ""
    """human_teacher: the labeler's name stored with each answer (default: the login name)."""
    human_viewer: str = "auto"
    """human_teacher: how clips are shown: auto (system viewer when a display exists), system,
    none (print the path only)."""
    human_frame_size: int | None = None
    """Height in pixels of the stored and shown clip frames; default 256 when a person labels
    (a gait is clear in the web page's clip), 128 for explained clips of a synthetic teacher."""
    human_frame_capacity: int | None = None
    """Most recent steps whose frames are kept; queries come from these. Default 5000 at 256
    px (1 GB for square frames), 10000 below (0.5 GB at 128 px)."""
    clip_fps: int = 20
    """Frames per second of query clips."""
    collect_prefs_only: bool = False
    """Ask for labels and train the reward model, but keep the agent on the intrinsic
    (state-entropy) reward: collect preferences now, train an agent on them later (prefs_path)."""
    xplain_action: bool = False
    """Captum attributions of the policy's action, drawn under each query clip."""
    xplain_state: bool = False
    """Captum attributions of the learned reward r̂(s, a), drawn under each query clip."""
    xplain_method: str = "integrated_gradients"
    """integrated_gradients, saliency or gradient_shap (lib/explain.py METHODS)."""
    xplain_baseline: str = "zeros"
    """Baseline of integrated_gradients (and saliency's unused one): zeros or mean (replay-buffer
    mean); gradient_shap always draws baselines from the replay buffer."""
    xplain_action_dim: int = -1
    """SAC: the action dimension explained, or -1 for the norm of the mean action."""
    xplain_top_k: int = 5
    """Features shown per frame in vector-observation panels."""
    xplain_clips_per_round: int = 4
    """Synthetic teachers: explained clips saved per feedback round (a person sees every one)."""

    # --- evaluation, logging, snapshots
    eval_frequency: int = 10_000
    """Environment steps between evaluations on the true reward."""
    num_eval_episodes: int = 5
    """Episodes per evaluation (mean true return in eval.csv)."""
    log_frequency: int = 5000
    """Steps between console lines."""
    save_snapshot: bool = True
    """pretrain: write snapshot.pt at the end of pretraining."""
    checkpoint_frequency: int = 10_000
    """Steps between full checkpoints (checkpoints/state.pt); also after every feedback round."""
    resume: str | None = None
    """Continue a run from its last checkpoint: resume=RUN_DIR, or resume=true with
    hydra.run.dir=RUN_DIR. The run's saved config is used; other overrides on the command line
    are applied on top (e.g. a larger num_train_steps)."""
    pretrained_snapshot: str | None = None
    """train: start from a snapshot written by themis_pretrain.sh."""
    prefs_path: str | None = None
    """A saved preference dataset (folder) the reward model is trained on before any query;
    with max_feedback=0 the reward is learned from it alone."""
    logger: list[str] = field(default_factory=lambda: ["csv"])
    """Log backends: csv (always written) and tensorboard: logger=[csv,tensorboard]."""

    agent: str = "auto"
    """auto (SAC for Box action spaces, PPO for Discrete), sac or ppo."""
    reset_critic: bool = True
    """Reset SAC's critic at the end of pretraining (PEBBLE; RIME keeps it)."""
    surf: SURFConfig = field(default_factory=SURFConfig)
    """SURF (method=surf): pseudo-labels and temporal cropping (themis/methods/surf.py)."""
    rune: RUNEConfig = field(default_factory=RUNEConfig)
    """RUNE (method=rune): reward + beta_t x ensemble std (themis/methods/rune.py)."""
    qpa: QPAConfig = field(default_factory=QPAConfig)
    """QPA (method=qpa): recent-episode queries and replay, crops (themis/methods/qpa.py)."""
    rime: RIMEConfig = field(default_factory=RIMEConfig)
    """RIME (method=rime): robust label selection, warm start (themis/methods/rime.py)."""
    mrn: MRNConfig = field(default_factory=MRNConfig)
    """MRN (method=mrn): bilevel reward update through the critic (themis/methods/mrn.py)."""
    sac: SACConfig = field(default_factory=lambda: SACConfig(hidden_dim=128))
    """SAC hyper-parameters (hidden 128: fits the 20-min main job on 2 cores; SB3 256)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters (discrete actions)."""


CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"


def frame_size(cfg: Any) -> int:
    """``human_frame_size``, or its default: 256 px when a person labels, else 128."""
    return int(cfg.human_frame_size or (256 if cfg.human_teacher else 128))


def frame_capacity(cfg: Any) -> int:
    """``human_frame_capacity``, or its default: 5000 frames at 256 px and more, else 10000
    (about 1 GB and 0.5 GB of square RGB frames)."""
    return int(cfg.human_frame_capacity or (5_000 if frame_size(cfg) >= 256 else 10_000))


def job_prefix() -> str:
    """``[job N] `` inside a Hydra multirun (``-m``), where parallel jobs print to one
    terminal; ``""`` otherwise (also outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return ""
    hydra_cfg = HydraConfig.get()
    return f"[job {hydra_cfg.job.num}] " if hydra_cfg.mode == RunMode.MULTIRUN else ""


def resume_target(value: object) -> str | None:
    """What ``resume=`` asks for: ``None`` (no resume: unset, false, no, 0, none, null),
    ``"here"`` (true, yes, 1: the run dir of this job) or the run dir given."""
    text = "" if value is None else str(value).strip()
    if text.lower() in ("", "false", "0", "no", "none", "null"):
        return None
    return "here" if text.lower() in ("true", "1", "yes") else text


def compose(overrides: list[str] | None = None, name: str = "train_themis",
            return_hydra_config: bool = False) -> DictConfig:
    """Compose ``config/<name>.yaml`` with command-line style ``overrides``, as the launchers
    do (for scripts, tests and the entry point's preflight).

    Raises:
        hydra.errors.HydraException, omegaconf.errors.OmegaConfBaseException: bad overrides.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=name, overrides=overrides or [],
                             return_hydra_config=return_hydra_config)


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (name ``train_schema``)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)


def validate(cfg: Any) -> None:
    """Check values and combinations Hydra's type checks cannot see.

    Args:
        cfg: a composed ``DictConfig`` or a :class:`TrainConfig`.

    Raises:
        ConfigError: with one line naming the key, the problem and the fix.
    """
    if resume_target(cfg.resume) is None:
        cfg.resume = None
    try:
        cfg.reward_batch = resolve_reward_batch(cfg.reward_batch, cfg.max_feedback)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    positive = ["num_train_steps", "topK", "entropy_pool_size", "num_interact",
                "reward_batch", "segment", "large_batch", "ensemble_size", "reward_update",
                "reward_train_batch", "reward_hidden_dim", "eval_frequency",
                "num_eval_episodes", "log_frequency", "query_pool_episodes",
                "checkpoint_frequency"]
    for key in positive:
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"{key}={getattr(cfg, key)} must be positive")
    try:
        parse_threads(cfg.torch_threads)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for key in ["num_seed_steps", "num_unsup_steps", "reset_update", "replay_buffer_capacity",
                "max_feedback"]:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key}={getattr(cfg, key)} must be >= 0")
    for key, value in (("reward_lr", cfg.reward_lr), ("sac.actor_lr", cfg.sac.actor_lr),
                       ("sac.critic_lr", cfg.sac.critic_lr), ("sac.alpha_lr", cfg.sac.alpha_lr),
                       ("ppo.learning_rate", cfg.ppo.learning_rate)):
        if not value > 0 or value == float("inf"):  # also NaN and inf
            raise ConfigError(f"{key}={value} must be a positive number")
    if cfg.num_seed_steps + cfg.num_unsup_steps >= cfg.num_train_steps:
        raise ConfigError(
            f"num_seed_steps + num_unsup_steps ({cfg.num_seed_steps + cfg.num_unsup_steps}) "
            f"must be smaller than num_train_steps ({cfg.num_train_steps})"
        )
    if cfg.learn_reward and not cfg.prefs_path and cfg.max_feedback < cfg.reward_batch:
        raise ConfigError(f"max_feedback={cfg.max_feedback} is smaller than "
                          f"reward_batch={cfg.reward_batch}; raise max_feedback")
    if cfg.prefs_path and not cfg.learn_reward:
        raise ConfigError("prefs_path is set but learn_reward=false; drop one of them")
    unknown = sorted(set(cfg.logger) - {"csv", "tensorboard"})
    if unknown:
        raise ConfigError(f"logger={','.join(cfg.logger)}: unknown backend {unknown[0]!r}; use "
                          "logger=[csv] or logger=[csv,tensorboard]")
    try:
        resolve_feed_type(cfg.feed_type)
        validate_teacher_params(cfg.teacher_beta, cfg.teacher_gamma, cfg.teacher_eps_mistake,
                                cfg.teacher_eps_skip, cfg.teacher_eps_equal)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for key in ("human_frame_size", "human_frame_capacity"):
        if getattr(cfg, key) is not None and getattr(cfg, key) <= 0:
            raise ConfigError(f"{key}={getattr(cfg, key)} must be positive")
    for key in ("clip_fps", "xplain_top_k"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"{key}={getattr(cfg, key)} must be positive")
    check_methods(cfg)
    if cfg.state_entropy_scale not in SCALES:
        raise ConfigError(f"state_entropy_scale={cfg.state_entropy_scale} is unknown; use "
                          f"{' or '.join(SCALES)}")
    if cfg.teacher_thres_schedule not in ("themis", "bpref"):
        raise ConfigError(f"teacher_thres_schedule={cfg.teacher_thres_schedule} is unknown; use "
                          "themis or bpref")
    if cfg.teacher_ui not in ("terminal", "web"):
        raise ConfigError(f"teacher_ui={cfg.teacher_ui} is unknown; use terminal or web")
    check_crowd(cfg)
    check_rating(cfg)
    if not 0 <= cfg.label_port <= 65535:
        raise ConfigError(f"label_port={cfg.label_port} is not a TCP port; use 1-65535, or 0 "
                          "for any free port")
    for key in ("labelers", "min_labels_before_training"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key}={getattr(cfg, key)} must be >= 0")
    if cfg.human_teacher and cfg.teacher_ui == "web":
        from ipaddress import ip_address

        try:
            loopback = cfg.label_host == "localhost" or ip_address(cfg.label_host).is_loopback
        except ValueError:
            loopback = False
        if not loopback and cfg.labelers == 0:
            raise ConfigError(f"label_host={cfg.label_host} exposes the labeling page beyond "
                              "this machine: create labeler tokens with labelers=N")
        if cfg.labels_per_query > max(1, cfg.labelers):
            raise ConfigError(f"labels_per_query={cfg.labels_per_query} needs at least that "
                              f"many labelers (labelers={cfg.labelers})")
    if cfg.human_viewer not in ("auto", "system", "none"):
        raise ConfigError(f"human_viewer={cfg.human_viewer} is unknown; use auto, system or none")
    if cfg.xplain_baseline not in ("zeros", "mean"):
        raise ConfigError(f"xplain_baseline={cfg.xplain_baseline} is unknown; use zeros or mean")
    if cfg.xplain_clips_per_round < 0:
        raise ConfigError(f"xplain_clips_per_round={cfg.xplain_clips_per_round} must be >= 0")
    for key in ("human_teacher", "collect_prefs_only", "xplain_action", "xplain_state"):
        if getattr(cfg, key) and not cfg.learn_reward:
            raise ConfigError(f"{key}=true needs learn_reward=true (preferences are only asked "
                              "for a learned reward)")
    if cfg.human_teacher or cfg.xplain_action or cfg.xplain_state:
        if frame_capacity(cfg) < cfg.segment:
            raise ConfigError(f"human_frame_capacity={frame_capacity(cfg)} is smaller than "
                              f"segment={cfg.segment}: no clip could be shown")
        if cfg.human_teacher and cfg.teacher_ui == "terminal" and not cfg.human_piped \
                and not sys.stdin.isatty():
            raise ConfigError("human_teacher=true needs a terminal, but stdin is not a TTY; run "
                              "it in a terminal, or pipe answers on purpose with "
                              "human_piped=true")
    if cfg.agent not in AGENTS:
        raise ConfigError(f"agent={cfg.agent} is unknown; use one of {', '.join(AGENTS)}")
    ppo = cfg.ppo
    for key in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "hidden_dim"):
        if getattr(ppo, key) <= 0:
            raise ConfigError(f"ppo.{key}={getattr(ppo, key)} must be positive")
    for key in ("hidden_dim", "batch_size"):
        if getattr(cfg.sac, key) <= 0:
            raise ConfigError(f"sac.{key}={getattr(cfg.sac, key)} must be positive")
