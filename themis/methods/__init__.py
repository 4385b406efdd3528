"""PEBBLE's successors as plug-in methods (:mod:`themis.methods.base` the interface,
:mod:`themis.methods.registry` the registry; ``docs/adding_a_method.md``).

============  =================================================  ===============================
method        mechanism (module)                                 hooks
============  =================================================  ===============================
``surf``      :class:`~themis.methods.surf.PseudoLabeler`,       ``after_queries``,
              :class:`~themis.methods.crop.TemporalCrop`         ``batch_loss``, augmentation
``rune``      :class:`~themis.methods.rune.UncertaintyBonus`     ``reward_bonus``
``mrn``       :class:`~themis.methods.mrn.MetaRewardUpdate`      ``between_rounds``
``qpa``       :class:`~themis.methods.qpa.HybridReplay`,         ``replay``, augmentation (its
              :class:`~themis.methods.crop.TemporalCrop`         query pool: its config file)
``rime``      :class:`~themis.methods.rime.RobustLabelFilter`,   ``select_labels``,
              :class:`~themis.methods.rime.WarmStart`            ``stop_rule``,
                                                                 ``pretraining_step``
============  =================================================  ===============================

This package's ``__init__`` imports nothing, so that the learner and the trainer can import
the interface (:mod:`themis.methods.base`) while the methods import the reward model.
"""
