#!/usr/bin/env python
"""Merge preference datasets from several runs or labelers into one.

    python scripts/merge_prefs.py merged/ runs/a/preferences runs/b/preferences
    ./themis_train.sh prefs_path=merged/ max_feedback=0      # learn a reward from them alone

Every input must have the same segment length and observation/action sizes. Pairs keep their
``labeler``; the merged ``meta.json`` lists the sources. An existing, non-empty ``OUT`` is left
alone (exit 2) unless ``--force`` replaces it.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

from themis.core.script_args import ScriptParser
from themis.reward.dataset import PreferenceDataset


def merge(sources: list[Path], out: Path) -> PreferenceDataset:
    """Concatenate the datasets at ``sources`` (in order) and save the result at ``out``.

    Raises:
        FileNotFoundError / ValueError: an input is not a dataset, or shapes differ.
    """
    datasets = [PreferenceDataset.load(p) for p in sources]
    first = datasets[0]
    merged = PreferenceDataset(sum(len(d) for d in datasets), first.segment, first.obs_dim,
                               first.action_dim, obs_dtype=first.observations.dtype,
                               frame_stack=first.frame_stack)
    envs = set()
    for path, data in zip(sources, datasets, strict=True):
        unnamed = data.labelers[: len(data)] == ""
        data.labelers[: len(data)][unnamed] = str(path)
        merged.extend(data)
        envs.add(data.metadata.get("env"))
    merged.save(out, metadata={"sources": [str(p) for p in sources],
                               "env": envs.pop() if len(envs) == 1 else sorted(map(str, envs))})
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="merge_prefs", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder of the merged dataset")
    parser.add_argument("sources", type=Path, nargs="+", help="dataset folders to merge")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT when it exists (it may be one of the sources)")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"{args.out} is a file; the merged dataset is a folder: name a new folder")
    out = args.out
    if not args.force and out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "holds a preference dataset" if (out / "meta.json").is_file() else \
            "exists and is not an empty folder"
        print(f"merge_prefs: {out} {what}; choose another OUT, or add --force to replace it",
              file=sys.stderr)
        return 2
    try:
        merged = merge(args.sources, args.out)
    except (OSError, ValueError) as e:  # FileNotFoundError too
        print(f"merge_prefs: error: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(merged)} labelled pairs from {len(args.sources)} datasets into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
