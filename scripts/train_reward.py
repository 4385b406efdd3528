#!/usr/bin/env python
"""Train a reward model from a preferences folder alone, without any RL run.

    python scripts/train_reward.py runs/collect/preferences runs/reward reward_update=200
    python scripts/train_reward.py merged/ runs/reward method=surf ensemble_size=5

Writes ``OUT_DIR/checkpoints/reward_model.pt`` (read by :func:`themis.load_reward_model`,
``LearnedRewardWrapper``, and ``PreferenceLearningWrapper(reward_model=OUT_DIR)``) and
``OUT_DIR/config.yaml``. ``key=value`` arguments are ``./themis_train.sh`` keys of the reward
model and its training. Bad input: one line and exit code 2.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from themis.core.script_args import ScriptParser
from themis.utils import ConfigError


def parse_value(text: str) -> object:
    """``key=value`` values as YAML reads them (numbers, booleans, lists)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def main() -> None:
    parser = ScriptParser(description=__doc__.split("\n")[0])
    parser.add_argument("prefs_dir", help="a preference dataset folder")
    parser.add_argument("out_dir", help="where the reward model goes")
    parser.add_argument("keys", nargs="*", help="key=value (./themis_train.sh keys)")
    args = parser.parse_args()
    keys = {}
    for item in args.keys:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"{item}: write key=value")
        keys[key] = parse_value(value)
    from themis.online.offline import train_reward_model

    try:
        train_reward_model(args.prefs_dir, args.out_dir, **keys)
    except ConfigError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
