"""Themis's Ray launcher for Hydra sweeps (``hydra/launcher=ray``); see ``ray_launcher``."""
