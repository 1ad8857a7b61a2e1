"""``reflect-trl data``: the SFT data sets of an environment, with negative examples."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from reflect_trl.data.builder import DATASET_NAMES, DataBuilderConfig, build_datasets
from reflect_trl.reflection import get_oracle_reflector


# -- command line --------------------------------------------------------------------------------------------
def check_data_config(config: DataBuilderConfig) -> None:
    """Up-front checks of ``reflect-trl data`` (nothing is written before): the environment, its kwargs and stages,
    an oracle reflector for it, and output paths that the builder may replace."""
    from reflect_trl.errors import UsageError, describe
    from reflect_trl.validation import check_env

    check_env(config.env_name, config.env_kwargs, config.stages)
    if config.tokenizer_name_or_path:
        from reflect_trl.validation import check_model_path

        check_model_path(config.tokenizer_name_or_path, "tokenizer_name_or_path")
    try:
        get_oracle_reflector(config.env_name)
    except (KeyError, ImportError) as err:
        raise UsageError(f"env_name {config.env_name!r}: {describe(err)}") from err
    out = Path(config.output_dir) / config.env_name
    if out.exists() and not out.is_dir():
        raise UsageError(f"output_dir: {out} is a file; choose another output_dir")
    for name in DATASET_NAMES:
        path = out / name
        if (
            path.exists()
            and not (path / "dataset_dict.json").is_file()
            and not (path.is_dir() and not any(path.iterdir()))
        ):
            raise UsageError(
                f"output_dir: {path} exists and is not a saved data set; move it away or choose another output_dir"
            )


def build_datasets_cli(argv: Sequence[str] | None = None) -> int:
    """``reflect-trl data --config recipes/taxi/data.yaml [--seed 1 ...]``: build and save the data sets."""
    from trl import TrlParser

    from reflect_trl.cli.option_table import parse_recipe

    (config,) = parse_recipe(
        TrlParser((DataBuilderConfig,)),
        argv,
        "data",
        "Generate the reflection / policy SFT data sets of an environment: oracle trajectories with injected "
        "mistakes (negative examples), saved under <output_dir>/<env_name>/ (save_to_disk + JSONL + a data card).",
        own=(DataBuilderConfig,),
    )
    check_data_config(config)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = build_datasets(config)
    out = Path(config.output_dir) / config.env_name
    for name, dataset in result.items():
        sizes = ", ".join(f"{split} {len(dataset[split])}" for split in dataset)
        print(f"{out / name} ({sizes}); {out / name}.jsonl")
    print(f"data card: {out / 'README.md'}")
    from reflect_trl.data.builder import length_stats

    rows = {
        name: {split: result[name][split].to_list() for split in result[name]}
        for name in ("reflection", "policy_reflect")
    }
    tokenizer = None
    if config.tokenizer_name_or_path:
        from reflect_trl.models import load_tokenizer

        tokenizer = load_tokenizer(config.tokenizer_name_or_path)
    print(length_stats(rows, tokenizer, config.tokenizer_name_or_path).summary())
    return 0
