"""Warm start from a Stable-Baselines3 model: ``pretrained_policy=model.zip``.

An SB3 ``.zip`` holds ``policy.pth`` (the policy's ``state_dict``: tensors only), a JSON
``data`` entry (hyper-parameters; some values in it are cloudpickle blobs, which are never
decoded here) and ``pytorch_variables.pth`` (SAC's entropy coefficient). Only these are read,
``policy.pth`` and ``pytorch_variables.pth`` with ``torch.load(weights_only=True)``: nothing
in the file can run code.

SB3's MlpPolicy names map onto Themis's modules when the shapes match:

- **SAC** (Box actions): ``actor.latent_pi.{0,2,..}`` -> ``actor.trunk.{0,2,..}``; ``actor.mu``
  and ``actor.log_std`` -> the trunk's last layer (Themis's actor emits ``[mu, log_std]`` from
  one layer); ``critic.qf0`` / ``critic.qf1`` -> the two members of the batched double-Q
  critic (``critic_target.*`` likewise); ``log_ent_coef`` -> ``log_alpha``.
- **PPO** (Discrete actions; A2C's policy has the same names):
  ``mlp_extractor.policy_net`` + ``action_net`` -> ``net.actor``, ``mlp_extractor.value_net``
  + ``value_net`` -> ``net.critic``; CnnPolicy's ``features_extractor.cnn`` / ``.linear`` ->
  the Nature-CNN encoder ``net.encoder.convs`` / ``.head``.

The mean action (SAC) and the action probabilities (PPO) are then SAC's / PPO's own. SAC's
spread differs a little: SB3 clamps ``log_std`` to [-20, 2], Themis bounds it softly (tanh into
[``sac.log_std_min``, ``sac.log_std_max``]). Optimiser states are not taken (Themis's start
fresh).
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from themis.agents.encoders import NatureCNN
from themis.agents.ppo import PPO
from themis.agents.sac import SAC
from themis.core.safe_loading import check_finite_tensors, check_tensor_sizes

MAX_ENTRY_BYTES = 1 << 30
"""The largest ``policy.pth`` / ``data`` entry read (1 GiB, uncompressed)."""
MAX_RATIO_FROM_BYTES = 16 << 20
"""Entries larger than this (16 MiB uncompressed) must not inflate more than
:data:`MAX_COMPRESSION_RATIO` times: network weights barely compress (random float32 bits,
about 1.1×), a zip bomb does (zeros: ~1000×)."""
MAX_COMPRESSION_RATIO = 100


class SB3Model(NamedTuple):
    """What Themis reads of an SB3 ``.zip``.

    Attributes:
        algorithm: ``"SAC"``, ``"PPO"`` (also A2C's actor-critic policy) or what else the
            policy's parameter names say (``"TD3/DDPG"``, ``"DQN"``, ``"unknown"``).
        state: ``policy.pth``: parameter name -> tensor (CPU).
        variables: ``pytorch_variables.pth`` (``log_ent_coef`` or ``ent_coef_tensor`` for
            SAC), or ``{}``.
        data: the JSON ``data`` entry (plain values; pickled blobs left undecoded), or ``{}``.
    """

    algorithm: str
    state: dict[str, torch.Tensor]
    variables: dict[str, torch.Tensor]
    data: dict[str, Any]


def _read_entry(archive: zipfile.ZipFile, name: str) -> bytes | None:
    if name not in archive.namelist():
        return None
    info = archive.getinfo(name)  # sizes from the zip's directory, before inflating
    if info.file_size > MAX_ENTRY_BYTES:
        raise ValueError(f"its {name} is larger than {MAX_ENTRY_BYTES >> 30} GiB")
    if info.file_size > MAX_RATIO_FROM_BYTES and \
            info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
        raise ValueError(f"its {name} inflates {info.compress_size:,} bytes to "
                         f"{info.file_size:,} (more than {MAX_COMPRESSION_RATIO}×: not network "
                         "weights, a zip bomb); refused before inflating")
    with archive.open(name) as f:  # a directory that understates the size is cut off here
        blob = f.read(min(MAX_ENTRY_BYTES, info.file_size) + 1)
    if len(blob) > info.file_size:
        raise ValueError(f"its {name} inflates to more than the zip's directory says "
                         f"({info.file_size:,} bytes); refused")
    return blob


def _tensors(blob: bytes, name: str) -> dict[str, torch.Tensor]:
    """A ``{name: tensor}`` dict from a ``torch.save`` blob, without unpickling code."""
    try:
        value = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"its {name} needs more than plain tensors (loading it could run "
                         "code from the file); refused") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise ValueError(f"its {name} is not a readable PyTorch file "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()):
        raise ValueError(f"its {name} is not a state dict of tensors")
    check_tensor_sizes(value, f"its {name}")  # no stride-0 weights a network is built from
    check_finite_tensors(value, f"its {name}")  # NaN weights would play NaN returns
    return dict(value)


def algorithm_of(state: dict[str, torch.Tensor]) -> str:
    """The SB3 algorithm whose policy has these parameter names (see :class:`SB3Model`)."""
    if any(k.startswith("actor.log_std") for k in state):  # a layer, or gSDE's parameter
        return "SAC"
    if "action_net.weight" in state:
        return "PPO"
    if any(k.startswith("actor.mu.") for k in state):  # mu is a Sequential ending in tanh
        return "TD3/DDPG"
    if any(k.startswith("q_net.") for k in state):
        return "DQN"
    return "unknown"


def read_sb3_zip(path: str | Path) -> SB3Model:
    """Read an SB3 ``model.save(...)`` archive without unpickling anything.

    Raises:
        ValueError: one line: missing, not a zip, no ``policy.pth``, or an entry that is not
            plain tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError("no such file")
    try:
        with zipfile.ZipFile(path) as archive:
            policy = _read_entry(archive, "policy.pth")
            if policy is None:
                torch_file = any(n.endswith("/data.pkl") for n in archive.namelist())
                raise ValueError("it holds no policy.pth: not a Stable-Baselines3 model "
                                 "saved with model.save()" + (
                                     " (a PyTorch file; a Themis run's agent.pt loads with "
                                     "pretrained_snapshot=)" if torch_file else ""))
            variables = _read_entry(archive, "pytorch_variables.pth")
            data_blob = _read_entry(archive, "data")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, zlib.error,
            RuntimeError, NotImplementedError) as e:  # encrypted, compression 99, bad deflate
        text = str(e).strip().splitlines()
        raise ValueError(f"not a Stable-Baselines3 .zip "
                         f"({text[0] if text else type(e).__name__})") from None
    state = _tensors(policy, "policy.pth")
    data: dict[str, Any] = {}
    if data_blob is not None:
        try:  # plain JSON; the ":serialized:" cloudpickle blobs in it are never decoded
            parsed = json.loads(data_blob.decode("utf-8"))
            data = parsed if isinstance(parsed, dict) else {}
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # too deep: ignored
            data = {}
    return SB3Model(algorithm_of(state), state,
                    _tensors(variables, "pytorch_variables.pth") if variables else {}, data)


