"""`serve` takes what real clients send (issue: tools, structured output, fields, prefix cache): every
standard field at a harmless value, any model name, a history built from `message.model_dump()`,
max_tokens past the context clamped, lone surrogates and empty bodies refused in one line, a huge
prompt refused before it is tokenized, llama-server's `timings`, CORS, a stream ended cleanly when the
server stops, and the longest-common-prefix cache (regenerate, an edited turn, a shared system
prompt, a continued assistant message)."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterator
from typing import Literal

import pydantic
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.serve.engine import Engine  # noqa: E402
from tests.factory import tiny_model_set  # noqa: E402
from tests.test_serve import N_CTX, Served, _slow  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    tiny = tiny_model_set(tmp_path_factory.mktemp("clients"), "glm4moe", "structured", "q8_0", head_noise=1.5)
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=N_CTX, n_threads=1))
    s = Served(engine.start())
    yield s
    s.close()
    engine.close()


def _ask(c, messages, **kw):
    return c.chat.completions.create(
        messages=messages, **{"model": "anything", "temperature": 0, "max_tokens": 8, **kw}
    )


def test_standard_fields_at_harmless_values_and_any_model_name_are_served(served):
    c = served.client()
    r = _ask(
        c,
        [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}, {"role": "user", "content": "hi"}],
        model="gpt-4o",
        store=False,
        metadata={"run": "1"},
        service_tier="auto",
        reasoning_effort="low",
        prompt_cache_key="k",
        user="u",
        safety_identifier="s",
        parallel_tool_calls=True,
        presence_penalty=0,
        frequency_penalty=0,
        n=1,
        stream_options=None,
        extra_body={"cache_prompt": True, "id_slot": -1, "typical_p": 1.0},
    )
    assert r.model == served.engine.alias and r.choices[0].message.refusal is None
    chunks = list(
        _ask(c, [{"role": "user", "content": "hi"}], stream=True, stream_options={"include_obfuscation": False})
    )
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_history_built_from_model_dump_goes_back_as_it_came(served):
    """The returned message, dumped with its null refusal/audio/function_call/tool_calls, is the next
    turn's history; and the cache keeps everything the first turn left."""
    c = served.client()
    msgs = [{"role": "user", "content": "the cat"}]
    a = _ask(c, msgs)
    msgs += [a.choices[0].message.model_dump(), {"role": "user", "content": "a dog"}]
    assert msgs[1]["refusal"] is None and "tool_calls" in msgs[1]
    b = _ask(c, msgs)
    assert b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens + a.usage.completion_tokens - 1


