"""`serve -np N`: requests run at once in slots, one batched decode per step (mtp_cli.serve.slots).
Each answer is what the request gets alone, with the same drafts kept, whatever runs beside it; a
follow-up goes to the slot that holds its conversation; a client that leaves frees its slot only.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from mtp_cli.config import GenConfig, LoadConfig  # noqa: E402
from mtp_cli.serve.engine import Engine  # noqa: E402
from tests.factory import tiny_model_set  # noqa: E402
from tests.test_serve import Served, _send, _wait_for  # noqa: E402

N_CTX = 1024  # (split among the slots: 256 each for 4)
PROMPTS = ["hello world", "the cat sat on the mat", "a b c d", "one two three", "to be or not", "x y"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_set(tmp_path_factory.mktemp("slots"), "glm4moe", "structured", "q8_0", head_noise=1.5)


def _engine(tiny, n_parallel: int) -> Engine:
    base = GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=N_CTX * n_parallel // 4, n_threads=1)
    return Engine.load(tiny["full"], base, load=LoadConfig(spec_type="mtp", n_parallel=n_parallel))


def _ask(s: Served, prompt: str, n: int = 24, stream: bool = False) -> tuple[str, dict]:
    c = s.client()
    msgs = [{"role": "user", "content": prompt}]
    if not stream:
        r = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=n)
        return r.choices[0].message.content, r.model_extra["mtp"]
    chunks = list(c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=n, stream=True))
    text = "".join((ch.choices[0].delta.content or "") if ch.choices else "" for ch in chunks)
    return text, chunks[-1].model_extra["mtp"]


def _mtp(m: dict) -> tuple:
    return m["drafted_by_pos"], m["accepted_by_pos"]


@pytest.fixture(scope="module")
def alone(tiny):
    """Each prompt's answer and drafts' fate, one request at a time on one slot."""
    engine = _engine(tiny, 1)
    s = Served(engine.start())
    try:
        return {p: (lambda t, m: (t, _mtp(m)))(*_ask(s, p)) for p in PROMPTS}
    finally:
        s.close()
        engine.close()


@pytest.mark.parametrize("n_parallel", [2, 4])
def test_concurrent_requests_each_get_their_answer_alone(tiny, alone, n_parallel):
    """Six clients at once, streaming or not, on 2 or 4 slots (so some wait for a free one): each
    answer and its drafted / accepted counts by position are the request's alone, for every slot."""
    engine = _engine(tiny, n_parallel)
    s = Served(engine.start())
    got: dict[str, tuple] = {}
    seen_busy: set[int] = set()

    def client(i: int, p: str) -> None:
        text, m = _ask(s, p, stream=i % 2 == 0)
        got[p] = (text, _mtp(m))

    try:
        threads = [threading.Thread(target=client, args=(i, p)) for i, p in enumerate(PROMPTS)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            seen_busy |= {sl["id"] for sl in engine.slots if sl["is_processing"]}
            time.sleep(0.002)
        assert got == alone
        assert seen_busy == set(range(n_parallel))  # (every slot served: slot ids > 0 too)
        status, health = s.raw("GET", "/health")
        assert status == 200 and len(health["slots"]) == n_parallel
    finally:
        s.close()
        engine.close()


def test_a_follow_up_goes_to_the_slot_holding_its_conversation(tiny):
    """Two conversations on two slots; each follow-up turn decodes only its new tokens (the slot
    whose memory shares the longest prefix with it takes it)."""
    engine = _engine(tiny, 2)
    s = Served(engine.start())
    c = s.client()
    try:
        convs = []
        for p in ("hello world", "the cat sat on the mat"):
            msgs = [{"role": "user", "content": p}]
            r = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=8)
            held = r.usage.prompt_tokens + r.usage.completion_tokens - 1  # (the last token was never decoded)
            convs.append((msgs + [{"role": "assistant", "content": r.choices[0].message.content}], held))
        for msgs, held in convs:
            more = msgs + [{"role": "user", "content": "and then?"}]
            r = c.chat.completions.create(model="m", messages=more, temperature=0, max_tokens=8)
            assert r.usage.prompt_tokens_details.cached_tokens == held
    finally:
        s.close()
        engine.close()


def test_a_system_prompt_another_slot_read_is_copied_not_read_again(tiny, monkeypatch):
    """A request arriving while another runs takes the free slot, and copies in the system prompt the
    running one's slot already read (cached_tokens); its answer is what it gets alone."""
    import mtp_cli.slots

    real = mtp_cli.slots.lx.decode

    def slow(*a, **k):  # (the first request is still running when the second arrives)
        time.sleep(0.01)
        return real(*a, **k)

    system = {"role": "system", "content": "You answer in the voice of a ship's cook, briefly and kindly."}
    q = {"role": "user", "content": "the cat sat on the mat"}
    engine = _engine(tiny, 1)
    s = Served(engine.start())
    try:
        r = s.client().chat.completions.create(model="m", messages=[system, q], temperature=0, max_tokens=24)
        want = r.choices[0].message.content
    finally:
        s.close()
        engine.close()
    monkeypatch.setattr(mtp_cli.slots.lx, "decode", slow)
    engine = _engine(tiny, 2)
    s = Served(engine.start())
    try:
        first = {"messages": [system, {"role": "user", "content": "go"}], "max_tokens": 120, "ignore_eos": True}
        t = threading.Thread(target=lambda: _send(s.port, {**first, "stream": True}).getresponse().read())
        t.start()
        _wait_for(lambda: bool(engine._active), "the first request did not start")
        r = s.client().chat.completions.create(model="m", messages=[system, q], temperature=0, max_tokens=24)
        assert r.model_extra["mtp"]["slot"] == 1
        assert r.usage.prompt_tokens_details.cached_tokens >= 16
        assert r.choices[0].message.content == want
        t.join(timeout=60)
    finally:
        s.close()
        engine.close()


