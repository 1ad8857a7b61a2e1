"""The memo of greedy reflections: each distinct prompt generated once, batches answered in order, LRU bound,
sampling players untouched, and the rollout / evaluation paths that use it."""

from __future__ import annotations

import pytest
import torch

from reflect_trl.envs import make_env
from reflect_trl.evaluation import EvalConfiguration, EvalSettings, evaluate
from reflect_trl.reflection.cache import CachedReflectionPlayer, with_reflection_cache
from reflect_trl.reflection.model import ReflectionBatch, ReflectionModel


class CountingPlayer:
    """A deterministic stand-in player: the reflection of a prompt is a function of its text; records every call."""

    tokenizer = None
    max_prompt_length = None

    def __init__(self, temperature: float = 0.0) -> None:
        self.temperature = temperature
        self.calls: list[list[str]] = []

    def generate(self, prompts, prompt_ids=None):
        self.calls.append(list(prompts))
        return ReflectionBatch(
            texts=[f"plan for {p}" for p in prompts],
            num_tokens=[len(p) for p in prompts],
            stopped=[len(p) % 2 == 0 for p in prompts],
            prompt_ids=[[len(p), i] for i, p in enumerate(prompts)],
            seconds=0.5,
        )


def test_each_distinct_prompt_is_generated_once_and_answers_keep_the_input_order():
    inner = CountingPlayer()
    memo = CachedReflectionPlayer(inner, max_entries=10)
    first = memo.generate(["a", "bb", "a", "ccc"])
    assert inner.calls == [["a", "bb", "ccc"]], (
        "duplicates inside a batch are generated once, first-seen order"
    )
    assert first.texts == ["plan for a", "plan for bb", "plan for a", "plan for ccc"]
    assert first.num_tokens == [1, 2, 1, 3] and first.stopped == [False, True, False, False]
    assert first.prompt_ids == [[1, 0], [2, 1], [1, 0], [3, 2]]
    assert first.seconds == 0.5
    second = memo.generate(["ccc", "dddd", "bb"])
    assert inner.calls[-1] == ["dddd"], "only the miss reaches the player"
    assert second.texts == ["plan for ccc", "plan for dddd", "plan for bb"]
    assert second.prompt_ids == [[3, 2], [4, 0], [2, 1]]
    assert (memo.hits, memo.lookups) == (1 + 2, 4 + 3) and memo.hit_rate == pytest.approx(3 / 7)
    third = memo.generate(["a", "bb"])
    assert len(inner.calls) == 2 and third.seconds == 0.0, "an all-hit batch generates nothing"
    assert memo.generate([]).texts == []


def test_least_recently_used_entries_are_evicted_first():
    inner = CountingPlayer()
    memo = CachedReflectionPlayer(inner, max_entries=2)
    memo.generate(["a", "b"])
    memo.generate(["a"])  # "a" is now the most recent
    memo.generate(["c"])  # evicts "b"
    assert len(memo) == 2
    memo.generate(["a", "b"])
    assert inner.calls == [["a", "b"], ["c"], ["b"]]


def test_a_sampling_player_or_size_zero_is_not_memoised():
    sampling = CountingPlayer(temperature=0.7)
    assert with_reflection_cache(sampling) is sampling
    greedy = CountingPlayer()
    assert with_reflection_cache(greedy, 0) is greedy
    assert with_reflection_cache(None) is None
    wrapped = with_reflection_cache(greedy, 5)
    assert isinstance(wrapped, CachedReflectionPlayer) and wrapped.player is greedy
    # a memo whose player turns to sampling passes every call through
    memo = CachedReflectionPlayer(CountingPlayer(temperature=1.0), 5)
    memo.generate(["a"])
    memo.generate(["a"])
    assert memo.player.calls == [["a"], ["a"]] and memo.lookups == 0
    with pytest.raises(ValueError, match="cache size must be >= 0"):
        CachedReflectionPlayer(greedy, -1)
    with pytest.raises(ValueError, match="2 prompt_ids for 1 prompts"):
        CachedReflectionPlayer(greedy, 5).generate(["a"], [[1], [2]])


def test_state_dict_round_trip_keeps_entries_order_and_counters():
    memo = CachedReflectionPlayer(CountingPlayer(), max_entries=3)
    memo.generate(["a", "bb", "ccc"])
    memo.generate(["a"])  # recency: bb, ccc, a
    state = memo.state_dict()
    assert all(len(entry[0]) == 16 for entry in state["entries"]), (
        "keys are 128-bit digests, not prompt texts"
    )
    inner = CountingPlayer()
    restored = CachedReflectionPlayer(inner, max_entries=3)
    restored.load_state_dict(state)
    assert (restored.hits, restored.lookups, len(restored)) == (1, 4, 3)
    again = restored.generate(["ccc", "a", "bb"])
    assert inner.calls == [] and again.prompt_ids == [[3, 2], [1, 0], [2, 1]]
    restored.generate(["dddd"])  # recency was ccc, a, bb: the oldest, "ccc", is evicted
    restored.generate(["ccc"])
    assert inner.calls == [["dddd"], ["ccc"]]
    smaller = CachedReflectionPlayer(CountingPlayer(), max_entries=1)
    smaller.load_state_dict(state)
    assert len(smaller) == 1