def test_max_tokens_past_the_context_stops_at_its_end_with_length(served):
    r = _ask(served.client(), [{"role": "user", "content": "hi"}], max_tokens=100_000, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == N_CTX


@pytest.mark.parametrize(
    "body, says",
    [
        ('{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "`messages.0.content` holds a lone surrogate"),
        ('{"prompt": "x", "stop": ["\\udfff"]}', "`stop.0` holds a lone surrogate"),
        ("", "the request body is empty"),
    ],
)
def test_lone_surrogates_and_an_empty_body_are_one_line(served, body, says):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    status, doc = served.raw("POST", path, body)
    assert status == 400 and says in doc["error"]["message"], doc
    assert served.raw("GET", "/health")[0] == 200


def test_a_huge_prompt_is_refused_before_it_is_tokenized(served, monkeypatch):
    seen: list[int] = []
    real = served.engine.rt.tokenize
    monkeypatch.setattr(served.engine.rt, "tokenize", lambda text, **k: seen.append(len(text)) or real(text, **k))
    t0 = time.monotonic()
    status, doc = served.raw("POST", "/v1/completions", json.dumps({"prompt": "hello world " * 400_000}))
    assert (
        status == 400 and doc["error"]["code"] == "context_length_exceeded" and "characters" in doc["error"]["message"]
    )
    assert seen == [] and time.monotonic() - t0 < 10


def test_timings_as_llama_server_reports_them(served):
    r = _ask(served.client(), [{"role": "user", "content": "the cat sat"}], max_tokens=12)
    t, mtp = r.model_extra["timings"], r.model_extra["mtp"]
    assert t["predicted_n"] == r.usage.completion_tokens == 12
    assert t["prompt_n"] + t["cache_n"] == r.usage.prompt_tokens
    assert (t["draft_n"], t["draft_n_accepted"]) == (mtp["drafted"], mtp["accepted"]) and t["draft_n"] > 0
    assert t["predicted_per_second"] > 0 and t["prompt_ms"] > 0


def test_cors_preflight_and_origin(served):
    c = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    headers = {
        "Origin": "http://example.org",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    c.request("OPTIONS", "/v1/chat/completions", headers=headers)
    r = c.getresponse()
    r.read()
    assert r.status == 200 and r.getheader("access-control-allow-origin") in ("*", "http://example.org")
    assert "authorization" in (r.getheader("access-control-allow-headers") or "").lower()
    c.request("GET", "/v1/models", headers={"Origin": "http://example.org"})
    r = c.getresponse()
    r.read()
    assert r.status == 200 and r.getheader("access-control-allow-origin") in ("*", "http://example.org")
    names = [k for k, _ in r.getheaders()]  # (as written: llama-server's clients may look them up in a dict)
    assert "Access-Control-Allow-Origin" in names and "Content-Type" in names, names
    c.close()


def test_a_preflight_from_an_origin_not_allowed_is_answered_without_allowing_it():
    """--cors-origins localhost: a localhost origin is reflected; another gets llama-server's answer,
    200 without Access-Control-Allow-Origin (Starlette's own is a 400)."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from mtp_cli.serve.middleware import Cors, HeaderCase

    app = Starlette(routes=[Route("/x", lambda r: PlainTextResponse("ok"), methods=["POST"])])
    app.add_middleware(Cors, cors_origins="localhost")
    app.add_middleware(HeaderCase)
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
    with TestClient(app) as c:
        ok = c.options("/x", headers={**pre, "Origin": "http://127.0.0.1:3000"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        assert b"Access-Control-Allow-Origin" in [k for k, _ in ok.headers.raw]
        for origin in ("http://evil.com", "http://localhost.evil.com"):
            no = c.options("/x", headers={**pre, "Origin": origin})
            assert no.status_code == 200 and "access-control-allow-origin" not in no.headers


def test_a_stopping_server_ends_the_running_stream_with_an_error_and_done(tmp_path):
    tiny = tiny_model_set(tmp_path, "glm4moe", "structured", "q8_0")
    engine = Engine.load(tiny["full"], GenConfig(spec_type="none", n_ctx=N_CTX, n_threads=1))
    s = Served(engine.start())
    try:
        with pytest.MonkeyPatch.context() as mp:
            _slow(engine, mp, per_token=0.05)
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
            body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 200, "ignore_eos": True}
            c.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}))
            r = c.getresponse()
            head = b"".join(r.readline() for _ in range(4)).decode()  # (two events: the stream is running)
            engine.cancel_all()  # (what SIGTERM and Ctrl-C do first)
            rest = head + r.read().decode()
            c.close()
        events = [e[len("data: ") :] for e in rest.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]
    finally:
        s.close()
        engine.close()


def test_the_cache_keeps_the_longest_common_prefix(served):
    """Regenerate, an edited last turn and a new question under the same system prompt reuse what the
    cache holds of them; the answers are those of a cold cache."""
    c = served.client()
    system = {"role": "system", "content": "You answer about animals. " * 6}
    first = [system, {"role": "user", "content": "the cat"}]
    a = _ask(c, first)
    again = _ask(c, first)
    assert again.usage.prompt_tokens_details.cached_tokens == a.usage.prompt_tokens - 1
    assert again.choices[0].message.content == a.choices[0].message.content
    other = [system, {"role": "user", "content": "a dog and a bird"}]
    b = _ask(c, other)
    shared = b.usage.prompt_tokens_details.cached_tokens
    assert 20 < shared < b.usage.prompt_tokens
    c.completions.create(model="x", prompt="unrelated words here", max_tokens=2, temperature=0)
    cold = _ask(c, other)
    assert cold.usage.prompt_tokens_details.cached_tokens < 4
    assert cold.choices[0].message.content == b.choices[0].message.content


def test_a_trailing_assistant_message_is_continued(served):
    c = served.client()
    start = _ask(c, [{"role": "user", "content": "the cat"}], max_tokens=6).choices[0].message.content
    assert start
    head, tail = start[: len(start) // 2], start[len(start) // 2 :]
    cont = _ask(c, [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": head}], max_tokens=6)
    assert (head + cont.choices[0].message.content).startswith(head + tail[:2])


def test_a_body_without_a_json_content_type_is_read_as_json(served):
    """curl -d sends application/x-www-form-urlencoded; llama-server reads the body as JSON anyway."""
    body = json.dumps({"prompt": "hello", "max_tokens": 2, "temperature": 0})
    for headers in ({}, {"Content-Type": "application/x-www-form-urlencoded"}):
        c = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        c.request("POST", "/v1/completions", body=body, headers=headers)
        r = c.getresponse()
        doc = json.loads(r.read())
        c.close()
        assert r.status == 200 and doc["usage"]["completion_tokens"] == 2, doc


class Answer(pydantic.BaseModel):
    ok: bool
    word: Literal["hello", "world"]
    n: int


def _plain(served, messages, **cfg) -> str:
    """The same chat through the runtime without drafting (the server drafts with MTP)."""
    from mtp_cli.session import Session

    rt = served.engine.rt  # (the worker is idle between these synchronous requests)
    served.engine.session._last = None  # (this run changes the memory under the server's session)
    gen = rt.generate(Session(rt).chat(messages).tokens, GenConfig(n_ctx=N_CTX, n_threads=1, temp=0.0, **cfg))
    return "".join(e.text for e in gen)


def test_structured_output_with_parse_a_pydantic_model_and_json_object(served):
    """client.chat.completions.parse (json_schema, strict) gives a valid object, the same text as plain
    decoding under the same grammar; json_object gives JSON; llama-server's own fields too."""
    c = served.client()
    msgs = [{"role": "user", "content": "the cat"}]
    r = c.chat.completions.parse(model="m", messages=msgs, response_format=Answer, temperature=0, max_tokens=60)
    got = r.choices[0].message
    assert isinstance(got.parsed, Answer) and r.choices[0].finish_reason == "stop"
    schema = Answer.model_json_schema()
    from mtp_cli import llama_ext as lx

    assert got.content == _plain(served, msgs, n_predict=60, grammar=lx.json_schema_grammar(schema))
    assert r.model_extra["mtp"]["drafted"] > 0
    j = _ask(c, msgs, response_format={"type": "json_object"}, max_tokens=60)
    assert j.choices[0].finish_reason == "stop" and isinstance(json.loads(j.choices[0].message.content), dict)
    g = _ask(c, msgs, max_tokens=10, extra_body={"grammar": 'root ::= ("hello" | " world")+'})
    assert set(re.findall(r"hello| world", g.choices[0].message.content)) <= {"hello", " world"}
    k = _ask(c, msgs, max_tokens=60, extra_body={"json_schema": schema})
    assert Answer.model_validate_json(k.choices[0].message.content)
    for bad, says in (
        ({"response_format": {"type": "json_schema"}}, "`response_format` takes"),
        ({"extra_body": {"grammar": "root ::= ("}}, "does not parse"),
        ({"response_format": {"type": "json_object"}, "extra_body": {"grammar": "root ::= x"}}, "give one of"),
    ):
        with pytest.raises(openai.BadRequestError, match=re.escape(says)):
            _ask(c, msgs, **bad)


def test_logprobs_chat_and_completions_streamed_or_not(served):
    c = served.client()
    msgs = [{"role": "user", "content": "the cat"}]
    r = _ask(c, msgs, logprobs=True, top_logprobs=2, max_tokens=6)
    content = r.choices[0].logprobs.content
    assert len(content) == 6 and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in content)
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == r.choices[0].message.content
    assert all(e.top_logprobs[0].token == e.token for e in content)  # (greedy: the most likely)
    streamed = [ch for ch in _ask(c, msgs, logprobs=True, top_logprobs=2, max_tokens=6, stream=True) if ch.choices]
    entries = [e for ch in streamed if ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in entries] == [e.token for e in content]
    assert all(abs(a.logprob - b.logprob) < 1e-2 for a, b in zip(entries, content))
    plain = _ask(c, msgs, max_tokens=6)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == r.choices[0].message.content
    t = c.completions.create(model="m", prompt="the cat", max_tokens=5, temperature=0, logprobs=3)
    lp = t.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5 and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == t.choices[0].text and all(len(d) <= 3 for d in lp.top_logprobs)


def test_logit_bias_and_penalties(served):
    c = served.client()
    msgs = [{"role": "user", "content": "the cat"}]
    from mtp_cli.session import Session

    rt = served.engine.rt
    served.engine.session._last = None
    first = next(iter(rt.generate(Session(rt).chat(msgs).tokens, GenConfig(n_ctx=N_CTX, temp=0.0, n_predict=1))))
    base = _ask(c, msgs, max_tokens=8, logprobs=True)
    banned = _ask(c, msgs, max_tokens=8, logprobs=True, logit_bias={str(first.token): -100})
    assert bytes(base.choices[0].logprobs.content[0].bytes) == rt.piece(first.token)
    assert bytes(banned.choices[0].logprobs.content[0].bytes) != rt.piece(first.token)
    pen = _ask(c, msgs, max_tokens=20, frequency_penalty=1.5, presence_penalty=1.0, extra_body={"ignore_eos": True})
    want = _plain(served, msgs, n_predict=20, frequency_penalty=1.5, presence_penalty=1.0, ignore_eos=True)
    assert pen.choices[0].message.content == want
    with pytest.raises(openai.BadRequestError, match="token ids"):
        _ask(c, msgs, logit_bias={"abc": 1})


COUNT_TOOL = {
    "type": "function",
    "function": {
        "name": "count",
        "description": "Count things",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
            "required": ["n", "unit"],
        },
    },
}
HERMES_TEMPLATE = (
    "{% if tools %}<|system|>\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    'Call a tool with <tool_call>{"name": ..., "arguments": ...}</tool_call>\n{% endif %}'
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|assistant|>\n{{ m.content or '' }}"
    "{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}\n'
    "{% elif m.role == 'tool' %}<|user|>\n<tool_response>\n{{ m.content }}\n</tool_response>\n"
    "{% else %}<|{{ m.role }}|>\n{{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _wide(directory, **kw) -> Iterator[Served]:
    """A server whose context holds tool descriptions (the tiny vocabulary spells most text byte by byte)."""
    tiny = tiny_model_set(directory, "glm4moe", "structured", "q8_0", head_noise=1.5, **kw)
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=2048, n_threads=1))
    s = Served(engine.start())
    yield s
    s.close()
    engine.close()


