"""``Llama``: llama-cpp-python's high-level class, on pyggml's model, context, samplers and grammars.

Code written against llama-cpp-python (0.3.x) runs by changing its import to ``from pyggml import Llama``:
the constructor takes the same keyword arguments, and ``__call__`` / ``create_completion``,
``create_chat_completion``, ``create_embedding`` / ``embed``, ``tokenize`` / ``detokenize``,
``generate`` / ``eval`` / ``sample``, ``save_state`` / ``load_state`` return the same dicts, lists,
generators and objects. The behaviour follows llama-cpp-python's, quirks included where they decide
what text comes out (the prompt of a completion is tokenized with special tokens parsed; the penalties
see only the completion's tokens; a token whose text ends in an incomplete UTF-8 character does not
count against ``max_tokens``; the prefix of the previous prompt still in the KV cache is reused), so
that greedy decoding gives the same text as llama-cpp-python on the same GGUF.

What pyggml does not do is refused, naming the argument, rather than dropped: LoRA adapters, draft
models, RoPE/YaRN overrides, KV overrides, tokenizer overrides, multi-GPU splits, llama-cpp-python's
own chat handlers (they drive llama.cpp through ctypes), and any keyword llama-cpp-python does not know.
Two things differ on purpose: a ``suffix`` uses the model's fill-in-the-middle tokens (llama-cpp-python
0.3.36 puts token 0 in their places), and ``logit_bias`` together with ``logits_processor`` applies both
(llama-cpp-python's ``list.extend`` returns None there and drops both).
"""

from __future__ import annotations

import fnmatch
import multiprocessing
import random
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..gguf.constants import Keys
from ..llm.batch import Batch
from ..llm.context import ContextParams, LlamaContext
from ..llm.hparams import PoolingType
from ..llm.model import Model
from ..llm.sampling import LLAMA_DEFAULT_SEED
from ..llm.tokenizer.vocab import Vocab
from ..types import GGMLType
from . import chat_format as _chat
from .grammar import LlamaGrammar
from .processors import (
    LogitsProcessorList,
    StoppingCriteriaList,
)
from .sampler import ChainParams, ChainSampler

#: llama.cpp's enum values llama-cpp-python exposes as module constants
LLAMA_POOLING_TYPE_UNSPECIFIED = -1
LLAMA_ATTENTION_TYPE_UNSPECIFIED, LLAMA_ATTENTION_TYPE_CAUSAL, LLAMA_ATTENTION_TYPE_NON_CAUSAL = -1, 0, 1
LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED = -1
LLAMA_SPLIT_MODE_LAYER = 1
LLAMA_MAX_PARALLEL_SEQUENCES = 64  # pyggml's LLAMA_MAX_SEQ (llama.cpp's is 256)

class LlamaState:
    """A saved context: the evaluated tokens, their logits (with ``logits_all``), the KV cache of the
    sequence (pyggml's llama_state_seq format: load it only into a pyggml ``Llama`` of the same model)."""

    def __init__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single], n_tokens: int,
                 llama_state: bytes, llama_state_size: int, seed: int) -> None:
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed


#: constructor arguments pyggml cannot honour, with the value that means "not used"
_UNSUPPORTED_ARGS: dict[str, tuple[Any, str]] = {
    "split_mode": (LLAMA_SPLIT_MODE_LAYER, "tensor splitting across GPUs"),
    "main_gpu": (0, "choosing a GPU (use n_gpu_layers)"),
    "tensor_split": (None, "tensor splitting across GPUs"),
    "vocab_only": (False, "a vocabulary-only model"),
    "use_mlock": (False, "locking the model in RAM"),
    "kv_overrides": (None, "overriding GGUF metadata"),
    "rope_scaling_type": (LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED, "overriding the RoPE scaling"),
    "rope_freq_base": (0.0, "overriding the RoPE base"),
    "rope_freq_scale": (0.0, "overriding the RoPE scale"),
    "yarn_ext_factor": (-1.0, "overriding YaRN parameters"),
    "yarn_attn_factor": (1.0, "overriding YaRN parameters"),
    "yarn_beta_fast": (32.0, "overriding YaRN parameters"),
    "yarn_beta_slow": (1.0, "overriding YaRN parameters"),
    "yarn_orig_ctx": (0, "overriding YaRN parameters"),
    "lora_base": (None, "LoRA adapters"),
    "lora_path": (None, "LoRA adapters"),
    "numa": (False, "NUMA placement"),
    "draft_model": (None, "speculative decoding with a draft model"),
    "tokenizer": (None, "a tokenizer override"),
}


