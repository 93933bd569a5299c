"""`fwk profile`: where one training step's time and memory go, and what to change.

- ``capture``: runs the recipe's real training step (the engine's ``train``) under
  ``torch.profiler`` in a throwaway run dir and writes the Chrome/Perfetto trace;
- ``figures``: reads the trace: operators by self time, time and peak memory per module,
  the step split (data, forward, backward, optimizer, communication);
- ``advice``: rules on those figures, each quoting the figure that triggered it;
- ``flame``: flame graphs of time and memory as self-contained SVG;
- ``report``: the tables on screen and ``profile.json``;
- ``graph``: the model graph before and after the JIT layer's optimizations (``--graph``).
"""
