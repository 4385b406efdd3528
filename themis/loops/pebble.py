"""The off-policy loop: SAC with PEBBLE (Lee, Smith & Abbeel, ICML 2021, Algorithm 1).

1. ``num_seed_steps`` of uniformly random actions;
2. ``num_unsup_steps`` of unsupervised pretraining: SAC on the state-entropy reward (Eq. 3);
3. the first feedback round (uniform queries), relabel, critic reset (``reset_critic``) and
   ``reset_update`` updates (B-Pref ``update_after_reset``);
4. every ``num_interact`` steps, while feedback is open: a feedback round of the learner
   (queries, teacher, reward training), then the whole replay buffer is relabelled with r̂;
5. every step: one SAC update on the (relabelled) replay buffer, or on the batches of a
   method's ``replay`` hook; before it, when a method's ``between_rounds`` hook changes r̂
   (e.g. a bilevel step through the critic), a relabel.

PEBBLE's successors (:mod:`themis.methods`) act through the learner's hooks (rewards, reward
training, ``warm_start`` in pretraining, ``replay``, ``update_between_rounds``); this loop
never names one.

With ``learn_reward=false`` the same loop trains SAC on the environment reward (no queries).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from themis.agents import SAC
from themis.agents.buffers import ReplayBuffer
from themis.agents.intrinsic import NoveltySample
from themis.run.plan import log_banner
from themis.utils import ConfigError, eval_mode, mode_dependent

if TYPE_CHECKING:
    from themis.run.workspace import Workspace

NAME = "sac"
PASSES_EVERY = 1000
"""``reward_schedule=passes``: agent steps between stretches of reward training (each ends in
a relabel of the replay buffer)."""
METHOD = "PEBBLE"


def make_agent(ws: Workspace) -> SAC:
    """SAC for the env's vector observations.

    Raises:
        ConfigError: pixel or grid observations (SAC on them is not supported yet).
    """
    facts = ws.facts
    if facts.obs_kind != "vector":
        raise ConfigError(f"{facts.env_id}: SAC on {facts.obs_kind} observations is not "
                          "supported yet; use a discrete-action variant with agent=ppo "
                          "(CarRacing-v3: +env_kwargs.continuous=false)")
    return SAC(facts.obs_dim, facts.action_dim, ws.device, ws.cfg.sac, precision=ws.precision)


def store(ws: Workspace) -> ReplayBuffer:
    """The replay buffer: ``replay_buffer_capacity``, or every step of the run."""
    cfg = ws.cfg
    return ReplayBuffer(ws.facts.obs_shape, ws.facts.action_dim,
                        cfg.replay_buffer_capacity or cfg.num_train_steps, ws.device,
                        obs_dtype=ws.facts.obs_dtype)


def replay(ws: Workspace) -> ReplayBuffer:
    """The workspace's store, which this driver made a replay buffer."""
    assert isinstance(ws.buffer, ReplayBuffer)
    return ws.buffer


def eval_action(ws: Workspace, obs: np.ndarray) -> Any:
    """SAC's mean action."""
    with eval_mode(ws.agent.actor):  # type: ignore[attr-defined]
        return ws.agent.act(obs, sample=False)


def resumed(ws: Workspace) -> None:
    """After a resume: the interrupted episode is not continued (its steps stay in the
    buffer, the next one gets a new number), and the buffer gets the restored model's reward."""
    buffer = ws.buffer
    last = (buffer.ptr - 1) % buffer.capacity
    if len(buffer) and buffer.episode[last] == ws.episode:
        ws.episode += 1
    if ws.pretraining_done:
        relabel(ws)


def relabel(ws: Workspace) -> None:
    """Relabel every stored transition with r̂ (PEBBLE Sec. 4.2) once there are labels; with
    ``collect_prefs_only`` the agent does not use the learned reward. With ``reward_norm_std``
    the members' normalisation is fitted on the buffer first and held until the next relabel
    (DRLHP)."""
    if ws.learner is not None and len(ws.learner.dataset) and not ws.cfg.collect_prefs_only:
        ws.learner.fit_normaliser(replay(ws))
        replay(ws).relabel(ws.learner.reward)


def unsupervised_update(ws: Workspace, agent: SAC) -> None:
    """One SAC update on the state-entropy reward of ``next_obs`` (PEBBLE, Eq. 3; or the
    centred scale, ``state_entropy_scale=centred``), then the methods' pretraining step."""
    buffer = replay(ws)
    idx = buffer.sample_indices(ws.cfg.sac.batch_size, ws.rng)
    batch = buffer.samples(idx)
    intrinsic = ws.state_entropy.replay_reward(batch.next_observations, idx, buffer, ws.rng)
    agent.update(batch._replace(rewards=intrinsic), ws.step)
    if ws.learner is not None and not ws.pretraining_done:  # e.g. a warm start of r̂
        ws.learner.warm_start(lambda: novelty_sample(ws))


def novelty_sample(ws: Workspace) -> NoveltySample:
    """A fresh replay batch with the standardised novelty of its states ``s`` (a warm-start
    target; the statistics are the agent's pretraining reward's, unchanged)."""
    batch = replay(ws).sample(ws.cfg.sac.batch_size, ws.rng)
    dist = ws.state_entropy.distances(batch.observations, ws.buffer.obs[: len(ws.buffer)],
                                      ws.rng)
    z, bound = ws.state_entropy.standardise(dist)
    return NoveltySample(batch.observations, batch.actions, z, bound)