class Llama:
    """A GGUF model and a context over it, with llama-cpp-python's ``Llama`` API."""

    def __init__(self, model_path: str, *, n_gpu_layers: int = 0, seed: int = LLAMA_DEFAULT_SEED, n_ctx: int = 512,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, pooling_type: int = LLAMA_POOLING_TYPE_UNSPECIFIED,
                 attention_type: int = LLAMA_ATTENTION_TYPE_UNSPECIFIED, logits_all: bool = False,
                 embedding: bool = False, offload_kqv: bool = True, flash_attn: bool = False,
                 op_offload: bool | None = None, swa_full: bool | None = None, no_perf: bool = False,
                 last_n_tokens_size: int = 64, lora_scale: float = 1.0, use_mmap: bool = True,
                 chat_format: str | None = None, chat_handler: Callable[..., Any] | None = None,
                 type_k: int | None = None, type_v: int | None = None, spm_infill: bool = False,
                 verbose: bool = True, **kwargs: Any) -> None:
        self._init_args = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        for name, value in kwargs.items():
            if name not in _UNSUPPORTED_ARGS:
                raise TypeError(f"Llama() got an unexpected keyword argument {name!r}")
            default, what = _UNSUPPORTED_ARGS[name]
            if value != default:
                raise NotImplementedError(f"Llama({name}={value!r}): {what} is not supported by pyggml "
                                          f"(leave {name} at {default!r})")
        if chat_handler is not None:
            if not callable(chat_handler):
                raise TypeError(f"chat_handler must be callable, not {type(chat_handler).__name__}")
            if type(chat_handler).__module__.startswith("llama_cpp"):
                raise NotImplementedError(f"chat_handler={type(chat_handler).__name__}: llama-cpp-python's own chat "
                                          "handlers (multimodal ones included) drive llama.cpp through ctypes and do "
                                          "not run on pyggml; use chat_format or a handler of your own")
        if attention_type not in (LLAMA_ATTENTION_TYPE_UNSPECIFIED, LLAMA_ATTENTION_TYPE_CAUSAL,
                                  LLAMA_ATTENTION_TYPE_NON_CAUSAL):
            raise ValueError(f"attention_type must be -1, 0 (causal) or 1 (non-causal), got {attention_type}")
        self.verbose = verbose
        self.model_path = str(model_path)
        if not Path(model_path).exists():
            raise ValueError(f"Model path does not exist: {model_path}")
        self._seed = seed or LLAMA_DEFAULT_SEED
        self._logits_all = logits_all
        self.last_n_tokens_size = last_n_tokens_size
        self.lora_scale = lora_scale
        self.spm_infill = spm_infill
        self.n_threads = n_threads or max(multiprocessing.cpu_count() // 2, 1)
        self.n_threads_batch = n_threads_batch or multiprocessing.cpu_count()
        self._model = Model(model_path, progress=verbose, n_gpu_layers=n_gpu_layers)
        self._vocab = Vocab.from_metadata(self._model.reader)
        hp = self._model.hparams
        if n_ctx == 0:
            n_ctx = hp.n_ctx_train
        self.n_batch = min(n_ctx, n_batch)
        self.n_ubatch = min(self.n_batch, n_ubatch)
        self._embedding = embedding
        if _ggml_type(type_v, "type_v").traits.blck_size > 1 and not flash_attn:
            raise ValueError(f"type_v={type_v} (a quantized V cache) needs flash_attn=True, as in llama.cpp")
        params = ContextParams(
            n_ctx=n_ctx, n_batch=self.n_batch, n_ubatch=self.n_ubatch, n_threads=self.n_threads_batch,
            flash_attn=bool(flash_attn), type_k=_ggml_type(type_k, "type_k"), type_v=_ggml_type(type_v, "type_v"),
            swa_full=True if swa_full is None else bool(swa_full), embeddings=embedding,  # None: llama.cpp's default
            n_seq_max=min(self.n_batch, LLAMA_MAX_PARALLEL_SEQUENCES) if embedding else 1, kv_unified=True,
            pooling_type=PoolingType(pooling_type),
            causal_attn=None if attention_type == LLAMA_ATTENTION_TYPE_UNSPECIFIED
            else attention_type == LLAMA_ATTENTION_TYPE_CAUSAL)
        self._ctx = LlamaContext(self._model, params)
        self._n_vocab = hp.n_vocab
        self._n_ctx = self._ctx.n_ctx
        self.n_tokens = 0
        self._requires_eval = True  # restored or truncated state must decode before sampling
        self.input_ids: npt.NDArray[np.intc] = np.zeros(self._n_ctx, dtype=np.intc)
        # llama-cpp-python keeps a row per position with logits_all; without, only the last row is read
        self.scores: npt.NDArray[np.single] = np.zeros((self._n_ctx if logits_all else 1, self._n_vocab),
                                                       dtype=np.single)
        self._last_logits = np.zeros(self._n_vocab, dtype=np.single)
        self._sampler: ChainSampler | None = None
        self.cache = None
        self.metadata = _metadata(self._model.reader)
        self.chat_handler = chat_handler
        self._chat_handlers: dict[str, Callable[..., Any]] = {}
        eos, bos = self.token_eos(), self.token_bos()
        eos_text = self._vocab.token_get_text(eos) if eos >= 0 else ""
        bos_text = self._vocab.token_get_text(bos) if bos >= 0 else ""
        key = Keys.TOKENIZER_CHAT_TEMPLATE  # named ones: KEY.NAME, offered as chat formats "chat_template.NAME"
        templates = {name[len("tokenizer."):]: tpl for name, tpl in self.metadata.items()
                     if name.startswith(key + ".")}
        if key in self.metadata:
            templates["chat_template.default"] = self.metadata[key]
        for name, tpl in templates.items():
            self._chat_handlers[name] = _chat.Jinja2ChatFormatter(
                tpl, eos_token=eos_text, bos_token=bos_text, stop_token_ids=[eos]).to_chat_handler()
        if chat_format is None and chat_handler is None:
            chat_format = "chat_template.default" if "chat_template.default" in templates else "llama-2"
        if chat_format is not None and chat_format not in {*self._chat_handlers, *_chat.CHAT_FORMATS,
                                                           *_chat.CHAT_HANDLERS}:
            known = ", ".join([*self._chat_handlers, *_chat.format_names()])
            raise ValueError(f"chat_format {chat_format!r} is not one pyggml knows (available here: {known})")
        self.chat_format = chat_format

    # ------------------------------------------------------------------ llama-cpp-python's views
    @property
    def _input_ids(self) -> npt.NDArray[np.intc]:
        return self.input_ids[: self.n_tokens]

    @property
    def _scores(self) -> npt.NDArray[np.single]:
        if self._logits_all:
            return self.scores[: self.n_tokens, :]
        return self._last_logits[None, :]

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self.input_ids[: self.n_tokens].tolist(), maxlen=self._n_ctx)

    @property
    def eval_logits(self) -> deque[list[float]]:
        return deque(self._scores.tolist(), maxlen=self._n_ctx if self._logits_all else 1)

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Tokenize UTF-8 bytes (``add_bos``: add BOS/EOS where the vocabulary asks for them; ``special``:
        control tokens written in the text become those tokens)."""
        if isinstance(text, str):
            raise TypeError("tokenize takes UTF-8 bytes, as llama-cpp-python's (use text.encode('utf-8'))")
        try:
            s = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"text to tokenize is not valid UTF-8: {e.reason} at byte {e.start}") from None
        return self._vocab.tokenize(s, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of ``tokens`` (``special``: control tokens as their text); a leading space after BOS
        is dropped, as llama-cpp-python does. ``prev_tokens`` is accepted and, as there, unused."""
        out = b"".join(self._vocab.token_to_piece(int(t), special=special) for t in tokens)
        if len(tokens) > 0 and int(tokens[0]) == self.token_bos() and out[:1] == b" ":
            return out[1:]
        return out

    # ------------------------------------------------------------------ state
    def set_cache(self, cache: Any) -> None:
        """llama-cpp-python's prompt caches (LlamaRAMCache, LlamaDiskCache) are not supported; None is."""
        if cache is not None:
            raise NotImplementedError("set_cache: llama-cpp-python's prompt caches are not supported by pyggml "
                                      "(the KV cache already reuses the prefix a new prompt shares with the last)")
        self.cache = None

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def reset(self) -> None:
        """Forget the evaluated tokens (the KV cache is trimmed when the next tokens are evaluated)."""
        self.n_tokens = 0
        self._requires_eval = True

    def eval(self, tokens: Sequence[int]) -> None:
        """Decode ``tokens`` after the ``n_tokens`` already evaluated, ``n_batch`` at a time."""
        tokens = [int(t) for t in tokens]
        if self.n_tokens + len(tokens) > self._n_ctx:
            raise ValueError(f"Requested tokens ({self.n_tokens + len(tokens)}) exceed context window of "
                             f"{self._n_ctx}")
        self._ctx.seq_rm(-1, self.n_tokens, -1)
        for i in range(0, len(tokens), self.n_batch):
            batch = tokens[i : i + self.n_batch]
            n_past, n = self.n_tokens, len(batch)
            logits = self._ctx.decode(batch, outputs=[True] * n if self._logits_all else None)
            self.input_ids[n_past : n_past + n] = batch
            if self._logits_all:
                self.scores[n_past : n_past + n, :] = logits
            if logits.shape[1]:
                self._last_logits = logits[-1].copy()
            self.n_tokens += n
            self._requires_eval = False

    # ------------------------------------------------------------------ sampling
    def _init_sampler(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                      temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                      presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                      mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
                      logits_processor: LogitsProcessorList | None = None,
                      grammar: LlamaGrammar | None = None) -> ChainSampler:
        if grammar is not None and not isinstance(grammar, LlamaGrammar):
            raise TypeError(f"grammar must be a pyggml LlamaGrammar (LlamaGrammar.from_string(...)), "
                            f"not {type(grammar).__module__}.{type(grammar).__name__}")
        params = ChainParams(top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp,
                             repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                             presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
                             mirostat_eta=mirostat_eta, mirostat_tau=mirostat_tau)
        return ChainSampler(params, self._seed, self._n_vocab, self.last_n_tokens_size, logits_processor,
                            grammar.sampler(self._vocab) if grammar is not None else None)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: LogitsProcessorList | None = None, grammar: LlamaGrammar | None = None,
               idx: int | None = None) -> int:
        """Sample a token from the logits of evaluated position ``idx`` (default: the last)."""
        if self.n_tokens <= 0:
            raise ValueError("sample: no tokens have been evaluated (call eval first)")
        sampler, temporary = self._sampler, self._sampler is None
        if sampler is None:
            sampler = self._init_sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                                         presence_penalty, tfs_z, mirostat_mode, mirostat_eta, mirostat_tau,
                                         penalize_nl, logits_processor, grammar)
        row = self._last_logits
        if idx is not None and idx != self.n_tokens - 1:
            if not self._logits_all or not 0 <= idx < self.n_tokens:
                raise ValueError(f"sample: no logits for position {idx} (logits_all keeps every position's)")
            row = self.scores[idx]
        token = sampler.sample(row, self._input_ids)
        if temporary:
            self._sampler = None
        return token

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None,
                 grammar: LlamaGrammar | None = None) -> Generator[int, Sequence[int] | None, None]:
        """Yield tokens sampled after ``tokens``, forever (the caller stops). With ``reset`` the part of
        the KV cache that ``tokens`` share with what was evaluated before is kept. ``send(tokens)``
        evaluates extra tokens after the yielded one."""
        self._sampler = self._init_sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                                           presence_penalty, tfs_z, mirostat_mode, mirostat_eta, mirostat_tau,
                                           penalize_nl, logits_processor, grammar)
        tokens = [int(t) for t in tokens]
        if reset and self.n_tokens > 0:
            prefix = Llama.longest_token_prefix(self._input_ids.tolist(), tokens)
            consumed = prefix == len(tokens)
            if self.n_tokens == len(tokens) and consumed and not self._requires_eval:
                reset, tokens = False, []  # the whole prompt is cached with live logits: sample at once
            else:
                # with nothing left to decode, step back one token to get its logits again
                keep = prefix - 1 if consumed else prefix
                # (a recurrent model's memory refuses to cut its states back: the prompt is evaluated anew)
                if keep > 0 and self._ctx.seq_rm(-1, keep, -1) is not False:
                    reset, tokens = False, tokens[keep:]
                    self.n_tokens = keep
                    self._requires_eval = True
        if reset:
            self.reset()
        sample_idx = self.n_tokens + len(tokens) - 1
        while True:
            self.eval(tokens)
            while sample_idx < self.n_tokens:
                token = self.sample(idx=sample_idx)
                sample_idx += 1
                if stopping_criteria is not None and stopping_criteria(self._input_ids[:sample_idx],
                                                                       self._scores[-1, :]):
                    return
                extra = yield token
                tokens = [token, *(extra or [])]
                if sample_idx < self.n_tokens and token != self._input_ids[sample_idx]:
                    if self._ctx.seq_rm(-1, sample_idx, -1) is False:
                        raise NotImplementedError("a recurrent model's state cannot be rolled back past evaluated "
                                                  "draft tokens (llama.cpp's n_rs_seq snapshots are not supported)")
                    self.n_tokens = sample_idx
                    self._requires_eval = True
                    break

    # ------------------------------------------------------------------ embeddings
    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        """OpenAI's embeddings response for one text or a list of texts."""
        texts = input if isinstance(input, list) else [input]
        embeds, total = self.embed(texts, return_count=True)
        return {"object": "list",
                "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
                "model": model if model is not None else self.model_path,
                "usage": {"prompt_tokens": total, "total_tokens": total}}

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """The embedding of a text (a list for a list of texts): one vector with pooling, one per token
        without (pooling none). ``normalize`` scales each to unit length; ``truncate`` cuts a text to
        ``n_batch`` tokens (else a longer one is a ValueError). Texts are decoded together, one
        sequence each, as many as a batch holds."""
        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        texts = [input] if isinstance(input, str) else list(input)
        pooled = self._ctx.pooling_type is not PoolingType.NONE
        n_seq_max = self._ctx.n_seq_max
        data: list[Any] = []
        total = 0
        pending: list[list[int]] = []

        def flush() -> None:
            if not pending:
                return
            self._ctx.clear()
            toks = [t for seq in pending for t in seq]
            seqs = [s for s, seq in enumerate(pending) for _ in seq]
            pos = [p for seq in pending for p in range(len(seq))]
            self._ctx.decode_batch(Batch(token=toks, pos=pos, seq_id=seqs, logits=[True] * len(toks)))
            row = 0
            for s, seq in enumerate(pending):
                if pooled:
                    data.append(_maybe_normalize(self._ctx.get_embeddings_seq(s), normalize))
                else:
                    data.append([_maybe_normalize(self._ctx.get_embeddings_ith(row + j), normalize)
                                 for j in range(len(seq))])
                row += len(seq)
            pending.clear()

        for text in texts:
            tokens = self.tokenize(text.encode("utf-8"))
            if truncate:
                tokens = tokens[: self.n_batch]
            if len(tokens) > self.n_batch:
                raise ValueError(f"Requested tokens ({len(tokens)}) exceed batch size of {self.n_batch}")
            total += len(tokens)
            if sum(map(len, pending)) + len(tokens) > self.n_batch or len(pending) >= n_seq_max:
                flush()
            pending.append(tokens)
        flush()
        self._ctx.clear()
        self.reset()
        out = data[0] if isinstance(input, str) else data
        return (out, total) if return_count else out

    # ------------------------------------------------------------------ completions
    def _prompt_tokens(self, prompt: str | list[int], suffix: str | None) -> tuple[list[int], list[int]]:
        """The tokens a completion starts from, and those its text starts with (BOS for an empty prompt)."""
        bos = self.token_bos()
        v = self._vocab
        text_prompt = isinstance(prompt, str)
        head = [bos] if (text_prompt or suffix is not None) and v.add_bos and bos >= 0 else []
        tail = [v.eos] if text_prompt and suffix is None and v.add_eos and v.eos >= 0 else []
        body = (self.tokenize(prompt.encode("utf-8"), add_bos=False, special=suffix is None) if prompt else []) \
            if text_prompt else [int(t) for t in prompt]
        if suffix is not None and self._has_fim():
            suf = self.tokenize(suffix.encode("utf-8"), add_bos=False, special=False) if suffix else []
            pre, sfx = [v.fim_pre, *body], [v.fim_suf, *suf]
            body = [*sfx, *pre] if self.spm_infill else [*pre, *sfx]
            body.append(v.fim_mid)
        completion_start = [] if len(prompt) > 0 else [bos]
        return head + body + tail, completion_start

    def _has_fim(self) -> bool:
        v = self._vocab
        return v.fim_pre >= 0 and v.fim_suf >= 0 and v.fim_mid >= 0

    def _create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                           temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                           typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                           stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                           presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                           stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                           mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                           model: str | None = None, stopping_criteria: StoppingCriteriaList | None = None,
                           logits_processor: LogitsProcessorList | None = None,
                           grammar: LlamaGrammar | None = None, logit_bias: dict[Any, float] | None = None,
                           _preserved_tokens: Collection[int] = ()) -> Iterator[dict[str, Any]]:
        if suffix is not None and not isinstance(suffix, str):
            raise TypeError(f"suffix must be a str, not {type(suffix).__name__}")
        if not isinstance(prompt, (str, list)):
            raise TypeError(f"prompt must be a str or a list of token ids, not {type(prompt).__name__}")
        completion_id = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        bos = self.token_bos()
        prompt_tokens, completion_tokens = self._prompt_tokens(prompt, suffix)
        stops = [s.encode("utf-8") for s in ([stop] if isinstance(stop, str) else list(stop or []))]
        model_name = model if model is not None else self.model_path
        if prompt_tokens[:2] == [bos] * 2:
            warnings.warn(f"Detected duplicate leading {self._vocab.token_get_text(bos)!r} in prompt, this will "
                          "likely reduce response quality, consider removing it...", RuntimeWarning, stacklevel=3)
        if logit_bias is not None:
            bias = {int(k): float(v) for k, v in logit_bias.items()}

            def add_bias(input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
                out = np.copy(scores)
                for tok, b in bias.items():
                    out[tok] = scores[tok] + b
                return out

            logits_processor = LogitsProcessorList([*(logits_processor or []), add_bias])
        if len(prompt_tokens) >= self._n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt_tokens)}) exceed context window of {self._n_ctx}")
        if max_tokens is None or max_tokens <= 0:
            max_tokens = self._n_ctx - len(prompt_tokens)
        max_tokens = min(max_tokens, self._n_ctx - len(prompt_tokens))
        if logprobs is not None and not self._logits_all:
            raise ValueError("logprobs is not supported for models created with logits_all=False")
        self.set_seed(seed if seed is not None else random.Random(self._seed).randint(0, 2**32))

        preserved = frozenset(_preserved_tokens)

        def detok(toks: Sequence[int]) -> bytes:
            if not preserved or preserved.isdisjoint(toks):
                return self.detokenize(toks)
            # tokens whose text a parser needs (a chat's tool-call markers) come out as text
            return b"".join(self.detokenize([t], special=t in preserved) for t in toks)

        def chunk(text: str, lp: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
            return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

        def top_dict(row: np.ndarray, k: int) -> dict[str, float]:
            order = np.lexsort((-np.arange(row.size), -row))[:k]  # by logprob, ties: the larger id first
            return {detok([int(i)]).decode("utf-8", errors="ignore"): float(row[i]) for i in order}

        text = b""
        finish_reason = "length"
        multibyte_fix = 0
        returned = 0
        for token in self.generate(prompt_tokens, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                                   temp=temperature, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                                   mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
                                   frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                   repeat_penalty=repeat_penalty, stopping_criteria=stopping_criteria,
                                   logits_processor=logits_processor, grammar=grammar):
            if self._vocab.is_eog(token):
                text = detok(completion_tokens)
                finish_reason = "stop"
                break
            completion_tokens.append(token)
            all_text = detok(completion_tokens)
            multibyte_fix = _pending_utf8(all_text, multibyte_fix)
            if multibyte_fix > 0:  # the text ends inside a character: wait for the rest of it
                multibyte_fix -= 1
                continue
            hit = [s for s in stops if s in all_text]
            if hit:
                text = all_text[: all_text.index(hit[0])]
                finish_reason = "stop"
                break
            if stream:
                remaining = completion_tokens[returned:]
                remaining_text = detok(remaining)
                # characters that may be the start of a stop string are held back
                held = 0
                for s in stops:
                    for i in range(min(len(s), len(remaining_text)), 0, -1):
                        if remaining_text.endswith(s[:i]):
                            held = max(held, i)
                            break
                end_pos = 0
                if logprobs is not None:
                    for tok in remaining:
                        if tok == bos:
                            continue
                        end_pos += len(detok([tok]))
                        if end_pos > len(remaining_text) - held:
                            break
                        tok_str = detok([tok]).decode("utf-8", errors="ignore")
                        offset = len(prompt) + len(detok(completion_tokens[:returned]).decode("utf-8", errors="ignore"))
                        row = Llama.logits_to_logprobs(self._scores[len(prompt_tokens) + returned - 1, :])
                        top = top_dict(row, logprobs)
                        top[tok_str] = float(row[tok])
                        lp = {"tokens": [tok_str], "text_offset": [offset], "token_logprobs": [float(row[tok])],
                              "top_logprobs": [top]}
                        returned += 1
                        yield chunk(detok([tok]).decode("utf-8", errors="ignore"), lp)
                else:
                    while remaining:
                        for i in range(1, len(remaining) + 1):
                            piece = detok(remaining[:i])
                            try:
                                piece_text = piece.decode("utf-8")
                                break
                            except UnicodeError:
                                pass
                        else:
                            break  # no prefix of the tokens is whole UTF-8 yet
                        end_pos += len(piece)
                        if end_pos > len(remaining_text) - held:
                            break
                        remaining = remaining[i:]
                        returned += i
                        yield chunk(piece_text, None)
            if len(completion_tokens) >= max_tokens:
                text = detok(completion_tokens)
                finish_reason = "length"
                break
        if stopping_criteria is not None and stopping_criteria(self._input_ids, self._scores[-1, :]):
            text = detok(completion_tokens)
            finish_reason = "stop"
        if stream:
            remaining = completion_tokens[returned:]
            remaining_text = detok(remaining)
            hits = [s for s in stops if s in remaining_text]
            end = min(remaining_text.index(s) for s in hits) if hits else len(remaining_text)
            end_pos = 0
            for tok in remaining:
                end_pos += len(detok([tok]))
                lp = None
                if logprobs is not None:
                    if tok == bos:
                        continue
                    tok_str = detok([tok]).decode("utf-8", errors="ignore")
                    offset = len(prompt) + len(detok(completion_tokens[:returned]))
                    row = Llama.logits_to_logprobs(self._scores[len(prompt_tokens) + returned - 1, :])
                    top = top_dict(row, logprobs)
                    top[tok_str] = float(row[tok])
                    lp = {"tokens": [tok_str], "text_offset": [offset], "token_logprobs": [float(row[tok])],
                          "top_logprobs": [top]}
                if end_pos >= end:
                    last = detok([tok])
                    if end_pos == end - 1:
                        break
                    returned += 1
                    yield chunk(last[: len(last) - (end_pos - end)].decode("utf-8", errors="ignore"), lp)
                    break
                returned += 1
                yield chunk(detok([tok]).decode("utf-8", errors="ignore"), lp)
            yield chunk("", None, finish_reason)
            return
        text_str = text.decode("utf-8", errors="ignore")
        if echo:
            text_str = (prompt if isinstance(prompt, str) else detok(prompt).decode("utf-8", errors="ignore")) \
                + text_str
        if suffix is not None and not self._has_fim():
            text_str += suffix
        lp_out = None
        if logprobs is not None:
            lp_out = self._completion_logprobs(prompt, prompt_tokens, completion_tokens, echo, logprobs, top_dict)
        yield {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
               "choices": [{"text": text_str, "index": 0, "logprobs": lp_out, "finish_reason": finish_reason}],
               "usage": {"prompt_tokens": len(prompt_tokens), "completion_tokens": len(completion_tokens),
                         "total_tokens": len(prompt_tokens) + len(completion_tokens)}}

    def _completion_logprobs(self, prompt: str | list[int], prompt_tokens: list[int], completion_tokens: list[int],
                             echo: bool, k: int, top_dict: Callable[[np.ndarray, int], dict[str, float]]
                             ) -> dict[str, Any]:
        """OpenAI's legacy logprobs of a finished completion (with ``echo``, of the prompt's tokens too)."""
        bos = self.token_bos()
        text_offset = 0 if echo else len(prompt)
        token_offset = 0 if echo else len(prompt_tokens[1:])
        if echo:
            skip = 1 if prompt_tokens and prompt_tokens[0] == bos else 0
            all_tokens = prompt_tokens[skip:] + completion_tokens
        else:
            all_tokens = list(completion_tokens)
        strs = [self.detokenize([t]).decode("utf-8", errors="ignore") for t in all_tokens]
        all_lp = Llama.logits_to_logprobs(self._scores)[token_offset:]
        offsets: list[int] = []
        tokens: list[str] = []
        token_lps: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for i, (tok, tok_str, row) in enumerate(zip(all_tokens, strs, all_lp, strict=False)):
            if tok == bos:
                continue
            offsets.append(text_offset + len(self.detokenize(all_tokens[:i]).decode("utf-8", errors="ignore")))
            tokens.append(tok_str)
            token_lps.append(float(row[tok]))
            top = top_dict(row, k)
            top[tok_str] = float(row[tok])
            tops.append(top)
        if echo and all_tokens and token_lps:  # OpenAI's: nothing for the first token
            token_lps[0] = None
            tops[0] = None
        return {"tokens": tokens, "text_offset": offsets, "token_logprobs": token_lps, "top_logprobs": tops}

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria: StoppingCriteriaList | None = None,
                          logits_processor: LogitsProcessorList | None = None, grammar: LlamaGrammar | None = None,
                          logit_bias: dict[Any, float] | None = None, *,
                          _preserved_tokens: Collection[int] = ()) -> Any:
        """Complete ``prompt`` (text or token ids): OpenAI's text_completion dict, or with ``stream`` a
        generator of its chunks (the last one empty, with the finish reason). ``_preserved_tokens``
        (pyggml's, for the chat handler): control tokens written into the text as their text."""
        gen = self._create_completion(
            prompt, suffix=suffix, max_tokens=max_tokens, temperature=temperature, top_p=top_p, min_p=min_p,
            typical_p=typical_p, logprobs=logprobs, echo=echo, stop=stop, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, repeat_penalty=repeat_penalty, top_k=top_k, stream=stream, seed=seed,
            tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            model=model, stopping_criteria=stopping_criteria, logits_processor=logits_processor, grammar=grammar,
            logit_bias=logit_bias, _preserved_tokens=_preserved_tokens)
        if stream:
            return gen
        return next(gen)

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict[str, Any]], functions: list[dict[str, Any]] | None = None,
                               function_call: Any = None, tools: list[dict[str, Any]] | None = None,
                               tool_choice: Any = None, temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               response_format: dict[str, Any] | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: LogitsProcessorList | None = None,
                               grammar: LlamaGrammar | None = None, logit_bias: dict[Any, float] | None = None,
                               logprobs: bool | None = None, top_logprobs: int | None = None) -> Any:
        """Answer a conversation: OpenAI's chat.completion dict, or with ``stream`` a generator of
        chat.completion.chunk dicts. ``response_format={"type": "json_object"}`` (optionally with a
        ``schema``) constrains the reply to JSON; ``tool_choice`` naming one of ``tools`` makes the reply a
        call of it (its arguments constrained to the tool's parameter schema)."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages must be a list of dicts with a 'role' (and 'content')")
        handler = self.chat_handler or self._chat_handlers.get(self.chat_format or "") \
            or _chat.CHAT_HANDLERS.get(self.chat_format or "")
        if handler is None:
            handler = _chat.chat_formatter_to_chat_completion_handler(_chat.CHAT_FORMATS[self.chat_format or ""])
        return handler(llama=self, messages=messages, functions=functions, function_call=function_call, tools=tools,
                       tool_choice=tool_choice, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                       typical_p=typical_p, logprobs=logprobs, top_logprobs=top_logprobs, stream=stream, stop=stop,
                       seed=seed, response_format=response_format, max_tokens=max_tokens,
                       presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                       repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                       mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model,
                       logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """create_chat_completion with the openai package's types (ChatCompletion, or a generator of
        ChatCompletionChunk)."""
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        out = self.create_chat_completion(*args, **kwargs)
        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**c) for c in out)
        return ChatCompletion(**out)

    # ------------------------------------------------------------------ state
    def save_state(self) -> LlamaState:
        """The evaluated tokens, their logits and the KV cache, to restore with :meth:`load_state`."""
        data = self._ctx.state_seq_get_data(0)
        return LlamaState(input_ids=self.input_ids.copy(), scores=self._scores.copy(), n_tokens=self.n_tokens,
                          llama_state=data, llama_state_size=len(data), seed=self._seed)

    def load_state(self, state: LlamaState) -> None:
        """Restore a :meth:`save_state` (the next sampling decodes the last token again for its logits)."""
        if self._logits_all:
            self.scores[: state.n_tokens, :] = state.scores
            self.scores[state.n_tokens :, :] = 0.0
        self.input_ids = state.input_ids.copy()
        self.n_tokens = state.n_tokens
        self._requires_eval = True
        self._seed = state.seed
        n = self._ctx.state_seq_set_data(state.llama_state[: state.llama_state_size], 0)
        if n != state.llama_state_size:
            raise RuntimeError("Failed to set llama state data")

    # ------------------------------------------------------------------ facts
    def tokenizer(self) -> LlamaTokenizer:
        """The model's tokenizer, as llama-cpp-python's LlamaTokenizer (encode/decode text)."""
        return LlamaTokenizer(self)

    def __getstate__(self) -> dict[str, Any]:
        """Pickling keeps the constructor's arguments (the model is loaded again on unpickling), as
        llama-cpp-python's; the evaluated tokens and KV cache are not kept (save_state does that)."""
        return dict(self._init_args)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def n_ctx(self) -> int:
        """The context window (llama.cpp rounds the n_ctx asked for up to whole pages of 256 cells)."""
        return self._n_ctx

    def n_embd(self) -> int:
        return self._model.hparams.n_embd

    def n_vocab(self) -> int:
        return self._n_vocab

    def token_eos(self) -> int:
        return self._vocab.eos

    def token_bos(self) -> int:
        return self._vocab.bos

    def token_nl(self) -> int:
        return self._vocab.nl

    def pooling_type(self) -> int:
        return int(self._ctx.pooling_type)

    def close(self) -> None:
        """Kept for llama-cpp-python's API: pyggml's memory is freed with the object."""

    @staticmethod
    def logits_to_logprobs(logits: npt.NDArray[np.single] | list[float], axis: int = -1) -> npt.NDArray[np.single]:
        """log_softmax in float32 along ``axis`` (a row of -inf stays -inf, not NaN)."""
        mx = np.amax(logits, axis=axis, keepdims=True)
        if mx.ndim > 0:
            mx[~np.isfinite(mx)] = 0
        elif not np.isfinite(mx):
            mx = 0
        shifted = np.subtract(logits, mx, dtype=np.single)
        with np.errstate(divide="ignore"):
            return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, additional_files: list[str] | None = None,
                        local_dir: str | None = None, local_dir_use_symlinks: Any = "auto",
                        cache_dir: str | None = None, **kwargs: Any) -> Llama:
        """A packaged model by name (``qwen2.5-coder-0.5b-instruct-q4_k_m``, ``qwen``, ``gemma``...), or by
        the Hugging Face repository and file llama-cpp-python would download it from (matched against the
        packaged files, no network). Anything else is a ModelNotFoundError naming what is available.
        ``local_dir``, ``local_dir_use_symlinks`` and ``cache_dir`` only say where a download would go: as
        nothing is downloaded they change nothing; the other keywords go to the constructor."""
        from ..llm import packaged

        if additional_files:
            raise NotImplementedError("from_pretrained(additional_files=...): split models are not packaged")
        entry = packaged.lookup(repo_id) or packaged.lookup(repo_id.rsplit("/", 1)[-1].removesuffix("-GGUF")
                                                           .removesuffix("-gguf"))
        if entry is None:
            names = ", ".join(packaged.REGISTRY)
            raise packaged.ModelNotFoundError(f"from_pretrained({repo_id!r}, {filename!r}): no packaged model of that "
                                              f"name (pyggml downloads nothing; available: {names}; or give "
                                              "Llama(model_path=...) a GGUF file)")
        if filename and entry.file_name and not fnmatch.fnmatch(entry.file_name.lower(), filename.lower()):
            raise packaged.ModelNotFoundError(f"from_pretrained: packaged model {entry.name} is the file "
                                              f"{entry.file_name}, which does not match {filename!r}")
        return cls(model_path=str(packaged.model_path(entry.name)), **kwargs)


