"""Themis: reinforcement learning from human preferences (PEBBLE, BPref) in PyTorch."""

__version__ = "0.1.0"
