"""Claims that carry their evidence: every general sentence of a lesson, checked over its whole domain.

See ``registry.py`` for what a claim is, ``families.py`` for the domains, ``lessonNN.py`` for the
claims of each lesson and ``test_claims.py`` for what CI checks.
"""
