"""The crowd side: what people answered, how much to trust it, and the audit of it.

- :mod:`themis.crowd.label_store`: the SQLite store of queries, answers, labelers and tokens
  that the web label server (``lib/label_server.py``) reads and writes;
- :mod:`themis.crowd.aggregation`: turning several people's answers into one label (gold
  questions, labeler scores, majority and Dawid–Skene);
- :mod:`themis.crowd.audit` and :mod:`themis.crowd.audit_report`: agreement, speed and
  disagreement of a finished run's labelers, and the report section that shows them.
"""