def end_pretraining(ws: Workspace, agent: SAC) -> None:
    """First feedback round, relabel, critic reset and ``reset_update`` updates (B-Pref)."""
    cfg = ws.cfg
    if ws.learner is not None:
        if cfg.prefs_path and cfg.max_feedback:  # saved labels first, then more queries
            ws.learner.fit_saved_labels(cfg.prefs_path)
        ws.feedback_round(first=True)
        relabel(ws)
    if cfg.reset_critic:  # PEBBLE; a method with a warm-started r̂ may keep the critic
        agent.reset_critic()
    for index in range(cfg.reset_update):  # B-Pref update_after_reset: its own counter
        agent.update(replay(ws).sample(cfg.sac.batch_size, ws.rng), index)
    ws.pretraining_done = True
    if not cfg.learn_reward and cfg.num_unsup_steps == 0:  # plain SAC: nothing was pretrained
        ws.logger.info(f"step {ws.step}: random seed steps done; SAC learns from the "
                       "environment reward", "cyan")
    else:
        ws.logger.info(f"step {ws.step}: pretraining done"
                       + (", critic reset" if cfg.reset_critic else ""), "cyan")


def run(ws: Workspace, until: int) -> None:
    """Run the PEBBLE loop from the current step up to ``until``."""
    cfg, env, buffer = ws.cfg, ws.env, replay(ws)
    agent: SAC = ws.agent  # type: ignore[assignment]
    # where SAC's batches come from: the whole buffer, or a method's replay (e.g. hybrid)
    batches: Any = ws.learner.replay(buffer) if ws.learner is not None else buffer
    log_banner(ws)
    obs, _ = env.reset(seed=cfg.seed + ws.episode)
    ws.start_episode(ws.episode)  # no query from it until it ends
    frame: Any = env.render() if ws.frames is not None else None
    episode_reward, episode_step = 0.0, 0
    bar = tqdm(total=until, initial=ws.step, unit="step", dynamic_ncols=True, leave=False,
               disable=True if ws.logger.prefix else None)  # a sweep's jobs share a terminal
    modal_actor = mode_dependent(agent.actor)  # SAC's MLP actor: eval mode changes nothing
    learner = ws.learner  # sync or async (its process gets every step): one protocol
    while ws.step < until:
        ws.checkpoint_before_people(round_at=ws.step)  # before people are first asked
        # ------------------------------------------------------------ act
        if ws.step < cfg.num_seed_steps:
            action = env.action_space.sample()
        else:
            with eval_mode(agent.actor) if modal_actor else contextlib.nullcontext():
                action = agent.act(obs, sample=True)

        # ------------------------------------------------------------ learn
        if ws.step >= cfg.num_seed_steps:
            if not ws.pretraining_done and ws.step >= cfg.pretrain_end and (
                    learner is None or not learner.first_model_pending()):  # people: no wait
                end_pretraining(ws, agent)
                ws.maybe_checkpoint(force=True)
            if not ws.pretraining_done:
                unsupervised_update(ws, agent)
            else:
                if ws.feedback_due():
                    if ws.feedback_round():
                        relabel(ws)
                    ws.maybe_checkpoint(force=learner is not None
                                        and learner.checkpoint_after_round)
                elif learner is not None and ws.step % PASSES_EVERY == 0 and \
                        learner.keep_training(PASSES_EVERY):  # reward_schedule=passes
                    relabel(ws)
                if cfg.collect_prefs_only:  # the agent keeps exploring, labels are not used
                    unsupervised_update(ws, agent)
                else:
                    if learner is not None and ws.step > cfg.pretrain_end and \
                            learner.update_between_rounds(agent, ws.step, lambda: buffer.sample(
                                cfg.sac.batch_size, ws.rng)):
                        relabel(ws)  # r̂ changed between rounds (a method's hook)
                    agent.update(batches.sample(cfg.sac.batch_size, ws.rng), ws.step)

        # ------------------------------------------------------------ step
        next_obs, reward, terminated, truncated, _ = env.step(action)
        true_reward = float(reward)
        # With learn_reward the agent never sees the true reward: the slot holds 0 until the
        # first feedback round relabels the buffer (pretraining uses the intrinsic reward),
        # and the reward model labels every later transition (lazily, in batches).
        stored_reward = 0.0 if cfg.learn_reward else true_reward
        if learner is not None:  # async: to the learner process (sync: nothing)
            learner.observe(0, obs, action, true_reward, terminated, terminated or truncated,
                            frame)
            learner.stepped(1)
        if ws.frames is not None:  # the frame shows `obs`, the state the action was taken in
            small = ws.frames.add(buffer.ptr, frame)
            if ws.episode_clips is not None:  # the last full episode, beside the pair
                ws.episode_clips.add(ws.episode, episode_step, small[None],
                                     bool(terminated or truncated))
            frame = env.render()
        buffer.add(obs, action, stored_reward, next_obs, terminated, ws.episode, episode_step,
                   true_reward)
        episode_reward += true_reward
        episode_step += 1
        obs = next_obs
        ws.step += 1
        bar.update(1)

        if terminated or truncated:
            ws.end_episode(episode_reward, episode_step, ws.episode)
            obs, _ = env.reset()
            ws.start_episode(ws.episode)
            if ws.frames is not None:
                frame = env.render()
            episode_reward, episode_step = 0.0, 0

        # ------------------------------------------------------------ logs, eval, checkpoints
        ws.after_steps(1, evaluate=ws.step == cfg.num_train_steps)
    bar.close()