class LlamaTokenizer:
    """llama-cpp-python's LlamaTokenizer over a Llama: ``encode`` text to tokens, ``decode`` back."""

    def __init__(self, llama: Llama) -> None:
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: list[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")


def _pending_utf8(text: bytes, pending: int) -> int:
    """llama-cpp-python's check of the text's last 3 bytes for the lead byte of an unfinished UTF-8
    character: how many more tokens to wait (the count it keeps, updated)."""
    tail = text[-3:]
    for i, byte in enumerate(tail):
        from_end = 3 - i
        for need, lead in ((2, 0xC0), (3, 0xE0), (4, 0xF0)):
            if need > from_end and byte & lead == lead:
                pending = need - from_end
    return pending


def _maybe_normalize(v: np.ndarray, normalize: bool) -> list[float]:
    """A vector as a list of floats, scaled to unit euclidean length when asked (a zero vector stays)."""
    out = np.asarray(v, dtype=np.float32)
    if normalize:
        norm = float(np.linalg.norm(out))
        if norm != 0.0:
            return [float(x) / norm for x in out.tolist()]
    return out.tolist()


def _ggml_type(value: int | None, name: str) -> GGMLType:
    """type_k / type_v as llama-cpp-python takes them: a GGML_TYPE_* number (None: F16)."""
    if value is None:
        return GGMLType.F16
    try:
        return GGMLType(int(value))
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a GGML type number") from None


def _metadata(reader: Any) -> dict[str, str]:
    """The GGUF's scalar metadata as strings, as llama-cpp-python's ``Llama.metadata`` (arrays left out)."""
    out = {}
    for key, value in reader.metadata.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            out[key] = str(value)
    return out
