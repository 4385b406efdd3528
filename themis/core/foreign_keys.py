"""Keys of other preference-learning libraries, given to Themis's launcher or wrapper: the one
line that names the Themis key doing the same (imitation's ``preference_comparisons`` names;
DRLHP's live beside the wrapper, :data:`themis.online.keys.DRLHP_KEYS`). Standard library only:
the launchers' quick check imports it."""

from __future__ import annotations

IMITATION_KEYS = {
    "total_timesteps": "num_train_steps",
    "total_comparisons": "max_feedback",
    "comparisons_per_iteration": "reward_batch (queries per round)",
    "num_iterations": "num_interact (agent steps between rounds: "
                      "num_train_steps / num_iterations)",
    "initial_comparison_frac": "first_round_queries (the first round's queries: "
                               "initial_comparison_frac × max_feedback)",
    "fragment_length": "segment",
    "transition_oversampling": "large_batch (candidates per query, with feed_type=1-5)",
    "active_selection_oversampling": "large_batch (candidates per query, with feed_type=1-5)",
    "active_selection": "feed_type=1-5 (the ensemble-disagreement samplers)",
    "initial_epoch_multiplier": "reward_pretrain_epochs (the first round's epochs, with "
                                "reward_schedule=passes)",
    "temperature": "teacher_beta (the Bradley–Terry teacher's rationality)",
    "discount_factor": "teacher_gamma (the teacher's myopia)",
    "noise_prob": "reward_random_response (the probability of a random answer)",
    "fragmenter_type": "feed_type (0: uniform, as RandomFragmenter)",
}
"""imitation's ``train_preference_comparisons`` names -> the Themis key that does the same
(``docs/coming-from/imitation.md``)."""


def foreign_key(key: str) -> str | None:
    """The one line for another library's name of a Themis key (:data:`IMITATION_KEYS`), or
    ``None``."""
    name = key.lstrip("+~")
    if name in IMITATION_KEYS:
        return (f"{name} is imitation's name, not a Themis key: use {IMITATION_KEYS[name]} "
                "(docs/coming-from/imitation.md)")
    return None
