"""Builds the preference-learning component of a run: learner, channel, clips, label store.

This is the one place the core imports ``lib/`` (terminal labeling, clips, Captum explanations,
the web server), lazily, so a run without people or explanations needs none of their
dependencies.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from themis.agents.encoders import observation_kind
from themis.core.run_keys import RunKeys
from themis.crowd.label_store import OWNER, LabelStore, UnsafeStoreError
from themis.feedback.channels import (
    Channel,
    CrowdVLMChannel,
    SyntheticChannel,
    TerminalChannel,
    VLMChannel,
    VLMGold,
    WebChannel,
)
from themis.feedback.learner import PreferenceLearner, RoundReport
from themis.feedback.rating import RatingLearner, SyntheticRatingChannel
from themis.feedback.sampling import resolve_feed_type
from themis.feedback.selector import DecayingSchedule, QuerySelector, round_grid
from themis.feedback.teachers import (
    PRESETS,
    SyntheticRatingTeacher,
    SyntheticTeacher,
    TeacherPreset,
)
from themis.feedback.vlm import VLMTeacher, make_client
from themis.feedback.vlm_cache import CACHE_FILE, AnswerCache
from themis.feedback.vlm_prompt import load_prompt, task_description
from themis.methods.base import MethodContext, choose_augmentation, overrides
from themis.methods.registry import build_methods, method_title
from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer
from themis.reward.ensemble import reward_model_from
from themis.reward.rating import RatingTrainer
from themis.reward.recipe import RewardNormaliser, trainer_kwargs
from themis.reward.schedule import LabelPassSchedule
from themis.utils import ConfigError


@dataclass(frozen=True)
class LearnerSpec:
    """What the preference learner needs of the run it serves: shapes, device, generators,
    where segments and frames come from, where labels go. Built by the Workspace
    (:meth:`themis.run.workspace.Workspace.learner_spec`) and by the async learner process
    (:mod:`themis.online.learner_process`) alike.

    Attributes:
        env_id: the environment's id (dataset metadata, messages).
        obs_shape: one observation's shape, e.g. ``(17,)`` or ``(4, 84, 84)``.
        obs_dtype: stored observations' dtype (``float32`` vectors, ``uint8`` pixels).
        action_dim: action vector size (``Discrete(n)``: ``n``, one-hot).
        discrete: the action space is ``Discrete``.
        frame_stack: frames per stacked observation (1: none); the dataset stores each once.
        max_episode_steps: the env's time limit (the teacher's margin), ``None`` without one.
        device: the torch device of the reward model.
        precision: ``torch.bfloat16`` for bf16 matrix products, ``None`` for float32.
        rng: the run's generator (query selection, explanations).
        run_dir: the run folder (``preferences/``, ``queries/``, ``web/``).
        on_policy: the agent is PPO (rounds after whole rollouts; methods' clocks).
        store: the replay buffer or episode store segments are cut from.
        clock: the run's environment step, read when a method needs it.
        info: console line writer ``(message, colour)``.
        feature_encoder: the random encoder of pixel observations (k-center samplers), or
            ``None``.
        frames: the ring of rendered frames for clips, or ``None``.
        label_store: the run's SQLite label store (``teacher_ui=web``), or ``None``.
        agent, env: the run's agent and env, for explained clips (``None`` where there are
            none, e.g. the async learner process).
        on_round: called with each round's :class:`~themis.feedback.RoundReport` by
            :meth:`PreferenceLearner.feedback_round` (the run logs it), or ``None``.
        rollout: agent steps between two updates of the agent, over all envs (PPO and A2C:
            a rollout, :func:`themis.agents.rollout_steps`; 1 for SAC): rounds come between
            them (DRLHP's decaying schedule).
    """

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: Any
    action_dim: int
    discrete: bool
    frame_stack: int
    max_episode_steps: int | None
    device: Any
    precision: Any
    rng: np.random.Generator
    run_dir: Path
    on_policy: bool
    store: Any
    clock: Callable[[], int]
    info: Callable[[str, str], None]
    feature_encoder: Any = None
    frames: Any = None
    label_store: LabelStore | None = None
    agent: Any = None
    env: Any = None
    on_round: Callable[[RoundReport], None] | None = None
    rollout: int = 1

    @property
    def obs_dim(self) -> int:
        """Flat observation size."""
        return int(np.prod(self.obs_shape))

    @property
    def obs_kind(self) -> str:
        """``vector``, ``pixels`` or ``grid`` (:func:`themis.agents.encoders.observation_kind`)."""
        return observation_kind(self.obs_shape)


EPOCH_HOOKS = ("select_labels", "start_epoch", "end_epoch", "round_epochs", "stop_rule")
"""Method hooks that act on a round's epochs (``reward_schedule=passes`` has none)."""


def teacher_description(cfg: RunKeys) -> str:
    """Who labels the queries, as stored with each label (``labeler`` column): ``human:NAME``
    for a person, ``vlm:MODEL`` for a vision-language model (alone), ``synthetic(...)`` with
    the B-Pref parameters otherwise."""
    if cfg.vlm_teacher and not cfg.human_teacher:
        return vlm_labeler(cfg)
    if cfg.human_teacher:
        return f"human:{cfg.human_labeler or getpass.getuser()}"
    return (f"synthetic(beta={cfg.teacher_beta},gamma={cfg.teacher_gamma},"
            f"eps_mistake={cfg.teacher_eps_mistake},eps_skip={cfg.teacher_eps_skip},"
            f"eps_equal={cfg.teacher_eps_equal})")


def vlm_labeler(cfg: RunKeys) -> str:
    """A VLM's labeler name: ``vlm:MODEL`` (a ``:`` or ``,`` of the model name written ``_``:
    labeler names are read up to their last ``:``)."""
    return "vlm:" + str(cfg.vlm_model).replace(":", "_").replace(",", "_")


INSTRUCTIONS_LIMIT = 8000
"""Most characters of ``label_instructions`` (a page of text)."""


def label_instructions(cfg: RunKeys) -> str:
    """What "better" means for this run (``label_instructions``): the text itself, or the
    text of the ``.md`` / ``.txt`` file it names; ``""`` when unset.

    Raises:
        ConfigError: a file that cannot be read, text over :data:`INSTRUCTIONS_LIMIT`
            characters, or instructions without a person to read them.
    """
    value = str(cfg.label_instructions or "").strip()
    if not value:
        return ""
    if not cfg.human_teacher:
        raise ConfigError("label_instructions are shown to people (human_teacher=true); a "
                          "synthetic teacher does not read them: drop the key")
    text = value
    if value.lower().endswith((".md", ".txt", ".markdown")):
        try:
            text = Path(value).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else "not UTF-8 text"
            raise ConfigError(f"label_instructions={value}: cannot read it ({reason})") from None
    if len(text) > INSTRUCTIONS_LIMIT:
        raise ConfigError(f"label_instructions: {len(text)} characters; keep them under "
                          f"{INSTRUCTIONS_LIMIT} (what a person reads before labeling)")
    return text.strip()


def teacher_name(cfg: RunKeys) -> str:
    """Who answers, in a few words, for the banner, plot titles and the run report: the preset
    (``oracle``, ``skip``, ...) or ``synthetic(...)`` for a synthetic teacher; for people the
    labeler names their labels are stored under (``human:ann``; on the web ``human:local``
    without tokens, ``human:labeler1`` ... with ``labelers=N``)."""
    if cfg.human_teacher and cfg.teacher_ui == "web":
        vlm = f" and {vlm_labeler(cfg)}" if cfg.vlm_teacher else ""
        if not cfg.labelers:
            from lib.label_server import LOCAL_LABELER

            return f"human:{LOCAL_LABELER}{vlm} (web page)"
        names = "human:labeler1" + (f"…labeler{cfg.labelers}" if cfg.labelers > 1 else "")
        return f"{names}{vlm} (web links)"
    if cfg.vlm_teacher:
        return f"{vlm_labeler(cfg)} (endpoint)"
    if cfg.human_teacher:
        return f"{teacher_description(cfg)} (terminal)"
    values = TeacherPreset(cfg.teacher_beta, cfg.teacher_gamma, cfg.teacher_eps_mistake,
                           cfg.teacher_eps_skip, cfg.teacher_eps_equal)
    return next((name for name, preset in PRESETS.items() if preset == values),
                teacher_description(cfg))


def run_title(cfg: RunKeys, agent: str) -> str:
    """What a run is, for the banner, ``learning_curve.png`` and the run report: the method
    (``PEBBLE``, the methods' titles joined by ``+``; ``PrefPPO`` or ``… on PrefPPO`` for
    PPO), the sampler and the teacher — or the agent on the true reward (``learn_reward=false``)."""
    if not cfg.learn_reward:
        return f"{agent.upper()} on the true reward"
    base = {"ppo": "PrefPPO", "a2c": "PrefA2C"}.get(agent, "PEBBLE")
    methods = method_title(cfg)
    method = base if methods == "PEBBLE" else methods + (f" on {base}" if base != "PEBBLE" else "")
    if cfg.max_feedback == 0:
        return f"{method} · reward from saved preferences"
    return f"{method} · sampler {resolve_feed_type(cfg.feed_type)} · teacher {teacher_name(cfg)}"


def explaining(cfg: RunKeys) -> bool:
    """Whether Captum explanations go under the clips (``xplain_action`` or ``xplain_state``)."""
    return bool(cfg.xplain_action or cfg.xplain_state)


def make_dataset(cfg: RunKeys, spec: LearnerSpec) -> PreferenceDataset:
    """An empty preference dataset, or the one at ``prefs_path`` with room to grow.

    Raises:
        ConfigError: ``prefs_path`` is missing, unreadable, or recorded for other shapes.
    """
    meta = {"env": spec.env_id, "domain": cfg.domain, "teacher": teacher_description(cfg),
            "obs_shape": list(spec.obs_shape)}
    # on the web each query may get labels_per_query labels, all kept as training labels
    capacity = cfg.max_feedback * (cfg.labels_per_query if cfg.human_teacher
                                   and cfg.teacher_ui == "web" else 1)
    classes = cfg.rating_classes if cfg.feedback == "rating" else 0
    if not cfg.prefs_path:
        return PreferenceDataset(capacity, cfg.segment, spec.obs_dim, spec.action_dim,
                                 metadata=meta, obs_dtype=spec.obs_dtype,
                                 frame_stack=spec.frame_stack, rating_classes=classes)
    try:
        loaded = PreferenceDataset.load(cfg.prefs_path)
    except (FileNotFoundError, ValueError) as e:
        labels = Path(str(cfg.prefs_path)) / "preferences"
        if (labels / "meta.json").is_file():  # prefs_path=RUN_DIR: its labels are in a folder
            raise ConfigError(f"prefs_path={cfg.prefs_path} is a run dir; its labels are in "
                              f"{labels}: use prefs_path={labels}") from None
        raise ConfigError(f"prefs_path={cfg.prefs_path}: {e}") from None
    if (loaded.obs_dim, loaded.action_dim) != (spec.obs_dim, spec.action_dim):
        raise ConfigError(
            f"prefs_path={cfg.prefs_path} holds obs_dim={loaded.obs_dim}, "
            f"action_dim={loaded.action_dim} (env {loaded.metadata.get('env')}); "
            f"{spec.env_id} has obs_dim={spec.obs_dim}, action_dim={spec.action_dim}")
    if loaded.rating_classes != classes:
        raise ConfigError(f"prefs_path={cfg.prefs_path} holds "
                          + (f"ratings in {loaded.rating_classes} classes" if
                             loaded.rating_classes else "pairwise preferences")
                          + f"; this run asks for feedback={cfg.feedback}"
                          + (f" with rating_classes={classes}" if classes else ""))
    if loaded.segment != cfg.segment:
        raise ConfigError(f"prefs_path={cfg.prefs_path} was recorded with "
                          f"segment={loaded.segment}; set segment={loaded.segment}")
    data = PreferenceDataset(len(loaded) + capacity, cfg.segment, spec.obs_dim, spec.action_dim,
                             metadata={**loaded.metadata, **meta}, obs_dtype=spec.obs_dtype,
                             frame_stack=spec.frame_stack, rating_classes=classes)
    data.extend(loaded)
    return data


def decaying_schedule(cfg: RunKeys, rollout: int) -> DecayingSchedule:
    """``query_schedule=decay``: DRLHP's decaying labelling rate over the run's rounds
    (``rollout``: agent steps between the agent's updates, to which rounds are rounded up;
    :func:`themis.agents.rollout_steps`)."""
    _, every, last = round_grid(cfg.num_train_steps, cfg.num_seed_steps + cfg.num_unsup_steps,
                                cfg.num_interact, rollout)
    return DecayingSchedule(cfg.query_decay_steps, every, last)


def make_learner(cfg: RunKeys, spec: LearnerSpec) -> PreferenceLearner:
    """The preference learner of a run (``cfg``, the resolved config; ``spec``, what it needs of
    the run: :class:`LearnerSpec`),
    with DRLHP's query schedule (``query_schedule=decay``) and reward normaliser
    (``reward_norm_std``) when they are on — built here, so that Themis's sync loops, the
    async learner process and the wrappers' learner get the same ones.

    Raises:
        ConfigError: an unknown ``xplain_method``, or a bad ``prefs_path``.
    """
    try:
        model = reward_model_from(cfg, spec.obs_dim, spec.action_dim, spec.obs_shape)
        model = model.to(spec.device)
    except ValueError as e:  # e.g. reward_net=drlhp for vector observations
        raise ConfigError(f"{spec.env_id}: {e}") from None
    model.precision = spec.precision
    methods = build_methods(cfg, MethodContext(
        cfg.segment, spec.obs_dim, spec.action_dim, spec.obs_dtype, clock=spec.clock,
        on_policy=spec.on_policy))
    rating = cfg.feedback == "rating"
    trainer: RewardTrainer = RatingTrainer(
        model, cfg.rating_classes, cfg.rating_k, cfg.reward_lr, cfg.reward_train_batch,
        np.random.default_rng(cfg.seed + 1)) if rating else RewardTrainer(
        model, cfg.reward_lr, cfg.reward_train_batch, np.random.default_rng(cfg.seed + 1),
        crop=choose_augmentation(methods), methods=methods,
        **trainer_kwargs(cfg))  # DRLHP's recipe keys
    for method in methods:
        method.bind(model, trainer.optimizer)
    teacher_rng = np.random.default_rng(cfg.seed + 2)
    teacher = SyntheticRatingTeacher(cfg.rating_classes, cfg.teacher_beta, cfg.teacher_gamma,
                                     cfg.teacher_eps_mistake, cfg.teacher_eps_skip,
                                     teacher_rng) if rating else \
        SyntheticTeacher(cfg.teacher_beta, cfg.teacher_gamma, cfg.teacher_eps_mistake,
                         cfg.teacher_eps_skip, cfg.teacher_eps_equal, rng=teacher_rng)
    selector = QuerySelector(resolve_feed_type(cfg.feed_type), cfg.segment, cfg.large_batch,
                             spec.rng, spec.feature_encoder, spec.obs_shape)
    learner = (RatingLearner if rating else PreferenceLearner)(
        model, trainer, make_dataset(cfg, spec), teacher, selector, spec.run_dir / "preferences",
        cfg.max_feedback, cfg.reward_batch, cfg.reward_update, cfg.segment,
        spec.max_episode_steps, cfg.min_labels_before_training, spec.info,
        bpref_thresholds=cfg.teacher_thres_schedule == "bpref")
    learner.channel = make_channel(cfg, spec, learner)
    learner.on_round = spec.on_round
    learner.methods = methods
    if cfg.query_schedule == "decay":  # DRLHP's decaying labelling rate
        learner.schedule = decaying_schedule(cfg, spec.rollout)
    if cfg.reward_norm_std:  # DRLHP's per-member normalisation of the policy's reward
        learner.normaliser = RewardNormaliser(cfg.ensemble_size, cfg.reward_norm_std)
    learner.first_round_queries = cfg.first_round_queries
    if cfg.reward_schedule == "passes":  # DRLHP: label-passes between the rounds
        epoch_bound = [f"{type(m).__name__}.{hook}" for m in methods for hook in EPOCH_HOOKS
                       if overrides(m, hook)]
        if epoch_bound:
            raise ConfigError(f"reward_schedule=passes trains minibatches between the rounds; "
                              f"{epoch_bound[0]} acts on whole epochs of a round: use "
                              "reward_schedule=rounds with this method")
        learner.passes = LabelPassSchedule(cfg.reward_pretrain_epochs,
                                           cfg.reward_passes_per_step, cfg.reward_label_buffer,
                                           cfg.reward_train_batch)
    selector.methods = methods
    if cfg.gold_path:
        try:
            learner.gold_dataset = PreferenceDataset.load(cfg.gold_path)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"gold_path={cfg.gold_path}: {e}") from None
        gold = learner.gold_dataset
        if (gold.segment, gold.obs_dim, gold.action_dim) != (cfg.segment, spec.obs_dim,
                                                              spec.action_dim):
            raise ConfigError(f"gold_path={cfg.gold_path} holds segment={gold.segment}, "
                              f"obs_dim={gold.obs_dim}, action_dim={gold.action_dim}; this run "
                              f"has {cfg.segment}, {spec.obs_dim}, {spec.action_dim}")
    return learner


