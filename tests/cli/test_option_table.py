"""``reflect-trl sft/rl --help`` and recipe checks from ``options.json``: equal to the real parsers, without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reflect_trl.cli import main
from reflect_trl.cli.option_table import GROUPS, TABLE_COMMANDS, load_table, precheck
from reflect_trl.cli.option_table_build import build_table, render_table
from reflect_trl.cli.recipes import own_fields, parser_options
from reflect_trl.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fresh() -> dict:
    """The table as the parsers and the shipped recipes give it now."""
    return build_table(REPO)


def test_options_json_is_generated_from_the_parsers_and_recipes(fresh):
    assert render_table(fresh) == render_table(load_table()), (
        "src/reflect_trl/cli/options.json is stale (a config field, its help or a shipped recipe changed): "
        "run `python -m reflect_trl.cli.option_table_build --write`"
    )


def test_the_table_holds_every_option_of_the_parsers():
    from reflect_trl.cli.rl import rl_parser
    from reflect_trl.cli.sft import sft_parser

    for command, parser in (("rl", rl_parser()), ("sft", sft_parser())):
        real = parser_options(parser)
        table = load_table()[command]["options"]
        assert set(table) == set(real), command
        for dest, spec in real.items():
            assert tuple(table[dest]["flags"]) == spec.flags, dest
            assert table[dest]["type"] == spec.type and (table[dest]["choices"] or None) == (
                list(spec.choices) if spec.choices else None
            ), dest


def test_every_group_names_real_options_and_every_own_option_is_grouped():
    from reflect_trl.cli.sft import ReflectSFTScriptArguments
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.sft_config import ReflectSFTConfig

    own = {"rl": (ReflectPPOConfig,), "sft": (ReflectSFTScriptArguments, ReflectSFTConfig)}
    for command in TABLE_COMMANDS:
        table = load_table()[command]
        grouped = [name for _, names in GROUPS[command] for name in names]
        assert len(grouped) == len(set(grouped)), command
        assert set(grouped) <= set(table["options"]), set(grouped) - set(table["options"])
        new, changed = own_fields(own[command])
        missing = set(new + changed) - set(grouped)
        assert not missing, (
            f"add {sorted(missing)} to a group of GROUPS[{command!r}] in reflect_trl/cli/option_table.py"
        )


def run_cli(*argv: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The CLI in a fresh interpreter; also which heavy modules it imported."""
    code = (
        "import sys\nfrom reflect_trl.cli import main\nrc = main(sys.argv[1:])\n"
        "print('HEAVY', [m for m in ('torch', 'trl', 'transformers') if m in sys.modules], file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    heavy = [line for line in done.stderr.splitlines() if line.startswith("HEAVY")]
    return done, json.loads(heavy[-1].split(" ", 1)[1].replace("'", '"'))


@pytest.mark.parametrize("command", TABLE_COMMANDS)
def test_help_and_recipe_errors_do_not_import_torch(command, tmp_path):
    done, heavy = run_cli(command, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: reflect-trl {command}")
    assert heavy == [], heavy
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rat: 1.0e-3\n")
    done, heavy = run_cli(command, "--config", str(recipe))
    assert done.returncode == 2
    assert "unknown key(s) 'learning_rat' (did you mean learning_rate" in done.stderr
    assert heavy == [], heavy


BAD_INPUT = [
    ("recipe", "learning_rat: 1.0e-3\n", []),
    ("recipe", "max_steps: abc\n", []),
    ("recipe", "lr_scheduler_type: cosin\n", []),
    ("recipe", "env: taxi\n", []),
    ("recipe", "- a list\n", []),
    ("flags", None, ["--max_step", "3"]),
    ("flags", None, ["--config"]),
]


@pytest.mark.parametrize("command", TABLE_COMMANDS)
@pytest.mark.parametrize(("kind", "recipe", "flags"), BAD_INPUT)
def test_the_table_checks_give_the_parsers_messages(command, kind, recipe, flags, tmp_path):
    from reflect_trl.cli.option_table import parse_recipe
    from reflect_trl.cli.rl import rl_parser
    from reflect_trl.cli.sft import sft_parser

    argv = list(flags)
    if recipe is not None:
        (tmp_path / "r.yaml").write_text(recipe)
        argv = ["--config", str(tmp_path / "r.yaml")]
    with pytest.raises(UsageError) as fast:
        precheck(command, argv)
    parser = rl_parser() if command == "rl" else sft_parser()
    with pytest.raises(UsageError) as slow:
        parse_recipe(parser, argv, command, "", own=())
    assert str(fast.value) == str(slow.value)


def test_a_valid_command_line_passes_the_precheck(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("env_name: taxi\nlearning_rate: 1.0e-3\nreflection_temperature: 0.0\n")
    assert precheck("rl", ["--config", str(recipe), "--max_steps", "3", "--no_curriculum"]) is False
    assert precheck("rl", ["--config=" + str(recipe), "--help-all"]) is False  # the real parser prints it
    assert precheck("data", ["--whatever"]) is False  # not in the table


def test_help_through_main_matches_the_slow_path(capsys):
    from reflect_trl.cli.rl import run_rl

    assert main(["rl", "--help"]) == 0
    fast = capsys.readouterr().out
    with pytest.raises(SystemExit):
        run_rl(["--help"])  # called directly (not through main): the same text
    assert capsys.readouterr().out == fast
