"""An environment's training-only kwargs (``TextEnv.training_only_kwargs``, e.g. AutoExplore's ``leaveout_prob``,
which keeps the path to the target in the options) are refused in evaluation environments -- ``reflect-trl eval``'s
``env_kwargs`` and ``ReflectPPOConfig.eval_env_kwargs`` -- unless allowed by name (``allow_training_only_kwargs``)."""

from __future__ import annotations

import json

import pytest

from reflect_trl.cli import main
from reflect_trl.envs.auto_explore.env import AutoExploreEnv
from reflect_trl.envs.auto_explore.example_repo import write_example_repo
from reflect_trl.envs.base import check_evaluation_kwargs
from reflect_trl.evaluation import EvalConfiguration, EvalSettings, evaluate
from reflect_trl.trainers.rl_config import ReflectPPOConfig


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> str:
    return str(write_example_repo(tmp_path_factory.mktemp("repo")))


def test_the_check_names_the_kwarg_the_environment_and_how_to_allow_it():
    kwargs = {"horizon": 6, "leaveout_prob": 0.5}
    with pytest.raises(ValueError) as err:
        check_evaluation_kwargs(AutoExploreEnv, kwargs, how_to_allow="--allow {name}")
    message = str(err.value)
    assert "\n" not in message
    assert "'leaveout_prob'" in message and "'auto_explore'" in message and "--allow leaveout_prob" in message
    check_evaluation_kwargs(AutoExploreEnv, {"leaveout_prob": 0.5}, allowed=["leaveout_prob"])
    check_evaluation_kwargs(AutoExploreEnv, {"horizon": 6})
    typo = r"names \['leaveout_prb'\].*training_only_kwargs: \['leaveout_prob'\]"
    with pytest.raises(ValueError, match=typo):
        check_evaluation_kwargs(AutoExploreEnv, {}, allowed=["leaveout_prb"])


def test_evaluate_refuses_a_training_only_kwarg_before_any_episode(repo):
    settings = EvalSettings(
        env_name="auto_explore",
        env_kwargs={"roots": [repo], "leaveout_prob": 0.5},
        stages=["depth1"],
        episodes_per_stage=1,
    )
    with pytest.raises(ValueError, match="--allow_training_only_kwargs leaveout_prob"):
        evaluate([EvalConfiguration("oracle", "oracle")], settings, progress=False)
    settings.allow_training_only_kwargs = ["leaveout_prob"]
    report = evaluate([EvalConfiguration("oracle", "oracle")], settings, progress=False)
    assert [r.stage for r in report.results] == ["depth1"]


def test_eval_command_refuses_it_in_one_line_unless_allowed(repo, tmp_path, capsys):
    argv = ["eval", "--policy", "oracle", "--env_name", "auto_explore", "--stages", "depth1"]
    argv += ["--episodes_per_stage", "2", "--output_dir", str(tmp_path / "eval"), "--no-progress"]
    argv += ["--env_kwargs", json.dumps({"roots": [repo], "horizon": 6, "leaveout_prob": 0.5})]
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "'leaveout_prob' is a training-only kwarg of environment 'auto_explore'" in lines[0]
    assert "--allow_training_only_kwargs leaveout_prob" in lines[0]
    assert not (tmp_path / "eval").exists()
    assert main([*argv, "--allow_training_only_kwargs", "leaveout_prob"]) == 0
    assert (tmp_path / "eval" / "results.json").is_file()


def test_rl_eval_env_kwargs_refuse_it_unless_allowed_by_name(tmp_path, capsys):
    common = dict(output_dir=str(tmp_path), env_name="auto_explore", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match=r"eval_env_kwargs: 'leaveout_prob' is a training-only kwarg") as err:
        ReflectPPOConfig(**common, eval_env_kwargs={"horizon": 6, "leaveout_prob": 0.5})
    assert '"allow_training_only_kwargs": ["leaveout_prob"] in eval_env_kwargs' in str(err.value)
    allowed = ReflectPPOConfig(
        **common, eval_env_kwargs={"leaveout_prob": 0.5, "allow_training_only_kwargs": ["leaveout_prob"]}
    )
    assert allowed.evaluation_env_kwargs == {"leaveout_prob": 0.5}
    # the training environments keep it; the default evaluation kwargs drop it (as before)
    default = ReflectPPOConfig(**common, env_kwargs={"horizon": 6, "leaveout_prob": 0.5})
    assert default.evaluation_env_kwargs == {"horizon": 6}
    # the command line: one line, before any model is loaded
    capsys.readouterr()
    argv = ["rl", "--model_name_or_path", "tiny", "--output_dir", str(tmp_path / "rl"), "--use_cpu"]
    argv += ["--env_name", "auto_explore", "--eval_env_kwargs", '{"leaveout_prob": 0.5}']
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "'leaveout_prob' is a training-only kwarg" in lines[0], lines