def make_channel(cfg: RunKeys, spec: LearnerSpec, learner: PreferenceLearner) -> Channel:
    """Who answers: a synthetic teacher, a person in the terminal, or people on the web."""
    clips = make_clips(cfg, spec, learner.model) if spec.frames is not None else None
    labeler = teacher_description(cfg)
    vlm = make_vlm_teacher(cfg, spec) if cfg.vlm_teacher else None
    if cfg.human_teacher and cfg.teacher_ui == "web":
        assert spec.label_store is not None
        aggregate = "model" if cfg.label_quality == "model" else cfg.label_aggregate
        web_args = (spec.label_store, clips, cfg.labels_per_query, aggregate,
                    spec.info, lambda: learner.rounds + 1)
        web_kwargs: dict[str, Any] = dict(
            gold_fraction=cfg.gold_fraction, label_quality=cfg.label_quality,
            min_gold_answers=cfg.min_gold_answers, min_gold_accuracy=cfg.min_gold_accuracy,
            gold_answers=max(1, cfg.labelers) + int(vlm is not None),
            rng=np.random.default_rng(cfg.seed + 3),
            rating_classes=cfg.rating_classes if cfg.feedback == "rating" else 0)
        if vlm is not None:  # the VLM answers every posted query into the store
            return CrowdVLMChannel(vlm, vlm_labeler(cfg), *web_args, **web_kwargs)
        return WebChannel(*web_args, **web_kwargs)
    if vlm is not None:
        assert clips is not None  # teacher=vlm renders frames
        gold = VLMGold(cfg.gold_fraction, cfg.min_gold_answers, cfg.min_gold_accuracy,
                       np.random.default_rng(cfg.seed + 3)) \
            if cfg.vlm_gold_from == "oracle" else None
        return VLMChannel(vlm, labeler, clips.frames, gold, record=learner.record)
    if cfg.human_teacher:
        from lib.human_interface import KeyReader, RatingTerminalTeacher, TerminalTeacher

        clip_dir = spec.run_dir / "queries"
        done = len(list(clip_dir.glob("query_*"))) if clip_dir.is_dir() else 0
        reader = KeyReader(piped=cfg.human_piped)
        person = RatingTerminalTeacher(clip_dir, reader, cfg.rating_classes, cfg.human_viewer,
                                       cfg.clip_fps, first_query=done) \
            if cfg.feedback == "rating" else \
            TerminalTeacher(clip_dir, reader, cfg.human_viewer, cfg.clip_fps, first_query=done)
        person.instructions = label_instructions(cfg)

        def header(asked: int = 0) -> str:  # asked: the queries of this round before it
            from lib.clips import EPISODE_PATTERN, newest_episode_clip

            episodes = spec.run_dir / "web" / "episodes"
            newest = newest_episode_clip(episodes)
            shown = "" if newest is None else \
                f"; the agent's last full episode: {episodes / EPISODE_PATTERN.format(newest)}"
            return (f"round {learner.rounds + 1}, {learner.total_feedback + asked} of "
                    f"{cfg.max_feedback} queries asked before it{shown}")

        return TerminalChannel(person, clips, labeler, learner.record, header)
    if isinstance(learner.teacher, SyntheticRatingTeacher):
        return SyntheticRatingChannel(
            learner.teacher, labeler, lambda: learner.dataset.true_rewards[: len(learner.dataset)],
            clips, cfg.xplain_clips_per_round if explaining(cfg) else 0)
    return SyntheticChannel(learner.teacher, labeler, clips,
                            cfg.xplain_clips_per_round if explaining(cfg) else 0)


