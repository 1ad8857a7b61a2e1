"""``reflect-trl envs``: the registered environments and their curriculum stages."""

from __future__ import annotations

import argparse

DESCRIPTION = "list the registered environments and their curriculum stages"


def list_envs_cmd(argv: list[str]) -> None:
    from reflect_trl.envs import get_env_class, list_envs

    argparse.ArgumentParser(prog="reflect-trl envs", description=DESCRIPTION).parse_args(argv)
    for name in list_envs():
        try:
            stages = ", ".join(get_env_class(name).stages)
        except ImportError as err:  # optional extra not installed
            stages = f"unavailable ({err})"
        print(f"{name:14s} {stages}")
