"""Training loops (drivers): PEBBLE with SAC, PrefPPO with PPO."""