@pytest.fixture(scope="module")
def tiny_players(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reflect_trl.action_head import OptionHead
    from reflect_trl.rollout import PolicyActor

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = PolicyActor(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), tok, OptionHead(tok))
    reflection = ReflectionModel(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
        max_new_tokens=6,
        temperature=0.0,
    )
    return policy, reflection


def test_rollout_with_the_memo_plays_the_same_episodes_and_generates_less(tiny_players):
    """Groups of episodes of one task share their states: the memo serves the repeats, and (one prompt per generate
    call, so no batch-composition rounding) the episodes are exactly those of the plain player."""
    from reflect_trl.rollout import RolloutEngine

    policy, reflection = tiny_players
    tasks = [t for t in make_env("taxi").make_tasks("train", 2, seed=3) for _ in range(3)]
    generated: list[int] = []

    class OneByOne:  # the plain player, one prompt per generate call (batch-invariant results)
        tokenizer, max_prompt_length, temperature = reflection.tokenizer, None, 0.0

        def generate(self, prompts, prompt_ids=None):
            generated.extend([1] * len(prompts))
            parts = [reflection.generate([p]) for p in prompts]
            return ReflectionBatch(
                [b.texts[0] for b in parts],
                [b.num_tokens[0] for b in parts],
                [b.stopped[0] for b in parts],
                [b.prompt_ids[0] for b in parts],
            )

    def play(player):
        torch.manual_seed(11)
        return RolloutEngine("taxi", policy, player, env_kwargs={"horizon": 5}).run(
            tasks, seeds=[5] * len(tasks), groups=[0, 0, 0, 1, 1, 1]
        )

    plain = play(OneByOne())
    plain_calls = len(generated)
    generated.clear()
    memo = CachedReflectionPlayer(OneByOne())
    cached = play(memo)
    assert [ep.transcript() for ep in cached] == [ep.transcript() for ep in plain]
    assert [t.prompt_ids for ep in cached for t in ep.turns] == [
        t.prompt_ids for ep in plain for t in ep.turns
    ]
    distinct = {(t.state_text) for ep in plain for t in ep.turns}
    assert len(generated) == len(distinct) < plain_calls
    assert memo.hits == plain_calls - len(distinct)


def test_greedy_evaluation_shares_one_memo_per_reflection_model(tiny_model_dir, monkeypatch):
    import reflect_trl.evaluation as evaluation

    made: list[CachedReflectionPlayer] = []
    original = evaluation.CachedReflectionPlayer

    def recording(player, max_entries):
        made.append(original(player, max_entries))
        return made[-1]

    monkeypatch.setattr(evaluation, "CachedReflectionPlayer", recording)
    settings = EvalSettings(
        env_name="taxi",
        episodes_per_stage=3,
        stages=["pickup", "dropoff"],
        seed=2,
        batch_size=2,
        reflection_max_new_tokens=4,
        decodings=["greedy", "sampled"],
    )
    confs = [
        EvalConfiguration("a", tiny_model_dir, reflection=tiny_model_dir),
        EvalConfiguration("b", tiny_model_dir, reflection=tiny_model_dir),
    ]
    report = evaluate(confs, settings, progress=False)
    assert len(made) == 1, "one memo for the one reflection model, greedy cells only"
    memo = made[0]
    greedy_turns = sum(
        len(ep["turns"]) for key, eps in report.transcripts.items() if key.endswith("greedy") for ep in eps
    )
    assert memo.lookups == greedy_turns and memo.hits > 0, (
        "the second configuration replays the first's states"
    )
    assert report.to_json()["reflection_memos"] == {
        tiny_model_dir: {"lookups": memo.lookups, "hits": memo.hits, "generated": memo.lookups - memo.hits}
    }
    off = evaluate(confs, EvalSettings(**{**settings.__dict__, "reflection_cache_size": 0}), progress=False)
    assert len(made) == 1, "reflection_cache_size 0: no memo"
    assert off.reflection_memos == {}
    assert [r.episodes for r in off.results] == [r.episodes for r in report.results]
    with pytest.raises(ValueError, match="reflection_cache_size must be >= 0"):
        EvalSettings(reflection_cache_size=-1)
