#!/usr/bin/env python
"""Explain a finished run: clips of its saved agent with Captum panels of the action and reward.

    python scripts/explain.py RUN_DIR                       # 4 clips, integrated gradients
    python scripts/explain.py RUN_DIR --clips 8 --method gradient_shap --steps 3000
    python scripts/explain.py RUN_DIR --no-action           # only the learned reward

Loads ``RUN_DIR/config.yaml``, ``checkpoints/agent.pt`` and ``checkpoints/reward_model.pt``,
rolls out the agent (its evaluation action) for ``--steps`` steps while rendering frames, cuts
``--clips`` random pairs of segments and writes them as side-by-side clips with explanation
panels and summary PNGs (see ``lib/explain.py``) to ``RUN_DIR/explanations/queries/``.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

import numpy as np

from themis.core.script_args import ScriptParser, int_at_least
from themis.feedback.factory import make_clips
from themis.interpret.inspection import load_run


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--clips", type=int_at_least(1), default=4)
    parser.add_argument("--steps", type=int_at_least(1), default=2000, help="env steps rolled out")
    parser.add_argument("--method", default=None, help="xplain_method (default: the run's)")
    parser.add_argument("--no-action", action="store_true", help="skip the policy's action")
    parser.add_argument("--no-reward", action="store_true", help="skip the learned reward")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    args = parser.parse_args(argv)

    run = args.run_dir
    overrides = {"xplain_action": not args.no_action,
                 "xplain_state": not args.no_reward
                 and (run / "checkpoints" / "reward_model.pt").is_file(),
                 "learn_reward": True,  # explanations hang off the reward-learning machinery
                 "seed": args.seed, "replay_buffer_capacity": args.steps,
                 "human_frame_capacity": args.steps}
    if args.method:
        overrides["xplain_method"] = args.method
    if not (overrides["xplain_action"] or overrides["xplain_state"]):
        print("explain: error: nothing to explain (no reward model, and --no-action)",
              file=sys.stderr)
        return 2
    try:
        ws = load_run(run, run / "explanations", **overrides)
    except (FileNotFoundError, ValueError) as e:  # ConfigError, UnsafeFileError too
        print(f"explain: error: {e}", file=sys.stderr)
        return 2
    cfg = ws.cfg

    # --- roll out the saved agent, keeping every frame
    assert ws.frames is not None
    env, rng = ws.env, np.random.default_rng(args.seed)
    obs, _ = env.reset(seed=args.seed)
    frame, episode, t = env.render(), 0, 0
    eye = np.eye(ws.facts.action_dim, dtype=np.float32)
    for _ in range(args.steps):
        action = ws.eval_action(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        stored = eye[action] if ws.facts.discrete else action
        ws.frames.add(ws.buffer.ptr, frame)
        ws.buffer.add(obs, stored, 0.0, next_obs, terminated, episode, t, float(reward))
        obs, frame, t = next_obs, env.render(), t + 1
        if terminated or truncated:
            obs, _ = env.reset()
            frame, episode, t = env.render(), episode + 1, 0
    queries = ws.buffer.sample_segment_pairs(args.clips, cfg.segment, rng,
                                             usable=ws.frames.has)
    make_clips(ws.cfg, ws.learner_spec(), ws.reward_model).save_explained(queries)
    out = ws.run_dir / "queries"
    print(f"{len(queries)} explained clips ({cfg.xplain_method}) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