@pytest.fixture(scope="module")
def generic(tmp_path_factory) -> Iterator[Served]:
    yield from _wide(tmp_path_factory.mktemp("generic"))


@pytest.fixture(scope="module")
def hermes(tmp_path_factory) -> Iterator[Served]:
    yield from _wide(tmp_path_factory.mktemp("hermes"), chat_template=HERMES_TEMPLATE)


def _streamed_calls(stream) -> tuple[str, list[dict], str]:
    """(content, calls joined from the deltas by index, finish_reason)."""
    content, calls, finish = "", {}, ""
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": ""})
            c["id"] = tc.id or c["id"]
            c["name"] += (tc.function and tc.function.name) or ""
            c["arguments"] += (tc.function and tc.function.arguments) or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("fixture", ["generic", "hermes"])
def test_a_tool_round_trip_streamed_or_not(request, fixture):
    """A forced call (required, or the function named), its result sent back as a `tool` message, the
    final answer: with a template that knows no tools (the generic format) and a Hermes-style one."""
    s = request.getfixturevalue(fixture)
    assert s.engine.tool_format.name == "hermes" and s.engine.knows_tools == (fixture == "hermes")
    c = s.client()
    msgs = [{"role": "user", "content": "how many cats?"}]
    for choice in ("required", {"type": "function", "function": {"name": "count"}}):
        r = _ask(c, msgs, tools=[COUNT_TOOL], tool_choice=choice, max_tokens=300, parallel_tool_calls=False)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and m.content is None and len(m.tool_calls) == 1
        call = m.tool_calls[0]
        args = json.loads(call.function.arguments)
        assert call.function.name == "count" and isinstance(args["n"], int) and args["unit"] in ("c", "f")
        content, streamed, finish = _streamed_calls(
            _ask(
                c, msgs, tools=[COUNT_TOOL], tool_choice=choice, max_tokens=300, stream=True, parallel_tool_calls=False
            )
        )
        assert finish == "tool_calls" and content == ""
        assert [(x["name"], json.loads(x["arguments"])) for x in streamed] == [("count", args)]
    follow = [*msgs, m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "3"}]
    final = _ask(c, follow, tools=[COUNT_TOOL], tool_choice="none", max_tokens=8)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason in ("stop", "length")


