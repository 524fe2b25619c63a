"""`generate -cnv` in a real (pseudo-)terminal: turns that decode only their own new tokens, Ctrl-C
stopping an answer without leaving, /exit and end of input; and the token bookkeeping behind it."""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from gguf_tools.gguf_file import open_gguf
from mtp_cli.chat import chat_prompt
from mtp_cli.config import GenConfig
from mtp_cli.session import Session
from mtp_cli.stats import Generation, GenStats, TokenEvent

pty = pytest.importorskip("pty")
ROOT = Path(__file__).resolve().parents[1]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
_SUMMARY = re.compile(r"(\d+) prompt tokens(?: \((\d+) decoded, (\d+) cached\))? at")


class Terminal:
    """mtp-cli running in a pseudo-terminal, read and typed into."""

    def __init__(self, *args: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command, its stdin/stdout/stderr the terminal
            os.chdir(ROOT)
            os.execv(sys.executable, [sys.executable, "-m", "mtp_cli", "generate", *args])
        self.out = ""

    def read_until(self, pattern: str, timeout: float = 120.0) -> str:
        end, start = time.monotonic() + timeout, len(self.out)
        while pattern not in self.out[start:]:
            left = end - time.monotonic()
            assert left > 0, f"no {pattern!r} in:\n{self.out[start:]}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                self.out += _ANSI.sub("", chunk.decode("utf-8", "replace")).replace("\r", "")
        return self.out[start:]

    def read_some(self, n: int, timeout: float = 60.0) -> None:
        """Wait for n more characters of output."""
        want, end = len(self.out) + n, time.monotonic() + timeout
        while len(self.out) < want and time.monotonic() < end:
            if select.select([self.fd], [], [], 0.1)[0]:
                self.out += _ANSI.sub("", os.read(self.fd, 4096).decode("utf-8", "replace")).replace("\r", "")

    def type(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


def _summary(text: str) -> tuple[int, int, int]:
    m = _SUMMARY.search(text)
    assert m, text
    n = int(m.group(1))
    return (n, int(m.group(2)), int(m.group(3))) if m.group(2) else (n, n, 0)


@pytest.mark.slow
def test_three_turns_each_decoding_only_its_new_tokens(tiny_models):
    path = str(tiny_models("glm4moe")["full"])
    t = Terminal("-m", path, "-cnv", "-n", "6", "--temp", "0", "--spec-type", "mtp", "-t", "1", "-sys", "be brief")
    t.read_until("> ")
    decoded = []
    for line in ("hello world", "the world", "a hello"):
        t.type(line)
        decoded.append(_summary(t.read_until("> ")))
    t.type("/exit")
    assert t.wait() == 0
    (n1, d1, c1), (n2, d2, c2), (n3, d3, c3) = decoded
    assert c1 == 0 and d1 == n1  # the first turn: the whole prompt
    assert c2 == n1 + 6 - 1 and d2 == n2 - c2 and d2 < n1  # the rest: all but the new turn was kept
    assert c3 == n2 + 6 - 1 and d3 == n3 - c3 and d3 < n1


@pytest.mark.slow
def test_ctrl_c_stops_an_answer_and_returns_to_the_prompt(tiny_models):
    path = str(tiny_models("glm4moe")["full"])
    t = Terminal("-m", path, "-cnv", "-n", "4000", "-c", "16384", "--temp", "0", "-t", "1")
    t.read_until("> ")
    t.type("hello world")
    t.read_until("hello world\n")  # (the terminal's echo of the line)
    t.read_some(40)  # it is answering (4000 tokens take a second or more)
    os.kill(t.pid, signal.SIGINT)  # what Ctrl-C sends the terminal's foreground process
    after = t.read_until("> ")
    assert "stop: interrupted" in after, after
    t.type("the world")  # still in the conversation
    assert "generated" in t.read_until("> ")
    t.type("/exit")
    assert t.wait() == 0


def test_end_of_input_leaves(tiny_models):
    path = str(tiny_models("glm4moe")["full"])
    t = Terminal("-m", path, "-cnv", "-n", "2", "--temp", "0", "-t", "1")
    t.read_until("> ")
    os.write(t.fd, b"\x04")  # Ctrl-D on an empty line
    assert t.wait() == 0


def test_a_conversation_keeps_each_answer_as_its_tokens(tiny_models):
    """The template's text between turns is added as tokens after the answer's own generated ones."""
    gf = open_gguf(tiny_models("glm4moe")["full"])
    seen: list[tuple[str, bool]] = []

    class Host:  # a stand-in runtime: one token per tokenize call, generations of fixed tokens
        file = chat_file = gf

        def special_texts(self) -> tuple[str, str]:
            return "<s>", "</s>"

        def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
            seen.append((text, add_special))
            return [len(text)]

        def generate(self, prompt_tokens, config, *, policy=None, reuse=False, seq=0, progress=None) -> Generation:
            def events():
                yield from (TokenEvent(t, f"<{t}>", "target", 0) for t in (7, 8, 9))

            return Generation(events(), GenStats())

    session = Session(Host())
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    first = session.chat(msgs)
    assert seen[0] == (chat_prompt(gf, "hi", "<s>", "</s>", system="be brief"), True)
    assert first.tokens == [len(seen[0][0])]
    gen = session.generate(first, GenConfig())
    answer = "".join(ev.text for ev in gen)
    second = session.chat([*msgs, {"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}])
    assert second.tokens[:4] == [*first.tokens, 7, 8, 9] and seen[1] == (
        "\n<|user|>\nand then?\n<|assistant|>\n",
        False,
    )
    # an edited answer is not what the memory holds: the conversation is rendered whole
    third = session.chat([*msgs, {"role": "assistant", "content": "no"}, {"role": "user", "content": "and then?"}])
    assert len(third.tokens) == 1 and seen[2][1] is True
