"""The forward kernel ``mamba_mimo_fwd`` (TileLang, ``mamba3_mimo_fwd.py`` of mamba-ssm 2.3.2.post1).

Modules: ``sites`` (the rounding sites, one policy switch each), ``spec`` (argument, output and stage names),
``validation`` (argument checks), ``reference`` (the policy reference). See ``docs/forward.md``.
"""
