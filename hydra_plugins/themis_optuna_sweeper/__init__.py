"""Themis's Optuna sweeper for Hydra (``hydra/sweeper=optuna``); see ``optuna_sweeper``."""
