"""The other APIs clients speak (issue 42): OpenAI's Responses API through the openai client and the
openai-agents SDK, Anthropic's Messages API through the anthropic client, `n` > 1, models.retrieve,
extra keys in content parts. Greedy text equals the chat completion's (itself `generate`'s)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Literal, Optional

import pydantic
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.serve.engine import Engine  # noqa: E402
from tests.test_serve import Served  # noqa: E402
from tests.test_serve_clients import COUNT_TOOL, HERMES_TEMPLATE, _wide  # noqa: E402

RESP_TOOL = {"type": "function", **COUNT_TOOL["function"]}
GREEDY = {"temperature": 0}  # (the anthropic client of 2.x has no sampling arguments: older ones sent them)
ANTH_TOOL = {"name": "count", "description": "Count things", "input_schema": COUNT_TOOL["function"]["parameters"]}


@pytest.fixture(scope="module")
def hermes(tmp_path_factory) -> Iterator[Served]:
    yield from _wide(tmp_path_factory.mktemp("apis"), chat_template=HERMES_TEMPLATE)


def _chat(s: Served, messages, **kw):
    return s.client().chat.completions.create(model="m", messages=messages, temperature=0, **kw)


def test_responses_create_and_its_stream_give_the_chat_completions_text(hermes):
    c = hermes.client()
    want = _chat(
        hermes, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}], max_tokens=8
    )
    r = c.responses.create(model="m", instructions="be brief", input="the cat", max_output_tokens=8, temperature=0)
    assert r.output_text == want.choices[0].message.content and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 8
    assert r.usage.input_tokens == want.usage.prompt_tokens and r.model_extra["mtp"]["verify_passes"] > 0
    events = list(
        c.responses.create(
            model="m", instructions="be brief", input="the cat", max_output_tokens=8, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"type": "message", "role": "user", "content": "the cat"},
    ]
    assert c.responses.create(model="m", input=items, max_output_tokens=8, temperature=0).output_text == r.output_text


def test_responses_function_calls_previous_response_id_and_the_store(hermes):
    c = hermes.client()
    r = c.responses.create(
        model="m",
        input="how many cats?",
        tools=[RESP_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
        temperature=0,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and calls[0].name == "count"
    args = json.loads(calls[0].arguments)
    assert isinstance(args["n"], int) and args["unit"] in ("c", "f")
    streamed = list(
        c.responses.create(
            model="m",
            input="how many cats?",
            tools=[RESP_TOOL],
            tool_choice={"type": "function", "name": "count"},
            max_output_tokens=300,
            temperature=0,
            stream=True,
        )
    )
    got = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(got) == 1 and json.loads(got[0].arguments) == args
    assert [e.item.type for e in streamed if e.type == "response.output_item.done"] == ["function_call"]
    follow = c.responses.create(
        model="m",
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "3"}],
        max_output_tokens=6,
        temperature=0,
    )
    assert (
        follow.previous_response_id == r.id
        and follow.output_text
        and follow.usage.input_tokens_details.cached_tokens > 0
    )
    assert c.responses.retrieve(r.id).id == r.id
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError, match="`previous_response_id`"):
        c.responses.create(model="m", previous_response_id=r.id, input="x")
    for bad, says in (
        (
            {"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "`input.0.content.0`: input_image",
        ),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "`tools.0`: web_search"),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"enum": []}}}},
            "`text.format.schema`: enum",
        ),
        ({"input": "x", "max_output_tokens": 0}, "`max_output_tokens`"),
    ):
        with pytest.raises(openai.BadRequestError, match=bad and says.replace(".", r"\.")):
            c.responses.create(model="m", **bad)
    shaped = c.responses.create(
        model="m",
        input="the cat",
        text={
            "format": {
                "type": "json_schema",
                "name": "a",
                "schema": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
                    "required": ["n"],
                    "additionalProperties": False,
                },
            }
        },
        max_output_tokens=40,
        temperature=0,
    )
    assert json.loads(shaped.output_text)["n"] in (1, 2, 3)


@pytest.fixture(scope="module")
def ending(tiny_models) -> Iterator[Served]:
    """The hermes server's model, ending its answer to a tool's result with EOS (after token 294,
    its second): an agent's final answer completes rather than running to max_tokens."""
    tiny = tiny_models("glm4moe", "structured", "q8_0", head_noise=1.5, chat_template=HERMES_TEMPLATE, eos_after=294)
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=2048, n_threads=1))
    s = Served(engine.start())
    yield s
    s.close()
    engine.close()


