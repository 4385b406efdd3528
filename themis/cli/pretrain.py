"""Hydra entry point of ``./themis_pretrain.sh``: seed + unsupervised phase, then a snapshot.

The snapshot (``snapshot.pt`` in the run dir: agent, replay buffer, step) is the input of
``./themis_train.sh pretrained_snapshot=PATH``, which skips straight to reward learning.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from themis.cli.train import build_workspace, main_or_stop, preflight, register_configs, run_or_stop
from themis.run.snapshot import save_snapshot

register_configs()


@hydra.main(version_base="1.3", config_path="../../config", config_name="pretrain_themis")
def main(cfg: DictConfig) -> None:
    ws = build_workspace(cfg)
    run_or_stop(ws, "./themis_pretrain.sh", until=ws.cfg.pretrain_end)
    path = save_snapshot(ws)
    ws.logger.info(f"snapshot written: {path}\n"
                   f"continue with: ./themis_train.sh pretrained_snapshot={path.resolve()}",
                   "cyan")
    ws.logger.close()
    if ws.tracking is not None:
        ws.tracking.close("FINISHED")


if __name__ == "__main__":
    preflight("pretrain_themis", sys.argv[1:])
    main_or_stop(main)
