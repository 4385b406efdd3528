"""Preference Transformer: a non-Markovian reward of segments (Kim et al., ICLR 2023).

A causal transformer reads a segment as tokens ``(a_1, s_1, a_2, s_2, ...)`` (each step's action
and state embedding plus a learned embedding of its position in the segment); the output at each
step's state token gives, through one linear layer, a query ``q_t``, a key ``k_t`` and a scalar
reward ``r̂_t``. The *preference attention* layer (Sec. 4.2, Eq. 4–5) weighs the rewards by
bidirectional attention: ``z_i = Σ_t softmax_t(q_i·k_t / √d) r̂_t``, and the segment's score is
their mean, ``(1/H) Σ_i z_i = Σ_t w_t r̂_t`` with weights ``w_t = (1/H) Σ_i softmax_t(...)``
that sum to 1. Two segments' scores enter the Bradley–Terry model as returns do
(:func:`themis.reward.trainer.bradley_terry_loss`): P[σ¹ ≻ σ⁰] = sigmoid(S¹ − S⁰), the
official code's softmax cross-entropy over the two scores.

Following the official implementation (github csmile-1006/PreferenceTransformer,
``flaxmodels/gpt2/trajectory_gpt2.py`` ``TransRewardModel`` with ``use_weighted_sum``,
``JaxPref/PrefTransformer.py`` with ``train_type="mean"``,
``JaxPref/new_preference_reward_main.py``): GPT-2 blocks (pre-LayerNorm, causal
self-attention, an MLP of width 4 × embedding with the launcher's ``activations='relu'``,
dropout 0.1), a LayerNorm on the stacked embeddings, the state token's output
(``target_idx=1``) feeding the preference attention, one attention head there with query/key
width 256 and no dropout. The README's MuJoCo command uses an embedding of 256,
one layer, four heads, batches of 256 and segments of 100; the optimiser is AdamW at 1e-4 with a
linear warm-up to 10× over the first 10% of the steps and a cosine decay back
(``warmup_steps = 0.1 × epochs × batches``). Not carried over: the official keeps the epoch with
the best loss on a tenth of the labels (early stopping); here every epoch is trained.

The per-step reward of a dataset step (for the offline agent) is ``r̂_t`` at the window's last
position of the segment-long window that ends at that step (the official
``reward_from_preference_transformer`` with ``label_mode="last"``; steps closer than a segment to
their episode's start take their position in the episode's first window, which under the causal
mask is the same quantity).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from themis.reward.dataset import PreferenceDataset
from themis.reward.trainer import RewardTrainStats, bradley_terry_loss


class _Block(nn.Module):
    """A GPT-2 block: ``x + attn(LN(x))`` then ``x + mlp(LN(x))`` (causal attention)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.norm_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm_1(x)
        x = x + self.drop(self.attention(h, h, h, attn_mask=mask, need_weights=False)[0])
        return x + self.mlp(self.norm_2(x))


