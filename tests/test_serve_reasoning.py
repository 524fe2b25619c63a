"""A thinking model's reasoning split from its answer (llama-server's --reasoning-format): whole and
streamed in any pieces alike, a block the prompt opened, tags arriving in pieces, the formats, and the
chat responses' `reasoning_content` (whole and as stream deltas)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from mtp_cli.serve.reasoning import ThinkSplit, opens_thinking, split

ANSWER = "<think>\nFirst, 2 + 2.\nThat is 4.\n</think>\n\nThe answer is 4."


def streamed(text: str, cuts: list[int], fmt: str = "auto", opened: bool = False) -> tuple[str, str]:
    s, r, c = ThinkSplit(fmt, opened), "", ""
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        dr, dc = s.feed(text[a:b])
        r, c = r + dr, c + dc
    dr, dc = s.close()
    return r + dr, c + dc


def test_whole_and_streamed_in_any_pieces_give_the_same_split():
    want = ("First, 2 + 2.\nThat is 4.", "The answer is 4.")
    assert split(ANSWER, "auto") == split(ANSWER, "deepseek") == want
    for i in range(len(ANSWER) + 1):
        for j in range(i, len(ANSWER) + 1, 3):
            assert streamed(ANSWER, [i, j]) == want, (i, j)
    assert streamed(ANSWER, list(range(1, len(ANSWER)))) == want  # (a character at a time)


def test_a_block_the_prompt_opened_an_unclosed_one_and_text_without_one():
    assert split("Plan it.\n</think>\nDone.", "auto", opened=True) == ("Plan it.", "Done.")
    assert split("Still thinking when the tokens ran out", "auto", opened=True) == (
        "Still thinking when the tokens ran out",
        "",
    )
    for text in ("Hello <think>not a block</think>", "<thinking is fun", "  indented answer", "<th", ""):
        assert split(text, "auto") == ("", text) and streamed(text, [2, 3]) == ("", text)


def test_the_formats():
    assert split(ANSWER, "none") == ("", ANSWER) and streamed(ANSWER, [5, 30], "none") == ("", ANSWER)
    assert split(ANSWER, "deepseek-legacy") == ("First, 2 + 2.\nThat is 4.", ANSWER)
    assert streamed(ANSWER, [5, 30], "deepseek-legacy") == ("First, 2 + 2.\nThat is 4.", ANSWER)


def test_a_prompt_ending_in_an_open_block_is_told_apart_from_a_closed_one():
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # (thinking turned off)
    assert not opens_thinking("<|im_start|>assistant\n") and not opens_thinking(None)


class _Run:
    """What openai_out reads of a Run: its jobs' request, the engine, and the events in turn."""

    def __init__(self, events, fmt=None):
        req = SimpleNamespace(mtp_pieces=False, timings_per_token=False, reasoning_format=fmt)
        self.jobs = [SimpleNamespace(request=req)]
        self.engine = SimpleNamespace(alias="m", reasoning_format="auto")
        self.events = list(events)

    async def next(self):
        return 0, self.events.pop(0)

    def close(self):
        pass


def test_chat_responses_carry_reasoning_content_whole_and_streamed():
    from mtp_cli.serve import openai_out
    from mtp_cli.serve.events import Delta, Done, Started
    from mtp_cli.stats import GenStats

    done = Done(ANSWER, "stop", GenStats(), {}, {})
    body = openai_out._whole({}, "chat.completion", Started(3, 0), [done], "auto")
    msg = body["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("First, 2 + 2.\nThat is 4.", "The answer is 4.")
    plain = openai_out._whole({}, "text_completion", Started(3, 0), [done], "none")
    assert plain["choices"][0]["text"] == ANSWER

    async def chunks(fmt):
        pieces = [ANSWER[:3], ANSWER[3:12], ANSWER[12:40], ANSWER[40:]]
        run = _Run([*(Delta(p) for p in pieces), done])
        out = [c async for c in openai_out._sse(run, {}, "chat.completion", Started(3, 0), False, fmt)]
        docs = [json.loads(c[6:]) for c in out if c.startswith("data: {")]
        deltas = [d["choices"][0]["delta"] for d in docs if d["choices"]]
        return "".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas)

    assert asyncio.run(chunks("auto")) == ("First, 2 + 2.\nThat is 4.", "The answer is 4.")
    assert asyncio.run(chunks("none")) == ("", ANSWER)


