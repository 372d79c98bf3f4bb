"""rampwatch drivers: everything that talks to the world. Never imports Textual."""

__version__ = "0.1.0"
