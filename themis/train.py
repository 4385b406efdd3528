"""Hydra entry point of ``./themis_train.sh``: PEBBLE (or SAC on the true reward) end to end.

    python -m themis.train env=HalfCheetah-v5 max_feedback=1000
    python -m themis.train pretrained_snapshot=runs/.../snapshot.pt
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from themis.config import register_configs
from themis.utils import ConfigError

register_configs()


def run_dir() -> Path:
    """The Hydra run dir of this job (``hydra.run.dir`` or the sweep's job dir)."""
    return Path(HydraConfig.get().runtime.output_dir)


def threads_per_job(cfg: DictConfig) -> int:
    """PyTorch threads for this job: ``torch_threads``, or a share of the cores in a joblib sweep.

    ``-m`` sweeps run ``hydra.launcher.n_jobs`` jobs side by side on this machine (-1 = one per
    core, joblib's convention); each job then gets ``cores // n_jobs`` threads (at least 1) so
    parallel jobs do not oversubscribe the CPU. Single runs and SLURM jobs keep the default.
    """
    if cfg.torch_threads > 0:
        return int(cfg.torch_threads)
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or "joblib" not in str(
            hydra_cfg.launcher.get("_target_", "")):
        return 0
    cores = os.cpu_count() or 1
    n_jobs = int(hydra_cfg.launcher.get("n_jobs", -1))
    n_jobs = n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)
    return max(1, cores // n_jobs)


def build_workspace(cfg: DictConfig):
    """Create the Workspace; a bad config ends the program with one line and exit code 2."""
    from themis.workspace import make_workspace

    out = run_dir()
    cfg.torch_threads = threads_per_job(cfg)
    try:
        ws = make_workspace(cfg, out)
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