def test_langchain_bind_tools_and_with_structured_output(generic):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = langchain_openai.ChatOpenAI(
        base_url=f"http://127.0.0.1:{generic.port}/v1", api_key="none", model="tiny", temperature=0, max_tokens=300
    )

    def count(n: int, unit: Literal["c", "f"]) -> str:
        """Count things."""
        return str(n)

    bound = llm.bind_tools([count], tool_choice="count", parallel_tool_calls=False)
    ai = bound.invoke([HumanMessage("how many?")])
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "count" and isinstance(ai.tool_calls[0]["args"]["n"], int)
    after = llm.invoke([HumanMessage("how many?"), ai, ToolMessage(content="3", tool_call_id=ai.tool_calls[0]["id"])])
    assert isinstance(after.content, str)
    shaped = llm.with_structured_output(Answer, method="json_schema").invoke("the cat")
    assert isinstance(shaped, Answer)


def test_review_fixes_logprobs_under_a_grammar_offsets_and_server_penalties(served):
    """Found by review: under a grammar the alternatives' log-probabilities were the masked row's
    (-inf, which json.dumps writes as -Infinity: no client parses it); a stream's text_offset drifted
    when text was held back; a request without penalties reset the server's own to 0."""
    from mtp_cli.serve.requests import ChatRequest

    body = {
        "messages": [{"role": "user", "content": "x"}],
        "grammar": 'root ::= "a" "b"',
        "logprobs": True,
        "top_logprobs": 20,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    c = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    raw = c.getresponse().read().decode()
    c.close()

    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    docs = [json.loads(e[6:], parse_constant=refuse) for e in raw.split("\n\n") if e.startswith("data: {")]
    entries = [
        x for d in docs if d["choices"] and d["choices"][0]["logprobs"] for x in d["choices"][0]["logprobs"]["content"]
    ]
    assert [x["token"] for x in entries] == ["a", "b"] and all(len(x["top_logprobs"]) == 20 for x in entries)
    t = served.client().completions.create(
        model="m", prompt="the cat", max_tokens=12, temperature=0, logprobs=2, stream=True, stop=["zzzz"]
    )
    toks, offs = [], []
    for ch in t:
        if ch.choices and ch.choices[0].logprobs:
            toks += ch.choices[0].logprobs.tokens
            offs += ch.choices[0].logprobs.text_offset
    assert offs == [sum(len(x) for x in toks[:i]) for i in range(len(toks))] and len(toks) == 12
    assert "presence_penalty" not in ChatRequest(messages=[{"role": "user", "content": "x"}]).overrides()


def test_schemas_that_cannot_hold_are_400s_naming_the_keyword_and_json_object_takes_a_schema(served):
    """Issue 42: impossible constraints and keywords a grammar cannot enforce are 400s naming them;
    llama-server's `json_object` + `schema` is honoured; integer bounds hold in sampled output."""
    c = served.client()
    msgs = [{"role": "user", "content": "the cat"}]

    def fmt(schema):
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}},
        },
    }
    for kw, says in (
        (
            {"response_format": fmt({"type": "integer", "minimum": 10, "maximum": 5})},
            "`response_format.json_schema.schema`: minimum: minimum 10 and maximum 5",
        ),
        ({"response_format": fmt({"enum": []})}, "`response_format.json_schema.schema`: enum: is empty"),
        (
            {"response_format": fmt({"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}})},
            "`response_format.json_schema.schema.properties.t`: uniqueItems",
        ),
        (
            {
                "response_format": {
                    "type": "json_object",
                    "schema": {"allOf": [{"type": "string"}, {"type": "integer"}]},
                }
            },
            "`response_format.schema`: allOf: of integer and string",
        ),
        ({"tools": [tool], "tool_choice": "required"}, "`tools.0.function.parameters.properties.n` (f): minimum"),
        (
            {"extra_body": {"json_schema": {"type": "string", "minLength": 3, "maxLength": 1}}},
            "`json_schema`: minLength",
        ),
    ):
        with pytest.raises(openai.BadRequestError, match=re.escape(says)):
            _ask(c, msgs, **kw)
    shaped = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 7, "maximum": 12}},
        "required": ["n"],
        "additionalProperties": False,
    }
    for seed in range(4):
        r = _ask(
            c,
            msgs,
            response_format={"type": "json_object", "schema": shaped},
            max_tokens=40,
            temperature=1.5,
            seed=seed,
        )
        got = json.loads(r.choices[0].message.content)
        assert set(got) == {"n"} and 7 <= got["n"] <= 12, got
