"""The demo pipeline in miniature: every step runs and every output file is written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from reflect_trl.pipelines.demo import DemoConfig, run_demo
from reflect_trl.pipelines.protocols import CONFIGURATIONS, PROTOCOLS, RL_RUNS, needed_runs

#: the strict protocol's table rows (label, policy run, reflection run) and the runs they need
TABLE_ROWS = [
    (c.label, c.policy, c.reflection) for c in (CONFIGURATIONS[n] for n in PROTOCOLS["strict"].configurations)
]
STRICT_RUNS = needed_runs(DemoConfig())
RL = [r for r in STRICT_RUNS if r in RL_RUNS]


def test_smoke_demo_produces_every_output(tmp_path):
    out = tmp_path / "demo"
    summary = run_demo(DemoConfig.smoke(str(out)))
    for name in STRICT_RUNS:
        assert (out / "runs" / name / "config.json").is_file(), name
    for name in RL:
        history = json.loads((out / "runs" / name / "log_history.json").read_text())
        assert any("env/success_rate" in h for h in history)
    for path in (
        "eval/results.md",
        "eval/results.json",
        "learning_curves.png",
        "success_bars_greedy.png",
        "summary.json",
        "results.md",
        "demo_config.json",
    ):
        assert (out / path).is_file() and (out / path).stat().st_size > 0, path
    table = (out / "eval" / "results.md").read_text()
    for label, _, _ in TABLE_ROWS:
        assert f"| {label} |" in table
    results = json.loads((out / "eval" / "results.json").read_text())["results"]
    assert len(results) == len(TABLE_ROWS) * 3  # three DangerousTaxi stages, greedy decoding
    assert len(list((out / "eval" / "transcripts").glob("*.jsonl"))) == len(results)
    assert set(summary["timings_seconds"]) and summary["total_seconds"] > 0
    assert summary["rl_steps"] == 3 == json.loads((out / "summary.json").read_text())["rl_steps"]  # resolved
    # every row was evaluated by its own job in the training graph
    assert {f"evaluation {label}" for label, _, _ in TABLE_ROWS} <= set(summary["timings_seconds"])
    # the same demo again: every job and every evaluation is reused
    repeated = run_demo(DemoConfig.smoke(str(out)))
    assert repeated["results"] == summary["results"]
    assert not [k for k in repeated["timings_seconds"] if k.startswith(("evaluation ", "SFT ", "RL "))]
    # `demo --evaluate_only` (reproduce's evaluation job) on the finished runs: every configuration's evaluation
    # is reused (pipelines.eval_step), so the table is the recorded one, wall times included
    from reflect_trl.cli.demo import demo_cli

    assert len(list((out / "eval" / "cache").glob("*.json"))) == len(TABLE_ROWS)
    (out / "summary.json").unlink()
    again = demo_cli(["--config", str(out / "demo_config.json"), "--evaluate_only"])
    assert again["results"] == summary["results"]
    assert json.loads((out / "summary.json").read_text())["results"] == again["results"]
    assert list(again["timings_seconds"]) == ["5/5 evaluation, table and plots"]


def _without_timings(results: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in results]


def test_same_seed_reproduces_the_demo_table(tmp_path):
    """Two smoke demos with seed 0 in different directories give the same table, SFT metrics and RL curves."""
    first = run_demo(DemoConfig.smoke(str(tmp_path / "a")))
    second = run_demo(DemoConfig.smoke(str(tmp_path / "b")))
    assert _without_timings(first["results"]) == _without_timings(second["results"])
    for name in RL:
        curves = [
            [
                {k: v for k, v in h.items() if k.startswith(("env/", "loss", "entropy"))}
                for h in json.loads((tmp_path / d / "runs" / name / "log_history.json").read_text())
            ]
            for d in ("a", "b")
        ]
        assert curves[0] == curves[1], name

    def measured(metrics: dict) -> dict:  # drop wall times and the run's own paths
        return {
            k: v
            for k, v in metrics.items()
            if not any(x in k for x in ("seconds", "runtime", "per_second")) and not k.endswith("path")
        }

    untimed = [{run: measured(m) for run, m in s["sft_metrics"].items()} for s in (first, second)]
    assert untimed[0] and all(untimed[0].values())
    assert untimed[0] == untimed[1]


def test_demo_overrides_are_typed():
    import argparse

    import pytest

    from reflect_trl.cli.demo import _parse_field

    parser = argparse.ArgumentParser()
    assert _parse_field("rl_steps", 60, "5", parser) == 5
    assert _parse_field("rl_steps", None, "900", parser) == 900  # int | None: the protocol's when not given
    assert _parse_field("rl_steps", None, "none", parser) is None
    assert _parse_field("sft_learning_rate", 3e-3, "1e-3", parser) == 1e-3
    assert _parse_field("eval_decodings", ["greedy"], "greedy,sampled", parser) == ["greedy", "sampled"]
    assert _parse_field("rl_env_kwargs", None, '{"step_reward": -1}', parser) == {"step_reward": -1}
    with pytest.raises(SystemExit):
        _parse_field("rl_env_kwargs", None, "[1]", parser)
    with pytest.raises(SystemExit):
        _parse_field("rl_steps", 60, "many", parser)
    with pytest.raises(SystemExit):
        _parse_field("rl_steps", None, "9.5", parser)
    # optional fields: typed by their annotation, "none" keeps the default
    assert _parse_field("rl_advantage_estimator", "gigpo", "rloo", parser) == "rloo"
    assert _parse_field("sft_policy_learning_rate", None, "3e-4", parser) == 3e-4
    assert _parse_field("sft_policy_learning_rate", None, "none", parser) is None
    with pytest.raises(SystemExit):
        _parse_field("sft_policy_learning_rate", None, "fast", parser)
    # a dict field takes a JSON object
    rates = {"sft_plain": 1e-3}
    assert _parse_field("sft_run_learning_rates", rates, '{"sft_plain": 3e-3}', parser) == {"sft_plain": 3e-3}
    assert _parse_field("sft_run_learning_rates", rates, "{}", parser) == {}
    with pytest.raises(SystemExit):
        _parse_field("sft_run_learning_rates", rates, "3e-3", parser)


def test_smoke_demo_runs_on_auto_explore(tmp_path):
    """`make demo ENV=auto_explore` path: the same pipeline on repository navigation (small example repository)."""
    from dataclasses import replace

    from reflect_trl.envs.auto_explore.example_repo import write_example_repo
    from reflect_trl.pipelines.jobs import DONE_MARKER

    repo = write_example_repo(tmp_path / "repo")
    cfg = replace(
        DemoConfig.smoke(str(tmp_path / "demo")),
        env_name="auto_explore",
        env_kwargs={"roots": [str(repo)], "horizon": 6, "max_content_tokens": 30, "max_content_lines": 4},
        sft_lookup_steps=2,  # its option list (the folder's entries) changes with the state
    )
    summary = run_demo(cfg)
    stages = {r["stage"] for r in summary["results"]}
    # The example repository is too small to hold out deeper files: evaluation skips stages without test tasks.
    assert "depth1" in stages and stages <= {"depth1", "depth2", "depth3"}
    assert len(summary["results"]) == len(TABLE_ROWS) * len(stages)
    data = tmp_path / "demo" / "data" / "auto_explore"
    assert (data / "README.md").is_file()
    # the warm-up ran on the bare lookup rows, and both policy SFT runs started from its model
    runs = tmp_path / "demo" / "runs"
    assert (data / "policy_lookup" / "dataset_dict.json").is_file()
    assert "# Reflection:" in (data / "policy_lookup.jsonl").read_text().splitlines()[0]
    assert (runs / "sft_policy_lookup" / "config.json").is_file()
    for name in ("sft_policy", "sft_plain"):
        marker = json.loads((runs / name / DONE_MARKER).read_text())
        start = marker["argv"][marker["argv"].index("--model_name_or_path") + 1]
        assert Path(start) == runs / "sft_policy_lookup", name


def test_the_lookup_warm_up_starts_every_policy_chain_when_asked(tmp_path):
    """``sft_lookup_steps``: one lookup-data job on the oracle-reflection rows, one warm-up SFT of that many steps
    from the base model, and every policy SFT run (not the reflection runs) starting from it; 0 adds nothing."""
    from reflect_trl.errors import UsageError
    from reflect_trl.pipelines.demo import check_demo_config
    from reflect_trl.pipelines.protocols import LOOKUP_STARTED, demo_jobs

    def flag(job, name):
        return job.argv[job.argv.index(f"--{name}") + 1]

    base, data, runs = tmp_path / "base", tmp_path / "data", tmp_path / "runs"
    cfg = DemoConfig(sft_lookup_steps=8000, configurations=["sft_only", "reflect_sft", "no_negatives"])
    check_demo_config(cfg)
    jobs = {j.name: j for j in demo_jobs(cfg, base, data, runs)}
    assert flag(jobs["lookup_data"], "dataset") == str(data / "policy_reflect.jsonl")
    assert flag(jobs["lookup_data"], "output") == str(data / "policy_lookup")
    warm = jobs["sft_policy_lookup"]
    assert warm.needs == ("lookup_data",) and flag(warm, "model_name_or_path") == str(base)
    assert flag(warm, "max_steps") == "8000" and flag(warm, "dataset_path") == str(data / "policy_lookup")
    started = [n for n in LOOKUP_STARTED if n in jobs]
    assert started == ["sft_policy", "sft_policy_positive", "sft_plain"]
    for name in started:
        assert flag(jobs[name], "model_name_or_path") == str(runs / "sft_policy_lookup"), name
        assert "sft_policy_lookup" in jobs[name].needs and flag(jobs[name], "max_steps") == "400"
    for name in ("sft_reflection", "sft_reflection_positive"):
        assert flag(jobs[name], "model_name_or_path") == str(base)
    names = list(jobs)
    assert names.index("sft_policy_lookup") < min(names.index(n) for n in started)

    default = {j.name: j for j in demo_jobs(replace(cfg, sft_lookup_steps=0), base, data, runs)}
    assert "lookup_data" not in default and "sft_policy_lookup" not in default
    assert flag(default["sft_policy"], "model_name_or_path") == str(base)
    with pytest.raises(UsageError, match="sft_lookup_steps must be >= 0"):
        check_demo_config(DemoConfig(sft_lookup_steps=-1))


def test_a_config_file_is_overridden_only_by_the_flags_given(tmp_path):
    """`reproduce --jobs 2` starts `reflect-trl demo --config <file>` per seed: the file's seed, environment and
    output directory must survive (argparse defaults once silently replaced them with seed 0)."""
    from dataclasses import asdict

    from reflect_trl.cli.demo import demo_config_from_cli

    request = tmp_path / "request.json"
    wanted = DemoConfig.smoke(str(tmp_path / "seed_7"))
    wanted = DemoConfig(
        **{**asdict(wanted), "seed": 7, "env_name": "auto_explore", "env_kwargs": {"horizon": 9}}
    )
    request.write_text(json.dumps(asdict(wanted)))
    assert demo_config_from_cli(["--config", str(request)]) == wanted
    flagged = demo_config_from_cli(["--config", str(request), "--seed", "3", "--rl_steps", "5"])
    assert (flagged.seed, flagged.rl_steps, flagged.env_name, flagged.output_dir) == (
        3,
        5,
        "auto_explore",
        str(tmp_path / "seed_7"),
    )
    plain = demo_config_from_cli([])
    assert (plain.seed, plain.env_name, plain.output_dir) == (0, "taxi", "outputs/demo")


def test_an_environment_brings_its_demo_settings_unless_a_flag_or_file_sets_them(tmp_path):
    """ENV_DEMO_SETTINGS fill the fields the command line and --config leave unset (a smoke run keeps no budget)."""
    from reflect_trl.cli.demo import demo_config_from_cli
    from reflect_trl.pipelines.protocols import ENV_DEMO_SETTINGS
    from reflect_trl.pipelines.reproduce import ReproduceConfig

    pytest.importorskip("textworld", reason="reflect-trl[textworld]")
    own = ENV_DEMO_SETTINGS["textworld"]
    out = ["--output_dir", str(tmp_path / "out"), "--env_name", "textworld"]
    cfg = demo_config_from_cli(out)
    assert cfg.env_kwargs == own["env_kwargs"] and cfg.sft_lookup_steps == own["sft_lookup_steps"] > 0
    assert cfg.sft_policy_steps == own["sft_policy_steps"]
    flagged = demo_config_from_cli(out + ["--sft_lookup_steps", "0", "--env_kwargs", '{"horizon": 7}'])
    assert (flagged.sft_lookup_steps, flagged.env_kwargs, flagged.sft_policy_steps) == (
        0,
        {"horizon": 7},
        own["sft_policy_steps"],
    )
    request = tmp_path / "request.yaml"
    request.write_text("env_name: textworld\nsft_policy_steps: 12\n")
    from_file = demo_config_from_cli(["--config", str(request)])
    assert (from_file.sft_policy_steps, from_file.sft_lookup_steps) == (12, own["sft_lookup_steps"])
    smoke = demo_config_from_cli(out + ["--smoke"])
    assert smoke.env_kwargs == own["env_kwargs"] and smoke.sft_lookup_steps == 0
    assert smoke.sft_policy_steps == DemoConfig.smoke("x").sft_policy_steps
    # reproduce gives every seed the same settings
    seed = ReproduceConfig(env_name="textworld", demo_overrides={"sft_policy_steps": 5}).demo_config(2)
    assert (seed.seed, seed.env_kwargs, seed.sft_lookup_steps, seed.sft_policy_steps) == (
        2,
        own["env_kwargs"],
        own["sft_lookup_steps"],
        5,
    )
    assert DemoConfig().sft_lookup_steps == 0, "DangerousTaxi's list never changes: no warm-up"


def test_auto_explore_demo_plays_the_package_corpus_with_a_warm_up(tmp_path):
    """`make demo ENV=auto_explore`: the pinned package corpus (held-out repositories), the option-lookup warm-up and
    the reference rows; a smoke run keeps the corpus but no budget."""
    from reflect_trl.cli.demo import demo_config_from_cli

    out = ["--output_dir", str(tmp_path / "out"), "--env_name", "auto_explore"]
    cfg = demo_config_from_cli(out)
    assert cfg.env_kwargs["corpus"] == "packages" and cfg.sft_lookup_steps > 0
    assert {"oracle", "random", "sft_only", "reflect_sft"} <= set(cfg.configurations)
    smoke = demo_config_from_cli(out + ["--smoke"])
    assert smoke.env_kwargs == cfg.env_kwargs and smoke.sft_lookup_steps == 0


@pytest.mark.slow  # starts `transformers serve` (~10 s) and plays every generated reflection through it
def test_smoke_demo_with_served_reflection_models(tmp_path):
    """`reflection_backend: openai`: the demo serves its own SFT'd reflection models with `transformers serve`; RL
    and evaluation request every reflection their greedy memos do not hold from it (the server's access log shows
    them) and the demo finishes."""
    for module in ("fastapi", "uvicorn", "openai"):
        pytest.importorskip(module, reason="`transformers serve` needs reflect-trl[serve]")
    from dataclasses import replace

    cfg = replace(DemoConfig.smoke(str(tmp_path)), reflection_backend="openai")
    summary = run_demo(cfg)
    assert {r["configuration"] for r in summary["results"]} == {label for label, _, _ in TABLE_ROWS}
    import torch

    # one completions request per generated reflection: every RL turn of the runs with a reflection model and every
    # evaluation turn of the configurations with one, less those the greedy reflection memos served, and nothing else
    rl_turns = rl_generated = 0
    for name, reflection in ((n, RL_RUNS[n].reflection) for n in RL):
        args = torch.load(tmp_path / "runs" / name / "training_args.bin", weights_only=False)
        assert args.reflection_backend == ("openai" if reflection else "hf"), name
        history = json.loads((tmp_path / "runs" / name / "log_history.json").read_text())
        if reflection:
            assert args.reflection_base_url.startswith("http://127.0.0.1:")
            rollouts = [h for h in history if "rollout/turn_samples" in h]
            rl_turns += sum(int(h["rollout/turn_samples"]) for h in rollouts)
            rl_generated += sum(
                round(h["rollout/turn_samples"] * (1.0 - h["rollout/reflection_cache_hit_rate"]))
                for h in rollouts
            )
    eval_turns = sum(
        round(r["mean_length"] * r["episodes"])
        for r, (_, _, reflection) in zip(summary["results"], _rows_of(summary["results"]), strict=True)
        if reflection
    )
    server_log = (tmp_path / "logs" / "reflection_server.log").read_text()
    posts = server_log.count('"POST /v1/completions HTTP/1.1" 200')
    memos = json.loads((tmp_path / "eval" / "results.json").read_text())["reflection_memos"]
    assert set(memos) == {str(tmp_path / "runs" / r) for _, _, r in TABLE_ROWS if r}
    greedy_turns = sum(
        round(r["mean_length"] * r["episodes"])
        for r, (_, _, reflection) in zip(summary["results"], _rows_of(summary["results"]), strict=True)
        if reflection and r["decoding"] == "greedy"
    )
    assert sum(m["lookups"] for m in memos.values()) == greedy_turns, (
        "every greedy reflection goes through a memo"
    )
    eval_generated = eval_turns - sum(m["hits"] for m in memos.values())
    assert rl_turns > 0 and eval_turns > 0 and 0 < rl_generated < rl_turns
    assert posts == rl_generated + eval_generated, server_log[-2000:]
    assert json.loads((tmp_path / "demo_config.json").read_text())["reflection_backend"] == "openai"


def _rows_of(results):
    """The TABLE_ROWS entry of every evaluation result."""
    rows = {row[0]: row for row in TABLE_ROWS}
    return [rows[r["configuration"]] for r in results]


def test_an_unknown_reflection_backend_is_refused_before_anything_runs(tmp_path):
    from reflect_trl.cli.demo import demo_config_from_cli

    with pytest.raises(ValueError, match="reflection_backend 'vllm'"):
        demo_config_from_cli(["--output_dir", str(tmp_path / "out"), "--reflection_backend", "vllm"])
    assert not (tmp_path / "out").exists()


def test_rl_skip_no_signal_steps_reaches_every_rl_run_only_when_set(tmp_path):
    from reflect_trl.cli.demo import demo_config_from_cli
    from reflect_trl.pipelines.demo import demo_jobs

    cfg = demo_config_from_cli(["--output_dir", str(tmp_path / "out"), "--rl_skip_no_signal_steps", "true"])
    assert cfg.rl_skip_no_signal_steps is True
    rl_jobs = [j for j in demo_jobs(cfg, tmp_path / "b", tmp_path / "d", tmp_path / "r") if j.command == "rl"]
    assert rl_jobs and all(j.argv[j.argv.index("--skip_no_signal_steps") + 1] == "true" for j in rl_jobs)
    # unset: the flag is left out, so the command lines (and the reuse of finished runs) of other settings stay as before
    default = demo_jobs(DemoConfig(), tmp_path / "b", tmp_path / "d", tmp_path / "r")
    assert not any("--skip_no_signal_steps" in j.argv for j in default)


def test_rl_eval_steps_give_every_rl_run_its_greedy_validation_curve(tmp_path):
    from reflect_trl.errors import UsageError
    from reflect_trl.pipelines.demo import check_demo_config, demo_jobs

    cfg = DemoConfig(rl_eval_steps=25, rl_eval_episodes_per_stage=300)
    check_demo_config(cfg)
    jobs = demo_jobs(cfg, tmp_path / "base", tmp_path / "data", tmp_path / "runs")
    for job in (j for j in jobs if j.command == "rl"):
        flags = dict(zip(job.argv[::2], job.argv[1::2], strict=False))
        assert flags["--eval_strategy"] == "steps" and flags["--eval_steps"] == "25"
        assert flags["--eval_on_start"] == "true" and flags["--eval_episodes_per_stage"] == "300"
    default = demo_jobs(DemoConfig(), tmp_path / "base", tmp_path / "data", tmp_path / "runs")
    assert not any("--eval_strategy" in j.argv for j in default if j.command == "rl")  # off by default
    with pytest.raises(UsageError, match="rl_eval_steps must be >= 0"):
        check_demo_config(DemoConfig(rl_eval_steps=-1))
    with pytest.raises(UsageError, match="rl_eval_episodes_per_stage must be >= 1"):
        check_demo_config(DemoConfig(rl_eval_episodes_per_stage=0))

    # a smoke demo: each RL run logs its evaluations, the demo draws them
    out = tmp_path / "demo"
    run_demo(replace(DemoConfig.smoke(str(out)), rl_eval_steps=1, rl_eval_episodes_per_stage=2))
    for name in RL:
        history = json.loads((out / "runs" / name / "log_history.json").read_text())
        assert [h["step"] for h in history if "eval_success_rate" in h] == [0, 1, 2, 3], name
    assert (out / "eval_curves.png").stat().st_size > 0


def test_protocols_choose_the_data_the_decoding_and_the_runs(tmp_path):
    from reflect_trl.errors import UsageError
    from reflect_trl.pipelines.demo import check_demo_config, demo_eval_settings, evaluation_jobs
    from reflect_trl.pipelines.protocols import demo_jobs

    def jobs_of(cfg):
        check_demo_config(cfg)
        return {j.name: j for j in demo_jobs(cfg, tmp_path / "base", tmp_path / "data", tmp_path / "runs")}

    def flag(job, name):
        return job.argv[job.argv.index(f"--{name}") + 1]

    strict = jobs_of(DemoConfig())
    assert set(strict) == set(STRICT_RUNS) | {"relabel_policy_reflect", "relabel_policy_reflect_positive"}
    assert all(flag(strict[n], "reflection_temperature") == "0.0" for n in RL if RL_RUNS[n].reflection)
    paper = jobs_of(DemoConfig(protocol="paper"))
    assert set(paper) == {"sft_reflection", "sft_policy", "sft_plain", "rl_reflect", "rl_plain"}, "no relabel"
    assert flag(paper["sft_policy"], "dataset_path").endswith("policy_reflect")
    assert flag(paper["rl_reflect"], "reflection_temperature") == "1.0"
    # RL steps: the protocol's own (each chosen on validation) unless rl_steps is given
    assert flag(strict["rl_reflect"], "max_steps") == "300"
    assert flag(paper["rl_reflect"], "max_steps") == "900"
    assert flag(paper["rl_plain"], "max_steps") == "900"
    assert flag(jobs_of(DemoConfig(protocol="paper", rl_steps=120))["rl_reflect"], "max_steps") == "120"
    with pytest.raises(UsageError, match="rl_steps 2: the curriculum needs at least one step per stage"):
        check_demo_config(DemoConfig(protocol="paper", rl_steps=2))
    arms = jobs_of(
        DemoConfig(configurations=["reflect_sft", "sampled_reflections", "both_learn", "reflection_learns"])
    )
    assert {"rl_reflect_sampled", "rl_both", "rl_reflection_only"} <= set(arms) and "rl_reflect" not in arms
    assert flag(arms["rl_reflect_sampled"], "reflection_temperature") == "1.0"
    assert "--train_reflection" not in arms["rl_reflect_sampled"].argv
    assert (
        flag(arms["rl_both"], "train_reflection") == "true"
        and flag(arms["rl_both"], "train_policy") == "true"
    )
    assert flag(arms["rl_reflection_only"], "train_policy") == "false"
    # a row whose reflection player an RL run trains waits for that run, not only for its policy's SFT run
    arms_cfg = DemoConfig(
        configurations=["both_learn", "reflection_learns"], output_dir=str(tmp_path / "arms")
    )
    training = demo_jobs(arms_cfg, tmp_path / "b", tmp_path / "d", tmp_path / "r")
    evaluations = evaluation_jobs(arms_cfg, training, demo_eval_settings(arms_cfg))
    assert [set(job.needs) for job in evaluations] == [{"rl_both"}, {"sft_policy", "rl_reflection_only"}]
    continued = jobs_of(DemoConfig(configurations=["reflect_sft", "continued_sft"], rl_tasks="disjoint"))
    job = continued["sft_policy_continued"]
    assert flag(job, "model_name_or_path").endswith("runs/sft_policy") and flag(job, "max_steps") == "300"
    assert "sft_policy" in job.needs
    with pytest.raises(ValueError, match="configurations \\['nope'\\]"):
        check_demo_config(DemoConfig(configurations=["nope"]))
    with pytest.raises(ValueError, match="protocol 'authors'"):
        check_demo_config(DemoConfig(protocol="authors"))


def test_disjoint_rl_tasks_share_no_instance_with_the_sft_data():
    from reflect_trl.envs import make_env
    from reflect_trl.pipelines.demo import rl_task_list

    cfg = DemoConfig(n_train_tasks=10, rl_tasks="disjoint")
    env = make_env("taxi")
    rl = rl_task_list(cfg)
    for stage in ("pickup", "full"):
        sft = {env.instance_key(t) for t in env.make_tasks("train", 10, seed=0, difficulty=stage)}
        mine = [env.instance_key(t) for t in rl if t.difficulty == stage]
        assert len(mine) == 10 and not sft & set(mine)
    same = rl_task_list(DemoConfig(n_train_tasks=10))
    assert same == [t for s in env.stages for t in env.make_tasks("train", 10, seed=0, difficulty=s)]


def test_rl_stages_leave_a_stage_out_of_rl(tmp_path):
    """Design D3 at K = 30: seed 1's SFT data poses all 12 `dropoff` start states, so disjoint RL tasks exist only for
    `pickup` and `full`; the error says how to leave `dropoff` out, and --rl_stages does, in the tasks, in every RL
    run's curriculum and in the no-curriculum run's single stage."""
    from reflect_trl.errors import UsageError
    from reflect_trl.pipelines.demo import check_demo_config, rl_task_list
    from reflect_trl.pipelines.protocols import demo_jobs

    with pytest.raises(ValueError, match="every 'dropoff' training instance.*--rl_stages pickup,full"):
        rl_task_list(DemoConfig(n_train_tasks=30, rl_tasks="disjoint", seed=1))
    cfg = DemoConfig(
        seed=1,
        n_train_tasks=30,
        rl_tasks="disjoint",
        rl_stages=["pickup", "full"],
        configurations=["reflect_sft", "reflect_rl", "no_curriculum", "continued_sft"],
    )
    check_demo_config(cfg)
    tasks = rl_task_list(cfg)
    assert [t.difficulty for t in tasks] == ["pickup"] * 30 + ["full"] * 30
    jobs = {j.name: j for j in demo_jobs(cfg, tmp_path / "base", tmp_path / "data", tmp_path / "runs")}

    def stages(job):
        return job.argv[job.argv.index("--curriculum_stages") + 1]

    assert stages(jobs["rl_reflect"]) == "pickup,full"
    assert stages(jobs["rl_reflect_no_curriculum"]) == "full"
    assert "--curriculum_stages" not in jobs["sft_policy_continued"].argv
    default = {j.name: j for j in demo_jobs(DemoConfig(), tmp_path / "b", tmp_path / "d", tmp_path / "r")}
    assert "--curriculum_stages" not in default["rl_reflect"].argv
    assert stages(default["rl_reflect_no_curriculum"]) == "full"
    for bad in (["dropof"], [], ["full", "full"]):
        with pytest.raises(UsageError, match="rl_stages"):
            check_demo_config(DemoConfig(rl_stages=bad))


def test_paper_protocol_smoke_demo(tmp_path):
    """The paper protocol end to end: executed (mostly random) targets, oracle reflections in the policy data,
    sampled reflections in RL, both decodings evaluated; the data's behaviour policy and the reflection follower are
    rows of their own (no policy training; the follower reads the SFT'd reflection model, under both decodings)."""
    cfg = replace(DemoConfig.smoke(str(tmp_path)), protocol="paper", eval_decodings=["greedy", "sampled"])
    summary = run_demo(cfg)
    behaviour = "oracle + random (the data's behaviour, no training)"
    follower = "follows its reflection (no policy training)"
    labels = {r["configuration"] for r in summary["results"]}
    assert labels == {
        "SFT only",
        "SFT + RL w/o reflection",
        "Reflect SFT (before RL)",
        "Reflect-RL",
        behaviour,
        follower,
    }
    assert {r["decoding"] for r in summary["results"]} == {"greedy", "sampled"}
    assert {r["decoding"] for r in summary["results"] if r["configuration"] == behaviour} == {"sampled"}
    assert {r["decoding"] for r in summary["results"] if r["configuration"] == follower} == {
        "greedy",
        "sampled",
    }
    for r in summary["results"]:  # the follower takes the move its reflection names wherever it names one
        if r["configuration"] == follower and r["diagnostics"].get("named"):
            assert r["diagnostics"]["followed"] == r["diagnostics"]["named"]
    assert not (tmp_path / "runs" / "oracle_random").exists()
    assert not (tmp_path / "runs" / "reflection_follower").exists()
    card = (tmp_path / "data" / "taxi" / "README.md").read_text()
    assert "random_action_prob 0.9" in card and "executed action" in card
    assert not (tmp_path / "data" / "taxi" / "policy_reflect_model").exists()
    args = json.loads((tmp_path / "runs" / "rl_reflect" / "log_history.json").read_text())
    assert any("rollout/reflection_tokens" in h for h in args)


def _crash_returns(env_kwargs: dict, gamma: float) -> list[float]:
    """The discounted return of an episode that crashes on turn 1, 3 or 5 (DangerousTaxi `full`, taxi at (0, 1)):
    moves back and forth, then north off the grid."""
    from reflect_trl.envs.taxi import NORTH, SOUTH, DangerousTaxiEnv, encode_state
    from reflect_trl.rl_math import returns_to_go

    returns = []
    for detours in range(3):
        env = DangerousTaxiEnv(mode="full", **env_kwargs)
        env.reset_to_state(encode_state(0, 1, 0, 1))
        rewards = [env.step(a)[1] for a in (SOUTH, NORTH) * detours]
        rewards.append(env.step(NORTH)[1])
        assert env.crashed and len(rewards) == 2 * detours + 1
        returns.append(returns_to_go(rewards, gamma)[0])
    return returns


def test_taxi_rl_settings_do_not_reward_crashing_later():
    """A crash must not score better the later it happens: with no step cost in RL, gamma < 1 discounts the crash
    penalty and teaches a policy that rarely succeeds to wander before crashing (docs/experiments.md §1.4a). The
    demo's and both Taxi recipes' RL settings keep a late crash no better than an early one."""
    import yaml

    from reflect_trl.pipelines.protocols import RL_ENV_KWARGS
    from reflect_trl.trainers.rl_config import ReflectPPOConfig

    recipes = Path(__file__).resolve().parents[1] / "recipes" / "taxi"
    settings = [(RL_ENV_KWARGS["taxi"], DemoConfig().rl_gamma)]
    for path in (recipes / "cpu" / "rl.yaml", recipes / "rl.yaml"):
        recipe = yaml.safe_load(path.read_text())
        gamma = recipe.get("gamma", ReflectPPOConfig.__dataclass_fields__["gamma"].default)
        settings.append(({k: v for k, v in recipe["env_kwargs"].items() if k != "horizon"}, gamma))
    for env_kwargs, gamma in settings:
        early, *later = _crash_returns(env_kwargs, gamma)
        assert all(r <= early + 1e-12 for r in later), (env_kwargs, gamma, early, later)
    early, *later = _crash_returns({"step_reward": 0.0}, 0.95)  # the trap itself
    assert all(r > early for r in later)


def test_random_action_prob_overrides_the_protocols_trajectories(tmp_path):
    """--random_action_prob replaces the protocol's "oracle + random p" (paper: 0.9) in the data a demo builds: the
    policy's executed-action targets are the oracle's move on about 1 - p + p / 6 of the rows."""
    import json

    from reflect_trl.errors import UsageError
    from reflect_trl.pipelines.demo import _Progress, check_demo_config, prepare_demo
    from reflect_trl.pipelines.protocols import configuration_rows, data_settings

    assert data_settings(DemoConfig(protocol="paper"))["random_action_prob"] == 0.9
    assert data_settings(DemoConfig(protocol="paper", random_action_prob=0.5))["random_action_prob"] == 0.5
    assert "random_action_prob" not in data_settings(DemoConfig())
    with pytest.raises(UsageError, match="random_action_prob must be in \\[0, 1\\], got 1.5"):
        check_demo_config(DemoConfig(random_action_prob=1.5))
    check_demo_config(DemoConfig(protocol="paper", random_action_prob=0.5))  # data_behaviour plays p = 0.5

    def behaviour_policy(cfg: DemoConfig) -> str:
        (row,) = [r for r in configuration_rows(cfg) if r.label.startswith("oracle + random")]
        return row.policy

    # the data's behaviour row plays what the policy targets teach: oracle + random p for executed-action targets
    assert behaviour_policy(DemoConfig(protocol="paper")) == "oracle_random:0.9"
    assert behaviour_policy(DemoConfig(protocol="paper", random_action_prob=0.5)) == "oracle_random:0.5"
    # ... and the oracle for oracle targets (strict), whatever the trajectories' p
    for p in (None, 0.5):
        strict = DemoConfig(configurations=["reflect_sft", "data_behaviour"], random_action_prob=p)
        assert behaviour_policy(strict) == "oracle_random:0"

    def oracle_share(p: float | None) -> float:
        cfg = DemoConfig(
            protocol="paper",
            random_action_prob=p,
            n_train_tasks=40,
            output_dir=str(tmp_path / f"p{p}"),
            report_to="none",
        )
        _, data = prepare_demo(cfg, _Progress())
        rows = [json.loads(line) for line in (data / "policy_reflect.jsonl").read_text().splitlines()]
        return sum(r["option_index"] == r["action_index"] for r in rows) / len(rows)

    paper, half = oracle_share(None), oracle_share(0.5)
    assert 0.17 < paper < 0.33, paper  # 0.1 + 0.9 / 6 = 0.25
    assert 0.50 < half < 0.67, half  # 0.5 + 0.5 / 6 = 0.58


def test_the_demo_reports_unseen_instances_beside_all():
    """A single seed's results say which share of each row's episodes replays a training instance, and the success
    on the others."""
    from reflect_trl.pipelines.demo import results_markdown
    from reflect_trl.pipelines.statistics import exposure_of_results

    result = {
        "configuration": "Reflect-RL",
        "stage": "full",
        "decoding": "greedy",
        "episodes": 4,
        "successes": 3,
        "outcomes": [1, 1, 1, 0],
        "instances": ["a", "a", "b", "c"],
    }
    (exposure,) = exposure_of_results([result], {"full": {"a"}})
    assert exposure["seen_share"] == 0.5
    assert exposure["unseen"] == {"successes": 1, "episodes": 2, "instances": 2, "success_rate": 0.5}
    summary = {
        "config": {"seed": 0, "model_arch": "llama", "model_preset": "nano", "env_name": "taxi"},
        "timings_seconds": {},
        "total_seconds": 60,
        "exposure": [exposure],
    }
    assert "| Reflect-RL | greedy | full | 50.0% | 2 | 50% |" in results_markdown(summary, "")


def test_the_reflection_reward_arms_and_their_controls_are_configurations(tmp_path):
    """Every arm of the reflection's own reward names its reward in its label and its command line; the controls share
    the Reflect SFT policy; the label-matched SFT starts from the SFT'd reflection, after the verified run it
    matches, at the reflection's RL learning rate; runs of other settings keep their command lines."""
    from reflect_trl.pipelines.protocols import LABEL_MATCHED_TO, demo_jobs

    names = [
        "reflect_sft",
        "both_learn",
        "both_learn_verified",
        "both_learn_mixed",
        "reflection_learns_verified",
        "reflection_dagger",
        "reflection_label_matched",
    ]
    cfg = DemoConfig(configurations=names, rl_reflection_verified_weight=0.25)
    labels = {n: CONFIGURATIONS[n].label for n in names}
    assert "verified" in labels["both_learn_verified"] and "verified" in labels["reflection_learns_verified"]
    assert "mixed" in labels["both_learn_mixed"]
    for control in ("reflection_dagger", "reflection_label_matched", "reflection_learns_verified"):
        assert CONFIGURATIONS[control].policy == "sft_policy"
    jobs = {j.name: j for j in demo_jobs(cfg, tmp_path / "base", tmp_path / "data", tmp_path / "runs")}

    def value(job: str, flag: str) -> str | None:
        argv = jobs[job].argv
        return argv[argv.index(flag) + 1] if flag in argv else None

    assert value("rl_both_verified", "--reflection_reward") == "verified"
    assert value("rl_both_mixed", "--reflection_reward") == "mixed"
    assert value("rl_both_mixed", "--reflection_verified_weight") == "0.25"
    assert value("rl_reflection_only_verified", "--train_policy") == "false"
    assert value("rl_reflection_dagger", "--reflection_objective") == "oracle_sft"
    assert value("rl_reflection_dagger", "--reflection_reward") is None
    assert value("rl_both", "--reflection_reward") is None, "the advantage arm keeps its command line"
    matched = jobs["sft_reflection_label_matched"]
    assert set(matched.needs) >= {"sft_reflection", LABEL_MATCHED_TO}
    assert value("sft_reflection_label_matched", "--match_oracle_labels_of") == str(
        tmp_path / "runs" / LABEL_MATCHED_TO
    )
    assert value("sft_reflection_label_matched", "--model_name_or_path") == str(
        tmp_path / "runs" / "sft_reflection"
    )
    assert float(value("sft_reflection_label_matched", "--learning_rate")) == cfg.rl_reflection_learning_rate
    assert value("sft_reflection_label_matched", "--lr_scheduler_type") == "constant"
    assert needed_runs(cfg).index(LABEL_MATCHED_TO) < needed_runs(cfg).index("sft_reflection_label_matched")


def test_the_demo_warns_when_the_policy_data_changes_its_option_list(capsys):
    from reflect_trl.pipelines.demo import _Progress, warn_if_options_change
    from reflect_trl.prompts import build_prompt

    fixed = build_prompt("s", ("go left", "go right"), "Go right.").text
    other = build_prompt("s", ("go right", "go left"), "Go right.").text
    warn_if_options_change(
        {"train": {"prompt": [fixed, fixed]}, "validation": {"prompt": [fixed]}}, _Progress()
    )
    assert capsys.readouterr().out == ""
    warn_if_options_change(
        {"train": {"prompt": [fixed, other]}, "validation": {"prompt": [other]}}, _Progress()
    )
    out = capsys.readouterr().out
    assert "WARNING the policy data shows 2 different option lists over 3 policy prompts" in out
    assert "learned only after an SFT warm-up on `reflect-trl lookup-data` rows" in out
    assert "--sft_lookup_steps 8000" in out
    # the demo that runs the warm-up is not warned
    warn_if_options_change({"train": {"prompt": [fixed, other]}}, _Progress(), lookup_steps=8000)
    assert capsys.readouterr().out == ""
