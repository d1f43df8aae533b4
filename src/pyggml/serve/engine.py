"""The slots and their scheduler: continuous batching over one LlamaContext, as llama-server's update_slots.

Each of the N slots owns sequence id ``slot.id`` of a unified KV cache holding N sequences. A
dedicated thread runs the loop: every step it

1. frees the slots whose client went away (their ``Task.cancelled`` flag), so a disconnect costs at
   most the step in flight;
2. gives waiting tasks to idle slots, the slot whose cached tokens share the longest prefix with the
   new prompt first (``cache_prompt``: positions past that prefix are dropped with ``seq_rm`` and only
   the rest is decoded), else the least recently used one;
3. builds ONE batch: the next token of every generating slot, then prompt chunks of new tasks up to
   n_batch tokens, and decodes it with ``decode_batch``;
4. samples each slot's next token from its row of logits with the slot's own sampler chain, checks
   end of generation, stop strings and limits, and hands text to the HTTP side through the task's
   asyncio queue (``call_soon_threadsafe``: the engine thread never touches the event loop itself).

Each slot may use n_ctx / N cells, so the cells of all slots together always fit in the cache.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..llm.batch import Batch, DecodeError
from ..llm.generate import Timings
from ..llm.grammar import GrammarSampler
from ..llm.sampling import Candidates, Sampler, SamplingParams
from ..llm.speculative import SpecStats, pad_draft
from .errors import APIError, ErrorType
from .textstop import StopMatcher, StopSet


@dataclass
class TaskParams:
    """What a request asks of its slot (llama-server's slot_params, the parts used here)."""

    n_predict: int = -1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stops: StopSet | None = None  # ``stop`` compiled (by the HTTP side, so the engine thread never waits on it)
    dry_breakers: dict[int, list[tuple[int, ...]]] | None = None  # DRY's breakers tokenized (likewise)
    n_probs: int = 0
    cache_prompt: bool = True
    ignore_eos: bool = False
    grammar: GrammarSampler | None = None  # the request's grammar (json_schema, grammar, response_format)
    preserved: frozenset[int] = frozenset()  # tokens whose text is sent even when special (preserved_tokens)
    timings_per_token: bool = False  # each TokenEvent carries the timings so far
    post_sampling_probs: bool = False  # n_probs from the candidates the chain kept, as probabilities
    id_slot: int = -1  # the slot this task must run in (llama-server's "id_slot"); -1: any idle one


@dataclass
class TokenEvent:
    """One sampled token: ``text`` is the text now safe to send (held back while it may start a stop string)."""

    token: int
    text: str
    probs: dict[str, Any] | None = None
    timings: dict[str, float] | None = None  # the task's timings so far (``timings_per_token``)


@dataclass
class DoneEvent:
    """The task finished: the unsent tail of the text and the counts and timings of the response."""

    text: str  # not yet sent in a TokenEvent
    full_text: str
    finish_reason: str  # "stop" or "length"
    stopping_word: str
    n_prompt: int
    n_cached: int
    n_decoded: int
    timings: dict[str, float]
    tokens: list[int] = field(default_factory=list)  # every sampled token, the end-of-generation one included
    id_slot: int = -1


@dataclass
class ErrorEvent:
    error: APIError


Event = TokenEvent | DoneEvent | ErrorEvent
_task_ids = itertools.count()


class Task:
    """A request's tokens and parameters; its events arrive on ``queue`` in the event loop's thread."""

    def __init__(self, tokens: list[int], params: TaskParams, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.id = next(_task_ids)
        self.tokens = tokens
        self.params = params
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = False
        self.t_queued = time.perf_counter()

    def post(self, event: Event) -> None:
        """Called from the engine thread."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


#: what a control function (Engine.call) returns to be run again after the next step
DEFER = object()

IDLE, PROMPT, GENERATING = "idle", "processing prompt", "generating"


class Slot:
    """One sequence of the cache and the task it serves; ``cached`` mirrors the tokens its cells hold."""

    def __init__(self, slot_id: int, n_ctx: int) -> None:
        self.id = slot_id
        self.n_ctx = n_ctx
        self.state = IDLE
        self.task: Task | None = None
        self.last_task: Task | None = None
        self.cached: list[int] = []  # tokens at positions 0.. of sequence ``id`` in the KV cache
        self.t_last_used = 0.0
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.n_prompt_done = 0  # prompt tokens in the cache so far
        self.n_cached = 0  # of them, reused from the previous task
        self.n_decoded = 0
        self.generated: list[int] = []
        self.next_token = -1
        self.spec_name, self.spec_n_real = "", 0  # the drafter of the slot's draft in flight, its unpadded length
        self.sampler: Sampler | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop: StopMatcher | None = None
        self.t_start = self.t_prompt_end = time.perf_counter()

    @property
    def is_processing(self) -> bool:
        return self.task is not None

    def n_remain(self) -> int:
        if self.task is None or self.task.params.n_predict < 0:
            return -1
        return self.task.params.n_predict - self.n_decoded


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Stats:
    """Counters for /metrics (llama-server's server_metrics)."""

    #: prompt and generated tokens of all requests, and the seconds spent on each
    work: Timings = field(default_factory=Timings)
    n_prompt_cached: int = 0
    n_decode: int = 0
    n_busy_slots: int = 0
    n_requests: int = 0
    n_cancelled: int = 0
    n_tokens_max: int = 0


class Engine:
    """The slots, the waiting queue and the decode thread (see the module docstring)."""

    def __init__(self, ctx: Any, vocab: Any, n_parallel: int, n_ctx: int, max_queue: int = 64,
                 can_generate: bool = True, drafters: list[Any] | None = None, spec_pad: int = 0) -> None:
        """``drafters`` (llm/speculative.py; a draft model's context holds n_parallel sequences): speculative
        decoding, each generating slot's next token decoded with a draft after it (see _draft)."""
        self.ctx = ctx
        self.drafters = drafters or []
        self.spec_pad = spec_pad
        self.spec_stats = SpecStats()
        self.vocab = vocab
        self.n_slot_ctx = n_ctx // n_parallel
        self.slots = [Slot(i, self.n_slot_ctx) for i in range(n_parallel)]
        self.max_queue = max_queue
        #: False for a model that computes embeddings only (bert, ...): completions are refused
        self.can_generate = can_generate
        self.pending: deque[Task] = deque()
        self.stats = Stats()
        self.n_swa = ctx.model.hparams.n_swa if ctx.model.hparams.uses_swa else 0
        self._cond = threading.Condition()
        self._controls: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the HTTP side (event-loop thread)
    def submit(self, task: Task) -> None:
        """Queue a task; 503 when the queue is full, 400 when the prompt cannot fit a slot."""
        n = len(task.tokens)
        if not self.can_generate:
            raise APIError("this model computes embeddings, not text: use /v1/embeddings", ErrorType.NOT_SUPPORTED)
        if n == 0:
            raise APIError("the prompt is empty (no tokens to start from)")
        if n >= self.n_slot_ctx:
            raise APIError(f"request ({n} tokens) exceeds the available context size ({self.n_slot_ctx} tokens), "
                           "try increasing it", ErrorType.EXCEED_CONTEXT_SIZE)
        with self._cond:
            if any(t.cancelled for t in self.pending):  # clients that left while waiting take no place
                self.pending = deque(t for t in self.pending if not t.cancelled)
            busy = sum(s.task is not None for s in self.slots)
            # tasks not yet launched take the idle slots first; the rest wait
            waiting = busy + len(self.pending) - len(self.slots)
            if waiting >= self.max_queue:
                raise APIError(f"the server is busy: all {len(self.slots)} slots are in use and "
                               f"{waiting} requests are waiting; try again later", ErrorType.UNAVAILABLE)
            self.pending.append(task)
            self._cond.notify()

    def cancel(self, task: Task) -> None:
        """The client went away: the task's slot is freed at the start of the next step."""
        with self._cond:
            task.cancelled = True
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``fn`` in the engine thread between two decodes (it may touch the cache and the slots);
        its result or error arrives on the returned future."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cond:
            self._controls.append((fn, fut))
            self._cond.notify()
        return fut

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pyggml-serve-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def n_deferred(self) -> int:
        return len(self.pending)

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self.pending or self._controls or any(s.task for s in self.slots)):
                    self._cond.wait()
                if self._stop:
                    break
            try:
                self.step()
            except Exception as e:  # never let the thread die: fail the tasks in flight and go on
                self._fail_all(APIError(f"internal error: {e}", ErrorType.SERVER))
        self._fail_all(APIError("the server is shutting down", ErrorType.UNAVAILABLE))
        with self._cond:
            controls, self._controls = list(self._controls), deque()
        for _, fut in controls:
            fut.set_exception(APIError("the server is shutting down", ErrorType.UNAVAILABLE))

    def _fail_all(self, err: APIError) -> None:
        with self._cond:
            waiting, self.pending = list(self.pending), deque()
        for t in waiting:
            t.post(ErrorEvent(err))
        for s in self.slots:
            if s.task is not None:
                s.task.post(ErrorEvent(err))
                self._release(s)

    def _run_controls(self) -> None:
        with self._cond:
            controls, self._controls = list(self._controls), deque()
        again = []
        for fn, fut in controls:
            try:
                out = fn()
            except Exception as e:
                fut.set_exception(e)
                continue
            if out is DEFER:
                again.append((fn, fut))  # its slot is busy: tried again after the next step, as llama-server defers
            else:
                fut.set_result(out)
        if again:
            with self._cond:
                self._controls.extendleft(reversed(again))

    def step(self) -> bool:
        """One scheduling step and (when any slot has work) one decode; False when there was nothing to do."""
        if self._controls:
            self._run_controls()
        with self._cond:
            for s in self.slots:
                if s.task is not None and s.task.cancelled:
                    self.stats.n_cancelled += 1
                    self._release(s)
            self._launch_pending()
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        outputs: list[bool] = []
        readers: list[tuple[Slot, int]] = []  # slots whose logits this batch yields, and their batch index
        fed: list[tuple[Slot, list[int]]] = []
        drafts: dict[int, list[int]] = {}  # slot id -> the draft decoded after its next token
        for s in self.slots:
            if s.state == GENERATING:
                draft = self._draft(s) if self.drafters else []
                drafts[s.id] = draft
                readers.append((s, len(tokens)))
                fed.append((s, [s.next_token]))
                p0 = len(s.cached)
                tokens += [s.next_token, *draft]
                pos += range(p0, p0 + 1 + len(draft))
                seqs += [s.id] * (1 + len(draft))
                outputs += [True] * (1 + len(draft))
        budget = self.ctx.n_batch - len(tokens)
        for s in sorted((s for s in self.slots if s.state == PROMPT), key=lambda s: s.t_start):
            if budget <= 0:
                break
            prompt = s.task.tokens
            chunk = prompt[len(s.cached): len(s.cached) + budget]
            last = len(s.cached) + len(chunk) == len(prompt)
            fed.append((s, chunk))
            p0 = len(s.cached)
            tokens += chunk
            pos += range(p0, p0 + len(chunk))
            seqs += [s.id] * len(chunk)
            outputs += [False] * (len(chunk) - 1) + [last]
            if last:
                readers.append((s, len(tokens) - 1))
            budget -= len(chunk)
        if not tokens:
            return False
        t0 = time.perf_counter()
        try:
            self.ctx.decode_batch(Batch(token=tokens, pos=pos, seq_id=[[q] for q in seqs], logits=outputs))
        except DecodeError as e:  # the memory is as it was: fail these tasks, keep serving
            for s, _ in fed:
                if s.task is not None:
                    s.task.post(ErrorEvent(APIError(f"decode failed: {e}", ErrorType.SERVER)))
                    self._release(s)
            return True
        dt = time.perf_counter() - t0
        st = self.stats
        st.n_decode += 1
        st.n_busy_slots += len(fed)
        n_gen = sum(1 + len(drafts.get(s.id, ())) for s, _ in fed if s.state == GENERATING)
        n_pp = len(tokens) - n_gen
        # the step's time is shared by prompt and generation tokens in proportion
        st.work.t_prompt += dt * n_pp / len(tokens)
        st.work.t_gen += dt * n_gen / len(tokens)
        st.work.n_prompt += n_pp
        for s, chunk in fed:
            s.cached += chunk
            if s.state == PROMPT:
                s.n_prompt_done = len(s.cached)
        for s, i in readers:
            if s.task is None:
                continue
            if s.state == PROMPT:
                s.state = GENERATING
                s.t_prompt_end = time.perf_counter()
            self._sample(s, self.ctx.get_logits_ith(i))
            draft = drafts.get(s.id)
            if draft:
                self._accept_draft(s, i, draft)
        return True

    def _draft(self, s: Slot) -> list[int]:
        """The first drafter's non-empty draft after the slot's next token, short enough that the tokens
        it may yield stay within the request's n_predict and the slot's context (as llama-server's)."""
        n_max = s.n_ctx - len(s.cached) - 2
        if s.n_remain() >= 0:
            n_max = min(n_max, s.n_remain() - 1)
        if n_max <= 0:
            return []
        t0 = time.perf_counter()
        for d in self.drafters:
            draft = d.draft(s.cached, s.next_token, n_max, s.id)[:n_max]
            if draft:
                s.spec_name, s.spec_n_real = d.name, len(draft)
                self.spec_stats.t_draft += time.perf_counter() - t0
                return pad_draft(draft, min(self.spec_pad, n_max))  # one batch shape where it is cheap
        self.spec_stats.t_draft += time.perf_counter() - t0
        return []

    def _accept_draft(self, s: Slot, i: int, draft: list[int]) -> None:
        """Row 0 was sampled; go on through the draft's rows while the sampled token equals the draft's
        (llama.cpp's sample-and-accept), then drop the cells of the rows not taken."""
        n_acc = 0
        while n_acc < len(draft) and s.task is not None and s.next_token == draft[n_acc]:
            s.cached.append(draft[n_acc])
            n_acc += 1
            self._sample(s, self.ctx.get_logits_ith(i + n_acc))
        self.ctx.seq_rm(s.id, len(s.cached), -1)
        self.spec_stats.n_steps += 1
        self.spec_stats.record(s.spec_name, s.spec_n_real, min(n_acc, s.spec_n_real))

    def _launch_pending(self) -> None:
        """Start waiting tasks in queue order while slots are idle; a task asking for a busy slot (``id_slot``)
        waits for it without holding back the tasks behind it."""
        waiting: deque[Task] = deque()
        while self.pending and any(s.task is None for s in self.slots):
            task = self.pending.popleft()
            if task.cancelled:
                continue
            if task.params.id_slot >= 0 and self.slots[task.params.id_slot].task is not None:
                waiting.append(task)
                continue
            self._launch(task)
        self.pending.extendleft(reversed(waiting))

    def _launch(self, task: Task) -> None:
        """Give a task an idle slot: the one it asks for, else the one sharing the longest prefix with it, else
        the least recently used."""
        idle = [s for s in self.slots if s.task is None]
        if task.params.id_slot >= 0:
            idle = [self.slots[task.params.id_slot]]
        best = max(idle, key=lambda s: (common_prefix(s.cached, task.tokens) if task.params.cache_prompt else 0,
                                        -s.t_last_used))
        if common_prefix(best.cached, task.tokens) == 0:
            best = min(idle, key=lambda s: s.t_last_used)
        s = best
        s._reset_counts()
        s.task = task
        s.state = PROMPT
        n_keep = common_prefix(s.cached, task.tokens) if task.params.cache_prompt else 0
        n_keep = min(n_keep, len(task.tokens) - 1)  # decode at least one token, for its logits
        if n_keep > 0 and self.ctx.seq_rm(s.id, n_keep, -1) is False:
            n_keep = 0  # a recurrent state cannot be cut back to the shared prefix (llama-server starts over)
        if n_keep > 0:
            # a sliding-window cache may have dropped cells the new tokens still need to see: start over
            # (none left at all: the window had moved past the whole kept prefix)
            pos_min = self.ctx.seq_pos_min(s.id)
            if self.n_swa and (pos_min < 0 or pos_min > max(0, n_keep - self.n_swa)):
                n_keep = 0
        if n_keep == 0:
            self.ctx.seq_rm(s.id, -1, -1)
        s.cached = task.tokens[:n_keep]
        s.n_cached = n_keep
        self.stats.n_prompt_cached += n_keep
        s.sampler = Sampler(task.params.sampling, self.vocab, task.params.dry_breakers, grammar=task.params.grammar)
        for t in task.tokens:
            s.sampler.accept(t, is_generated=False)
        s.stop = StopMatcher(task.params.stops if task.params.stops is not None else task.params.stop)

    def _release(self, s: Slot) -> None:
        s.last_task = s.task
        s.task = None
        s.state = IDLE
        s.t_last_used = time.perf_counter()

    def _sample(self, s: Slot, logits: np.ndarray) -> None:
        task = s.task
        assert task is not None and s.sampler is not None and s.stop is not None
        p = task.params
        if p.n_predict == 0:  # the prompt only (it is cached for the next request): no token
            self._finish(s, "length")
            return
        post: list[tuple[int, float]] | None = None
        if p.post_sampling_probs and p.n_probs > 0:
            tok, post = sample_keeping_candidates(s.sampler, logits)
        else:
            tok = s.sampler.sample(logits)
        s.sampler.accept(tok)
        s.n_decoded += 1
        s.generated.append(tok)
        self.stats.work.n_gen += 1
        probs = None
        if post is not None:
            probs = post_sampling_probs(self.vocab, post, tok, p.n_probs)
        elif p.n_probs > 0:
            probs = token_probs(self.vocab, logits, tok, p.n_probs)
        finish = ""
        if self.vocab.is_eog(tok) and not p.ignore_eos:
            finish = "stop"
            piece = ""
        else:
            piece = s.decoder.decode(self.vocab.token_to_piece(tok, special=tok in p.preserved))
        ready = ""
        if not finish:
            ready = s.stop.feed(piece)
            if s.stop.stopped:
                finish = "stop"
            elif 0 <= p.n_predict <= s.n_decoded or len(s.cached) + 1 >= s.n_ctx:
                finish = "length"
            if not finish:
                s.next_token = tok
                task.post(TokenEvent(tok, ready, probs, self._timings(s) if p.timings_per_token else None))
                return
        if not s.stop.stopped:
            ready += s.stop.feed(s.decoder.decode(b"", final=True))
        tail = ready + s.stop.flush()  # a partial stop string held back is text after all
        if probs is not None or tail:
            task.post(TokenEvent(tok, tail, probs, self._timings(s) if p.timings_per_token else None))
        self._finish(s, finish)

    def _finish(self, s: Slot, finish: str) -> None:
        """Send the task's DoneEvent (counts, timings) and free the slot."""
        task = s.task
        assert task is not None and s.stop is not None
        self.stats.n_requests += 1
        self.stats.n_tokens_max = max(self.stats.n_tokens_max, len(s.cached) + 1)
        timings = self._timings(s)
        task.post(DoneEvent("", s.stop.text, finish, s.stop.word, len(task.tokens), s.n_cached, s.n_decoded,
                            timings, s.generated, s.id))
        self._release(s)


    @staticmethod
    def _timings(s: Slot) -> dict[str, float]:
        """llama-server's timings of the slot's task so far (result_timings)."""
        assert s.task is not None
        t_prompt = (s.t_prompt_end - s.t_start) * 1e3
        t_gen = (time.perf_counter() - s.t_prompt_end) * 1e3
        n_pp = len(s.task.tokens) - s.n_cached
        return {"cache_n": s.n_cached, "prompt_n": n_pp, "prompt_ms": t_prompt,
                "prompt_per_token_ms": t_prompt / max(n_pp, 1),
                "prompt_per_second": n_pp / (t_prompt / 1e3) if t_prompt > 0 else 0.0,
                "predicted_n": s.n_decoded, "predicted_ms": t_gen,
                "predicted_per_token_ms": t_gen / max(s.n_decoded, 1),
                "predicted_per_second": s.n_decoded / (t_gen / 1e3) if t_gen > 0 else 0.0}


def token_probs(vocab: Any, logits: np.ndarray, token: int, n_probs: int) -> dict[str, Any]:
    """The chosen token's log-probability and the n_probs most likely ones, from the softmax of the raw
    logits (llama-server's default, post_sampling_probs off), in OpenAI's logprobs entry layout."""
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    n = min(n_probs, x.size)
    top = np.argpartition(-x, n - 1)[:n]
    top = top[np.argsort(-x[top], kind="stable")]

    def entry(t: int) -> dict[str, Any]:
        piece = vocab.token_to_piece(int(t), special=True)
        return {"id": int(t), "token": piece.decode("utf-8", errors="replace"), "logprob": float(x[t] - lse),
                "bytes": list(piece)}

    out = entry(token)
    out["top_logprobs"] = [entry(int(t)) for t in top]
    return out


def sample_keeping_candidates(sampler: Sampler, logits: np.ndarray) -> tuple[int, list[tuple[int, float]]]:
    """Sampler.sample, also returning what llama.cpp's common_sampler_get_candidates holds afterwards: the
    candidates the chain kept with their probabilities, most likely first (post_sampling_probs). A greedy
    chain (temperature <= 0) keeps the chosen token alone, at probability 1."""
    if sampler._greedy_only:  # the chain's own shortcut: the first maximum of the logits
        tok = sampler.sample(logits)
        return tok, [(tok, 1.0)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        c = Candidates(logits)
        tok = sampler.sample_candidates(c)
        g = sampler.grammar
        if g is not None and not g.allows(tok):  # as Sampler.sample: filter every candidate and draw again
            c = Candidates(g.apply(logits))
            tok = sampler.sample_candidates(c)
    p = c.p if c.p is not None else np.zeros(c.ids.size, dtype=np.float32)
    order = np.argsort(-p, kind="stable")
    return tok, [(int(c.ids[i]), float(p[i])) for i in order]


def post_sampling_probs(vocab: Any, candidates: list[tuple[int, float]], token: int, n_probs: int) -> dict[str, Any]:
    """llama-server's entry with post_sampling_probs: ``prob`` and ``top_probs`` (at most n_probs of the kept
    candidates) instead of the raw logits' ``logprob`` and ``top_logprobs``."""

    def entry(t: int, prob: float) -> dict[str, Any]:
        piece = vocab.token_to_piece(int(t), special=True)
        return {"id": int(t), "token": piece.decode("utf-8", errors="replace"), "prob": prob, "bytes": list(piece)}

    out = entry(token, next((q for t, q in candidates if t == token), 0.0))
    out["top_probs"] = [entry(t, q) for t, q in candidates[:n_probs]]
    return out
