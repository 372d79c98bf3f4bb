"""rampwatch's drivers: everything but the terminal UI. The model (events, the fold, every figure) at the bottom;
the network, the client and telemetry that measure; the run that drives them; what a run looks like as tables
and pictures (present); and the simulated engine. Never imports Textual (pyproject.toml's import contracts)."""

__version__ = "0.1.0"
