"""Observations of any layout through the loops (:mod:`themis.environments.observations`):
channels-last images, small images, dict observations with ``obs_transform``, and the bad inputs.

The envs are in ``tests/obs_envs.py`` (``domain=Gym env=tests.obs_envs:NAME`` imports it).
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from tests import obs_envs
from tests.conftest import TINY_PENDULUM, launch
from themis.agents.encoders import GridCNN, NatureCNN, make_encoder, observation_kind
from themis.builder import make_workspace
from themis.environments.domains import make_env
from themis.environments.observations import (
    image_layout,
    make_obs_transform,
    prepare_observations,
    to_channels_first,
    unsupported,
)
from themis.reward import PreferenceDataset, RewardEnsemble
from themis.run.received_config import check_named_code
from themis.utils import ConfigError

GYM = "tests.obs_envs:"
TINY_PPO = [*TINY_PENDULUM, "domain=Gym", "ppo.num_envs=2", "ppo.num_steps=32",
            "ppo.hidden_dim=16", "num_train_steps=1000"]


# ---------------------------------------------------------------- layouts
@pytest.mark.parametrize("shape,dtype,layout", [
    ((64, 64, 3), np.uint8, "channels_last"), ((84, 84, 4), np.uint8, "channels_last"),
    ((7, 7, 3), np.uint8, "channels_last"), ((3, 32, 32), np.uint8, "channels_first"),
    ((4, 84, 84), np.uint8, "channels_first"), ((4, 4, 4), np.uint8, "channels_first"),
    ((84, 84), np.uint8, "frame"), ((84, 84), np.float32, None), ((17,), np.float32, None),
])
def test_image_layout_follows_the_smallest_axis(shape, dtype, layout):
    assert image_layout(gym.spaces.Box(0, 255, shape, dtype)) == layout


def test_channels_last_images_are_transposed_once_with_their_values():
    raw = gym.make("ChannelsLast-v0")
    env = to_channels_first(gym.make("ChannelsLast-v0"))
    assert env.observation_space.shape == (3, 64, 64)
    assert env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=3)
    expected, _ = raw.reset(seed=3)
    np.testing.assert_array_equal(obs, np.transpose(expected, (2, 0, 1)))
    assert obs.flags.c_contiguous
    assert to_channels_first(env) is env  # channels-first already: not wrapped again
    frames = to_channels_first(gym.wrappers.GrayscaleObservation(gym.make("ChannelsLast-v0")))
    assert frames.observation_space.shape == (1, 64, 64)
    assert frames.reset(seed=0)[0].shape == (1, 64, 64)


def test_make_env_gives_channels_first_images_of_any_domain():
    env = make_env("Gym", f"{GYM}ChannelsLast-v0", seed=0)
    assert env.observation_space.shape == (3, 64, 64)
    assert env.reset(seed=0)[0].shape == (3, 64, 64)
    assert make_env("Gym", f"{GYM}SmallImage-v0").observation_space.shape == (3, 32, 32)
    assert make_env("Gym", "CartPole-v1").observation_space.shape == (4,)


# ---------------------------------------------------------------- small images
@pytest.mark.parametrize("shape", [(3, 32, 32), (3, 35, 35), (3, 16, 16), (1, 16, 40)])
def test_small_images_go_through_the_pixel_cnn(shape):
    """(3, 32, 32) crashed in the Nature stack (8×8/4, 4×4/2, 3×3/1 leave nothing below 36)."""
    assert observation_kind(shape) == "pixels"
    encoder = make_encoder(shape)
    assert isinstance(encoder, NatureCNN)
    assert encoder(torch.zeros(2, *shape, dtype=torch.uint8)).shape == (2, 512)
    model = RewardEnsemble(int(np.prod(shape)), 2, ensemble_size=2, hidden_dim=8,
                           hidden_depth=1, obs_shape=shape)
    assert model(torch.zeros(5, int(np.prod(shape))), torch.zeros(5, 2)).shape == (2, 5)


def test_large_images_keep_the_nature_stack():
    convs = [m for m in make_encoder((4, 84, 84)).convs if isinstance(m, torch.nn.Conv2d)]
    assert [(c.kernel_size[0], c.stride[0], c.padding[0]) for c in convs] == \
        [(8, 4, 0), (4, 2, 0), (3, 1, 0)]


@pytest.mark.parametrize("shape", [(4, 7, 7), (3, 3, 3), (2, 1, 1), (3, 2, 9)])
def test_grids_of_any_size_go_through_the_grid_cnn(shape):
    encoder = make_encoder(shape)
    assert isinstance(encoder, GridCNN)
    assert encoder(torch.zeros(2, *shape)).shape == (2, 128)


# ---------------------------------------------------------------- dict observations
def test_obs_transform_picks_a_dict_entry():
    space = obs_envs.DictObs.observation_space
    fn, new = make_obs_transform("image", space)
    assert new == space["image"]
    obs = space.sample()
    np.testing.assert_array_equal(fn(obs), obs["image"])
    env = prepare_observations(gym.make("DictObs-v0"), "image")  # then made channels-first
    assert env.observation_space.shape == (3, 16, 16)
    assert env.reset(seed=0)[0].shape == (3, 16, 16)


def test_obs_transform_calls_a_function_given_by_path_or_object():
    space = obs_envs.DictObs.observation_space
    for spec in (f"{GYM}position_and_bit", obs_envs.position_and_bit):
        fn, new = make_obs_transform(spec, space)
        assert new.shape == (4,) and new.dtype == np.float32
        obs = space.sample()
        np.testing.assert_array_equal(fn(obs), obs_envs.position_and_bit(obs))


@pytest.mark.parametrize("spec,message", [
    ("imag", "obs_transform=imag: the observations have no key 'imag'; their keys: image, "
             "mission, position"),
    ("mission", "obs_transform=mission: that entry is Text"),
    ("no_such_module_x:f", "obs_transform=no_such_module_x:f: cannot import no_such_module_x"),
    (f"{GYM}nothing", f"obs_transform={GYM}nothing: tests.obs_envs has no nothing"),
    ("builtins:str", "obs_transform=builtins:str returned <U"),
    ("builtins:len", "obs_transform=builtins:len returned int64 of shape ()"),
])
def test_bad_obs_transforms_are_one_line(spec, message):
    with pytest.raises(ValueError) as err:
        make_obs_transform(spec, obs_envs.DictObs.observation_space)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_what_the_loops_cannot_take_is_said_with_the_fix():
    assert "obs_transform=KEY" in unsupported(obs_envs.DictObs.observation_space)
    assert "uint8 images" in unsupported(gym.spaces.Box(0, 1, (3, 32, 32), np.float32))
    assert "Discrete are not supported" in unsupported(gym.spaces.Discrete(5))
    assert unsupported(gym.spaces.Box(0, 255, (3, 32, 32), np.uint8)) is None


# ---------------------------------------------------------------- through the workspace
@pytest.mark.parametrize("overrides,message", [
    ([f"env={GYM}DictObs-v0"], "DictObs-v0: the observations are a dict (keys image, mission, "
                               "position): choose one entry with obs_transform=KEY"),
    ([f"env={GYM}DictObs-v0", "obs_transform=pos"], "obs_transform=pos: the observations have "
                                                    "no key 'pos'"),
    ([f"env={GYM}FloatImage-v0"], "FloatImage-v0: image observations (3, 32, 32) of float32"),
    (["env=no_such_pkg_x:Env-v0"], "env=no_such_pkg_x:Env-v0: cannot import no_such_pkg_x"),
])
def test_workspace_refuses_observations_it_cannot_take(compose, tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        make_workspace(compose([*TINY_PPO, *overrides]), tmp_path)
    assert message in str(err.value)


@pytest.mark.parametrize("overrides,shape", [
    ([f"env={GYM}ChannelsLast-v0"], (3, 64, 64)),
    ([f"env={GYM}SmallImage-v0"], (3, 32, 32)),
    ([f"env={GYM}DictObs-v0", "obs_transform=image"], (3, 16, 16)),
])
def test_images_reach_agent_store_and_reward_model_channels_first(compose, tmp_path, overrides,
                                                                 shape):
    ws = make_workspace(compose([*TINY_PPO, *overrides, "num_train_steps=300",
                                 "num_seed_steps=64", "num_unsup_steps=64"]), tmp_path)
    assert ws.facts.obs_shape == shape and ws.facts.obs_kind == "pixels"
    ws.run(until=256)  # seed steps, state-entropy PPO updates through the CNN
    assert ws.buffer.obs.shape[1:] == shape and ws.buffer.obs[: len(ws.buffer)].any()
    assert ws.learner.model.obs_shape == shape
    ws.logger.close()


# ---------------------------------------------------------------- received configs
def test_a_received_config_may_not_name_code_to_import():
    cfg = OmegaConf.create({"env": f"{GYM}DictObs-v0", "obs_transform": "image"})
    with pytest.raises(ConfigError, match=r"env=tests.obs_envs:DictObs-v0 names code to import"):
        check_named_code(cfg, "run/config.yaml")
    check_named_code(cfg, "run/config.yaml", given=["env"])  # the user's own command line
    cfg = OmegaConf.create({"env": "CartPole-v1", "obs_transform": "os:getcwd"})
    with pytest.raises(ConfigError, match="obs_transform=os:getcwd names code"):
        check_named_code(cfg, "run/config.yaml", given=["env"])


@pytest.mark.slow
def test_resume_refuses_a_config_that_names_code_unless_repeated(compose, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = compose([*TINY_PPO, f"env={GYM}DictObs-v0", f"obs_transform={GYM}position_and_bit"])
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    proc = launch("themis_train.sh", f"resume={run}")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert f"obs_transform={GYM}position_and_bit names code to import and run " \
        "(tests.obs_envs); a received config may not: repeat" in line
    proc = launch("themis_train.sh", f"resume={run}", f"obs_transform={GYM}position_and_bit")
    assert f"env={GYM}DictObs-v0 names code to import" in proc.stderr  # each key on its own
    proc = launch("themis_train.sh", f"resume={run}", f"env={GYM}DictObs-v0",
                  f"obs_transform={GYM}position_and_bit")
    assert proc.returncode == 2  # past the check: no checkpoint to resume from
    assert "names code" not in proc.stderr and "checkpoint" in proc.stderr


def test_launcher_says_the_unknown_dict_key_in_one_line(tmp_path):
    proc = launch("themis_train.sh", *TINY_PPO, f"env={GYM}DictObs-v0", "obs_transform=imge",
                  f"hydra.run.dir={tmp_path / 'r'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "themis: error: obs_transform=imge: the observations have no key 'imge'; their keys: "
        "image, mission, position"]


# ---------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.parametrize("overrides,obs_shape", [
    ([f"env={GYM}ChannelsLast-v0"], [3, 64, 64]),
    ([f"env={GYM}SmallImage-v0"], [3, 32, 32]),
    ([f"env={GYM}DictObs-v0", "obs_transform=image"], [3, 16, 16]),
    ([f"env={GYM}DictObs-v0", f"obs_transform={GYM}position_and_bit",
      "+env_kwargs.continuous=true"], [4]),  # SAC on the function's vectors
])
def test_layouts_run_end_to_end(tmp_path, overrides, obs_shape):
    proc = launch("themis_train.sh", *TINY_PPO, *overrides, "num_train_steps=800",
                  f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["total_feedback"].tolist() == [10, 20]  # rounds at steps 400 and 700
    assert len(pd.read_csv(tmp_path / "eval.csv"))
    assert len(PreferenceDataset.load(tmp_path / "preferences")) == 20
    meta = json.loads((tmp_path / "preferences" / "meta.json").read_text())
    assert meta["obs_shape"] == obs_shape
    assert ("agent sac" if obs_shape == [4] else "agent ppo") in proc.stdout
