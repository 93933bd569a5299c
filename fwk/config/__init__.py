"""The config, from the command line to a validated run config: ``schema`` (torch-free
dataclasses, the defaults and their docs), ``grammar`` (overrides as users write them),
``compose`` (Hydra's compose API, the only place fwk calls Hydra), ``sweep`` (``-m``
expansion), ``validate`` (the checks and the typed config) and ``resolve`` (all of it once:
the typed config, the dict a run id hashes, the YAML a run dir keeps)."""
