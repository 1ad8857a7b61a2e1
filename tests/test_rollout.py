"""Lock-step rollouts on DangerousTaxi with the tiny model, with and without a reflection model."""

from __future__ import annotations

import math

import pytest
import torch

from reflect_trl.action_head import OptionHead
from reflect_trl.batching import left_pad, position_ids_from_mask
from reflect_trl.envs import make_env
from reflect_trl.prompts import build_prompt, options_block, reflection_prompt, with_stop
from reflect_trl.reflection.model import ReflectionModel
from reflect_trl.rollout import Episode, PolicyActor, RolloutEngine, Turn, episode_metrics
from reflect_trl.scripted_actors import OracleActor
from reflect_trl.seeding import derive_seed


@pytest.fixture(scope="module", autouse=True)
def single_torch_thread():
    """Nano models gain nothing from intra-op threads, and OpenMP spinning is very slow on a busy 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def policy_parts(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, tok, OptionHead(tok)


@pytest.fixture(scope="module")
def reflection_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return ReflectionModel(
        model, AutoTokenizer.from_pretrained(tiny_model_dir), max_new_tokens=4, temperature=1.0
    )


@pytest.fixture(scope="module")
def tasks():
    return make_env("taxi").make_tasks("train", 6, seed=0)


def _engine(policy_parts, reflection=None, **kwargs) -> RolloutEngine:
    model, tok, head = policy_parts
    return RolloutEngine("taxi", PolicyActor(model, tok, head), reflection, **kwargs)


def _tokenize(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _check_episode_replays(ep: Episode, horizon: int = 20) -> None:
    """Re-play the chosen actions in a fresh env: same states, rewards, and the episode ends exactly at its last turn."""
    env = make_env("taxi")
    obs = env.reset(seed=ep.seed, task=ep.task)
    assert 1 <= ep.length <= horizon
    for k, turn in enumerate(ep.turns):
        assert turn.step == k
        assert turn.state_text == obs.text and turn.actions == obs.actions
        obs, reward, terminated, truncated, info = env.step(turn.action_index)
        assert turn.reward == pytest.approx(reward)
        done = terminated or truncated
        assert done == (k == ep.length - 1), "every episode ends, and only at its last turn"
    assert ep.success == bool(info["success"])
    assert ep.truncated == bool(truncated and not terminated)


def _check_turn(turn: Turn, head: OptionHead) -> None:
    assert turn.num_options == len(turn.actions)
    assert 0 <= turn.option < turn.num_options
    assert 0 <= turn.action_index < len(turn.actions)
    assert math.isfinite(turn.logprob) and turn.logprob <= 0.0
    assert math.isfinite(turn.entropy) and -1e-6 <= turn.entropy <= math.log(turn.num_options) + 1e-5
    assert turn.label_token == head.label_ids[turn.option].item()


def test_rollout_without_reflection(policy_parts, tasks):
    model, tok, head = policy_parts
    engine = _engine(policy_parts)
    calls: list[int] = []
    act = engine.policy.act
    engine.policy.act = lambda ids, n, live=None: calls.append(len(ids)) or act(ids, n, live=live)
    torch.manual_seed(0)
    episodes = engine.run(tasks)
    assert [ep.task for ep in episodes] == list(tasks)
    assert [ep.group for ep in episodes] == list(range(len(tasks)))
    for ep in episodes:
        _check_episode_replays(ep)
        for turn in ep.turns:
            _check_turn(turn, head)
            assert turn.reflection is None and turn.action_index == turn.option, (
                "no shuffling: identity order"
            )
            assert turn.prompt_ids == _tokenize(tok, build_prompt(turn.state_text, turn.actions).text)
    # Lock-step: one policy call per turn index, over exactly the episodes still running.
    longest = max(ep.length for ep in episodes)
    assert calls == [sum(ep.length > t for ep in episodes) for t in range(longest)]
    assert engine.timings.env_steps == sum(ep.length for ep in episodes)


def test_rollout_with_reflection(policy_parts, reflection_model, tasks):
    _, tok, head = policy_parts
    engine = _engine(policy_parts, reflection_model)
    generate_sizes: list[int] = []
    generate = reflection_model.generate

    def counting_generate(prompts, prompt_ids=None):
        generate_sizes.append(len(prompts))
        return generate(prompts, prompt_ids)

    reflection_model.generate = counting_generate
    try:
        torch.manual_seed(0)
        episodes = engine.run(tasks, seeds=[7] * len(tasks), groups=[0, 0, 0, 1, 1, 1])
    finally:
        del reflection_model.generate
    assert [ep.group for ep in episodes] == [0, 0, 0, 1, 1, 1] and all(ep.seed == 7 for ep in episodes)
    longest = max(ep.length for ep in episodes)
    assert generate_sizes == [sum(ep.length > t for ep in episodes) for t in range(longest)]
    for ep in episodes:
        _check_episode_replays(ep)
        for turn in ep.turns:
            _check_turn(turn, head)
            assert isinstance(turn.reflection, str) and "<end>" not in turn.reflection
            assert 1 <= turn.reflection_tokens <= 4
            assert turn.reflection_stopped or turn.reflection_tokens == 4
            expected = build_prompt(turn.state_text, turn.actions, turn.reflection).text
            assert turn.prompt_ids == _tokenize(tok, expected), "piecewise ids equal whole-text ids"
    assert engine._concat_ok is True, "the byte-level BPE allows reusing the reflection prompt ids"
    metrics = episode_metrics(episodes)
    turns = [t for ep in episodes for t in ep.turns]
    assert metrics["reflection_tokens"] == pytest.approx(sum(t.reflection_tokens for t in turns) / len(turns))
    assert engine.timings.reflection_tokens == sum(t.reflection_tokens for t in turns)


def test_same_seed_gives_identical_episodes(policy_parts, reflection_model, tasks):
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        episodes = _engine(policy_parts, reflection_model, env_kwargs={"horizon": 6}).run(tasks[:4])
        runs.append([(ep.transcript(), [t.prompt_ids for t in ep.turns]) for ep in episodes])
    assert runs[0] == runs[1]
    assert sum(len(turns) for _, turns in runs[0]) > 4, "more than one turn per episode on average"


def test_shuffled_options_map_back_to_env_actions(policy_parts, tasks):
    _, tok, head = policy_parts
    torch.manual_seed(0)
    episodes = _engine(policy_parts, shuffle_options=True).run(tasks)
    shuffled = 0
    for ep in episodes:
        _check_episode_replays(ep)
        for turn in ep.turns:
            _check_turn(turn, head)
            prompt = build_prompt(turn.state_text, turn.actions, shuffle_seed=derive_seed(ep.seed, turn.step))
            assert turn.action_index == prompt.action_index(turn.option)
            assert turn.prompt_ids == _tokenize(tok, prompt.text)
            shuffled += prompt.order != tuple(range(len(turn.actions)))
    assert shuffled > 0


def test_greedy_actor_and_value_fn(policy_parts, tasks):
    model, tok, head = policy_parts
    value_head = torch.nn.Linear(model.config.n_embd, 1)
    actor = PolicyActor(model, tok, head, greedy=True, value_fn=value_head)
    prompts = [build_prompt("state one", ("a", "b", "c")), build_prompt("a longer state two", ("a", "b"))]
    ids = [_tokenize(tok, p.text) for p in prompts]
    options, logps, entropies, values = actor.act(ids, [3, 2])
    with torch.no_grad():
        input_ids, mask = left_pad(ids, tok.pad_token_id)
        table = head.forward(model, ids, [3, 2]).log_probs
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            output_hidden_states=True,
        )
        expected_values = value_head(out.hidden_states[-1][:, -1]).view(-1)
    assert options == table.argmax(-1).tolist()
    assert logps == pytest.approx(table.max(-1).values.tolist(), abs=1e-5)
    assert values == pytest.approx(expected_values.tolist(), abs=1e-5)
    assert len(entropies) == 2
    episodes = RolloutEngine("taxi", actor).run(tasks[:2])
    assert all(t.value is not None for ep in episodes for t in ep.turns)


def test_truncation_by_horizon(policy_parts, tasks):
    torch.manual_seed(0)
    episodes = _engine(policy_parts, env_kwargs={"horizon": 1}).run(tasks)
    assert all(ep.length == 1 for ep in episodes)
    assert [ep.truncated for ep in episodes] == [not ep.crashed and not ep.success for ep in episodes]
    # The oracle never crashes and needs more than one step on these tasks: every episode is cut by the horizon.
    oracle = RolloutEngine("taxi", OracleActor(), env_kwargs={"horizon": 1}).run(tasks)
    assert [(ep.length, ep.crashed, ep.success, ep.truncated) for ep in oracle] == [
        (1, False, False, True)
    ] * len(tasks)


def test_policy_ids_piecewise_equals_whole_text(policy_parts, reflection_model):
    _, tok, _ = policy_parts
    engine = _engine(policy_parts, reflection_model)
    env = make_env("taxi")
    observations = [env.reset(task=t) for t in env.make_tasks("validation", 3, seed=1)]
    reflections = ["go east", "", "pick up the passenger, then move south twice"]
    heads = [_tokenize(tok, reflection_prompt(o.text)) for o in observations]
    prompts = [
        build_prompt(o.text, o.actions, r, shuffle_seed=i)
        for i, (o, r) in enumerate(zip(observations, reflections, strict=True))
    ]
    suffixes = [
        with_stop(r) + "\n" + options_block(o.actions, p.labels, p.order)
        for o, r, p in zip(observations, reflections, prompts, strict=True)
    ]
    full = [p.text for p in prompts]
    ids = engine._policy_ids(heads, suffixes, full)
    assert ids == [_tokenize(tok, text) for text in full]
    assert engine._policy_ids(None, [], full) == ids
    # Left truncation to the policy's max prompt length.
    limited = _engine(policy_parts, reflection_model, max_prompt_length=20)
    assert limited._policy_ids(heads, suffixes, full) == [x[-20:] for x in ids]
    assert limited.truncated_prompts == 3


def test_policy_ids_with_truncated_reflection_prompts(policy_parts, tiny_model_dir):
    """Reflection prompts cut by the reflection model's max_prompt_length must not leak into the policy prompt."""
    from transformers import AutoModelForCausalLM

    _, tok, _ = policy_parts
    env = make_env("taxi")
    observations = [env.reset(task=t) for t in env.make_tasks("validation", 2, seed=1)]
    texts = [reflection_prompt("short state"), reflection_prompt(observations[0].text)]
    limit = len(_tokenize(tok, texts[0])) + 2
    reflection = ReflectionModel(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tok, max_prompt_length=limit
    )
    engine = _engine(policy_parts, reflection)
    actions = ("move north", "move south")
    for state, text in zip(["short state", observations[0].text], texts, strict=True):
        heads = reflection.tokenize([text])  # the second one is left-truncated to `limit` tokens
        prompt = build_prompt(state, actions, "go")
        suffix = with_stop("go") + "\n" + options_block(actions, prompt.labels, prompt.order)
        assert engine._policy_ids(heads, [suffix], [prompt.text]) == [_tokenize(tok, prompt.text)]
    assert len(reflection.tokenize([texts[1]])[0]) == limit


