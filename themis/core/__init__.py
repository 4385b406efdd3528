"""Pieces every floor above the ground floor (:mod:`themis.utils`) may use; none imports
another package of ``themis/``.

- :mod:`themis.core.precision`: matrix products in bfloat16 (``precision=auto|fp32|bf16``),
  used by SAC, the reward ensemble and the run;
- :mod:`themis.core.safe_loading`: files a user may have received, loaded without running
  code from them (PyTorch files as plain data, configs as values);
- :mod:`themis.core.console`: the run's progress bars, paused while a person answers in the
  terminal;
- :mod:`themis.core.figures`: plots written to files (matplotlib's ``Agg`` backend);
- :mod:`themis.core.run_keys`: the run's flat keys (:class:`~themis.core.run_keys.RunKeys`),
  documented and ranged, the type the floors below the run read a config as;
- :mod:`themis.core.choices` and :mod:`themis.core.env_names`: the lines that refuse an
  unknown domain or env name, shared with the launchers' quick check (standard library only).
"""
