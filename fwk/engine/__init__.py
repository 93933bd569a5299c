"""The loop every worker runs, and only the loop: build (``build``), one optimizer step
(``step``), evaluation (``evaluate``), what a checkpoint restores and when to stop
(``state``), and the loop itself (``trainer``). Strategies (``fwk.strategies``) and
components (``fwk.components``) plug in."""
