"""Typed configuration schema (Hydra structured configs) and validation.

Every knob of a Themis run is a field here, under BPref's key names, so that a typo
(``num_trian_steps=5``) or a wrong type (``num_train_steps=abc``) fails when Hydra composes the
config, before anything runs. :func:`validate` then checks values and combinations.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from themis.agents.intrinsic import SCALES
from themis.agents.ppo import PPOConfig
from themis.agents.sac import SACConfig
from themis.core.precision import PRECISIONS
from themis.core.safe_loading import check_no_resolvers
from themis.crowd.aggregation import check_crowd
from themis.feedback.rating import check_rating
from themis.feedback.sampling import resolve_feed_type
from themis.feedback.selector import resolve_reward_batch
from themis.feedback.teachers import validate_teacher_params
from themis.methods.registry import check_methods, config_fields, numeric_keys
from themis.run.threads import parse_threads
from themis.tracking.settings import LoggerConfig
from themis.utils import (
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_REAL,
    UNIT,
    ConfigError,
    Range,
)

AGENTS = ("auto", "sac", "ppo")


@dataclass
class BaseTrainConfig:
    """Schema of ``config/train_themis.yaml`` and ``config/pretrain_themis.yaml`` without the
    methods' key groups (:data:`TrainConfig` adds one per registered method)."""

    # --- experiment
    domain: str = "Control"
    """Environment family: Control (MuJoCo), DMC (DeepMind Control), MetaWorld, ALE (Atari),
    Box2d, Minigrid, BabyAI, Classic, MovingDot (DRLHP's pixel dot), seals (fixed-horizon
    MuJoCo and diagnostics), Gym (any registered id, also env=module:EnvId)."""
    env: str = "HalfCheetah-v5"
    """Environment name within the domain (short or full gymnasium id)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra gym.make keyword arguments, e.g. ``+env_kwargs.continuous=false`` (CarRacing)."""
    obs_transform: str | None = None
    """Dict observations as one array: a key (obs_transform=image) or a module:function called
    with each observation (DRLHP's obs_transform_func; themis/environments/observations.py)."""
    seed: int = 0
    """Seed of every generator (envs, networks, samplers, teacher)."""
    device: str = "auto"
    """auto (CUDA when present), cpu or cuda."""
    precision: str = "auto"
    """Matrix products of SAC's update and the reward model: ``fp32``, ``bf16`` (bfloat16
    autocast, float32 output layers) or ``auto`` (bf16 on CPUs with bf16 instructions);
    :mod:`themis.core.precision`."""
    torch_threads: Any = "auto"
    """PyTorch intra-op threads: ``auto`` (Themis's measured rule, :mod:`themis.run.threads`: one
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
    (clip((d − mean) / 3 std, −1, 1), Cheng et al. 2024; a method's config may set it)."""
    reset_update: int = 100
    """Gradient updates right after the critic reset that ends pretraining (BPref)."""

    # --- preference learning
    learn_reward: bool = True
    """Train SAC on the learned reward (true) or on the environment reward (false)."""
    num_interact: int = 5000
    """Environment steps between feedback rounds."""
    reward_training: str = "sync"
    """sync: the agent waits while each feedback round asks and trains (PEBBLE); async: a
    background learner process asks and trains while the agent keeps stepping, and each new
    reward-model version relabels the buffer (SAC) or rewards the next rollout (PPO);
    themis/online/loop.py."""
    max_feedback: int = 1000
    """Total queries the teacher may be asked."""
    reward_batch: Any = "auto"
    """Queries per feedback round; ``auto``: ``max_feedback`` / 10 (themis.feedback.selector)."""
    segment: int = 50
    """Steps per segment of a query."""
    large_batch: int = 10
    """Candidate multiplier for the non-uniform samplers."""
    feed_type: Any = 0
    """Query sampler, 0-5 or its name (themis.feedback.sampling)."""
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
    # DRLHP's recipe (Christiano et al. 2017, Sec. 2.2 and App. A; README: DRLHP recipe)
    reward_val_fraction: float = 0.0
    """Share of the labels held out of reward training as a validation set; its loss and
    accuracy go to reward.csv every round (val_loss, val_accuracy). DRLHP: 1/e ≈ 0.368."""
    reward_random_response: float = 0.0
    """ε: the preference model assumes the teacher answers uniformly at random with
    probability ε, P = (1 − ε) · sigmoid(R² − R¹) + ε / 2. DRLHP: 0.1."""
    reward_bootstrap: bool = False
    """Each ensemble member trains on its own bootstrap sample of the labels (DRLHP: on)."""
    reward_dropout: float = 0.0
    """Dropout after every convolution and hidden layer of the reward model. DRLHP (Atari):
    0.5."""
    reward_batchnorm: bool = False
    """Batch normalisation of every convolution and hidden layer (DRLHP, Atari: on)."""
    reward_l2: float = 0.0
    """L2 coefficient of the reward members' weights (the start value when adaptive)."""
    reward_adaptive_l2: bool = False
    """Adapt each member's L2 coefficient after every epoch to keep the validation loss within
    1.1–1.5 × the training loss (DRLHP: on; needs reward_val_fraction > 0)."""
    reward_norm_std: float = 0.0
    """0: the policy gets the raw ensemble mean r̂. > 0: each member normalised to zero mean and
    this standard deviation, then averaged, in the PEBBLE relabel and PPO's rollouts. DRLHP:
    0.05 (Atari), 1 (MuJoCo)."""
    query_schedule: str = "constant"
    """constant (reward_batch queries per round) or decay: the labelling rate falls as
    query_decay_steps / (T + query_decay_steps) at step T, the budget spread over the rounds
    (DRLHP)."""
    query_decay_steps: int = 2_000_000
    """T₀ of query_schedule=decay. DRLHP: 2·10⁶ (MuJoCo), 5·10⁶ frames (Atari)."""

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
    label_instructions: str = ""
    """human_teacher: what "better" means for this run, shown to people on the labeling page
    and in the terminal: the text itself, or a .md / .txt file holding it (shown as text)."""
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
    """train: start from a snapshot written by themis_pretrain.sh (or, agent only, from a
    run's checkpoints/agent.pt)."""
    pretrained_policy: str | None = None
    """Start the agent from a Stable-Baselines3 model (.zip of SAC for Box actions, PPO or A2C
    for Discrete) with the same network shapes; read without unpickling (themis/agents/sb3.py)."""
    prefs_path: str | None = None
    """A saved preference dataset (folder) the reward model is trained on before any query;
    with max_feedback=0 the reward is learned from it alone."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Where rows go besides the CSV files (config group): logger=tensorboard, logger=wandb,
    logger=mlflow or several, logger=[wandb,mlflow]; settings logger.* (README: Tracking)."""

    agent: str = "auto"
    """auto (SAC for Box action spaces, PPO for Discrete), sac or ppo."""
    reset_critic: bool = True
    """Reset SAC's critic at the end of pretraining (PEBBLE; a method's config may keep it)."""
    sac: SACConfig = field(default_factory=lambda: SACConfig(hidden_dim=128))
    """SAC hyper-parameters (hidden 128: fits the 20-min main job on 2 cores; SB3 256)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters (discrete actions)."""


