"""What to send: prompts from `{"turns": [...]}` jsonl files, or random text of chosen lengths.

Both produce `RequestInput`s and cycle when a run asks for more requests than there are prompts, so a run is
bounded by `--num-prompts` / `--duration`, never by the dataset.

Eval datasets: every `*.jsonl` in a directory or one file. Only the first turn of each record is used, as a single
user message: later turns need the model's own earlier replies. The default is the load tester's own
`loadtest/prompts/`: the first 64 prompts of each of the repository's eval sets (GSM8K, MATH-500, HumanEval,
MBPP, LBPP; sources and licences in `loadtest/prompts/README.md`), shipped inside the package so a load test needs
neither the deepspec library nor the checkout's `datasets/`. Pass `--dataset-path datasets/eval` for every prompt.

Random workload: prompts of `input_len` words drawn from a list of common English words that are one token each
in the usual BPE vocabularies (GPT-2, Llama, Qwen, SmolLM), so the prompt length in tokens is close to, not
exactly, `input_len`; the server's `usage.prompt_tokens` is what the report counts. Each prompt starts with
its own index so no two share a prefix (prefix caching would otherwise flatter TTFT). `ignore_eos` makes the
output length exact on servers that support it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from loadtest.records import RequestInput

#: the load tester's own prompt sets, found from the package so it works from any working directory
DEFAULT_EVAL_DIR = Path(__file__).resolve().parent / "prompts"

_WORDS = """
the of and to in is that it was for on are as with his they at be this from have or by one had not but what all
were when we there can an your which their said if do will each about how up out them then she many some so
these would other into has more her two like him see time could no make than first been its who now people my
made over did down only way find use may water long little very after words called just where most know get
through back much before go good new write our used me man too any day same right look think also around another
came come work three word must because does part even place well such here take why things help put years
different away again off went old number great tell men say small every found still between name should home big
give air line set own under read last never us left end along while might next sound below saw something thought
both few those always looked show large often together asked house world going want school
""".split()  # noqa: SIM905 (a list literal is formatted one word per line: 195 lines)


def load_turns(path: str | Path) -> list[str]:
    """First turns of every record in `path` (a .jsonl file, or a directory of them, sorted by name)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"no *.jsonl files in {path}; pass --dataset-path FILE_OR_DIR")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(
            f"dataset {path} does not exist; pass --dataset-path FILE_OR_DIR or --dataset-name random"
        )
    prompts: list[str] = []
    for f in files:
        with f.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    turns = json.loads(line)["turns"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{f}:{lineno}: expected a JSON object with a 'turns' list ({e})") from None
                if turns and isinstance(turns[0], str) and turns[0]:
                    prompts.append(turns[0])
    if not prompts:
        raise ValueError(f"no prompts found in {path}")
    return prompts


def dataset_requests(
    prompts: list[str], *, max_tokens: int | None, ignore_eos: bool, seed: int, temperature: float | None = 0.0
) -> Iterator[RequestInput]:
    """Endless requests: the prompts shuffled with `seed`, then repeated in the same order."""
    order = list(prompts)
    random.Random(seed).shuffle(order)
    while True:
        for p in order:
            yield RequestInput(prompt=p, max_tokens=max_tokens, ignore_eos=ignore_eos, temperature=temperature)


def random_requests(
    *, input_len: int, output_len: int, range_ratio: float, seed: int, ignore_eos: bool, temperature: float | None = 0.0
) -> Iterator[RequestInput]:
    """Endless random-word prompts; lengths uniform in [len * (1 - range_ratio), len * (1 + range_ratio)]."""
    if input_len < 1 or output_len < 1:
        raise ValueError(f"random input and output lengths must be >= 1 token, got {input_len}, {output_len}")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)

    def length(n: int) -> int:
        return max(1, rng.randint(int(n * (1 - range_ratio)), int(n * (1 + range_ratio))))

    i = 0
    while True:
        n_in, n_out = length(input_len), length(output_len)
        words = [str(i)] + rng.choices(_WORDS, k=n_in - 1)
        yield RequestInput(
            prompt=" ".join(words), prompt_len=n_in, max_tokens=n_out, ignore_eos=ignore_eos, temperature=temperature
        )
        i += 1
