"""``python -m reflect_trl.envs.auto_explore``: the corpus statistics (the same as ``reflect-trl corpus-stats``)."""

from reflect_trl.envs.auto_explore.packages import corpus_stats_cli

corpus_stats_cli()
