"""Text generation: tokenize, decode the prompt, then sample and decode one token at a time.

This is the loop of llama.cpp's completion tool: the prompt is decoded in batches of ``n_batch``
(only its last token produces logits), every sampled token is accepted by the sampler, decoded
and streamed out as soon as its bytes form complete UTF-8, and generation stops at an
end-of-generation token, after ``n_predict`` tokens, or when the context is full.
"""

from __future__ import annotations

import codecs
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import PyGGMLError
from ..notice import first_run_seconds
from .context import LlamaContext
from .sampling import Sampler
from .speculative import Speculator


@dataclass
class Timings:
    """Tokens and seconds spent on prompt processing and on generation: of one generation, or summed over
    every request a server has answered (its /metrics)."""

    n_prompt: int = 0
    t_prompt: float = 0.0
    n_gen: int = 0
    t_gen: float = 0.0
    t_first_run: float = 0.0  # compiling kernels (a first run's), left out of t_prompt and t_gen

    @property
    def pp_rate(self) -> float:
        """Prompt tokens per second (0 before any)."""
        return self.n_prompt / self.t_prompt if self.t_prompt else 0.0

    @property
    def tg_rate(self) -> float:
        """Generated tokens per second (0 before any)."""
        return self.n_gen / self.t_gen if self.t_gen else 0.0

    def summary(self) -> str:
        s = (f"prompt eval: {self.n_prompt} tokens in {self.t_prompt * 1e3:.0f} ms ({self.pp_rate:.1f} tok/s); "
             f"generation: {self.n_gen} tokens in {self.t_gen * 1e3:.0f} ms ({self.tg_rate:.1f} tok/s)")
        if self.t_first_run >= 0.0005:
            s += f"; not counted: {self.t_first_run * 1e3:.0f} ms compiling kernels (first run only)"
        return s


@dataclass
class Generation:
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""
    timings: Timings = field(default_factory=Timings)
    n_shifts: int = 0  # context shifts made


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`generate`: a KeyboardInterrupt that carries what was generated so far and
    its timings, so a command can print them before it stops (as llama.cpp prints its perf figures)."""

    def __init__(self, generation: Generation) -> None:
        super().__init__()
        self.generation = generation


def generate(ctx: LlamaContext, vocab: object, prompt_tokens: list[int], sampler: Sampler, n_predict: int = -1,
             on_text: Callable[[str], None] | None = None, context_shift: bool = False,
             n_keep: int = 0, ignore_eos: bool = False, n_ctx: int | None = None,
             speculator: Speculator | None = None) -> Generation:
    """Generate after ``prompt_tokens``; ``on_text`` receives text pieces as they complete.

    When the context fills up, generation stops (stop_reason "context full"), or with
    ``context_shift`` continues as llama.cpp's completion tool does: the first ``n_keep`` positions
    stay, the older half of the rest is dropped and the newer half moves down (LlamaContext.context_shift).
    ``ignore_eos`` keeps going past end-of-generation tokens (llama.cpp's --ignore-eos).

    ``n_ctx`` is the context size the user asked for, when below ``ctx.n_ctx``: the context's KV
    cache holds whole pages of 256 cells, so ``-c 10`` gets 256 cells, but the prompt and the
    generation keep to the 10 asked for. Seconds spent compiling kernels (notice.first_run_time)
    are left out of the timings. Ctrl-C raises :class:`GenerationInterrupted` with what was done.

    With a ``speculator`` (llm/speculative.py) each step decodes the last token with a draft after it
    and may yield several tokens; they are taken one by one exactly as plain decoding's (the same
    stops, the same context checks), so greedy output is plain greedy output.
    """
    n_ctx = ctx.n_ctx if n_ctx is None else min(n_ctx, ctx.n_ctx)
    if not prompt_tokens:
        raise PyGGMLError("the prompt is empty (no tokens to start from)")
    if len(prompt_tokens) >= n_ctx:
        raise PyGGMLError(f"the prompt has {len(prompt_tokens)} tokens, more than the context size {n_ctx}; "
                          "use a larger --ctx-size")
    out = Generation(list(prompt_tokens))
    tm = out.timings
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces: list[str] = []
    for t in prompt_tokens:
        sampler.accept(t, is_generated=False)
    clock = _Clock(tm)
    generating = False
    try:
        logits = None
        for s in range(0, len(prompt_tokens), ctx.n_batch):
            logits = ctx.decode(prompt_tokens[s : s + ctx.n_batch])
            tm.n_prompt = min(s + ctx.n_batch, len(prompt_tokens))
        if speculator is not None:
            speculator.begin(prompt_tokens)
        tm.t_prompt = clock.lap()
        generating = True
        ready: deque[int] = deque()  # tokens sampled ahead by a speculative step, their cells already decoded
        while True:
            if 0 <= n_predict <= len(out.tokens):
                out.stop_reason = "n_predict"
                break
            if ready:
                tok = ready.popleft()
            elif speculator is not None and out.tokens:
                left = n_predict - len(out.tokens) if n_predict >= 0 else n_ctx
                ready.extend(speculator.step(sampler, out.tokens[-1], left, n_ctx))
                tok = ready.popleft()
            else:
                assert logits is not None
                tok = sampler.sample(logits[-1])
                sampler.accept(tok)
            if vocab.is_eog(tok) and not ignore_eos:
                out.stop_reason = "eog"
                break
            out.tokens.append(tok)
            text = decoder.decode(vocab.token_to_piece(tok, special=False))
            if text:
                pieces.append(text)
                if on_text is not None:
                    on_text(text)
            # llama.cpp's test: the next token would fill the context (cells decoded ahead not counted;
            # a speculative step's drafts end early enough that it can only hold for its last token)
            if ctx.n_past - len(ready) + 1 >= n_ctx:
                if not context_shift:
                    out.stop_reason = "context full"
                    break
                n_discard = ctx.context_shift(n_keep)
                if speculator is not None:
                    speculator.shifted(n_keep, n_discard)
                out.n_shifts += 1
            if speculator is None:
                logits = ctx.decode([tok])
        tail = decoder.decode(b"", final=True)
        if tail:
            pieces.append(tail)
            if on_text is not None:
                on_text(tail)
    except KeyboardInterrupt:
        out.stop_reason = "interrupted"
        raise GenerationInterrupted(out) from None
    finally:  # kept true on every exit, an interrupt's included
        if generating:
            out.text = "".join(pieces)
            tm.n_gen = len(out.tokens)
            tm.t_gen = clock.lap()
        else:
            tm.t_prompt = clock.lap()
    return out


class _Clock:
    """Wall time between laps, less the seconds spent compiling kernels meanwhile (those are added to
    ``timings.t_first_run``)."""

    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self.t0, self.c0 = time.perf_counter(), first_run_seconds()

    def lap(self) -> float:
        """Seconds since the last lap (or the start) that were not spent compiling; starts the next lap."""
        t, c = time.perf_counter(), first_run_seconds()
        compiling = c - self.c0
        self.timings.t_first_run += compiling
        seconds = t - self.t0 - compiling
        self.t0, self.c0 = t, c
        return seconds
