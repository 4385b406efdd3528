"""Hydra entry point of ``./themis_train.sh``: PEBBLE (or SAC on the true reward) end to end.

    python -m themis.train env=HalfCheetah-v5 max_feedback=1000
    python -m themis.train pretrained_snapshot=runs/.../snapshot.pt
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from themis.config import register_configs
from themis.utils import ConfigError

register_configs()


def run_dir() -> Path:
    """The Hydra run dir of this job (``hydra.run.dir`` or the sweep's job dir)."""
    return Path(HydraConfig.get().runtime.output_dir)


def build_workspace(cfg: DictConfig):
    """Create the Workspace; a bad config ends the program with one line and exit code 2."""
    from themis.workspace import Workspace

    out = run_dir()
    try:
        ws = Workspace(cfg, out)
    except ConfigError as e:
        print(f"themis: error: {e}", file=sys.stderr)
        sys.exit(2)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return ws


@hydra.main(version_base="1.3", config_path="../config", config_name="train_themis")
def main(cfg: DictConfig) -> None:
    ws = build_workspace(cfg)
    ws.run()
    ws.finish()


if __name__ == "__main__":
    main()
