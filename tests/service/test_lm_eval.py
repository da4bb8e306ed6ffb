"""lm-eval-harness as a real client: its API models run a generation task and a multiple-choice log-likelihood task
against a real gateway in front of a real worker serving the default target (SmolLM2-135M in fp32, prompt-lookup
draft), through `lm_eval.simple_evaluate` as a user's script would.

- `local-chat-completions` sends each question as chat `messages` with `max_tokens`, `temperature`, `stop` and
  `seed`, and reads `choices[i].message.content` (lm_eval/models/openai_completions.py LocalChatCompletion
  `_create_payload`, `parse_generations`).
- `local-completions` scores each (context, choice) pair as a batch of token-id prompts with `echo`, `max_tokens` 1
  and `logprobs` 1, and sums the continuation's `token_logprobs` (LocalCompletionsAPI `_create_payload`,
  `parse_logprobs`). It tokenizes itself, with the Hugging Face tokenizer named by `tokenizer` under
  `tokenizer_backend: huggingface` (lm_eval/models/api_models.py TemplateAPI.__init__): the target's own, saved with
  `save_pretrained`. `auto` (lm_eval/utils.py check_remote_tokenizer_support) probes the server for vLLM's
  `/tokenizer_info` and `/tokenize`, which ours does not serve, then loads `model` from the Hub as a tokenizer.

The tasks are YAML configs the test writes over the rows in tests/service/fixtures/lm_eval/ (`dataset_path: json`),
loaded by lm-eval's TaskManager without its built-in tasks; Hugging Face runs offline, so nothing needs the network.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml

from tests.service.conftest import served

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
FIXTURES = Path(__file__).parent / "fixtures" / "lm_eval"
#: lm-eval's loglikelihood of a choice against the target's fp32 log-softmax, summed over the choice's tokens
TOLERANCE = 1e-3
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
MAX_GEN_TOKS = 8
NUMBER = "-?[0-9]+"

ARITHMETIC = {
    "task": "deepspec_arithmetic",
    "dataset_path": "json",
    "dataset_kwargs": {"data_files": {"test": str(FIXTURES / "arithmetic.jsonl")}},
    "test_split": "test",
    "output_type": "generate_until",
    "doc_to_text": "{{question}} Answer with the number only.",
    "doc_to_target": "{{answer}}",
    "generation_kwargs": {"until": ["\n"], "max_gen_toks": MAX_GEN_TOKS, "do_sample": False, "temperature": 0},
    # the small model answers "2 + 3 = 5": score the last number it writes, as gsm8k's flexible-extract does
    "filter_list": [
        {
            "name": "last-number",
            "filter": [{"function": "regex", "regex_pattern": NUMBER, "group_select": -1}, {"function": "take_first"}],
        }
    ],
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
}
CAPITALS = {
    "task": "deepspec_capitals",
    "dataset_path": "json",
    "dataset_kwargs": {"data_files": {"test": str(FIXTURES / "capitals.jsonl")}},
    "test_split": "test",
    "output_type": "multiple_choice",
    "doc_to_text": "The capital of {{country}} is",
    "doc_to_choice": "choices",
    "doc_to_target": "label",
    "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
}


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """Set before the servers start, so they inherit it too; datasets caches the parsed rows in the test's tmp."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path_factory.mktemp("datasets"))}.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def gateway(offline, tmp_path_factory):
    """fp32, so the worker's logprobs can be held to the reference's tolerance (the default bf16 would not be)."""
    with served(
        tmp_path_factory.mktemp("servers"),
        "--target",
        MODEL,
        "--dtype",
        "float32",
        "--draft",
        "prompt-lookup",
        "--max-seq-len",
        "512",
    ) as gw:
        yield gw


