"""llama-server's own surface on `serve` (issue 43): /tokenize, /detokenize, /apply-template, /props,
/slots, the native /completion (greedy text equal to /v1/completions'), /metrics parsed by
prometheus_client with counters matching the requests sent, per-token draft flags in the stream,
a per-request draft length, and the chat page in a real browser (Chromium, headless)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.serve.api import Surface  # noqa: E402
from mtp_cli.serve.engine import Engine  # noqa: E402
from tests.factory import tiny_model_set  # noqa: E402
from tests.test_serve import N_CTX, Served  # noqa: E402

SHOT = Path(os.environ.get("MTP_WEBUI_SHOT", "")) if os.environ.get("MTP_WEBUI_SHOT") else None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_set(tmp_path_factory.mktemp("native"), "glm4moe", "structured", "q8_0", head_noise=1.5)


@pytest.fixture(scope="module")
def native(tiny) -> Iterator[Served]:
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=N_CTX, n_threads=1))
    s = Served(engine.start(), surface=Surface(metrics=True))
    yield s
    s.close()
    engine.close()


def _stream(s: Served, path: str, body: dict) -> list[dict]:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    raw = c.getresponse().read().decode()
    c.close()
    lines = [line for block in raw.split("\n\n") for line in block.split("\n")]  # (Responses: event + data)
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_tokenize_detokenize_apply_template_props_and_slots(native):
    rt = native.engine.rt
    status, doc = native.raw("POST", "/tokenize", json.dumps({"content": "the cat sat"}))
    assert status == 200 and doc["tokens"] == rt.tokenize("the cat sat", add_special=False, parse_special=True)
    status, back = native.raw("POST", "/detokenize", json.dumps({"tokens": doc["tokens"]}))
    assert back["content"].strip() == "the cat sat"  # (as llama-server's suite reads it)
    _, pieces = native.raw("POST", "/tokenize", json.dumps({"content": "the cat", "with_pieces": True}))
    assert "".join(p["piece"] for p in pieces["tokens"]).strip() == "the cat" and all(
        "id" in p for p in pieces["tokens"]
    )
    assert native.raw("POST", "/detokenize", json.dumps({"tokens": [10**9]}))[0] == 400
    msgs = [{"role": "user", "content": "the cat"}]
    _, applied = native.raw("POST", "/apply-template", json.dumps({"messages": msgs}))
    chat = native.client().chat.completions.create(model="m", messages=msgs, max_tokens=1, temperature=0)
    assert len(rt.tokenize(applied["prompt"], add_special=True, parse_special=True)) == chat.usage.prompt_tokens
    _, props = native.raw("GET", "/props")
    assert props["total_slots"] == 1 and props["default_generation_settings"]["n_ctx"] == N_CTX
    assert props["model_path"].endswith(".gguf") and props["mtp"]["spec_type"] == "mtp" and props["endpoint_metrics"]
    status, slots = native.raw("GET", "/slots")
    assert status == 200 and [s["id"] for s in slots] == [0] and slots[0]["n_ctx"] == N_CTX
    assert native.raw("POST", "/props", "{}")[0] == 501


def want_ids(s: Served) -> list[int]:
    return s.engine.rt.tokenize("the cat", add_special=True)


def test_native_completion_equals_the_openai_one_streamed_or_not(native):
    want = native.client().completions.create(model="m", prompt="the cat", max_tokens=8, temperature=0)
    body = {"prompt": "the cat", "n_predict": 8, "temperature": 0, "return_tokens": True}
    status, doc = native.raw("POST", "/completion", json.dumps(body))
    assert status == 200 and doc["content"] == want.choices[0].text and len(doc["tokens"]) == 8
    assert doc["stop"] is True and doc["stop_type"] == "limit" and doc["timings"]["predicted_n"] == 8
    assert doc["tokens_evaluated"] == want.usage.prompt_tokens and doc["mtp"]["drafted"] > 0
    chunks = _stream(native, "/completions", {**body, "stream": True})  # (llama-server's: /completions is native)
    assert "".join(c["content"] for c in chunks) == doc["content"] and chunks[-1]["stop"] is True
    assert [t for c in chunks[:-1] for t in c["tokens"]] == doc["tokens"]
    text = doc["content"]
    at = next(i for i in range(1, len(text) - 1) if text[i : i + 2].isascii() and text[i : i + 2].isprintable())
    word = text[at : at + 2]
    _, cut = native.raw("POST", "/completion", json.dumps({**body, "stop": [word]}))
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word and cut["content"] == text[: text.find(word)]
    _, banned = native.raw("POST", "/completion", json.dumps({**body, "logit_bias": [[doc["tokens"][0], False]]}))
    assert banned["tokens"][0] != doc["tokens"][0]
    _, many = native.raw(
        "POST",
        "/completion",
        json.dumps({**body, "prompt": [want_ids(native), {"prompt_string": "the cat"}]}),
    )
    assert [m["content"] for m in many] == [doc["content"]] * 2 and [m["index"] for m in many] == [0, 1]
    _, few = native.raw(
        "POST",
        "/completion",
        json.dumps(
            {
                **body,
                "n_probs": 3,
                "response_fields": ["content", "generation_settings/n_predict", "completion_probabilities"],
            }
        ),
    )
    assert (
        set(few) == {"content", "generation_settings/n_predict", "completion_probabilities"}
        and few["generation_settings/n_predict"] == 8
    )
    assert all(
        p["id"] >= 0 and len(p["top_logprobs"]) == 3 and all(t["id"] >= 0 for t in p["top_logprobs"])
        for p in few["completion_probabilities"]
    )
    assert [p["id"] for p in few["completion_probabilities"]] == doc["tokens"]
    _, lone = native.raw("POST", "/completion", json.dumps({**body, "n_predict": 1}))
    assert lone["timings"]["predicted_per_second"] == 0.0  # (the one token is the prompt pass's)
    status, bad = native.raw("POST", "/completion", json.dumps({**body, "mirostat": 2}))
    assert status == 400 and "`mirostat`" in bad["error"]["message"]


def test_draft_flags_per_token_and_a_draft_length_per_request(native):
    msgs = [{"role": "user", "content": "the cat"}]
    chunks = _stream(
        native,
        "/v1/chat/completions",
        {"messages": msgs, "stream": True, "max_tokens": 24, "temperature": 0, "mtp_pieces": True},
    )
    pieces = [p for c in chunks for p in c.get("mtp_pieces", [])]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "".join(p[0] for p in pieces) == text and any(p[1] for p in pieces) and not all(p[1] for p in pieces)
    assert sum(p[1] for p in pieces) == chunks[-1]["mtp"]["accepted"]
    timed = _stream(
        native,
        "/completion",
        {"prompt": "the cat", "n_predict": 12, "temperature": 0, "stream": True, "timings_per_token": True},
    )
    seen = [c["timings"]["predicted_n"] for c in timed[:-1]]
    assert seen and seen == sorted(seen) and all("predicted_per_second" in c["timings"] for c in timed[:-1])
    one = native.client().chat.completions.create(
        model="m", messages=msgs, max_tokens=12, temperature=0, extra_body={"speculative.n_max": 1}
    )
    assert one.model_extra["mtp"]["draft_n_max"] == 1 and one.model_extra["mtp"]["mode"] == "fixed"
    for off in (0, -1):  # (llama-server clamps below 1 to 0: no drafts for this request)
        r = native.client().chat.completions.create(
            model="m", messages=msgs, max_tokens=12, temperature=0, extra_body={"speculative.n_max": off}
        )
        assert r.model_extra["mtp"]["draft_n_max"] == 0 and r.model_extra["mtp"]["drafted"] == 0
        assert r.choices[0].message.content == one.choices[0].message.content  # (greedy: the same text)


def test_metrics_parse_and_count_the_requests_sent(tiny):
    parser = pytest.importorskip("prometheus_client.parser")
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=N_CTX, n_threads=1))
    s = Served(engine.start(), surface=Surface(metrics=True))
    try:
        sent = [
            s.client().completions.create(model="m", prompt="the cat sat", max_tokens=n, temperature=0)
            for n in (3, 5, 5)
        ]
        import http.client

        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode()
        assert r.getheader("Process-Start-Time-Unix")
        c.close()
        got = {
            m.name: {tuple(x.labels.items()): x.value for x in m.samples}
            for m in parser.text_string_to_metric_families(text)
        }
        value = {name: samples.get((), None) for name, samples in got.items()}
        assert value["llamacpp:tokens_predicted"] == sum(x.usage.completion_tokens for x in sent) == 13
        assert value["llamacpp:prompt_tokens_cached"] == sum(x.usage.prompt_tokens_details.cached_tokens for x in sent)
        assert value["llamacpp:prompt_tokens"] + value["llamacpp:prompt_tokens_cached"] == sum(
            x.usage.prompt_tokens for x in sent
        )
        assert value["mtpcli:requests"] == 3 and value["llamacpp:requests_processing"] == 0
        mtp = [x.model_extra["mtp"] for x in sent]
        assert value["llamacpp:spec_decode_num_draft_tokens"] == sum(m["drafted"] for m in mtp)
        assert value["llamacpp:spec_decode_num_accepted_tokens"] == sum(m["accepted"] for m in mtp)
        by_pos = got["mtpcli:draft_tokens_by_pos"]
        assert sum(by_pos.values()) == sum(m["drafted"] for m in mtp) and (("pos", "1"),) in by_pos
        assert got["mtpcli:drafting"] == {(("spec_type", "mtp"), ("mode", "fixed")): 1.0}
    finally:
        s.close()
        engine.close()


def _browser():
    """A headless Chromium driven by selenium, or the reason there is none."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no Chromium and chromedriver here (Debian: apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,800", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    from selenium.webdriver.chrome.service import Service

    return webdriver.Chrome(service=Service(driver), options=opts)