def test_openai_agents_default_model_runs_an_agent_with_a_function_tool(ending):
    hermes = ending
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    called: list[int] = []

    @agents.function_tool
    def count(n: int, unit: Literal["c", "f"]) -> str:  # (an enum: the tiny model never ends a free string)
        """Count things."""
        called.append(n)
        return str(n)

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{hermes.port}/v1", api_key="none", max_retries=0)
    model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
    settings = agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=300)
    agent = agents.Agent(name="counter", instructions="Count.", model=model, model_settings=settings, tools=[count])
    result = agents.Runner.run_sync(agent, "how many cats?", max_turns=4)
    assert called and isinstance(result.final_output, str)


def test_anthropic_messages_create_stream_tools_and_count_tokens(hermes):
    anthropic = pytest.importorskip("anthropic")
    a = anthropic.Anthropic(base_url=f"http://127.0.0.1:{hermes.port}", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "the cat", "cache_control": {"type": "ephemeral"}}]}]
    want = _chat(
        hermes, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}], max_tokens=8
    )
    m = a.messages.create(model="m", system="be brief", messages=msgs, max_tokens=8, extra_body=GREEDY)
    assert m.content[0].text == want.choices[0].message.content and m.stop_reason == "max_tokens"
    assert (
        m.usage.output_tokens == 8
        and m.usage.input_tokens + m.usage.cache_read_input_tokens == want.usage.prompt_tokens
    )
    assert a.messages.count_tokens(model="m", system="be brief", messages=msgs).input_tokens == want.usage.prompt_tokens
    with a.messages.stream(model="m", system="be brief", messages=msgs, max_tokens=8, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text and final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    stop = m.content[0].text[2:4]
    cut = a.messages.create(
        model="m", system="be brief", messages=msgs, max_tokens=8, extra_body=GREEDY, stop_sequences=[stop]
    )
    assert (
        cut.stop_reason == "stop_sequence"
        and cut.stop_sequence == stop
        and cut.content[0].text == m.content[0].text[:2]
    )
    ask = [{"role": "user", "content": "how many cats?"}]
    used = a.messages.create(
        model="m",
        messages=ask,
        tools=[ANTH_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        max_tokens=300,
        extra_body=GREEDY,
    )
    uses = [b for b in used.content if b.type == "tool_use"]
    assert used.stop_reason == "tool_use" and len(uses) == 1 and isinstance(uses[0].input["n"], int)
    with a.messages.stream(
        model="m",
        messages=ask,
        tools=[ANTH_TOOL],
        tool_choice={"type": "tool", "name": "count"},
        max_tokens=300,
        extra_body=GREEDY,
    ) as s:
        streamed = s.get_final_message()
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [uses[0].input]
    back = [*ask, {"role": "assistant", "content": [b.model_dump() for b in used.content]}]
    back.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "3"}]})
    after = a.messages.create(model="m", messages=back, tools=[ANTH_TOOL], max_tokens=6, extra_body=GREEDY)
    assert after.content and after.content[0].type == "text"
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["n"],
        "additionalProperties": False,
    }
    shaped = a.messages.create(
        model="m",
        messages=msgs,
        max_tokens=40,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )
    assert json.loads(shaped.content[0].text)["n"] in (1, 2, 3)
    with pytest.raises(anthropic.BadRequestError, match=r"`output_config\.format\.schema`: enum"):
        a.messages.create(
            model="m",
            messages=msgs,
            max_tokens=4,
            output_config={"format": {"type": "json_schema", "schema": {"enum": []}}},
        )
    with pytest.raises(anthropic.BadRequestError, match="image"):
        a.messages.create(
            model="m",
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
            max_tokens=4,
        )
    status, doc = hermes.raw("POST", "/v1/messages", json.dumps({"model": "m", "messages": msgs}))
    assert status == 400 and doc["type"] == "error" and "max_tokens" in doc["error"]["message"]