@pytest.mark.parametrize("fmt", ["none", "auto", "deepseek", "deepseek-legacy"])
def test_a_request_names_its_format_and_a_bad_one_is_refused(fmt):
    import pydantic

    from mtp_cli.serve.requests import ChatRequest

    msgs = [{"role": "user", "content": "x"}]
    assert ChatRequest.model_validate({"messages": msgs, "reasoning_format": fmt}).reasoning_format == fmt
    with pytest.raises(pydantic.ValidationError, match="reasoning_format"):
        ChatRequest.model_validate({"messages": msgs, "reasoning_format": "think"})


def test_a_served_model_whose_template_opens_thinking_answers_in_reasoning_content(tiny_models):
    """Through serve: a template ending in `<think>\\n` (as DeepSeek-R1's does) makes the whole
    answer reasoning (the tiny model never closes the block); a request's reasoning_format none
    gives it back as content, streamed alike."""
    pytest.importorskip("fastapi")
    from mtp_cli.chat import CHATML
    from mtp_cli.config import GenConfig, LoadConfig
    from mtp_cli.serve.engine import Engine
    from tests.test_serve import N_CTX, Served

    opening = CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'")
    assert opening != CHATML
    tiny = tiny_models("glm4moe", "structured", "q8_0", head_noise=1.5)
    load = LoadConfig(spec_type="mtp", chat_template=opening)
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", n_ctx=N_CTX, n_threads=1, temp=0.0), load=load)
    s = Served(engine.start())
    try:
        body = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 12, "temperature": 0}
        _, thought = s.raw("POST", "/v1/chat/completions", json.dumps(body))
        _, plain = s.raw("POST", "/v1/chat/completions", json.dumps({**body, "reasoning_format": "none"}))
        msg, raw = thought["choices"][0]["message"], plain["choices"][0]["message"]
        assert "reasoning_content" not in raw and raw["content"].strip()
        assert msg["reasoning_content"] == raw["content"].strip() and msg["content"] == ""
        c = s.client()
        stream = c.chat.completions.create(model="m", stream=True, **body)
        got = [ch.choices[0].delta for ch in stream if ch.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in got) == msg["reasoning_content"]
        assert not "".join(d.content or "" for d in got)
        anthropic = pytest.importorskip("anthropic")
        a = anthropic.Anthropic(base_url=f"http://127.0.0.1:{s.port}", api_key="none", max_retries=0)
        ask = {"model": "m", "max_tokens": 12, "messages": body["messages"]}
        m = a.messages.create(**ask)
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == msg["reasoning_content"] and m.content[1].text == ""
        with a.messages.stream(**ask) as st:
            final = st.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].thinking == msg["reasoning_content"]
        resp = c.responses.create(model="m", input="the cat", max_output_tokens=12, temperature=0)
        assert [o.type for o in resp.output] == ["reasoning", "message"]
        assert resp.output[0].content[0].text == msg["reasoning_content"] and resp.output_text == ""
        with c.responses.stream(model="m", input="the cat", max_output_tokens=12, temperature=0) as st:
            events = list(st)  # (cut by max_output_tokens: response.incomplete, which get_final_response refuses)
        kinds, streamed = [e.type for e in events], events[-1].response
        assert (
            kinds[-1] == "response.incomplete"
            and "response.reasoning_text.delta" in kinds
            and "response.output_text.delta" not in kinds
        )
        assert [o.type for o in streamed.output] == ["reasoning", "message"]
        assert streamed.output[0].content[0].text == msg["reasoning_content"]
        follow = c.responses.create(
            model="m", input="and?", previous_response_id=resp.id, max_output_tokens=4, temperature=0
        )
        assert follow.status in ("completed", "incomplete")
    finally:
        s.close()
        engine.close()


def test_a_repeated_opener_is_not_reasoning():
    """Found by review: the prompt opened the block and the model wrote `<think>` again."""
    assert split("<think>\nabc</think>x", "auto", opened=True) == ("abc", "x")
    assert streamed("<think>\nabc</think>x", [1, 3, 9], opened=True) == ("abc", "x")


def test_tool_calls_are_read_after_the_thinking_never_inside_it():
    """Found by review: a hermes call mentioned in the reasoning cut it there; a llama3-style answer
    (a JSON object) was held from the first `<` of `<think>`."""
    from mtp_cli.serve.jobs import Begun
    from mtp_cli.serve.tools import FORMATS, ToolPlan

    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    text = "<think>\nI will emit a <tool_call> for get_weather.\n</think>\n\n" + call
    for opened, said in ((False, text), (True, text[len("<think>") :])):
        b = Begun(None, None, ToolPlan([tool], FORMATS["hermes"], None, True), None, None, opened)  # type: ignore[arg-type]
        content, calls = b.parse(said)
        assert [c.name for c in calls] == ["get_weather"] and json.loads(calls[0].arguments) == {"city": "Oslo"}
        assert split(content, "auto", opened) == ("I will emit a <tool_call> for get_weather.", "")
        assert b.held(said[: -len(call)]) == -1 and b.held(said) == said.index(call)
        assert b.held(said[: said.index("</think>")]) == -1  # (inside the block: nothing is a call)
    llama3 = Begun(None, None, ToolPlan([tool], FORMATS["llama3"], None, True), None, None, False)  # type: ignore[arg-type]
    assert llama3.held("<think>\nhm") == -1 and llama3.held("<think>\nhm</think>\n{") == len("<think>\nhm</think>")