def test_the_chat_page_streams_an_answer_with_its_drafted_tokens_marked(native, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    try:
        browser.get(f"http://127.0.0.1:{native.port}/?q=the%20cat")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".turn.assistant.done"))
        answer = browser.find_element(By.CSS_SELECTOR, ".turn.assistant .text")
        figures = browser.find_element(By.CSS_SELECTOR, ".turn.assistant .figures").text
        assert answer.text.strip() and "tok/s" in figures and "acceptance" in figures and "N=3" in figures, figures
        assert browser.find_elements(By.CSS_SELECTOR, ".turn.assistant .text span.draft")
        assert "context 256" in browser.find_element(By.ID, "model").text
        browser.save_screenshot(str(SHOT or tmp_path / "webui.png"))
    finally:
        browser.quit()
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", native.port, timeout=30)
    c.request("GET", "/")
    assert c.getresponse().read().decode().lower().startswith("<!doctype html>")
    c.close()


def test_a_chat_template_given_is_read_instead_of_the_files(tiny, tmp_path):
    """llama-server's --chat-template / --chat-template-file: the prompt, /apply-template and the
    model's tool format follow the template given; a name not known is one line, exit 2."""

    from mtp_cli.chat import CHATML
    from mtp_cli.config import LoadConfig

    load = LoadConfig(spec_type="mtp", chat_template=CHATML)
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", n_ctx=N_CTX, n_threads=1), load=load)
    s = Served(engine.start())
    try:
        _, applied = s.raw("POST", "/apply-template", json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
        assert applied["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        _, props = s.raw("GET", "/props")
        assert props["chat_template"] == CHATML
    finally:
        s.close()
        engine.close()
    r = chat_generate(tiny, "--chat-template", "nonesuch")
    assert r.exit_code == 2 and "nonesuch" in r.output and "Traceback" not in r.output
    (tmp_path / "t.jinja").write_text(CHATML)
    r = chat_generate(tiny, "-n", "2", "--temp", "0", "--chat-template-file", str(tmp_path / "t.jinja"), "-c", "256")
    assert r.exit_code == 0, r.output


def chat_generate(tiny, *flags: str):
    """`mtp-cli generate --chat -p hi` on the tiny model with these flags (click's result)."""
    from click.testing import CliRunner

    from mtp_cli.cli import main

    return CliRunner().invoke(main, ["generate", "-m", str(tiny["full"]), "--chat", "-p", "hi", *flags])


def test_review_fixes_bias_surrogates_one_prompt_auth_counts_and_templates(native, tiny):
    """Found by review and by llama.cpp's suite: a bad logit_bias or a lone surrogate on the native
    routes was a 500; `["a"]` came back as a list; x-api-key beat a right Authorization; batched
    decodes were counted once per request; a broken --chat-template was accepted at start."""
    body = {"prompt": "the cat", "n_predict": 2, "temperature": 0}
    for bad in (
        {"logit_bias": [["x", "abc"]]},
        {"logit_bias": [["x", None]]},
        {"logit_bias": {"1": "x"}},
        {"logit_bias": [[10**9, 1]]},
        {"prompt": [1, "x\ud800y"]},
    ):
        status, doc = native.raw("POST", "/completion", json.dumps({**body, **bad}))
        assert status == 400 and "error" in doc, (bad, doc)
    assert native.raw("POST", "/tokenize", json.dumps({"content": "x\ud800"}))[0] == 400
    assert (
        native.raw("POST", "/apply-template", json.dumps({"messages": [{"role": "user", "content": "x\ud800"}]}))[0]
        == 400
    )
    _, one = native.raw("POST", "/completion", json.dumps({**body, "prompt": ["the cat"]}))
    assert isinstance(one, dict) and one["prompt"] == "the cat"
    five = native.engine.rt.tokenize("5", add_special=False)
    _, text_key = native.raw("POST", "/completion", json.dumps({**body, "logit_bias": [["5", False]], "n_probs": 1}))
    assert text_key["stop"] and not set(five) & set(text_key.get("tokens", []))
    _, counted = native.raw(
        "POST", "/chat/completions/input_tokens", json.dumps({"messages": [{"role": "user", "content": "the cat"}]})
    )
    chat = native.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "the cat"}], max_tokens=1
    )
    assert counted["input_tokens"] == chat.usage.prompt_tokens and chat.system_fingerprint.startswith("mtp-cli-")
    _, counted = native.raw("POST", "/v1/responses/input_tokens", json.dumps({"input": "the cat"}))
    assert counted["input_tokens"] == chat.usage.prompt_tokens
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the"}]
    assert (
        native.raw(
            "POST",
            "/v1/chat/completions",
            json.dumps(
                {"messages": prefill, "max_tokens": 1, "continue_final_message": True, "add_generation_prompt": False}
            ),
        )[0]
        == 200
    )
    status, doc = native.raw(
        "POST",
        "/v1/chat/completions",
        json.dumps({"messages": prefill, "continue_final_message": True, "add_generation_prompt": True}),
    )
    assert status == 400 and "exclude each other" in doc["error"]["message"]
    engine = Engine.load(tiny["full"], GenConfig(spec_type="none", n_ctx=N_CTX, n_threads=1)).start()
    s = Served(engine, api_key="sekrit")
    try:
        models = "/v1/models"
        assert s.raw("GET", models, headers={"Authorization": "Bearer sekrit", "x-api-key": "wrong"})[0] == 200
        assert s.raw("GET", models, headers={"Authorization": "sekrit"})[0] == 200  # (llama-server takes a bare key)
        assert s.raw("GET", models, headers={"Authorization": "Bearer wrong", "x-api-key": "sekrit"})[0] == 401
    finally:
        s.close()
        engine.close()
    from mtp_cli.serve.metrics import Metrics

    m = Metrics()
    m.step(3)
    m.step(1)
    assert "llamacpp:n_busy_slots_per_decode 2" in m.text(
        0, 0, "fixed", "mtp"
    ) and "llamacpp:n_decode_total 2" in m.text(0, 0, "fixed", "mtp")
    r = chat_generate(tiny, "--chat-template", "{% for m in messages %}{{ m.nope() }}{% endfor %}")
    assert r.exit_code == 2 and "--chat-template does not render" in r.output