def test_a_client_that_leaves_frees_its_slot_and_the_others_go_on(tiny, alone, monkeypatch):
    import mtp_cli.slots

    real = mtp_cli.slots.lx.decode

    def slow(*a, **k):  # (a step the client can leave during)
        time.sleep(0.01)
        return real(*a, **k)

    monkeypatch.setattr(mtp_cli.slots.lx, "decode", slow)
    engine = _engine(tiny, 2)
    s = Served(engine.start())
    try:
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 180, "ignore_eos": True, "stream": True}
        leaving = _send(s.port, body)
        _wait_for(lambda: bool(engine._active), "the first request did not start")
        out: list = []
        t = threading.Thread(target=lambda: out.append(_ask(s, PROMPTS[0])))
        t.start()
        leaving.sock.shutdown(socket.SHUT_RDWR)
        leaving.close()
        t.join(timeout=60)
        assert out and (out[0][0], _mtp(out[0][1])) == alone[PROMPTS[0]]
        _wait_for(lambda: not engine._active, "the abandoned slot was not freed")
        stopped = [r for r in engine.recent if r.stop_reason == "interrupted"]
        assert stopped and stopped[0].n_tokens < 180
    finally:
        s.close()
        engine.close()


@pytest.mark.parametrize("n_parallel", [1, 2])
def test_every_decode_runs_on_the_thread_that_loaded_the_model(tiny, monkeypatch, n_parallel):
    """(llama.cpp built with OpenMP gives each calling thread a thread team of its own; two teams on 2
    cores made libgomp stop spinning at the graph's barriers, and serve decoded 6x slower than generate.)"""
    import mtp_cli.llama_ext as lx
    from mtp_cli.runtime import Runtime

    threads = {"load": set(), "decode": set()}
    real_load, real_decode = Runtime.load.__func__, lx.decode

    def load(cls, *a, **k):
        threads["load"].add(threading.current_thread())
        return real_load(cls, *a, **k)

    def decode(*a, **k):
        threads["decode"].add(threading.current_thread())
        return real_decode(*a, **k)

    monkeypatch.setattr(Runtime, "load", classmethod(load))
    monkeypatch.setattr(lx, "decode", decode)
    engine = _engine(tiny, n_parallel)
    s = Served(engine.start())
    try:
        _ask(s, PROMPTS[0], stream=True)
        _ask(s, PROMPTS[1])
    finally:
        s.close()
        engine.close()
    assert len(threads["load"]) == 1 and threads["decode"] == threads["load"]
    assert threads["load"] != {threading.main_thread()}


def test_a_request_that_fixes_its_draft_length_keeps_it_beside_others(tiny, alone):
    """Under the server's auto, a request giving llama-server's `speculative.n_max` drafts that N
    while another request runs beside it (it is not put under drafting by load): each answer and its
    drafts' fate are the request's alone, at the same N."""
    base = GenConfig(spec_type="mtp", draft_mode="auto", n_ctx=N_CTX // 2, n_threads=1)
    engine = Engine.load(tiny["full"], base, load=LoadConfig(spec_type="mtp", n_parallel=2))
    s = Served(engine.start())
    got: dict[str, tuple] = {}

    def client(p: str) -> None:
        msgs = [{"role": "user", "content": p}]
        r = s.client().chat.completions.create(
            model="m", messages=msgs, temperature=0, max_tokens=24, extra_body={"speculative.n_max": 3}
        )
        got[p] = (r.choices[0].message.content, _mtp(r.model_extra["mtp"]))

    try:
        threads = [threading.Thread(target=client, args=(p,)) for p in PROMPTS[:2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        s.close()
        engine.close()
    assert got == {p: alone[p] for p in PROMPTS[:2]}


def test_a_request_with_draft_length_0_drafts_nothing_on_the_servers_contexts(tiny):
    """llama-server's `speculative.n_max` 0 turns a request's drafting off: under the server's auto,
    beside another request, it drafts nothing, runs on the same contexts (the key holds the draft
    length: a rebuild while the other generates would be refused) and gives plain decoding's text."""
    # (a small n_batch: the context key then holds the draft length, max(n_batch, n_seq (N + 1)))
    base = GenConfig(spec_type="mtp", draft_mode="auto", n_ctx=N_CTX // 2, n_threads=1, n_batch=8)
    engine = Engine.load(tiny["full"], base, load=LoadConfig(spec_type="mtp", n_parallel=2))
    plain = Engine.load(tiny["full"], GenConfig(spec_type="none", n_ctx=N_CTX // 2, n_threads=1))
    s, p = Served(engine.start()), Served(plain.start())
    ctx = engine.rt._ctx
    got: dict[object, tuple] = {}

    def client(n_max: object) -> None:
        msgs = [{"role": "user", "content": PROMPTS[1]}]
        extra = {"speculative.n_max": n_max} if n_max is not None else {}
        r = s.client().chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=24, extra_body=extra)
        got[n_max] = (r.choices[0].message.content, r.model_extra["mtp"])

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in (0, None)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        want = p.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPTS[1]}], temperature=0, max_tokens=24
        )
        same = engine.rt._ctx is ctx
    finally:
        s.close(), p.close()
        engine.close(), plain.close()
    text, mtp = got[0]
    assert mtp["draft_n_max"] == 0 and mtp["drafted"] == 0 and mtp["mode"] == "fixed"
    assert got[None][1]["mode"] == "adaptive" and text == want.choices[0].message.content
    assert same  # (never rebuilt)
