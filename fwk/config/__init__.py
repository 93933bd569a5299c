"""The config, from the command line to a validated run config.

- ``schema``: the torch-free dataclasses, the defaults and their docs.
- ``grammar``: overrides as users write them.
- ``compose``: Hydra's compose API, the only place fwk calls Hydra.
- ``sweep``: the expansion of ``-m``.
- ``validate``: the checks and the typed config.
- ``resolve``: all of it once, giving the typed config, the dict a run id hashes, and the
  YAML a run dir keeps."""
