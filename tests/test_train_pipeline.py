"""`mtp-cli train` (mtp_cli.train.pipeline, trainer): training raises held-out agreement, runs are
deterministic and resume, the command writes a sidecar, and refusals are one line.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gguf_tools.gguf_file import open_gguf
from mtp_cli.cli import main
from mtp_cli.train import TORCH_HINT
from tests.trainkit import tiny_sources, tiny_trunk

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def test_training_raises_heldout_agreement(trained):
    r = trained["res"].train
    assert trained["stages"] == ["adopt", "collect", "train", "export"]
    assert r.steps == 120
    assert r.final[0] > r.initial[0] + 0.2, (r.initial, r.final)  # measured: 0.14 -> ~0.6
    assert r.final[1] > r.initial[1] + 0.1, (r.initial, r.final)
    # on training rows the head agrees better than on held-out ones (a tiny store is memorised)
    assert r.fit is not None and r.fit[0] > r.final[0] + 0.05, (r.fit, r.final)  # measured: 0.73 vs 0.56


@pytest.mark.slow
def test_training_is_deterministic_and_resumes(trained, tmp_path):
    import torch

    from mtp_cli.train.data import Store
    from mtp_cli.train.head import MtpHead
    from mtp_cli.train.trainer import TrainConfig, Trainer
    from mtp_cli.train.trunk import Trunk, initial_weights

    work = trained["job"].work_dir
    store = Store.open(work / "data")
    tr = Trunk(work / "adopted.gguf")
    cfg = TrainConfig(minutes=0, max_steps=6, batch_seqs=4, lr=3e-3, eval_rows=128, seed=3, unroll_from=0.0)

    def fresh():
        return MtpHead.from_trunk(tr, initial_weights(tr, "trunk", 3))

    a = fresh()
    Trainer(a, store, replace(cfg, max_steps=12)).run()
    b = fresh()
    Trainer(b, store, replace(cfg, max_steps=12)).run()
    c = fresh()
    Trainer(c, store, cfg, checkpoint=tmp_path / "c.ckpt").run()
    c2 = fresh()
    t2 = Trainer(c2, store, cfg, checkpoint=tmp_path / "c.ckpt")
    assert t2.step == 6
    t2.run()
    for k, v in a.w.items():
        assert torch.equal(v, b.w[k]), k  # same seed, same steps: same weights
        assert torch.allclose(v, c2.w[k], atol=1e-6), k  # 6 + 6 steps resumed = 12 steps
    # a resumed run takes this run's weight decay, not the checkpoint's (lr is set every step anyway)
    t3 = Trainer(fresh(), store, replace(cfg, weight_decay=0.0), checkpoint=tmp_path / "c.ckpt")
    assert [g["weight_decay"] for g in t3.opt.param_groups] == [0.0] * len(t3.opt.param_groups)
    assert cfg.weight_decay > 0.0


@pytest.mark.slow
def test_cli_train_writes_a_sidecar(trained, tmp_path):
    txt, pr = tiny_sources(tmp_path, 8, 8)
    out = tmp_path / "head.gguf"
    r = CliRunner().invoke(
        main,
        [
            "train",
            str(trained["src"]),
            "-o",
            str(out),
            "--text",
            str(txt),
            "--prompts",
            str(pr),
            "--minutes",
            "0.05",
            "--sidecar",
            "--head-type",
            "q8_0",
        ],
    )
    assert r.exit_code == 0, r.output
    gf = open_gguf(out)
    assert gf.layout().nextn_layers == 1 and "blk.0.attn_norm.weight" not in gf.tensors  # MTP-only
    assert "held-out top-1" in r.output
    r = CliRunner().invoke(main, ["train", str(trained["src"]), "-o", str(out), "--text", str(txt)])
    assert r.exit_code == 2 and "exists" in r.output
    # --minutes 0: no training, the checkpoint in the work folder exported again (here without an own output)
    r = CliRunner().invoke(
        main,
        [
            "train",
            str(trained["src"]),
            "-o",
            str(out),
            "--text",
            str(txt),
            "--prompts",
            str(pr),
            "--minutes",
            "0",
            "--sidecar",
            "--own-output",
            "none",
            "--overwrite",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "0 steps" in r.output and "blk.2.nextn.shared_head_head.weight" not in open_gguf(out).tensors
    # the fixture's work folder (a store with held-out rows): agreement on training rows is reported too
    work = tmp_path / "work"
    shutil.copytree(trained["job"].work_dir, work)
    r = CliRunner().invoke(
        main,
        [
            "train",
            str(trained["src"]),
            "-o",
            str(tmp_path / "again.gguf"),
            "--work",
            str(work),
            "--minutes",
            "0",
            "--sidecar",
            "--lr",
            "1e-4",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "on training rows: step 1" in r.output
    import torch  # --lr reaches the trainer (its config is saved in the checkpoint)

    assert torch.load(work / "head.ckpt", weights_only=False)["config"]["lr"] == 1e-4
    r = CliRunner().invoke(
        main,
        [
            "train",
            str(trained["src"]),
            "-o",
            str(tmp_path / "bad.gguf"),
            "--work",
            str(work),
            "--minutes",
            "0",
            "--lr",
            "0",
        ],
    )
    assert r.exit_code == 2 and "--lr" in r.output and not (tmp_path / "bad.gguf").exists()


def test_missing_torch_gives_a_one_line_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    src = tiny_trunk(tmp_path)
    r = CliRunner().invoke(main, ["train", str(src), "-o", str(tmp_path / "o.gguf")])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and TORCH_HINT in lines[0], r.output
    assert not (tmp_path / "o.gguf").exists() and not (tmp_path / "o.gguf.train").exists()


def test_refuses_what_it_cannot_train(tmp_path):
    from tests.factory import tiny_model_set

    s = tiny_model_set(tmp_path, "qwen35", "random", "f32")
    r = CliRunner().invoke(main, ["train", str(s["trunk"]), "-o", str(tmp_path / "o.gguf")])
    assert r.exit_code == 2 and "qwen35" in r.output


def _train_cli(trained, work: Path, out: Path) -> object:
    return CliRunner().invoke(
        main, ["train", str(trained["src"]), "-o", str(out), "--work", str(work), "--minutes", "0", "--sidecar"]
    )


@pytest.mark.parametrize(
    "damage", ["index not json", "index wrong shape", "rows missing", "checkpoint", "another model"]
)
def test_a_bad_work_folder_is_one_line_exit_2(trained, tmp_path, damage):
    """A corrupt data index, data files shorter than the index says, a corrupt checkpoint, another
    model's work folder: one line naming the file and how to recover, exit 2, no output."""
    work = tmp_path / "work"
    shutil.copytree(trained["job"].work_dir, work)
    index = work / "data" / "index.json"
    if damage == "index not json":
        index.write_text("{not json")
    elif damage == "index wrong shape":
        index.write_text(json.dumps({"n_embd": 64, "seqs": "?"}))
    elif damage == "rows missing":
        (work / "data" / "h.f16").write_bytes(b"")
    elif damage == "checkpoint":
        (work / "head.ckpt").write_bytes(b"not a checkpoint")
    else:
        doc = json.loads(index.read_text())
        doc["n_embd"] += 8
        index.write_text(json.dumps(doc))
    out = tmp_path / "head.gguf"
    r = _train_cli(trained, work, out)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    named = {
        "index not json": "index.json",
        "index wrong shape": "index.json",
        "rows missing": "h.f16",
        "checkpoint": "head.ckpt",
        "another model": "another model or top-k",
    }[damage]
    assert named in lines[0] and str(work) in lines[0]
    assert damage != "another model" or "(--work)" in lines[0]  # the library's `work`, spelled as the flag
    assert not out.exists()
    if damage == "another model":  # collecting into it is refused too, naming the setting to change
        from mtp_cli.errors import TrainDataError
        from mtp_cli.train.data import Store

        with pytest.raises(TrainDataError, match=r"another model.*\(work\)"):
            Store.create(work / "data", n_embd=doc["n_embd"] - 8, top_k=doc["top_k"], n_vocab=doc["n_vocab"], model="m")


