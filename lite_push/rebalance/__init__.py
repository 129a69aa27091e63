"""Rebalance: queue allocation strategies (and, later, the rebalance service)."""

from .allocate import AVERAGELY, STRATEGIES, AllocateStrategy, allocate_averagely, get_strategy, register

__all__ = ["AVERAGELY", "STRATEGIES", "AllocateStrategy", "allocate_averagely", "get_strategy", "register"]