def test_n_choices_models_retrieve_and_extra_keys_in_parts(hermes):
    c = hermes.client()
    ask = [{"role": "user", "content": [{"type": "text", "text": "the cat", "cache_control": {"type": "ephemeral"}}]}]
    two = c.chat.completions.create(model="m", messages=ask, n=2, temperature=1.0, seed=5, max_tokens=6)
    one = c.chat.completions.create(model="m", messages=ask, temperature=1.0, seed=6, max_tokens=6)
    assert [ch.index for ch in two.choices] == [0, 1] and two.choices[1].message.content == one.choices[
        0
    ].message.content
    assert two.usage.completion_tokens == 12
    texts = ["", ""]
    for ch in c.chat.completions.create(
        model="m", messages=ask, n=2, temperature=1.0, seed=5, max_tokens=6, stream=True
    ):
        for choice in ch.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [ch.message.content for ch in two.choices]
    assert c.models.retrieve("gpt-4o").id == "gpt-4o"


@pytest.fixture(scope="module")
def embedding(tmp_path_factory) -> Iterator[Served]:
    from tests.factory import tiny_model_set

    tiny = tiny_model_set(tmp_path_factory.mktemp("embed"), "glm4moe", "structured", "q8_0", head_noise=1.5)
    engine = Engine.load(
        tiny["full"], GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=256, n_threads=1), embeddings="mean"
    )
    s = Served(engine.start())
    yield s
    s.close()
    engine.close()


def test_embeddings_through_the_openai_client_and_langchain(embedding, hermes):
    """Unit vectors, the same for the same text (as text or as its tokens, floats or base64), equal
    to the library's own; langchain's OpenAIEmbeddings; a server without --embeddings says so (501)."""
    import numpy as np

    from mtp_cli.embeddings import Embedder

    c = embedding.client()
    rt = embedding.engine.rt
    got = c.embeddings.create(model="m", input=["the cat", "the cat", "a dog runs far"])  # (the client asks for base64)
    vecs = [np.array(d.embedding) for d in got.data]
    assert [d.index for d in got.data] == [0, 1, 2] and all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs)
    assert float(vecs[0] @ vecs[1]) > 0.9999 and float(vecs[0] @ vecs[2]) < 0.99
    floats = c.embeddings.create(model="m", input=rt.tokenize("the cat"), encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vecs[0], atol=1e-6) and got.usage.prompt_tokens == 2 * len(
        rt.tokenize("the cat")
    ) + len(rt.tokenize("a dog runs far"))
    own = Embedder(rt.model, 256, "mean", 1)
    try:
        assert np.allclose(own.embed([rt.tokenize("a dog runs far")])[0], vecs[2], atol=1e-5)
    finally:
        own.close()
    langchain_openai = pytest.importorskip("langchain_openai")
    lc = langchain_openai.OpenAIEmbeddings(
        base_url=f"http://127.0.0.1:{embedding.port}/v1", api_key="none", model="m", check_embedding_ctx_length=False
    )
    assert np.allclose(lc.embed_query("the cat"), vecs[0], atol=1e-5) and len(lc.embed_documents(["a", "b"])) == 2
    for bad, says in (
        ({"input": ""}, "`input.0` is empty"),
        ({"input": "x", "dimensions": 3}, "`dimensions`"),
        ({"input": [[10**9]]}, "outside the vocabulary"),
    ):
        with pytest.raises(openai.BadRequestError, match=re.escape(says)):
            c.embeddings.create(model="m", **bad)
    assert (
        c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        ).usage.completion_tokens
        == 3
    )
    status, doc = hermes.raw("POST", "/v1/embeddings", json.dumps({"input": "x"}))
    assert status == 501 and "--embeddings" in doc["error"]["message"]
    openai_like = pytest.importorskip("llama_index.embeddings.openai_like", reason="llama-index is not installed")
    li = openai_like.OpenAILikeEmbedding(
        model_name="m", api_base=f"http://127.0.0.1:{embedding.port}/v1", api_key="none"
    )
    assert np.allclose(li.get_text_embedding("the cat"), vecs[0], atol=1e-5)


