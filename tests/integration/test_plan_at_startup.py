"""The capacity plan's choice reaches the first launch (issue 6, item 3), through launcher.start_engine.

The GPU figures cannot come from this machine, so the plan is made for a 24 GiB card from a
config; the engine is the scripted stand-in, which records the argv of each launch. What is
checked is main's part: a profile the plan chose is the first launch's configuration, shown
as a degraded profile, and the ladder still counts from there.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.fake_engine import FakeEngine
from vllm_worker.engine import launcher
from vllm_worker.config.profile import PARSES, LaunchProfile
from vllm_worker import capacity
from vllm_worker.capacity import kv_cache
from vllm_worker.config import settings as settings_mod
from vllm_worker.capacity.gpus import find_card

CARD = find_card("RTX 4090").total_bytes
# A Llama-8B shape whose 1,000,000-token vocabulary makes the sampler of 256 sequences
# cost several GiB: MAX_NUM_SEQS=256 cannot fit a long context, 32 can.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 1_048_576,
    "torch_dtype": "bfloat16",
    "vocab_size": 1_000_000,
    "tie_word_embeddings": False,
}
PARAMS = {"BF16": 8030261248}


def _length_beyond(facts: capacity.ModelFacts, env: dict[str, str]) -> int:
    loose = capacity.plan(facts, CARD, capacity.knobs_from_env(env, worker_seqs=True), max_concurrency=30)
    return (loose.kv_cache_bytes + loose.margin_bytes) // kv_cache.kv_bytes_per_token(facts) + 256


def test_the_first_launch_runs_the_profile_the_plan_predicted_to_fit(tmp_path: Path) -> None:
    facts = capacity.facts_from_config(CONFIG, PARAMS, source="org/big-vocab")
    base = {"MODEL_NAME": "org/big-vocab", "MAX_NUM_SEQS": "256", "MAX_CONCURRENCY": "30"}
    env = {**base, "MAX_MODEL_LEN": str(_length_beyond(facts, base))}
    plan = capacity.startup_plan(LaunchProfile.parse(env), CARD, facts=facts)
    assert plan.status == "profile" and plan.overrides == {"MAX_NUM_SEQS": "32"}

    engine = FakeEngine(tmp_path, [{"serve": True}])
    env.update(engine.env())
    settings = settings_mod.load(env)
    supervisor = launcher.Supervisor(settings)
    try:
        outcome = launcher.start_engine(LaunchProfile.parse(env), settings, supervisor, None, plan.first_steps, CARD)
        assert outcome.engine is not None and outcome.climb is not None
        _, outcome.capacity_plan = capacity.ready_engine_report(plan, outcome.climb.profile, outcome.engine.tail())
    finally:
        supervisor.stop()
        engine.kill_leftovers()

    [argv] = engine.argvs()
    assert argv[argv.index("--max-num-seqs") + 1] == "32"
    assert argv[argv.index("--max-model-len") + 1] == env["MAX_MODEL_LEN"]  # never lowered
    assert outcome.fatal is None and [r["outcome"] for r in outcome.launches] == ["ready"]
    assert outcome.profile is not None and outcome.profile["name"] == "max_num_seqs=32"
    assert outcome.capacity_plan["plan"] == "profile"



# A real public CUDA out-of-memory log from a 24 GiB card (vllm-project/vllm#15105, RTX 3090).
REAL_OOM = (Path(__file__).parents[1] / "field" / "startup_failures" / "mem_016_v1_vllmworker_oom_tp2_3090.log").read_text()


def _start_on_the_plan(
    tmp_path: Path, launches: list[dict[str, object]], parses: list[int] | None = None
) -> tuple[launcher.StartupOutcome, list[list[str]]]:
    """main's part of a start from the parse on: the plan, then start_engine; `parses` gets the count."""
    facts = capacity.facts_from_config(CONFIG, PARAMS, source="org/big-vocab")
    base = {"MODEL_NAME": "org/big-vocab", "MAX_NUM_SEQS": "256", "MAX_CONCURRENCY": "30"}
    env = {**base, "MAX_MODEL_LEN": str(_length_beyond(facts, base))}
    engine = FakeEngine(tmp_path, launches)
    env.update(engine.env())
    settings = settings_mod.load(env)
    before = PARSES.count
    profile = LaunchProfile.parse(env)  # as main does: one profile for the plan and the launches
    plan = capacity.startup_plan(profile, CARD, facts=facts)
    assert plan.status == "profile" and plan.overrides == {"MAX_NUM_SEQS": "32"}
    supervisor = launcher.Supervisor(settings)
    try:
        outcome = launcher.start_engine(profile, settings, supervisor, None, plan.first_steps, CARD)
        if outcome.engine is not None and outcome.climb is not None:  # as main does once the engine is ready
            _, outcome.capacity_plan = capacity.ready_engine_report(plan, outcome.climb.profile, outcome.engine.tail())
    finally:
        supervisor.stop()
        engine.kill_leftovers()
    if parses is not None:
        parses.append(PARSES.count - before)
    return outcome, engine.argvs()


def _seqs_and_eager(argv: list[str]) -> tuple[str, bool]:
    return argv[argv.index("--max-num-seqs") + 1], "--enforce-eager" in argv


def test_a_plan_chosen_first_launch_that_dies_of_oom_keeps_the_plans_batch_and_adds_the_next_step(
    tmp_path: Path,
) -> None:
    outcome, argvs = _start_on_the_plan(tmp_path, [{"output": REAL_OOM, "exit_code": 1}, {"serve": True}])
    # Never 256 again: the plan already took the fewer-sequences step, so the relaunch is 32 and eager.
    assert [_seqs_and_eager(argv) for argv in argvs] == [("32", False), ("32", True)]
    assert outcome.fatal is None and [r["outcome"] for r in outcome.launches] == ["failed", "ready"]
    assert outcome.profile is not None and outcome.profile["name"] == "eager"
    assert outcome.profile["tried"] == ["launched with MAX_NUM_SEQS=32", "relaunched with ENFORCE_EAGER=true"]


def test_when_the_plans_profile_and_eager_both_die_of_oom_the_answer_names_both(tmp_path: Path) -> None:
    oom = {"output": REAL_OOM, "exit_code": 1}
    outcome, argvs = _start_on_the_plan(tmp_path, [oom, oom, oom])
    # Two launches, not three: both memory steps were taken, so none is left to try.
    assert [_seqs_and_eager(argv) for argv in argvs] == [("32", False), ("32", True)]
    assert outcome.fatal is not None and outcome.cause == "memory_shortfall"
    assert "Already tried: launched with MAX_NUM_SEQS=32; relaunched with ENFORCE_EAGER=true." in outcome.fatal


def test_the_profile_is_parsed_once_however_many_profiles_a_start_plans_or_launches(tmp_path: Path) -> None:
    counted: list[int] = []
    outcome, argvs = _start_on_the_plan(tmp_path, [{"output": REAL_OOM, "exit_code": 1}, {"serve": True}], counted)
    [parses] = counted
    assert outcome.climb is not None and outcome.fatal is None
    plan_steps = len(outcome.capacity_plan.get("plan_overrides", {}))  # the plan walked one step: seqs, predicted to fit
    ladder_profiles = len({step.profile for step in outcome.climb.taken})  # the plan's seqs, then eager
    print(f"LaunchProfile.parse calls for this start: {parses} (the configuration; the plan's candidates "
          f"{plan_steps} and the ladder's profiles {ladder_profiles} are typed changes of it; {len(argvs)} launches)")
    assert parses == 1
    assert plan_steps == 1 and ladder_profiles == len(argvs) == 2