@pytest.mark.parametrize("n_parallel", [1, 2])
def test_prompt_progress_is_reported_chunk_by_chunk(tiny, n_parallel):
    """llama-server's return_progress: a prompt_progress before the prompt's first chunk (processed =
    cache) and after each one, up to the whole prompt, in native, chat and Responses streams."""
    from mtp_cli.config import LoadConfig

    load = LoadConfig(spec_type="mtp", n_parallel=n_parallel)
    cfg = GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=N_CTX * n_parallel, n_batch=16, n_threads=1)
    engine = Engine.load(tiny["full"], cfg, load=load)
    s = Served(engine.start())
    try:
        prompt = "the cat sat on the mat " * 6
        chunks = _stream(
            s,
            "/completion",
            {"prompt": prompt, "n_predict": 3, "stream": True, "return_progress": True, "timings_per_token": True},
        )
        seen = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
        total = seen[0]["total"]
        assert len(seen) >= 3 and seen[0]["processed"] == seen[0]["cache"] == 0 and seen[-1]["processed"] == total
        assert [p["processed"] for p in seen] == sorted(p["processed"] for p in seen) and len(
            {p["processed"] for p in seen}
        ) == len(seen)
        assert [c["timings"]["prompt_n"] for c in chunks if "prompt_progress" in c][0] == 0
        again = _stream(
            s, "/completion", {"prompt": prompt + "and", "n_predict": 3, "stream": True, "return_progress": True}
        )
        first = next(c["prompt_progress"] for c in again if "prompt_progress" in c)
        assert first["cache"] == first["processed"] > 0  # (the prompt cache held most of it)
        chat = _stream(
            s,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 2,
                "stream": True,
                "return_progress": True,
            },
        )
        assert [c for c in chat if "prompt_progress" in c and c["choices"] == []]
        events = _stream(
            s, "/v1/responses", {"input": prompt, "max_output_tokens": 2, "stream": True, "return_progress": True}
        )
        assert [e for e in events if e["type"] == "response.in_progress" and "prompt_progress" in e]
    finally:
        s.close()
        engine.close()


