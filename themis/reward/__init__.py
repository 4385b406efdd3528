"""Reward learning from preferences: ensemble, Bradley–Terry trainer, preference dataset."""

from themis.reward.dataset import PreferenceDataset
from themis.reward.ensemble import RewardEnsemble, load_reward_model, save_reward_model
from themis.reward.trainer import RewardTrainer, RewardTrainStats, bradley_terry_loss

__all__ = ["PreferenceDataset", "RewardEnsemble", "RewardTrainStats", "RewardTrainer",
           "bradley_terry_loss", "load_reward_model", "save_reward_model"]