def make_vlm_teacher(cfg: RunKeys, spec: LearnerSpec) -> VLMTeacher:
    """``teacher=vlm``: the VLM teacher of a run (:mod:`themis.feedback.vlm`): the endpoint's
    client (the key from the environment), the prompt, the env's task and the answer cache
    (``vlm_cache``, default ``RUN_DIR/vlm_answers.jsonl``).

    Raises:
        ConfigError: no ``openai`` package, an unreadable prompt, no task for the env.
    """
    return VLMTeacher(make_client(cfg.vlm_base_url, cfg.vlm_timeout, cfg.vlm_max_retries),
                      cfg.vlm_model, load_prompt(cfg.vlm_prompt or None),
                      task_description(cfg.vlm_task, cfg.env),
                      AnswerCache(Path(cfg.vlm_cache).expanduser() if cfg.vlm_cache
                                  else spec.run_dir / CACHE_FILE), cfg.vlm_frames,
                      cfg.vlm_key_frames, cfg.vlm_max_concurrency, cfg.vlm_max_tokens,
                      cfg.vlm_temperature)


def make_clips(cfg: RunKeys, spec: LearnerSpec, reward_model: RewardEnsemble) -> Any:
    """A ``lib.clips.ClipMaker`` over the run's frame ring, with Captum panels when
    ``xplain_*`` is on (an explainer built each round from the current agent and model).

    Raises:
        ConfigError: an unknown ``xplain_method``.
    """
    from lib.clips import ClipMaker

    explainer = None
    if explaining(cfg):
        from lib.explain import METHODS, Explainer, action_forward, feature_names, reward_forward

        if cfg.xplain_method not in METHODS:
            raise ConfigError(f"xplain_method={cfg.xplain_method} is unknown; use one of "
                              f"{', '.join(METHODS)} (or register one in lib/explain.py)")

        def explainer() -> Any:
            store = spec.store
            idx = spec.rng.integers(0, len(store), size=64)
            idx = idx[store.readable(idx)]
            if len(idx) == 0:  # unlikely: take the readable ones in storage order
                idx = np.flatnonzero(store.readable(np.arange(len(store))))[:64]
            return Explainer(
                cfg.xplain_method, spec.obs_shape, store.observations(idx), store.actions[idx],
                cfg.xplain_baseline,
                action_forward(spec.agent, spec.discrete, cfg.xplain_action_dim)
                if cfg.xplain_action else None,
                reward_forward(reward_model) if cfg.xplain_state else None,
                discrete=spec.discrete,
                names=feature_names(spec.env, spec.obs_dim) if spec.obs_kind == "vector" else (),
                top_k=cfg.xplain_top_k, device=spec.device)

    return ClipMaker(spec.frames, spec.store.capacity, spec.run_dir, cfg.clip_fps, explainer)


