"""memplan: measure, plan, prove and size activation checkpointing. The CLI lives in memplan.cli."""

__version__ = "0.1.0"