@pytest.mark.slow
def test_nothing_held_out_is_said_not_shown_as_zero(trained, tmp_path):
    """It printed "held-out 0.0%" when no source was held out."""
    from mtp_cli.train.data import is_heldout, source_key

    kept = [
        p for p in (f"tell me about item {i}" for i in range(60)) if not is_heldout(source_key("prompt", p), 0, 0.1)
    ]
    pr = tmp_path / "p.txt"
    pr.write_text("\n".join(kept[:2]))
    args = ["train", str(trained["src"]), "-o", str(tmp_path / "o.gguf"), "--prompts", str(pr), "--sidecar"]
    r = CliRunner().invoke(main, [*args, "--minutes", "0.03"])
    assert r.exit_code == 0, r.output
    assert "nothing held out: no agreement measured" in r.output and "held-out top-1 0.0%" not in r.output


@pytest.mark.slow
def test_ctrl_c_while_training_keeps_the_steps_and_says_how_to_resume(trained, tmp_path, monkeypatch):
    from mtp_cli.train import trainer

    real, calls = trainer.Trainer._one_step, {"n": 0}

    def interrupted_at_3(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(trainer.Trainer, "_one_step", interrupted_at_3)
    txt, pr = tiny_sources(tmp_path, 4, 4)
    work = tmp_path / "work"
    args = ["train", str(trained["src"]), "-o", str(tmp_path / "o.gguf"), "--text", str(txt), "--prompts", str(pr)]
    r = CliRunner().invoke(main, [*args, "--work", str(work), "--minutes", "0.05", "--sidecar"])
    assert r.exit_code == 130 and "the same command resumes it" in r.output and str(work) in r.output, r.output
    assert any(p.name.endswith(".pt") or "ckpt" in p.name for p in work.rglob("*")), list(work.rglob("*"))


def test_training_budget_leaves_room_for_the_export(trained, tmp_path, monkeypatch):
    """`--minutes 1` took 1 min 32 s: the export came after the whole budget had been trained."""
    from mtp_cli.train import pipeline

    job = replace(
        trained["job"], out=tmp_path / "o.gguf", work=tmp_path / "w", train=None, minutes=0.05, collect_share=0.0
    )
    shutil.copytree(trained["job"].work_dir / "data", tmp_path / "w" / "data")
    monkeypatch.setattr(pipeline, "export_seconds", lambda job, trunk: 3.0)  # the whole budget
    res = pipeline.run_train(job)
    assert res.train.steps == 0 and res.out.is_file()


def test_training_budget_covers_its_evaluations(trained, monkeypatch):
    """The first evaluation ran before the clock started and the last two after the budget ended."""
    import time

    from mtp_cli.train import trainer as tm
    from mtp_cli.train.data import Store
    from mtp_cli.train.head import MtpHead
    from mtp_cli.train.trunk import Trunk, initial_weights

    work = trained["job"].work_dir
    tr = Trunk(work / "adopted.gguf")
    real = tm.Trainer._evaluate

    def slow_evaluate(self, seqs):
        time.sleep(0.4)
        return real(self, seqs)

    monkeypatch.setattr(tm.Trainer, "_evaluate", slow_evaluate)
    t = tm.Trainer(
        MtpHead.from_trunk(tr, initial_weights(tr, "trunk", 3)),
        Store.open(work / "data"),
        tm.TrainConfig(minutes=1.5 / 60, batch_seqs=4, eval_every_s=1e9, eval_rows=64),
    )
    t0 = time.perf_counter()
    res = t.run()
    took = time.perf_counter() - t0
    assert took < 1.5 + 0.35, took  # before: 0.4 + 1.5 + 2 x 0.4 s
    assert res.steps > 0


def test_progress_stops_each_stages_clock_when_the_next_starts(monkeypatch):
    """The collecting clock ran on through training and export."""
    import io
    import re
    import time

    from rich.console import Console

    from mtp_cli.cli import render
    from mtp_cli.train.collect import CollectProgress

    buf = io.StringIO()
    monkeypatch.setattr(render, "err", Console(file=buf, force_terminal=True, width=160))
    with render.train_progress() as (on_stage, on_collect, _):
        on_collect(CollectProgress("prompt", 3, 10, 5, 0.0, 10.0, 1))
        on_stage("train")
        time.sleep(1.3)
    last = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue()).split("collecting")[-1].splitlines()[0]
    assert "3/10 sources (1 from earlier runs), 5 rows, answers 10 tok/s" in last, last
    assert last.rstrip().endswith("0:00:00"), last