def make_episode_clips(ws: Any) -> Any:
    """A ``lib.clips.EpisodeClips`` writing the last full episode to ``RUN_DIR/web/episodes/``
    when a person labels (frames are kept), else ``None``."""
    if ws.frames is None:
        return None
    from lib.clips import EpisodeClips

    return EpisodeClips(ws.run_dir / "web" / "episodes", ws.cfg.clip_fps)


def make_label_store(ws: Any) -> tuple[LabelStore, list[tuple[str, str | None]]] | None:
    """``teacher_ui=web``: the run's SQLite label store and the labelers' tokens (``None``
    for a labeler that exists already: only its token's hash is stored), the run owner's last
    (named :data:`themis.crowd.label_store.OWNER`) when there are labelers."""
    cfg = ws.cfg
    text = label_instructions(cfg)  # checked for every run (a synthetic one refuses them)
    if not (cfg.human_teacher and cfg.teacher_ui == "web"):
        return None
    try:  # a received run's store with triggers or views of its own is refused
        store = LabelStore(ws.run_dir / "labels.sqlite", ws.run_dir / "web")
    except UnsafeStoreError as e:
        raise ConfigError(str(e)) from None
    page_text = ws.run_dir / "web" / "instructions.md"  # what the labeling page shows
    if text:
        page_text.parent.mkdir(parents=True, exist_ok=True)
        page_text.with_suffix(".tmp").write_text(text + "\n", encoding="utf-8")
        os.replace(page_text.with_suffix(".tmp"), page_text)
    else:
        page_text.unlink(missing_ok=True)
    tokens = store.add_labelers(cfg.labelers)
    return store, [*tokens, (OWNER, store.owner_token())] if tokens else tokens


