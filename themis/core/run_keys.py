"""The run's flat keys (:class:`RunKeys`): every knob of a Themis run that is one value, each
documented under its field, with the range of each number (:data:`RANGES`).

On the core floor so that every package that reads a run's keys (the agents, the reward model,
the methods, the crowd, the feedback component) is typed against it: ``cfg.reward_batch`` jumps
to its field, its docstring and its range, and mypy checks the read.
:class:`themis.run.config.TrainConfig` extends it with the key groups (``logger.*``, ``sac.*``,
``ppo.*``, ``a2c.*`` and one per method), and is what a run passes; the groups a lower floor
needs it takes as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from themis.core.ranges import (
    BATCH,
    DEPTH,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_REAL,
    UNIT,
    WIDTH,
    Range,
)


@dataclass
class RunKeys:
    """The flat keys of ``config/train_themis.yaml`` and ``config/pretrain_themis.yaml``, under
    BPref's names (:class:`themis.run.config.TrainConfig` adds the key groups)."""

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
    """PyTorch intra-op threads: ``auto`` (one thread, :mod:`themis.run.threads`; the banner
    names a larger count for CNNs and wide networks that have the cores to themselves), ``0``
    (PyTorch's default: all cores) or a fixed count. In a local ``-m`` sweep ``auto`` and ``0``
    mean ``cores // n_jobs``."""

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
    # DRLHP's recipe (Christiano et al. 2017, Sec. 2.2 and App. A; docs/guide/methods/drlhp.md)
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
    reward_compile: bool = False
    """torch.compile the reward model's image encoders (fused batch norm, leaky ReLU and dropout
    around oneDNN's convolutions: DRLHP's network trains about a fifth faster on a CPU; the
    first minibatches of each process compile, about 30 s; same weights and state dict)."""
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
    (DRLHP); continuous (async and the wrappers): reward_batch queries whenever the teacher has
    answered and new steps came (DRLHP's interface). The background learner counts what is due
    by the agent's step, so late rounds catch up (themis/online/stream.py)."""
    query_decay_steps: int = 2_000_000
    """T₀ of query_schedule=decay, in agent steps. DRLHP: 2·10⁶ (MuJoCo, where a step is a
    frame), 5·10⁶ frames (Atari) = 1.25·10⁶ agent steps at frame skip 4."""
    first_round_queries: int = 0
    """Queries of the first feedback round; 0: as the query schedule. DRLHP: 500 labels from
    the random policy (mrahtz's n_initial_prefs)."""
    reward_net: str = "bpref"
    """bpref (a Nature-DQN CNN per member for pixels, then a 3×reward_hidden_dim tanh MLP over
    features and action), drlhp (the paper's Atari network: 4 convolutions of 16 filters, FC
    64, a scalar; no action input; dropout / batch norm on the convolutions only), drlhp_dot
    (mrahtz's MovingDot network: the dot's position and the action index / 4 into an MLP
    64-64-64-1) or drlhp_dot_onehot (the same with the action one-hot).
    themis/reward/networks.py."""
    reward_shared_trunk: bool = False
    """One CNN for every ensemble member, each with its own head (pixels)."""
    reward_schedule: str = "rounds"
    """rounds: up to reward_update epochs over every label after each feedback round (B-Pref);
    passes: DRLHP's schedule counted in label-passes — reward_pretrain_epochs over the first
    round's labels, then reward_passes_per_step label-passes per agent step over the newest
    reward_label_buffer labels, between the rounds (themis/reward/schedule.py)."""
    reward_pretrain_epochs: int = 200
    """reward_schedule=passes: epochs over the first round's labels (DRLHP: 200)."""
    reward_passes_per_step: float = 0.1
    """reward_schedule=passes: label-passes per agent step (DRLHP: "1 label per 10 RL
    timesteps")."""
    reward_label_buffer: int = 3000
    """reward_schedule=passes: train on the newest this-many labels; 0: all (DRLHP: 3000)."""
    reward_max_lag: int = 0
    """reward_training=async with reward_schedule=passes: the agent waits while the background
    learner's label-passes are more than this many agent steps behind it, so that r̂ trains at
    reward_passes_per_step however slow its core is; 0: never wait (the learner trains as fast
    as it can, as mrahtz's reproduction)."""

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
    vlm_teacher: bool = False
    """A vision-language model labels the queries (``teacher=vlm`` sets it): the segments'
    frames go to an OpenAI-compatible endpoint with RL-VLM-F's two-stage prompt
    (themis/feedback/vlm.py; docs/guide/vlm-teachers.md). With ``human_teacher=true
    teacher_ui=web`` it is one more labeler of the crowd."""
    vlm_base_url: str = ""
    """teacher=vlm: the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (vLLM) or
    https://api.openai.com/v1; the key comes from $THEMIS_VLM_API_KEY or $OPENAI_API_KEY only.
    A received run's value is refused unless the command line repeats it."""
    vlm_model: str = ""
    """teacher=vlm: the model name the endpoint serves (one that reads images)."""
    vlm_task: str = ""
    """teacher=vlm: the goal the prompt names ("to ..."); default: the env's entry in
    themis/feedback/vlm_prompt.py TASKS (refused when it has none)."""
    vlm_prompt: str = ""
    """teacher=vlm: a prompt file replacing themis/feedback/vlm_prompt.txt (sections
    ### analysis with {images_1} {images_2} {task}, and optionally ### label with {analysis})."""
    vlm_cache: str = ""
    """teacher=vlm: the answer cache (JSON lines) to read and append to; default
    RUN_DIR/vlm_answers.jsonl. A file shared by runs makes a repeated run (same seed, same
    images) ask nothing again."""
    vlm_frames: str = "last"
    """teacher=vlm: the images of a segment: last (its last frame, RL-VLM-F) or key
    (vlm_key_frames frames evenly spaced over it)."""
    vlm_key_frames: int = 4
    """vlm_frames=key: images per segment."""
    vlm_max_concurrency: int = 4
    """teacher=vlm: requests in flight at once."""
    vlm_timeout: float = 60.0
    """teacher=vlm: seconds one request may take (then retried, then "can't tell")."""
    vlm_max_retries: int = 5
    """teacher=vlm: retries of a request on timeouts, 429 and 5xx (the openai client's
    exponential backoff, Retry-After honoured)."""
    vlm_max_tokens: int = 1000
    """teacher=vlm: most tokens of each answer (RL-VLM-F: 1000)."""
    vlm_temperature: float = 0.0
    """teacher=vlm: sampling temperature (RL-VLM-F: 0)."""
    vlm_gold_from: str = "none"
    """teacher=vlm: none, or oracle: gold_fraction of each round's queries get the env
    reward's label (the trusted labels of PRIMT / PrefVLM), score the VLM (vlm_gold_accuracy in
    reward.csv) and its labels are left out of training while that accuracy is below
    min_gold_accuracy after min_gold_answers gold answers."""
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
    checkpoint_minutes: float = 30.0
    """Also a full checkpoint when this many minutes of wall time passed since the last one
    (long pixel runs: at most this much work is lost when a run is stopped)."""
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

    # --- agent
    agent: str = "auto"
    """auto (SAC for Box action spaces, PPO for Discrete), sac, ppo or a2c (Discrete: one
    gradient step per rollout of 16 envs × 5 steps, DRLHP's Atari agent)."""
    reset_critic: bool = True
    """Reset SAC's critic at the end of pretraining (PEBBLE; a method's config may keep it)."""

    @property
    def pretrain_end(self) -> int:
        """The step where pretraining ends: ``num_seed_steps + num_unsup_steps``."""
        return self.num_seed_steps + self.num_unsup_steps


RANGES: dict[str, Range] = {
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
    "ensemble_size": Range(1, cap=64),
    "reward_lr": POSITIVE_REAL, "reward_update": POSITIVE,
    "reward_train_batch": BATCH, "reward_hidden_dim": WIDTH,
    "reward_hidden_depth": DEPTH,
    "reward_val_fraction": Range(0, 1, hi_open=True),
    "reward_random_response": Range(0, 1, hi_open=True),
    "reward_dropout": Range(0, 1, hi_open=True), "reward_l2": Range(0),
    "reward_norm_std": Range(0), "query_decay_steps": POSITIVE,
    "first_round_queries": NON_NEGATIVE, "reward_pretrain_epochs": NON_NEGATIVE,
    "reward_passes_per_step": Range(0), "reward_label_buffer": NON_NEGATIVE,
    # teacher
    "teacher_beta": Range(-1, text="must be -1 (perfectly rational) or a finite number > 0"),
    "teacher_gamma": Range(0, 1, lo_open=True), "teacher_eps_mistake": UNIT,
    "teacher_eps_skip": UNIT, "teacher_eps_equal": UNIT,
    "label_port": Range(0, 65535, text="is not a TCP port; use 1-65535, or 0 for any free port"),
    "labelers": Range(0, cap=1000),
    "labels_per_query": POSITIVE, "rating_classes": Range(2, 9),
    "rating_k": POSITIVE_REAL, "min_labels_before_training": NON_NEGATIVE,
    "gold_fraction": UNIT, "min_gold_accuracy": UNIT, "min_gold_answers": POSITIVE,
    "human_frame_size": Range(16, 4096), "human_frame_capacity": POSITIVE,
    "clip_fps": Range(1, 240), "xplain_action_dim": Range(-1), "xplain_top_k": POSITIVE,
    "xplain_clips_per_round": NON_NEGATIVE,
    "vlm_key_frames": Range(1, 16), "vlm_max_concurrency": Range(1, 64),
    "vlm_timeout": POSITIVE_REAL, "vlm_max_retries": Range(0, 20),
    "vlm_max_tokens": Range(1, 100_000), "vlm_temperature": Range(0, 2),
    # evaluation, logging, snapshots
    "eval_frequency": POSITIVE, "num_eval_episodes": POSITIVE, "log_frequency": POSITIVE,
    "checkpoint_frequency": POSITIVE, "checkpoint_minutes": POSITIVE_REAL,
    "reward_max_lag": NON_NEGATIVE,
}
"""Every numeric flat key and the values it takes (``reward_batch`` once ``auto`` is resolved;
``feed_type`` is a name or code, checked by :func:`themis.feedback.sampling.resolve_feed_type`);
a key of ``None`` (a default left to Themis) is not checked. With the groups' ranges they make
:data:`themis.run.validation.NUMERIC_KEYS`."""