def test_episode_metrics_values():
    def turn(
        reward: float, entropy: float, reflection: str | None = None, tokens: int = 0, stopped: bool = True
    ) -> Turn:
        return Turn(0, "s", ("a",), reflection, [1], 1, 0, 0, -0.1, entropy, reward, None, tokens, stopped)

    task = make_env("taxi").make_tasks("test", 1, seed=0)[0]
    episodes = [
        Episode(task, 0, turns=[turn(-0.05, 1.0, "r", 4, True), turn(1.0, 0.5, "q", 8, False)], success=True),
        Episode(task, 1, turns=[turn(-0.5, 0.0, "x", 2, True)], crashed=True),
    ]
    metrics = episode_metrics(episodes)
    assert metrics["success_rate"] == 0.5
    assert metrics["return"] == pytest.approx((0.95 - 0.5) / 2)
    assert metrics["episode_length"] == 1.5
    assert metrics["crash_rate"] == 0.5
    assert metrics["reflection_tokens"] == pytest.approx(14 / 3)
    assert metrics["reflection_stop_rate"] == pytest.approx(2 / 3)
    assert metrics["policy_entropy"] == pytest.approx(0.5)
    plain = episode_metrics([Episode(task, 0, turns=[turn(1.0, 0.2)])])
    assert "reflection_tokens" not in plain and plain["success_rate"] == 0.0
    assert episode_metrics([]) == {
        "success_rate": 0.0,
        "return": 0.0,
        "episode_length": 0.0,
        "crash_rate": 0.0,
    }
    record = episodes[0].transcript()
    assert (
        record["return"] == pytest.approx(0.95)
        and record["length"] == 2
        and record["turns"][1]["reflection"] == "q"
    )