if TYPE_CHECKING:
    class TrainConfig(BaseTrainConfig):
        """The whole schema (see below); a method's group is ``cfg.<name>``."""

        def __getattr__(self, name: str) -> Any: ...
else:
    TrainConfig = make_dataclass("TrainConfig", config_fields(), bases=(BaseTrainConfig,))
    TrainConfig.__module__ = __name__  # pickles and reads as themis.run.config.TrainConfig
    TrainConfig.__doc__ = """Schema of ``config/train_themis.yaml`` and
    ``config/pretrain_themis.yaml``: :class:`BaseTrainConfig` and one ``<name>.*`` group per
    method of :data:`themis.methods.registry.REGISTRY` (its ``Config`` dataclass)."""


CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


# ---------------------------------------------------------------- numeric keys: one table
NUMERIC_KEYS: dict[str, Range] = {
    # experiment
    "seed": Range(0, 2**31 - 1),  # np.random.seed takes < 2**32; evaluation adds 10000
    # torch_threads: auto or a count (themis.run.threads.parse_threads, checked in validate)
    # schedule
    "num_train_steps": POSITIVE, "replay_buffer_capacity": NON_NEGATIVE,
    "num_seed_steps": NON_NEGATIVE, "num_unsup_steps": NON_NEGATIVE, "topK": POSITIVE,
    "entropy_pool_size": POSITIVE, "reset_update": NON_NEGATIVE,
    # preference learning
    "num_interact": POSITIVE, "max_feedback": NON_NEGATIVE, "reward_batch": POSITIVE,
    "segment": POSITIVE, "large_batch": POSITIVE, "query_pool_episodes": POSITIVE,
    "ensemble_size": POSITIVE, "reward_lr": POSITIVE_REAL, "reward_update": POSITIVE,
    "reward_train_batch": POSITIVE, "reward_hidden_dim": POSITIVE,
    "reward_hidden_depth": NON_NEGATIVE,
    "reward_val_fraction": Range(0, 1, hi_open=True),
    "reward_random_response": Range(0, 1, hi_open=True),
    "reward_dropout": Range(0, 1, hi_open=True), "reward_l2": Range(0),
    "reward_norm_std": Range(0), "query_decay_steps": POSITIVE,
    # teacher
    "teacher_beta": Range(-1, text="must be -1 (perfectly rational) or a finite number > 0"),
    "teacher_gamma": Range(0, 1, lo_open=True), "teacher_eps_mistake": UNIT,
    "teacher_eps_skip": UNIT, "teacher_eps_equal": UNIT,
    "label_port": Range(0, 65535, text="is not a TCP port; use 1-65535, or 0 for any free port"),
    "labelers": NON_NEGATIVE, "labels_per_query": POSITIVE, "rating_classes": Range(2, 9),
    "rating_k": POSITIVE_REAL, "min_labels_before_training": NON_NEGATIVE,
    "gold_fraction": UNIT, "min_gold_accuracy": UNIT, "min_gold_answers": POSITIVE,
    "human_frame_size": Range(16, 4096), "human_frame_capacity": POSITIVE,
    "clip_fps": Range(1, 240), "xplain_action_dim": Range(-1), "xplain_top_k": POSITIVE,
    "xplain_clips_per_round": NON_NEGATIVE,
    # evaluation, logging, snapshots
    "eval_frequency": POSITIVE, "num_eval_episodes": POSITIVE, "log_frequency": POSITIVE,
    "checkpoint_frequency": POSITIVE, "logger.clips": NON_NEGATIVE,
    "logger.finish_timeout": POSITIVE,
    # agents
    "sac.hidden_dim": POSITIVE, "sac.hidden_depth": NON_NEGATIVE, "sac.batch_size": POSITIVE,
    "sac.discount": UNIT, "sac.actor_lr": POSITIVE_REAL, "sac.critic_lr": POSITIVE_REAL,
    "sac.alpha_lr": POSITIVE_REAL, "sac.init_temperature": POSITIVE_REAL,
    "sac.critic_tau": Range(0, 1, lo_open=True), "sac.actor_update_frequency": POSITIVE,
    "sac.critic_target_update_frequency": POSITIVE, "sac.log_std_min": Range(),
    "sac.log_std_max": Range(),
    "ppo.hidden_dim": POSITIVE, "ppo.hidden_depth": NON_NEGATIVE, "ppo.num_envs": POSITIVE,
    "ppo.num_steps": POSITIVE, "ppo.learning_rate": POSITIVE_REAL, "ppo.gamma": UNIT,
    "ppo.gae_lambda": UNIT, "ppo.num_minibatches": POSITIVE, "ppo.update_epochs": POSITIVE,
    "ppo.clip_coef": POSITIVE_REAL, "ppo.ent_coef": NON_NEGATIVE, "ppo.vf_coef": NON_NEGATIVE,
    "ppo.max_grad_norm": POSITIVE_REAL,
}
"""Every numeric key of the train/pretrain config and its method and agent groups, with the
values it takes (``reward_batch`` once ``auto`` is resolved; ``feed_type`` is a name or code,
checked by :func:`themis.feedback.sampling.resolve_feed_type`). A key of ``None`` (a default left to
Themis) is not checked."""
NUMERIC_KEYS.update(numeric_keys())  # each method's own keys (its RANGES)