class Point(pydantic.BaseModel):
    x: int = pydantic.Field(ge=0, le=99)
    y: int


class Shape(pydantic.BaseModel):
    """Nested models: pydantic writes $defs and $refs (ints and enums: the tiny model never ends a free string)."""

    kind: Literal["a", "b"]
    origin: Point
    corners: list[Point] = pydantic.Field(max_length=2)
    next: Optional[Shape] = None


def test_nested_pydantic_models_as_forced_tools_and_structured_output(hermes):
    """pydantic-ai's output_type (a forced tool), openai's pydantic_function_tool and parse, and
    instructor's TOOLS mode where installed: nested, recursive models come back valid."""
    c = hermes.client()
    ask = [{"role": "user", "content": "a shape"}]
    tool = openai.pydantic_function_tool(Shape)
    r = c.chat.completions.create(
        model="m",
        messages=ask,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "Shape"}},
        max_tokens=400,
        temperature=0,
    )
    assert Shape.model_validate_json(r.choices[0].message.tool_calls[0].function.arguments)
    parsed = c.chat.completions.parse(model="m", messages=ask, response_format=Shape, max_tokens=400, temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, Shape)
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        "tiny", provider=OpenAIProvider(base_url=f"http://127.0.0.1:{hermes.port}/v1", api_key="none")
    )
    agent = pydantic_ai.Agent(model, output_type=Shape, model_settings={"max_tokens": 400, "temperature": 0})
    assert isinstance(agent.run_sync("a shape").output, Shape)
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{hermes.port}/v1", api_key="none", max_retries=0)
    settings = agents.ModelSettings(temperature=0, max_tokens=400)
    model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
    shaper = agents.Agent(name="shaper", model=model, model_settings=settings, output_type=Shape)
    assert isinstance(agents.Runner.run_sync(shaper, "a shape", max_turns=2).final_output, Shape)
    instructor = pytest.importorskip("instructor")
    client = instructor.from_openai(hermes.client(), mode=instructor.Mode.TOOLS)
    got = client.chat.completions.create(
        model="m", messages=ask, response_model=Shape, max_tokens=400, temperature=0, max_retries=0
    )
    assert isinstance(got, Shape)


def test_a_streamed_message_stays_in_the_response_when_only_a_call_follows():
    """Found by review: whitespace streamed before a tool call opened the message item, the parsed
    content ("") left it out of the Response, and the stream failed on the missing item."""
    from mtp_cli.serve.events import Done, Started
    from mtp_cli.serve.responses import _finished
    from mtp_cli.serve.tools import Call
    from mtp_cli.stats import GenStats

    done = Done("", "tool_calls", GenStats(), {}, {}, tool_calls=(Call("count", "{}", "call_x"),))
    doc = _finished({"id": "resp_x"}, Started(3, 0), done, "auto", "msg_streamed")
    assert [o["type"] for o in doc["output"]] == ["message", "function_call"] and doc["output"][0][
        "id"
    ] == "msg_streamed"
    assert [o["type"] for o in _finished({"id": "r"}, Started(3, 0), done, "auto")["output"]] == ["function_call"]