def test_prompts_carry_the_bos_that_sft_trained_with(tiny_model_dir):
    """With a tokenizer that adds a BOS (Llama, Mistral), rollouts, the reflection model and SFT's metrics all feed
    exactly the ids TRL's SFTTrainer trained on: one BOS at the start, also when the policy prompt is assembled
    from the reflection prompt's ids."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reflect_trl.trainers.sft_metrics import encode_truncated_prompts

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    bos = tok.eos_token
    tok._tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.convert_tokens_to_ids(bos))]
    )
    bos_id = tok.convert_tokens_to_ids(bos)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    reflection = ReflectionModel(model, tok, max_new_tokens=3)
    engine = RolloutEngine("taxi", PolicyActor(model, tok, OptionHead(tok)), reflection)
    env = make_env("taxi")
    observations = [env.reset(task=t) for t in env.make_tasks("validation", 2, seed=1)]
    heads = reflection.tokenize([reflection_prompt(o.text) for o in observations])
    assert all(h[0] == bos_id and h.count(bos_id) == 1 for h in heads)
    prompts = [build_prompt(o.text, o.actions, "go east") for o in observations]
    suffixes = [
        with_stop("go east") + "\n" + options_block(o.actions, p.labels, p.order)
        for o, p in zip(observations, prompts, strict=True)
    ]
    full = [p.text for p in prompts]
    ids = engine._policy_ids(heads, suffixes, full)
    sft_ids = encode_truncated_prompts(tok, full, None)
    assert ids == sft_ids == [tok(text=t)["input_ids"] for t in full]
    assert all(x[0] == bos_id and x.count(bos_id) == 1 for x in ids)
    episodes = engine.run(env.make_tasks("validation", 2, seed=1))
    assert all(turn.prompt_ids[0] == bos_id for ep in episodes for turn in ep.turns)