def check_numbers(cfg: Any) -> None:
    """Every key of :data:`NUMERIC_KEYS`: finite (no NaN, no inf) and inside its range, and the
    numeric combinations that must hold (``sac.log_std_min < sac.log_std_max``, a PPO rollout
    that fills its minibatches).

    Raises:
        ConfigError: ``KEY=VALUE`` and the rule it breaks, for the first key that breaks one.
    """
    for key, allowed in NUMERIC_KEYS.items():
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value is not None and not allowed.holds(value):
            raise ConfigError(f"{key}={value} {allowed.rule(value)}")
    if cfg.sac.log_std_min >= cfg.sac.log_std_max:
        raise ConfigError(f"sac.log_std_min={cfg.sac.log_std_min} must be smaller than "
                          f"sac.log_std_max={cfg.sac.log_std_max}")
    if cfg.ppo.num_minibatches > cfg.ppo.num_envs * cfg.ppo.num_steps:
        raise ConfigError(f"ppo.num_minibatches={cfg.ppo.num_minibatches} is more than the "
                          f"{cfg.ppo.num_envs * cfg.ppo.num_steps} transitions of a rollout "
                          "(ppo.num_envs * ppo.num_steps)")


QUERY_SCHEDULES = ("constant", "decay")


def check_recipe(cfg: Any) -> None:
    """DRLHP's keys (``reward_val_fraction`` ... ``query_schedule``): combinations that do
    something.

    Raises:
        ConfigError: an unknown ``query_schedule``, an adaptive L2 without held-out labels, or
            a pairwise-only key with ``feedback=rating``.
    """
    if cfg.query_schedule not in QUERY_SCHEDULES:
        raise ConfigError(f"query_schedule={cfg.query_schedule} is unknown; use "
                          f"{' or '.join(QUERY_SCHEDULES)}")
    if cfg.reward_adaptive_l2 and not cfg.reward_val_fraction:
        raise ConfigError("reward_adaptive_l2=true adapts the L2 coefficient to the validation "
                          "loss: hold labels out with reward_val_fraction (DRLHP: 0.368)")
    if cfg.feedback == "rating":
        pairwise = [key for key in ("reward_val_fraction", "reward_random_response",
                                    "reward_bootstrap", "reward_l2", "reward_adaptive_l2")
                    if getattr(cfg, key)]
        if pairwise:
            raise ConfigError(f"{pairwise[0]} is a key of pairwise preferences; "
                              "feedback=rating does not use it: drop it")


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