def start_label_server(ws: Any) -> Any:
    """Serve the labeling page (``lib/label_server.py``) from a thread; print its URLs.

    Raises:
        ConfigError: the server cannot listen (port taken, ...).
    """
    from lib.label_server import LabelServer

    cfg = ws.cfg
    try:
        server = LabelServer(ws.label_store, cfg.label_host, cfg.label_port, ws.run_dir).start()
    except (RuntimeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    url = server.url
    if ws.label_tokens:
        labelers = sum(name != OWNER for name, _ in ws.label_tokens)
        for name, token in ws.label_tokens:
            if token is None:  # only the token's hash is stored
                ws.logger_info(f"{name} keeps the link printed when it was created (new links: "
                               f"scripts/label_server.py {ws.run_dir} --labelers "
                               f"{labelers} --new-tokens)", "green")
            elif name == OWNER:
                ws.logger_info(f"status of every labeler, for you (the run's owner): "
                               f"{url}status?token={token}", "green")
            else:
                ws.logger_info(f"labeling page for {name}: {url}?token={token}", "green")
    else:
        ws.logger_info(f"labeling page: {url} (status: {url}status)", "green")
    return server


__all__ = ["LearnerSpec", "decaying_schedule", "label_instructions", "make_channel", "make_clips",
           "make_episode_clips", "make_label_store",
           "make_learner", "make_vlm_teacher", "run_title",
           "start_label_server", "teacher_description", "teacher_name", "vlm_labeler"]

