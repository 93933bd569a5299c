"""The loop every worker runs, and only the loop: build (``build``), one optimizer step
(``step``), evaluation (``evaluate``), what a checkpoint restores and when to stop
(``trainer``). Strategies (``fwk.strategies``) and components (``fwk.components``) plug in."""