def test_llama_cpps_own_templates_by_name(tiny):
    """--chat-template NAME for llama.cpp's built-in templates (llama-server's names: llama3,
    command-r...): rendered by llama.cpp as llama-server renders them, a held conversation continued
    token for token, an assistant prefill continued, a name not known refused in one line."""
    from gguf_tools.gguf_file import open_gguf
    from mtp_cli.chat import NATIVE, Templated, continuation, render, template_text
    from mtp_cli.config import LoadConfig
    from mtp_cli.errors import ChatTemplateError

    gf = open_gguf(tiny["full"])
    llama3 = Templated(gf, template_text("llama3"))
    book = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    want = (
        "<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\nWhat is the best book<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render(llama3, book, "<s>", "</s>") == want  # (llama.cpp's own test expects this prompt)
    answered = [*book, {"role": "assistant", "content": "Dune"}]
    more = [{"role": "user", "content": "Why?"}]
    whole = render(llama3, [*answered, *more], "<s>", "</s>")
    assert whole == want + "Dune" + continuation(llama3, answered, more, "<s>", "</s>")
    assert render(llama3, answered, "<s>", "</s>") == want + "Dune"  # (a prefill is continued)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "a\n\nb<|eot_id|>" in render(llama3, parts, "<s>", "</s>")
    with pytest.raises(ChatTemplateError, match="nonesuch"):
        template_text("nonesuch")

    load = LoadConfig(spec_type="mtp", chat_template=template_text("command-r"))
    assert load.chat_template == NATIVE + "command-r"
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", n_ctx=N_CTX, n_threads=1), load=load)
    s = Served(engine.start())
    try:
        msgs = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]
        _, applied = s.raw("POST", "/apply-template", json.dumps({"messages": msgs}))
        assert applied["prompt"] == (
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
            "<|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
        )
        status, r = s.raw("POST", "/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 4}))
        assert status == 200 and r["usage"]["completion_tokens"] == 4
    finally:
        s.close()
        engine.close()
    r = chat_generate(tiny, "-n", "2", "--temp", "0", "--chat-template", "llama3", "-c", "256")
    assert r.exit_code == 0, r.output


def test_post_sampling_probs_are_the_distribution_the_chain_drew_from(native):
    """llama-server's post_sampling_probs: `prob` and `top_probs` under top_k / top_p / min_p and
    the temperature (the kept tokens' probabilities sum to 1, none is 0); greedy: the token, certain."""
    import math

    body = {
        "prompt": "the cat",
        "n_predict": 6,
        "n_probs": 5,
        "post_sampling_probs": True,
        "seed": 7,
        "return_tokens": True,
    }
    _, doc = native.raw("POST", "/completion", json.dumps({**body, "temperature": 1.5, "top_k": 3}))
    probs = doc["completion_probabilities"]
    assert [p["id"] for p in probs] == doc["tokens"] and len(probs) == 6
    for p in probs:
        assert "logprob" not in p and 0.0 < p["prob"] <= 1.0 and 1 <= len(p["top_probs"]) <= 3
        assert sum(t["prob"] for t in p["top_probs"]) == pytest.approx(1.0, abs=1e-5)
        assert p["prob"] == pytest.approx(next(t["prob"] for t in p["top_probs"] if t["id"] == p["id"]))
    _, greedy = native.raw("POST", "/completion", json.dumps({**body, "temperature": 0}))
    assert all(
        p["prob"] == 1.0 and [t["id"] for t in p["top_probs"]] == [p["id"]] for p in greedy["completion_probabilities"]
    )
    _, raw = native.raw(
        "POST", "/completion", json.dumps({**body, "temperature": 1.5, "top_k": 3, "post_sampling_probs": False})
    )
    assert raw["tokens"] == doc["tokens"]  # (the same draws: only what is reported differs)
    assert all(len(p["top_logprobs"]) == 5 for p in raw["completion_probabilities"])
    assert any(
        math.exp(p["logprob"]) < q["prob"] for p, q in zip(raw["completion_probabilities"], probs)
    )  # (the vocabulary's softmax spreads what the chain's three tokens share)


def test_chain_dist_follows_llama_cpps_order():
    """top_k, then top_p on the softmax of what is left, then min_p, then the temperature."""
    import math

    import numpy as np

    from mtp_cli.config import GenConfig
    from mtp_cli.sampling import ChainDist

    row = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], dtype=np.float32))
    lp, top = ChainDist(GenConfig(temp=1.0, top_k=0, top_p=0.8, min_p=0.0)).probs(row, 1, 5)
    assert [i for i, _ in top] == [0, 1, 2]  # (0.5 + 0.2 < 0.8 <= 0.85)
    assert np.allclose([np.exp(x) for _, x in top], np.array([0.5, 0.2, 0.15]) / 0.85) and lp == top[1][1]
    _, top = ChainDist(GenConfig(temp=1.0, top_k=4, top_p=1.0, min_p=0.25)).probs(row, 0, 5)
    assert [i for i, _ in top] == [0, 1, 2]  # (0.15 >= 0.5 x 0.25 > 0.1)
    _, top = ChainDist(GenConfig(temp=0.5, top_k=2, top_p=1.0, min_p=0.0)).probs(row, 0, 5)
    assert np.allclose([np.exp(x) for _, x in top], np.array([0.25, 0.04]) / 0.29)  # (squared: T = 0.5)
    assert ChainDist(GenConfig(temp=1.0, top_k=1, top_p=1.0, min_p=0.0)).probs(row, 3, 5)[0] == -math.inf