# ---------------------------------------------------------------- configs from elsewhere
def named_code(cfg: Any) -> dict[str, str]:
    """Config values that name code for this process to import and call:
    ``obs_transform=module:function`` and ``env=module:EnvId`` (``domain=Gym`` imports the
    module). Keys with such values -> the values."""
    found = {}
    for key in ("obs_transform", "env"):
        value = cfg.get(key) if isinstance(cfg, dict | DictConfig) else getattr(cfg, key, None)
        if isinstance(value, str) and ":" in value:
            found[key] = value
    return found


def check_named_code(cfg: Any, where: str | Path, given: Collection[str] = ()) -> None:
    """Refuse a received config (another person's run folder) that names code to import
    (:func:`named_code`): a run folder can carry a Python module of its own, and importing
    it would run it. A key the command line sets (``given``) is the user's own choice.

    Raises:
        ConfigError: the first such key, and how to confirm it.
    """
    for key, value in named_code(cfg).items():
        if key not in given:
            raise ConfigError(f"{where}: {key}={value} names code to import and run "
                              f"({value.split(':')[0]}); a received config may not: repeat "
                              f"{key}={value} on the command line if you trust it")


def load_received_config(path: str | Path) -> DictConfig:
    """A run's ``config.yaml`` as the schema reads it, refusing what a crafted file could do:
    resolver calls (:func:`themis.core.safe_loading.check_no_resolvers`), no YAML mapping,
    keys or types the schema does not know.

    Raises:
        ConfigError: one line naming the file and the problem.
    """
    from omegaconf import ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        raw = OmegaConf.load(path)
    except (OSError, UnicodeDecodeError, YAMLError, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{path} is not a readable YAML config ({first})") from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path} is not a Themis config (no key: value mapping)")
    check_no_resolvers(raw, path)
    if isinstance(raw.get("logger"), ListConfig):  # runs before the logger group: [csv, ...]
        raw.logger = {"tensorboard": "tensorboard" in list(raw.logger)}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), raw)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "a value"
        raise ConfigError(f"{path}: {key}: {str(e).splitlines()[0]}") from None
    assert isinstance(merged, DictConfig)
    return merged


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


