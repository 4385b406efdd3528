"""A Hydra launcher that runs each job of a ``-m`` sweep as a Ray task (``hydra/launcher=ray``).

Written on Ray's current API (``ray.init``, ``ray.remote(...).options(...)``) instead of
Hydra's ``hydra-ray-launcher`` 1.2.2, whose pins hold the stack back (``cloudpickle<3``) and
which fails on an existing cluster with Ray 2.60 (README: Sweeps on Ray).

    ./themis_train.sh -m hydra/launcher=ray hydra.launcher.address=auto seed=0,1,2
    ./themis_train.sh -m hydra/launcher=ray hydra.launcher.address=ray://HEAD:10001 \\
        hydra.launcher.num_cpus=4 feed_type=0,1,2

Each job asks Ray for ``num_cpus`` CPUs (and ``num_gpus`` GPUs): Ray runs as many side by side
as the cluster has room for. The job writes its run dir under ``hydra.sweep.dir`` on the node it
runs on, so on several machines the sweep dir must be on storage they share.
"""

# No "from __future__ import annotations": Hydra loads plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations.
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


@dataclass
class RayLauncherConf:
    """``hydra.launcher.*`` of ``hydra/launcher=ray``."""

    _target_: str = "hydra_plugins.themis_ray_launcher.ray_launcher.ThemisRayLauncher"
    address: str | None = None
    """The cluster: ``auto`` (the one ``ray start`` began on this machine), ``HOST:PORT`` of
    its head, ``ray://HOST:10001`` (Ray Client); null: a Ray instance on this machine for the
    sweep alone. Null and ``127.0.0.1:PORT`` keep Ray on the loopback."""
    num_cpus: float = 1
    """CPUs Ray reserves per job (PyTorch threads: as many, with torch_threads=auto)."""
    num_gpus: float = 0
    """GPUs Ray reserves per job (with device=cuda)."""
    max_retries: int = 0
    """Ray's retries of a job whose worker died (a job that fails is not retried)."""
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """Ray's runtime environment when Themis is not installed on the cluster's nodes, e.g.
    ``+hydra.launcher.runtime_env.working_dir=$PWD``."""
    init: dict[str, Any] = field(default_factory=dict)
    """More ``ray.init`` arguments, e.g. ``+hydra.launcher.init.namespace=themis``."""


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf,
                             provider="themis")


def _run_job(hydra_context: HydraContext, sweep_config: DictConfig,
             task_function: TaskFunction, singleton_state: dict[Any, Any]) -> JobReturn:
    """One job on a Ray worker: Hydra's globals as in the driver, the Ray task id as the
    job id, then Hydra's own ``run_job`` (run dir, ``.hydra/``, the task)."""
    import ray

    setup_globals()
    Singleton.set_state(singleton_state)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"ray_{ray.get_runtime_context().get_task_id()}"
    HydraConfig.instance().set_config(sweep_config)
    return run_job(hydra_context=hydra_context, task_function=task_function,
                   config=sweep_config, job_dir_key="hydra.sweep.dir",
                   job_subdir_key="hydra.sweep.subdir")


class ThemisRayLauncher(Launcher):
    """Hydra's Launcher interface over Ray tasks (see the module docstring).

    Args: the fields of :class:`RayLauncherConf`.
    """

    def __init__(self, address: str | None = None, num_cpus: float = 1, num_gpus: float = 0,
                 max_retries: int = 0, runtime_env: Any = None, init: Any = None) -> None:
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.max_retries = max_retries
        self.runtime_env = _plain(runtime_env)
        self.init = _plain(init)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, \
            task_function

    def start_ray(self) -> None:
        """Connect to the cluster (or start one on 127.0.0.1 for the sweep)."""
        host = (self.address or "").rsplit(":", 1)[0]
        if self.address is None or host in ("127.0.0.1", "localhost"):
            # a cluster on the loopback: Ray would otherwise swap 127.0.0.1 for this
            # machine's LAN address (and listen there)
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray

        if ray.is_initialized():
            return
        kwargs = dict(self.init)
        if self.runtime_env:
            kwargs["runtime_env"] = self.runtime_env
        if self.address is None:
            kwargs.setdefault("include_dashboard", False)
        log.info(f"Ray: connecting to {self.address or 'a new local instance'}")
        try:
            ray.init(address=self.address, **kwargs)
        except Exception as e:  # a token the cluster refuses: one line, exit 2
            if not is_token_refused(e):
                raise
            print(f"themis: error: {token_refused_line(self.address)}", file=sys.stderr)
            sys.exit(2)

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit every job as a Ray task, wait for all, return their results in order."""
        assert self.config is not None and self.hydra_context is not None
        assert self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.start_ray()  # first: it sets what Ray reads when it is imported
        import ray
        remote = ray.remote(_run_job).options(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                              max_retries=self.max_retries)
        log.info(f"Ray: launching {len(job_overrides)} jobs ({self.num_cpus:g} CPU each), "
                 f"sweep dir {sweep_dir}")
        refs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.num = idx
            refs.append(remote.remote(self.hydra_context, sweep_config, self.task_function,
                                      Singleton.get_state()))
        return list(ray.get(refs))


def _plain(node: Any) -> dict[str, Any]:
    """A config mapping (or None) as a plain dict for Ray."""
    if node is None:
        return {}
    if isinstance(node, DictConfig):
        value = OmegaConf.to_container(node, resolve=True)
        assert isinstance(value, dict)
        return {str(k): v for k, v in value.items()}
    return dict(node)


def is_token_refused(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is Ray refusing this client's token: Ray's
    ``AuthenticationError``, or a gRPC ``InvalidAuthToken`` / ``Unauthenticated`` status."""
    seen = 0
    while error is not None and seen < 8:
        text = f"{type(error).__name__}: {error}"
        if type(error).__name__ == "AuthenticationError" or "InvalidAuthToken" in text or \
                "UNAUTHENTICATED" in text:
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def token_refused_line(address: str | None) -> str:
    """The one line for a Ray cluster that refused this client's token."""
    where = f"the Ray cluster at {address}" if address else "the local Ray instance"
    return (f"{where} refused this machine's authentication token (InvalidAuthToken): the "
            "token in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN is not the "
            "cluster's; use the token the cluster was started with, or a clean HOME for a "
            "cluster of your own (README: Sweeps on Ray)")
