"""Hooks that write rollout dumps from a training framework as it trains, for ``klviz diagnose``.

- :mod:`klviz.integrations.trl`: TRL's ``GRPOTrainer`` (``attach(trainer, "kl_dumps")``): one dump per rank per
  optimizer step, reuse steps included, with TRL's logged metrics beside them.

Each integration imports its framework only when used; ``import klviz`` never does.
"""
