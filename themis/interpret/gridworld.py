"""Every transition of a MiniGrid/BabyAI layout, as a table (for tabular preprocessing and EPIC).

Starting from the env's current state (after ``reset(seed=...)``), :func:`enumerate_grid`
explores all reachable states breadth-first — a state is the agent's cell and direction, what
it carries and the grid's object encoding (doors opened, keys picked up) — and steps every
action from each. ``step_count`` is set to 0 before each step, so the true reward of reaching the
goal is the same everywhere (``1 − 0.9 / max_steps``). A step that ends the episode leads to one
extra absorbing state (index ``n_states``) whose potential is fixed at 0, as potential shaping
needs in episodic tasks (Ng et al. 1999).
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from themis.interpret.inspection import encode_observation


@dataclass
class GridMDP:
    """The transition table of one gridworld layout.

    Attributes:
        obs: ``(S, *obs_shape)`` what the agent (and reward model) sees in each state.
        positions: ``(S, 2)`` the agent's cell ``(x, y)``; ``directions``: ``(S,)`` 0-3.
        state: ``(T,)`` index of the state before each transition.
        action: ``(T,)`` the action index.
        next_state: ``(T,)`` index after it (``S``: the absorbing state after a terminal step).
        true_reward: ``(T,)`` the env's reward.
        terminal: ``(T,)`` the step ended the episode.
        next_position: ``(T, 2)`` the agent's cell after the step (for a terminal step: the
            cell it stepped into).
        n_actions: number of actions.
        width, height: the grid's size.
    """

    obs: np.ndarray
    positions: np.ndarray
    directions: np.ndarray
    state: np.ndarray
    action: np.ndarray
    next_state: np.ndarray
    true_reward: np.ndarray
    terminal: np.ndarray
    next_position: np.ndarray
    n_actions: int
    width: int
    height: int

    @property
    def n_states(self) -> int:
        """``S``, without the absorbing state."""
        return len(self.obs)

    def action_vectors(self) -> np.ndarray:
        """``(T, n_actions)`` one-hot actions (what a reward model takes)."""
        return np.eye(self.n_actions, dtype=np.float32)[self.action]

    def flat_obs(self) -> np.ndarray:
        """``(T, obs_dim)`` observation before each transition."""
        return self.obs[self.state].reshape(len(self.state), -1)


def _key(base: Any) -> bytes:
    carrying = base.carrying.encode() if base.carrying is not None else (0, 0, 0)
    return bytes([*map(int, base.agent_pos), int(base.agent_dir), *carrying]) + \
        base.grid.encode().tobytes()


def enumerate_grid(env: gym.Env, max_states: int = 20_000) -> GridMDP:
    """All states reachable from ``env``'s current state and every action from each.

    Args:
        env: a MiniGrid/BabyAI env made by :func:`themis.environments.domains.make_env`, after
            ``reset``.
        max_states: refuse layouts with more reachable states (memory and time).

    Raises:
        ValueError: not a MiniGrid env, or more than ``max_states`` states.
    """
    base: Any = env.unwrapped
    if not hasattr(base, "grid") or not hasattr(base, "agent_pos"):
        raise ValueError(f"{env.spec.id if env.spec else env}: not a MiniGrid env")
    n_actions = int(env.action_space.n)  # type: ignore[attr-defined]
    start = copy.deepcopy(base)
    index = {_key(start): 0}
    states = [start]
    queue = deque([0])
    rows: list[tuple[int, int, int, float, bool, tuple[int, int]]] = []
    while queue:
        s = queue.popleft()
        for a in range(n_actions):
            probe = copy.deepcopy(states[s])
            probe.step_count = 0
            _, reward, terminated, _, _ = probe.step(a)
            pos = (int(probe.agent_pos[0]), int(probe.agent_pos[1]))
            if terminated:  # MiniGrid moves the agent onto the goal (or lava) first
                rows.append((s, a, -1, float(reward), True, pos))
                continue
            key = _key(probe)
            if key not in index:
                if len(states) >= max_states:
                    raise ValueError(f"the layout has more than max_states={max_states} "
                                     "reachable states")
                index[key] = len(states)
                states.append(probe)
                queue.append(index[key])
            rows.append((s, a, index[key], float(reward), False, pos))
    n = len(states)
    obs = np.stack([encode_observation(env, st.gen_obs()) for st in states])
    state, action, nxt, reward, terminal, npos = map(np.asarray, zip(*rows, strict=True))
    nxt = np.where(nxt < 0, n, nxt)
    return GridMDP(obs, np.asarray([st.agent_pos for st in states], dtype=np.int64),
                   np.asarray([st.agent_dir for st in states], dtype=np.int64),
                   state.astype(np.int64), action.astype(np.int64), nxt.astype(np.int64),
                   reward.astype(np.float64), terminal.astype(bool),
                   npos.reshape(-1, 2).astype(np.int64), n_actions, base.grid.width,
                   base.grid.height)


def cell_map(mdp: GridMDP, values: np.ndarray, moves_only: bool = True) -> np.ndarray:
    """Mean of a per-transition quantity over the transitions that enter each cell.

    Args:
        mdp: the table.
        values: ``(T,)`` e.g. a reward per transition.
        moves_only: only transitions that change the agent's cell (stepping into a cell);
            otherwise every transition is counted at the cell it ends in.

    Returns:
        ``(width, height)``, NaN where no transition enters.
    """
    before = mdp.positions[mdp.state]
    moved = np.any(before != mdp.next_position, axis=1) if moves_only else \
        np.ones(len(values), dtype=bool)
    total = np.zeros((mdp.width, mdp.height))
    count = np.zeros((mdp.width, mdp.height))
    x, y = mdp.next_position[moved, 0], mdp.next_position[moved, 1]
    np.add.at(total, (x, y), np.asarray(values, dtype=np.float64)[moved])
    np.add.at(count, (x, y), 1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)