REWARD_TRAININGS = ("sync", "async")


def check_reward_training(cfg: Any) -> None:
    """``reward_training``: sync or async; what async cannot do is refused.

    Raises:
        ConfigError: one line: an unknown value, or with async: no learned reward, a resume,
            a method or option that needs the agent inside the learner (a method's
            ``inside_agent`` or its own async rule, explanations).
    """
    if cfg.reward_training not in REWARD_TRAININGS:
        raise ConfigError(f"reward_training={cfg.reward_training} is unknown; use sync or async")
    if cfg.reward_training == "sync":
        return
    why = None
    if not cfg.learn_reward:
        why = "learn_reward=false has no reward to learn"
    elif cfg.resume:
        why = ("resume of an async run is not supported (the background learner's labels and "
               "the agent's checkpoint are not saved together); start a new run with "
               "prefs_path=RUN_DIR/preferences to keep its labels")
    elif cfg.xplain_action or cfg.xplain_state:
        why = "explained clips need the agent inside the learner process"
    elif cfg.query_schedule != "constant" or cfg.reward_norm_std:
        why = ("the DRLHP query schedule and reward normalisation (query_schedule=decay, "
               "reward_norm_std) run in the loop's own learner")
    if why is not None:
        raise ConfigError(f"reward_training=async: {why}; use reward_training=sync")
    check_methods(cfg, where="async")  # a method inside the agent, or its own async rule


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
    try:
        parse_threads(cfg.torch_threads)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"precision={cfg.precision} is not one of {', '.join(PRECISIONS)}")
    check_numbers(cfg)
    if cfg.num_seed_steps + cfg.num_unsup_steps >= cfg.num_train_steps:
        raise ConfigError(
            f"num_seed_steps + num_unsup_steps ({cfg.num_seed_steps + cfg.num_unsup_steps}) "
            f"must be smaller than num_train_steps ({cfg.num_train_steps})"
        )
    if cfg.learn_reward and not cfg.prefs_path and cfg.max_feedback < cfg.reward_batch:
        raise ConfigError(f"max_feedback={cfg.max_feedback} is smaller than "
                          f"reward_batch={cfg.reward_batch}; raise max_feedback")
    if cfg.pretrained_policy and cfg.pretrained_snapshot:
        raise ConfigError("pretrained_policy and pretrained_snapshot are both set: a snapshot "
                          "holds its own agent; drop one of them")
    if cfg.prefs_path and not cfg.learn_reward:
        raise ConfigError("prefs_path is set but learn_reward=false; drop one of them")
    try:
        resolve_feed_type(cfg.feed_type)
        validate_teacher_params(cfg.teacher_beta, cfg.teacher_gamma, cfg.teacher_eps_mistake,
                                cfg.teacher_eps_skip, cfg.teacher_eps_equal)
    except ValueError as e:
        raise ConfigError(str(e)) from None
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
    check_reward_training(cfg)
    check_recipe(cfg)
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
