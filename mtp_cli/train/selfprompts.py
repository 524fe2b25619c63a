"""Prompts written by the trunk itself: the chat template up to the user's turn, an opening phrase
(or none), and the model samples the rest of the user's message.

Templated prompts repeat their subjects, so a head trained on their answers learns those answers,
not the trunk. An instruct model has seen countless real user turns: sampled at temperature 1 it
writes varied, natural requests (emails, recipes, how-tos, ...), which the trunk then answers
greedily for training data.

    prompts = generate_prompts("smollm2.gguf", SelfPromptConfig(n=1000, n_threads=2))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gguf_tools.atomic import write_text
from mtp_cli.chat import Source, chat_prompt
from mtp_cli.runtime import Runtime
from mtp_cli.train.answers import BatchedAnswerer, run_answerers

# Opening phrases, steering kinds without fixing subjects; "" lets the model choose freely.
STARTERS: tuple[str, ...] = (
    "",
    "",
    "",
    "",
    "",
    "",
    "",
    "",
    "",
    "",
    "",
    "",
    "Write an email",
    "Write a short email",
    "Could you write an email",
    "Please write an email",
    "Draft an email",
    "Email to",
    "write an email",
    "I need to email",
    "Help me write a message",
    "How do I make",
    "Give me a recipe",
    "Recipe for",
    "What's a good recipe",
    "How do you cook",
    "how do i make",
    "I have",
    "What can I cook",
    "Tell me a story",
    "Write a story",
    "Write a short story",
    "Can you write a story",
    "Write a poem",
    "Write a children's story",
    "short story:",
    "How do I",
    "How do you",
    "how do i",
    "How can I",
    "What's the best way to",
    "Steps to",
    "Teach me how to",
    "I want to learn",
    "I want to start",
    "Help me",
    "Explain",
    "Explain how",
    "Why do",
    "Why does",
    "Why is",
    "What is",
    "What are",
    "What happens when",
    "How does",
    "How do",
    "why do",
    "what is",
    "Can you explain",
    "List",
    "Give me a list",
    "Name",
    "What are some",
    "Give me ideas",
    "Suggest",
    "Which",
    "Give me",
    "Can you",
    "Could you",
    "Please",
    "I need",
    "I'm",
    "My",
    "Is it",
    "Should I",
    "What should I",
    "Compare",
    "Describe",
    "Summarize",
    "Write a",
    "Create a",
    "Plan",
    "What's the difference between",
)


@dataclass(frozen=True)
class SelfPromptConfig:
    n: int  # prompts wanted (fewer if the model repeats itself)
    seed: int = 0
    temp: float = 1.0
    top_k: int = 40  # sampled from the model's top-k
    max_new: int = 64  # tokens the model may write; a message not finished by then is dropped
    n_threads: int = 1  # one batched context per thread
    n_seq: int = 16
    min_words: int = 3
    max_words: int = 60


@dataclass
class SelfPromptProgress:
    kept: int
    tried: int
    total: int


def normalized(s: str) -> str:
    """Case and spacing aside: what counts as the same prompt."""
    return " ".join(s.lower().split())


def acceptable(text: str, cfg: SelfPromptConfig) -> bool:
    """One line, a sensible length, plain text (no markup the template uses, mostly ASCII)."""
    if "\n" in text or "<|" in text or "|>" in text:
        return False
    words = len(text.split())
    if not cfg.min_words <= words <= cfg.max_words:
        return False
    return sum(c.isascii() for c in text) >= 0.97 * len(text)


def user_prefix(gf: Source, bos: str, eos: str) -> str:
    """The chat template rendered up to where the user's message begins."""
    mark = "\x00USER\x00"
    text = chat_prompt(gf, mark, bos, eos)
    return text[: text.index(mark)]


def generate_prompts(
    model_path: str | os.PathLike[str],
    cfg: SelfPromptConfig,
    *,
    exclude: Iterable[str] = (),
    progress: Callable[[SelfPromptProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[str]:
    """`cfg.n` distinct user prompts sampled from the model (the same for a seed, up to batched
    kernels' rounding), none equal (case and spacing aside) to one of `exclude` (say, held-out
    evaluation prompts). Raises ChatTemplateError when the model has no chat template."""
    rt = Runtime.load(model_path)
    answerers: list[BatchedAnswerer] = []
    seen = {normalized(e) for e in exclude}
    results: dict[int, str] = {}
    tried = 0
    try:
        prefix = user_prefix(rt.chat_file, *rt.special_texts())
        rng = np.random.default_rng(cfg.seed)
        tries = int(cfg.n * 2) + 16
        starters = [STARTERS[i] for i in rng.integers(0, len(STARTERS), size=tries)]
        prefix_toks = rt.tokenize(prefix, add_special=True, parse_special=True)
        max_len = len(prefix_toks) + 16 + cfg.max_new

        def jobs() -> Iterable[tuple[str, list[int], int]]:
            for i, st in enumerate(starters):
                if len(results) >= cfg.n:
                    return
                yield f"{i}", rt.tokenize(prefix + st, add_special=True, parse_special=True), cfg.max_new

        def done(key: str, seq: dict) -> None:
            nonlocal tried
            tried += 1
            i = int(key)
            gen = rt.detokenize([int(t) for t in seq["tokens"][seq["n_prompt"] :]])
            text = (starters[i] + gen).strip()
            if seq["eog"] and acceptable(text, cfg) and normalized(text) not in seen:
                seen.add(normalized(text))
                results[i] = text
            if progress:
                progress(SelfPromptProgress(len(results), tried, cfg.n))

        answerers = [
            BatchedAnswerer(
                rt.model, max_len=max_len, top_k=cfg.top_k, n_seq=cfg.n_seq, n_threads=1, temp=cfg.temp, seed=cfg.seed
            )
            for _ in range(max(1, cfg.n_threads))
        ]
        # no early stop once enough are kept: the jobs in flight finish, so the first n by job order are
        # the same whatever the threads' timing
        run_answerers(answerers, jobs(), done, should_stop)
    finally:
        for a in answerers:
            a.close()
        rt.close()
    # in job order, not finishing order: the same set for a seed comes out the same way
    return [results[i] for i in sorted(results)][: cfg.n]


def write_prompts(path: str | os.PathLike[str], prompts: Sequence[str], header: Sequence[str] = ()) -> None:
    """One prompt per line (`#` header lines first), written atomically."""
    write_text(path, "".join(f"# {h}\n" for h in header) + "".join(p + "\n" for p in prompts))


__all__ = [
    "STARTERS",
    "SelfPromptConfig",
    "SelfPromptProgress",
    "generate_prompts",
    "write_prompts",
    "acceptable",
    "normalized",
    "user_prefix",
]
