"""LockPuzzle for reflect-trl: a small text environment and its oracle reflector, registered through entry points
(see ``pyproject.toml``); nothing in reflect-trl names it."""

from reflect_lock_puzzle.env import LockPuzzleEnv
from reflect_lock_puzzle.reflector import LockPuzzleOracleReflector

__version__ = "0.1.0"
__all__ = ["LockPuzzleEnv", "LockPuzzleOracleReflector", "__version__"]