# ---------------------------------------------------------------- reading SB3's layers
def _chain(state: dict[str, torch.Tensor], prefix: str) -> list[tuple[torch.Tensor,
                                                                       torch.Tensor]]:
    """The ``(weight, bias)`` of the linear layers ``prefix0``, ``prefix2``, ... in order."""
    indices = sorted({int(k[len(prefix):].split(".")[0]) for k in state
                      if k.startswith(prefix) and k.endswith(".weight")
                      and k[len(prefix):].split(".")[0].isdigit()})
    return [(state[f"{prefix}{i}.weight"], state[f"{prefix}{i}.bias"]) for i in indices]


def _widths(chain: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    return [int(w.shape[0]) for w, _ in chain]


def _activation(data: dict[str, Any]) -> str | None:
    """The class name of ``policy_kwargs.activation_fn`` as the JSON shows it, or None."""
    kwargs = data.get("policy_kwargs")
    text = kwargs.get("activation_fn") if isinstance(kwargs, dict) else None
    if not isinstance(text, str):
        return None
    return text.rstrip("'>").rsplit(".", 1)[-1]


def _check_activation(model: SB3Model, expected: str, agent: str) -> None:
    found = _activation(model.data)
    if found is not None and found != expected:
        raise ValueError(f"its policy uses activation_fn={found}; Themis's {agent} uses "
                         f"{expected} (train the SB3 model with the default activation)")


def _layers_note(key: str, widths: list[int], themis: list[int]) -> str:
    """``set sac.hidden_dim=32 sac.hidden_depth=2`` when ``widths`` are uniform, else why not."""
    if widths == themis:
        return ""
    if widths and len(set(widths)) > 1:
        return (f"; Themis's {key} layers all have one width ({key}.hidden_dim), so hidden "
                f"layers {widths} cannot be loaded")
    dim = f"{key}.hidden_dim={widths[0]} " if widths else ""
    return f"; set {dim}{key}.hidden_depth={len(widths)}"


# ---------------------------------------------------------------- SAC
def _sac_state(model: SB3Model, agent: SAC) -> tuple[dict[str, torch.Tensor],
                                                     dict[str, torch.Tensor],
                                                     dict[str, torch.Tensor]]:
    """Themis ``actor``, ``critic`` and ``critic_target`` state dicts from SB3 SAC's names."""
    state = model.state
    if "actor.log_std.weight" not in state:
        raise ValueError("its SAC policy uses gSDE (use_sde=True); Themis's SAC has a "
                         "log_std layer (train the SB3 model with use_sde=False)")
    if any(".features_extractor." in k for k in state):
        raise ValueError("its SAC policy has a features extractor with parameters (CnnPolicy "
                         "or a custom one); Themis's SAC takes vector observations (MlpPolicy)")
    _check_activation(model, "ReLU", "SAC")
    hidden = _chain(state, "actor.latent_pi.")
    mu_w, log_std_w = state["actor.mu.weight"], state["actor.log_std.weight"]
    obs_dim = int(hidden[0][0].shape[1] if hidden else mu_w.shape[1])
    action_dim = int(mu_w.shape[0])
    widths = _widths(hidden)
    themis = [agent.cfg.hidden_dim] * (agent.cfg.hidden_depth or 0)  # resolved: an int
    n_critics = len({k.split(".")[1] for k in state if k.startswith("critic.qf")})
    critics = [_chain(state, f"critic.qf{i}.") for i in range(n_critics)]
    critic_widths = _widths(critics[0][:-1]) if critics and critics[0] else []
    if (obs_dim, action_dim, widths, critic_widths) != (agent.obs_dim, agent.action_dim,
                                                        themis, themis):
        sb3 = f"hidden layers {widths}" + (f" (critic {critic_widths})"
                                           if critic_widths != widths else "")
        other = "" if (obs_dim, action_dim) == (agent.obs_dim, agent.action_dim) else \
            " (a model of another env)"
        raise ValueError(f"SB3 SAC with {sb3}, {obs_dim}-d observations and {action_dim}-d "
                         f"actions; this run's SAC expects hidden layers {themis}, "
                         f"{agent.obs_dim}-d observations and {agent.action_dim}-d actions"
                         f"{other}{'' if other else _layers_note('sac', widths, themis)}")
    if n_critics != 2:
        raise ValueError(f"its SAC has n_critics={n_critics}; Themis's SAC has 2 Q networks")

    actor: dict[str, torch.Tensor] = {}
    for i, (w, b) in enumerate(hidden):
        actor[f"trunk.{2 * i}.weight"], actor[f"trunk.{2 * i}.bias"] = w, b
    last = 2 * len(hidden)
    actor[f"trunk.{last}.weight"] = torch.cat([mu_w, log_std_w])
    actor[f"trunk.{last}.bias"] = torch.cat([state["actor.mu.bias"], state["actor.log_std.bias"]])

    def critic(prefix: str) -> dict[str, torch.Tensor]:
        members = [_chain(state, f"{prefix}.qf{i}.") for i in range(2)]
        out = {}
        for j, (layer0, layer1) in enumerate(zip(*members, strict=True)):
            # EnsembleLinear: weight (E, in, out), bias (E, 1, out); nn.Linear: (out, in), (out,)
            out[f"q.net.{2 * j}.weight"] = torch.stack([layer0[0].T, layer1[0].T])
            out[f"q.net.{2 * j}.bias"] = torch.stack([layer0[1], layer1[1]]).unsqueeze(1)
        return out

    online = critic("critic")
    target = critic("critic_target") if "critic_target.qf0.0.weight" in state else online
    return actor, online, target


def _load_sac(model: SB3Model, agent: SAC) -> str:
    actor, critic, target = _sac_state(model, agent)
    _load_strict(agent.actor, actor)
    _load_strict(agent.critic, critic)
    _load_strict(agent.critic_target, target)
    log_alpha = model.variables.get("log_ent_coef")
    if log_alpha is None and "ent_coef_tensor" in model.variables:
        log_alpha = model.variables["ent_coef_tensor"].log()
    alpha = ""
    if log_alpha is not None and log_alpha.numel() == 1:
        with torch.no_grad():
            agent.log_alpha.copy_(log_alpha.reshape(()))
        alpha = f", temperature {float(agent.alpha.detach()):.3g}"
    return f"SB3 SAC: actor, both critics{alpha}"


# ---------------------------------------------------------------- PPO
def _ppo_state(model: SB3Model, agent: PPO) -> dict[str, torch.Tensor]:
    """Themis ``PPO.net`` state dict from SB3 actor-critic names."""
    state = model.state
    if "log_std" in state:
        raise ValueError("its PPO acts in a Box action space (a Gaussian policy); Themis's "
                         "PPO is for Discrete actions")
    _check_activation(model, "Tanh", "PPO")
    net = agent.net
    target = net.state_dict()
    encoder: dict[str, torch.Tensor] = {}
    pi = {k.split(".", 1)[1]: v for k, v in state.items()
          if k.startswith(("features_extractor.", "pi_features_extractor."))}
    vf = {k.split(".", 1)[1]: v for k, v in state.items()
          if k.startswith("vf_features_extractor.")}
    if vf and any(k not in pi or not torch.equal(v, pi[k]) for k, v in vf.items()):
        raise ValueError("its policy and value function have separate features extractors "
                         "(share_features_extractor=False); Themis's PPO shares one encoder")
    themis_cnn = isinstance(net.encoder, NatureCNN)
    if pi:
        if not themis_cnn or not all(k.startswith(("cnn.", "linear.")) for k in pi):
            kind = "a NatureCNN" if all(k.startswith(("cnn.", "linear.")) for k in pi) \
                else "a custom"
            raise ValueError(f"its policy has {kind} features extractor; this run's PPO "
                             f"encodes its observations with {type(net.encoder).__name__}")
        for k, v in pi.items():
            encoder["encoder." + k.replace("cnn.", "convs.", 1).replace("linear.", "head.", 1)] = v
    elif themis_cnn:
        raise ValueError("its policy has no CNN (MlpPolicy); this run's PPO sees images "
                         "through a Nature CNN (train the SB3 model with CnnPolicy)")
    policy = _chain(state, "mlp_extractor.policy_net.")
    value = _chain(state, "mlp_extractor.value_net.")
    pi_w, vf_w = _widths(policy), _widths(value)
    themis = [agent.cfg.hidden_dim] * (agent.cfg.hidden_depth or 0)  # resolved: an int
    n_actions = int(state["action_net.weight"].shape[0])
    features = int((policy[0][0] if policy else state["action_net.weight"]).shape[1])
    themis_features = net.encoder.feature_dim
    if (pi_w, vf_w, n_actions, features) != (themis, themis, agent.n_actions, themis_features):
        other = "" if (n_actions, features) == (agent.n_actions, themis_features) else \
            " (a model of another env)"
        note = other or _layers_note("ppo", pi_w if pi_w != themis else vf_w, themis)
        raise ValueError(f"SB3 PPO with policy layers {pi_w}, value layers {vf_w}, "
                         f"{features} input features and {n_actions} actions; this run's PPO "
                         f"expects policy and value layers {themis}, {themis_features} input "
                         f"features and {agent.n_actions} actions{note}")
    out = dict(encoder)
    for head, chain, last in (("actor", policy, "action_net"), ("critic", value, "value_net")):
        for i, (w, b) in enumerate(chain):
            out[f"{head}.{2 * i}.weight"], out[f"{head}.{2 * i}.bias"] = w, b
        out[f"{head}.{2 * len(chain)}.weight"] = state[f"{last}.weight"]
        out[f"{head}.{2 * len(chain)}.bias"] = state[f"{last}.bias"]
    for k, v in out.items():
        if k in target and target[k].shape != v.shape:
            raise ValueError(f"its {k} has shape {tuple(v.shape)}; this run's PPO expects "
                             f"{tuple(target[k].shape)} (another observation shape?)")
    return out


def _load_ppo(model: SB3Model, agent: PPO) -> str:
    _load_strict(agent.net, _ppo_state(model, agent))
    return "SB3 PPO: policy and value networks" + (
        ", CNN encoder" if isinstance(agent.net.encoder, NatureCNN) else "")


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``load_state_dict`` (strict); a missing or extra key, or a shape, -> ValueError."""
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise ValueError(f"its layers do not fit this run's networks ({lines[-1][:160]})"
                         ) from None


LOADERS: dict[type, tuple[str, Callable[[SB3Model, Any], str]]] = {
    SAC: ("SAC", _load_sac), PPO: ("PPO", _load_ppo)}
"""Themis agent class -> the SB3 algorithm it takes and its loader."""


def load_sb3_policy(path: str | Path, agent: SAC | PPO) -> str:
    """Load the policy of an SB3 ``.zip`` into ``agent`` (in place) when the shapes match.

    Args:
        path: a file written by SB3's ``model.save()`` (SAC for :class:`SAC`, PPO or A2C for
            :class:`PPO`; MlpPolicy, or CnnPolicy for PPO on images).
        agent: the run's agent, built for the env.

    Returns:
        What was loaded, e.g. ``"SB3 SAC: actor, both critics, temperature 0.1"``.

    Raises:
        ValueError: one line: the file cannot be read safely, holds another algorithm, or its
            networks do not match the agent's (what each has, and the keys that would fit).
    """
    model = read_sb3_zip(path)
    expected, loader = LOADERS[type(agent)]
    if model.algorithm != expected:
        spaces = {"SAC": "Box", "PPO": "Discrete"}
        found = f"SB3 {model.algorithm} policy" + (
            f" ({spaces[model.algorithm]} actions)" if model.algorithm in spaces else "")
        takes = "SB3 SAC models" if expected == "SAC" else "SB3 PPO or A2C models"
        raise ValueError(f"it holds an {found}; this run's agent is {expected} "
                         f"({spaces[expected]} actions), which loads {takes}")
    try:
        return loader(model, agent)
    except KeyError as e:
        raise ValueError(f"its {model.algorithm} policy lacks {e.args[0]!r} (not an "
                         "MlpPolicy/CnnPolicy of SB3's?)") from None