class PreferenceTransformer(nn.Module):
    """Preference Transformer's reward model (see the module docstring).

    Args:
        obs_dim: flat observation size.
        action_dim: action vector size.
        max_len: the longest segment it reads (positions ``0 … max_len - 1``).
        embed_dim: token width (paper: 256).
        layers: causal transformer blocks (paper: 1).
        heads: attention heads of each block (paper: 4).
        pref_attn_dim: query/key width of the preference attention (official: 256).
        dropout: dropout of embeddings, attention and residuals (official: 0.1).

    Shapes:
        :meth:`forward`: ``obs (B, T, obs_dim)``, ``act (B, T, action_dim)`` with ``T <=
        max_len`` -> per-step rewards ``(B, T)`` and preference weights ``(B, T)`` (each row
        sums to 1). :meth:`segment_scores`: -> ``(B,)``.

    Raises:
        ValueError: a width that the heads do not divide, or non-positive sizes.
    """

    def __init__(self, obs_dim: int, action_dim: int, max_len: int, embed_dim: int = 256,
                 layers: int = 1, heads: int = 4, pref_attn_dim: int = 256,
                 dropout: float = 0.1) -> None:
        super().__init__()
        if min(obs_dim, action_dim, max_len, embed_dim, layers, heads, pref_attn_dim) < 1:
            raise ValueError("Preference Transformer sizes must be positive")
        if embed_dim % heads:
            raise ValueError(f"pt_embed_dim={embed_dim} is not a multiple of pt_heads={heads}")
        self.obs_dim, self.action_dim, self.max_len = obs_dim, action_dim, max_len
        self.embed_dim, self.layers, self.heads = embed_dim, layers, heads
        self.pref_attn_dim, self.dropout = pref_attn_dim, dropout
        self.state_embed = nn.Linear(obs_dim, embed_dim)
        self.action_embed = nn.Linear(action_dim, embed_dim)
        self.position_embed = nn.Embedding(max_len, embed_dim)
        self.embed_norm = nn.LayerNorm(embed_dim)
        self.embed_drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(embed_dim, heads, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(embed_dim)
        self.preference_attention = nn.Linear(embed_dim, 2 * pref_attn_dim + 1)

    @property
    def device(self) -> torch.device:
        return self.state_embed.weight.device

    def config(self) -> dict[str, Any]:
        """The constructor's arguments (saved with the weights)."""
        return {"obs_dim": self.obs_dim, "action_dim": self.action_dim, "max_len": self.max_len,
                "embed_dim": self.embed_dim, "layers": self.layers, "heads": self.heads,
                "pref_attn_dim": self.pref_attn_dim, "dropout": self.dropout}

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-step rewards ``r̂_t`` and preference weights ``w_t``, each ``(B, T)``."""
        batch, length = obs.shape[:2]
        if length > self.max_len:
            raise ValueError(f"a segment of {length} steps is longer than this model's "
                             f"{self.max_len}")
        position = self.position_embed(torch.arange(length, device=obs.device))
        states = self.state_embed(obs.float()) + position
        actions = self.action_embed(act.float()) + position
        tokens = torch.stack([actions, states], dim=2).reshape(batch, 2 * length,
                                                               self.embed_dim)
        x = self.embed_drop(self.embed_norm(tokens))
        mask = torch.ones(2 * length, 2 * length, dtype=torch.bool, device=obs.device).triu(1)
        for block in self.blocks:
            x = block(x, mask)
        hidden = self.final_norm(x).reshape(batch, length, 2, self.embed_dim)[:, :, 1]
        query, key, reward = self.preference_attention(hidden).split(
            [self.pref_attn_dim, self.pref_attn_dim, 1], dim=-1)
        attention = torch.softmax(query @ key.transpose(1, 2) / math.sqrt(self.pref_attn_dim),
                                  dim=-1)  # (B, T, T): row i attends over every step t
        return reward.squeeze(-1), attention.mean(1)

    def segment_scores(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """``S = Σ_t w_t r̂_t`` per segment, ``(B,)`` (the official ``weighted_sum``'s mean)."""
        reward, weight = self(obs, act)
        return (weight * reward).sum(-1)

    @torch.no_grad()
    def step_rewards(self, observations: np.ndarray, actions: np.ndarray, starts: np.ndarray,
                     lengths: np.ndarray, window: int, chunk: int = 256) -> np.ndarray:
        """Per-step rewards of whole episodes for an offline agent (module docstring).

        Args:
            observations: ``(N, obs_dim)`` steps, episodes concatenated.
            actions: ``(N, action_dim)``.
            starts, lengths: ``(E,)`` each episode's first step and length.
            window: steps per window (the segment length it was trained on).
            chunk: windows per forward pass.

        Returns:
            ``(N,)`` float32 rewards.
        """
        was_training = self.training
        self.eval()
        out = np.zeros(len(actions), dtype=np.float32)
        # (first step, window length, positions read, steps written): one window from each
        # episode's start, then one per later step (its last position)
        jobs: dict[int, list[tuple[int, int]]] = {}
        for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
            size = min(window, length)
            jobs.setdefault(size, []).append((start, -1))  # -1: every position of the window
            jobs[size] += [(start + t - size + 1, 1) for t in range(size, length)]
        for size, items in jobs.items():
            offsets = np.arange(size)
            for lo in range(0, len(items), chunk):
                part = items[lo:lo + chunk]
                first = np.asarray([p[0] for p in part])
                idx = first[:, None] + offsets
                obs_t = torch.as_tensor(observations[idx], device=self.device)
                act_t = torch.as_tensor(actions[idx], device=self.device)
                reward = self(obs_t, act_t)[0].float().cpu().numpy()
                for row, (begin, kind) in enumerate(part):
                    if kind == -1:
                        out[begin:begin + size] = reward[row]
                    else:
                        out[begin + size - 1] = reward[row, -1]
        self.train(was_training)
        return out


def preference_transformer_loss(scores_1: torch.Tensor, scores_2: torch.Tensor,
                                labels: torch.Tensor) -> torch.Tensor:
    """Bradley–Terry cross-entropy on two segments' weighted-sum scores, averaged over pairs
    (Kim et al. 2023, Eq. 3 with the scores of Eq. 5; the official ``cross_ent_loss`` on
    ``[S¹, S²]`` with one-hot labels, 0.5/0.5 for ties).

    Args:
        scores_1, scores_2: ``(n,)`` scores of segment 1 and 2.
        labels: ``(n,)`` probability that segment 2 is preferred (0, 0.5 or 1).

    Returns:
        the scalar mean loss.
    """
    return bradley_terry_loss(scores_1, scores_2, labels)


class PreferenceTransformerTrainer:
    """Fits a :class:`PreferenceTransformer` to a :class:`PreferenceDataset`.

    Args:
        model: the transformer.
        lr: AdamW's base learning rate (official ``trans_lr``: 1e-4); the schedule warms up to
            10× over the first 10% of ``total_steps`` and decays back by a cosine.
        weight_decay: AdamW's (optax's default, 1e-4).
        batch_size: pairs per step (official: 256).
        total_steps: gradient steps the schedule spans.
        rng: the random generator of the minibatch order.
    """

    def __init__(self, model: PreferenceTransformer, lr: float = 1e-4,
                 weight_decay: float = 1e-4, batch_size: int = 256, total_steps: int = 1000,
                 rng: np.random.Generator | None = None) -> None:
        self.model, self.batch_size = model, batch_size
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        warmup = max(1, total_steps // 10)

        def factor(step: int) -> float:
            if step < warmup:
                return 1.0 + 9.0 * step / warmup
            progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
            return 1.0 + 9.0 * 0.5 * (1.0 + math.cos(math.pi * progress))

        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.rng = rng if rng is not None else np.random.default_rng()
        self.steps_taken = 0

    def train(self, dataset: PreferenceDataset, epochs: int) -> RewardTrainStats:
        """``epochs`` passes over the labels in random minibatches.

        Returns:
            the last epoch's mean loss and accuracy (strict labels; NaN when all are ties).

        Raises:
            ValueError: the dataset is empty.
        """
        if len(dataset) == 0:
            raise ValueError("cannot train the reward model on an empty preference dataset")
        device = self.model.device
        obs = torch.as_tensor(dataset.observations[:len(dataset)], device=device)
        act = torch.as_tensor(dataset.actions[:len(dataset)], device=device)
        labels = torch.as_tensor(dataset.labels[:len(dataset)], device=device)
        loss_sum, correct, counted, first = 0.0, 0.0, 0.0, self.steps_taken
        self.model.train()
        for _ in range(epochs):
            loss_sum, correct, counted, batches = 0.0, 0.0, 0.0, 0
            order = torch.as_tensor(self.rng.permutation(len(dataset)), device=device)
            for lo in range(0, len(dataset), self.batch_size):
                rows = order[lo:lo + self.batch_size]
                s1 = self.model.segment_scores(obs[rows, 0], act[rows, 0])
                s2 = self.model.segment_scores(obs[rows, 1], act[rows, 1])
                y = labels[rows]
                loss = preference_transformer_loss(s1, s2, y)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                self.schedule.step()
                self.steps_taken += 1
                strict = y != 0.5
                correct += float(((s2 > s1) == (y > 0.5))[strict].sum())
                counted += float(strict.sum())
                loss_sum += float(loss.detach())
                batches += 1
            loss_sum /= max(1, batches)
        self.model.eval()
        return RewardTrainStats(loss=loss_sum, accuracy=correct / counted if counted else
                                float("nan"), epochs=epochs, steps=self.steps_taken - first)

    @torch.no_grad()
    def accuracy(self, observations: np.ndarray, actions: np.ndarray,
                 labels: np.ndarray, chunk: int = 128) -> float:
        """Agreement with strict labels on pairs ``observations (n, 2, H, obs_dim)``,
        ``actions (n, 2, H, action_dim)``, ``labels (n,)`` (NaN without a strict label),
        ``chunk`` pairs per forward pass."""
        self.model.eval()
        device = self.model.device
        scores = []
        for lo in range(0, len(labels), chunk):
            obs = torch.as_tensor(observations[lo:lo + chunk], device=device)
            act = torch.as_tensor(actions[lo:lo + chunk], device=device)
            scores.append(torch.stack([self.model.segment_scores(obs[:, i], act[:, i])
                                       for i in (0, 1)], 1).float().cpu().numpy())
        s1, s2 = np.concatenate(scores).T if scores else (np.zeros(0), np.zeros(0))
        strict = labels != 0.5
        if not strict.any():
            return float("nan")
        return float(((s2 > s1) == (labels > 0.5))[strict].mean())


def state_dict_of(model: PreferenceTransformer) -> dict[str, Any]:
    """What a run saves of the model: its config and weights (plain tensors)."""
    return {"kind": "preference_transformer", "config": model.config(),
            "weights": model.state_dict()}


def model_from_state(state: dict[str, Any], device: str | torch.device = "cpu",
                     ) -> PreferenceTransformer:
    """Rebuild a model from :func:`state_dict_of`'s output (read with ``safe_load``).

    Raises:
        ValueError: not a Preference Transformer's state, or weights that do not fit.
    """
    if not isinstance(state, dict) or state.get("kind") != "preference_transformer":
        raise ValueError("not a Preference Transformer's saved state")
    model = PreferenceTransformer(**state["config"]).to(device)
    try:
        model.load_state_dict(state["weights"])
    except RuntimeError as e:
        raise ValueError(f"the saved weights do not fit: {str(e).splitlines()[0]}") from None
    model.eval()
    return model