@pytest.fixture(scope="module")
def task_manager(offline, tmp_path_factory):
    from lm_eval.tasks import TaskManager

    tasks = tmp_path_factory.mktemp("lm_eval_tasks")
    for config in (ARITHMETIC, CAPITALS):
        (tasks / f"{config['task']}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return TaskManager(include_path=str(tasks), include_defaults=False)


def evaluate(task_manager, task: str, model: str, model_args: dict, **kwargs) -> dict[str, Any]:
    """One attempt per request (`max_retries` 1): a request the gateway refuses fails the test at once, with the
    gateway's message in lm-eval's log, rather than after lm-eval's backoff."""
    from lm_eval.evaluator import simple_evaluate

    results = simple_evaluate(
        model=model,
        model_args={"model": MODEL, "max_retries": 1, **model_args},
        tasks=[task],
        task_manager=task_manager,
        log_samples=True,
        bootstrap_iters=0,
        **kwargs,
    )
    assert results is not None
    return {**results}  # the JSON-like report, read by key


def test_a_generation_task_through_local_chat_completions(gateway, task_manager):
    """lm-eval's answers are the ones the gateway gives the same greedy chat requests, and its exact_match is
    theirs."""
    results = evaluate(
        task_manager,
        ARITHMETIC["task"],
        "local-chat-completions",
        {"base_url": f"{gateway.url}/v1/chat/completions"},
        apply_chat_template=True,
    )
    exact_match = results["results"][ARITHMETIC["task"]]["exact_match,last-number"]
    samples = results["samples"][ARITHMETIC["task"]]
    assert len(samples) == 3
    right = []
    for sample in samples:
        messages = [{"role": "user", "content": f"{sample['doc']['question']} Answer with the number only."}]
        direct = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            timeout=120,
            json={"model": MODEL, "messages": messages, "max_tokens": MAX_GEN_TOKS, "temperature": 0, "stop": ["\n"]},
        )
        assert direct.status_code == 200, direct.text
        answer = direct.json()["choices"][0]["message"]["content"]
        assert answer and sample["resps"] == [[answer]]
        right.append(re.findall(NUMBER, answer)[-1] == sample["doc"]["answer"])
    assert exact_match == pytest.approx(sum(right) / len(right))


def reference_loglikelihood(target, context: str, continuation: str) -> tuple[float, bool]:
    """log P(continuation | context) from the target's fp32 logits, and whether greedy decoding would write it:
    what lm-eval's HF model computes (context and continuation tokenized together, the continuation's tokens
    being those after the context's)."""
    context_ids = target.tokenizer(context, add_special_tokens=False)["input_ids"]
    ids = target.tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    assert ids[: len(context_ids)] == context_ids, "the data should not make a token span context and choice"
    with torch.no_grad():
        logits = target.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.long)).logits[0]
    rows = torch.log_softmax(logits.float(), dim=-1)[len(context_ids) - 1 : -1]
    continuation_ids = torch.tensor(ids[len(context_ids) :])
    picked = rows.gather(1, continuation_ids[:, None])[:, 0]
    return float(picked.sum()), bool((rows.argmax(dim=-1) == continuation_ids).all())


def test_a_multiple_choice_task_is_scored_by_prompt_scoring(gateway, task_manager, smollm2, tmp_path):
    """Each choice's loglikelihood, as lm-eval parsed it from our prompt scoring, is the target's own, within 1e-3;
    the choices of a question differ, so acc is computed from real numbers. batch_size 4: lm-eval sends a batch of
    token-id prompts per request."""
    tokenizer_dir = tmp_path / "tokenizer"
    smollm2.tokenizer.save_pretrained(tokenizer_dir)
    results = evaluate(
        task_manager,
        CAPITALS["task"],
        "local-completions",
        {
            "base_url": f"{gateway.url}/v1/completions",
            "tokenizer_backend": "huggingface",
            "tokenizer": str(tokenizer_dir),
            "max_length": 512,
        },
        batch_size=4,
    )
    acc = results["results"][CAPITALS["task"]]["acc,none"]
    samples = results["samples"][CAPITALS["task"]]
    assert len(samples) == 4
    correct, greedy = 0, set()
    for sample in samples:
        scored = [resp[0] for resp in sample["resps"]]  # one (loglikelihood, is_greedy) per choice
        assert len(scored) == len(sample["doc"]["choices"]) == 3
        for (context, continuation), (loglikelihood, is_greedy) in zip(sample["arguments"], scored):
            expected, expected_greedy = reference_loglikelihood(smollm2, context, continuation)
            assert abs(loglikelihood - expected) < TOLERANCE, (context, continuation, loglikelihood, expected)
            assert is_greedy == expected_greedy, (context, continuation)
            greedy.add(is_greedy)
        loglikelihoods = [ll for ll, _ in scored]
        assert len(set(loglikelihoods)) == len(loglikelihoods), loglikelihoods
        correct += max(range(3), key=loglikelihoods.__getitem__) == sample["doc"]["label"]
    assert acc == correct / len(samples)
    assert greedy == {True, False}  # the right capital is the greedy continuation, the others are not