class _Engine(SimpleNamespace):
    pass


def _legacy_run(pieces):
    from mtp_cli.serve.events import Delta, Done
    from mtp_cli.stats import GenStats

    run = _Run([*(Delta(p) for p in pieces), Done("".join(pieces), "stop", GenStats(), {}, {})])
    run.engine.reasoning_format = "deepseek-legacy"
    return run


def test_deepseek_legacy_gives_messages_and_responses_their_blocks():
    """Found by review: with deepseek-legacy the streams alternated reasoning and text blocks (the raw
    text is content there); in Messages and Responses the reasoning has a block of its own, so they
    split as deepseek does, and a Responses reasoning item is done before the message is added."""
    from mtp_cli.serve import anthropic, responses
    from mtp_cli.serve.events import Started

    pieces = ["<think>", "\nFirst, 2", " + 2.\n", "</think>", "\n\nThe answer", " is 4."]

    async def collect(gen):
        return [json.loads(e.split("data: ", 1)[1]) for e in [x async for x in gen]]

    msgs = asyncio.run(collect(anthropic._events(_legacy_run(pieces), "msg_x", "m", Started(3, 0))))
    starts = [e["content_block"]["type"] for e in msgs if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    text = "".join(e["delta"].get("text", "") for e in msgs if e["type"] == "content_block_delta")
    thought = "".join(e["delta"].get("thinking", "") for e in msgs if e["type"] == "content_block_delta")
    assert (thought, text) == ("First, 2 + 2.", "The answer is 4.")

    resp = asyncio.run(collect(responses._events(_legacy_run(pieces), {"id": "r"}, Started(3, 0), None, [])))
    order = [(e["type"], e.get("output_index")) for e in resp if "output_item" in e["type"]]
    assert order == [
        ("response.output_item.added", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.output_item.done", 1),
    ]
    final = resp[-1]["response"]["output"]
    assert [o["type"] for o in final] == ["reasoning", "message"]
    assert final[1]["content"][0]["text"] == "The answer is 4."


def test_verbose_gives_the_prompt_as_decoded_and_progress_starts_at_zero(tiny_models):
    """llama-server's per-request `verbose` (`__verbose`: the prompt with its special tokens spelled,
    beside the answer) and return_progress's first timings at 0 ms (llama.cpp's suite checks both)."""
    import http.client

    pytest.importorskip("fastapi")
    from mtp_cli.chat import CHATML
    from mtp_cli.config import GenConfig, LoadConfig
    from mtp_cli.serve.engine import Engine
    from tests.test_serve import N_CTX, Served

    tiny = tiny_models("glm4moe", "structured", "q8_0", head_noise=1.5)
    load = LoadConfig(spec_type="mtp", chat_template=CHATML)
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", n_ctx=N_CTX, n_threads=1, temp=0.0), load=load)
    s = Served(engine.start())
    try:
        body = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "the cat"}]}
        for verbose in (True, False):
            status, r = s.raw("POST", "/v1/chat/completions", json.dumps({**body, "max_tokens": 2, "verbose": verbose}))
            assert status == 200 and ("__verbose" in r) == verbose
        _, r = s.raw("POST", "/v1/chat/completions", json.dumps({**body, "max_tokens": 2, "verbose": True}))
        v = r["__verbose"]
        assert "<|im_start|>system\nBook<|im_end|>" in v["prompt"] and v["prompt"].endswith("<|im_start|>assistant\n")
        assert v["content"] == r["choices"][0]["message"]["content"] and v["tokens_predicted"] == 2
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        ask = {"prompt": "the cat sat " * 20, "n_predict": 2, "stream": True, "return_progress": True}
        c.request("POST", "/completion", json.dumps({**ask, "timings_per_token": True}))
        got = c.getresponse()
        assert got.status == 200
        lines = [x for x in got.read().decode().split("\n\n") if x.startswith("data: {")]
        progress = [json.loads(x[6:]) for x in lines if "prompt_progress" in x]
        assert progress and progress[0]["timings"]["prompt_ms"] == 0.0
        c.close()
    finally:
        s.close()
        engine.close()
