"""The command line: exit codes, error output without tracebacks, the summary table, --help."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import MODEL_YAML, ONE_STEP, ROOT, TINY, random_run

from tfcompile.cli import main
from tfcompile.console import duration
from tfcompile.spec import Spec, load_spec
from tfcompile.train import Trainer
from tfcompile.train import progress as progress_module
from tfcompile.train.progress import Progress

SPECS = ROOT / "specs"


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SPECS / "shakespeare-char.yaml")]) == 0
    assert "ok (decoder, causal_lm, 6 layers, d_model 384, 10,788,929 parameters)" in capsys.readouterr().out


def test_validate_show_prints_resolved_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SPECS / "llama.yaml"), "--show"]) == 0
    assert "d_ff: 1536" in capsys.readouterr().out


def test_validate_reports_errors_and_exits_2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_model: 64\n  n_layer: 2\n  n_heads: 4\n  max_seq_len: 8\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3:3: error: model.n_layer: unknown field 'n_layer'" in err
    assert "did you mean 'n_layers'?" in err
    assert "Traceback" not in err


def test_summary_table_has_modules_total_and_flops(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SPECS / "gpt2.yaml")]) == 0
    out = capsys.readouterr().out
    assert "124,475,904" in out  # GPT-2 small's 124,439,808 with the table padded to 50,304 rows
    assert "blocks.11.ffn" in out and "(1, 1024, 50304)" in out
    assert "weight tied to embed" in out
    assert "FLOPs per token" in out


def test_summary_rows_add_up_and_its_input_is_the_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    """ViT's [CLS] token, a parameter of the model itself, had no row (the rows fell 64 short of
    the total); and the input line named train.context_length where the shapes are at max_seq_len."""
    from tfcompile.summary import summarize

    vit = load_spec(SPECS / "vit-digits.yaml", ["task.labels=[a, b, c]", "model.pooling=cls"])
    summary = summarize(vit)
    assert summary.rows[0].name == "cls_token" and sum(r.params for r in summary.rows) == summary.total_params
    assert main(["summary", str(SPECS / "gpt2.yaml"), "--set", "train.context_length=64"]) == 0
    out = capsys.readouterr().out
    assert "(1, 1024, 50304)" in out and "input: (batch 1, seq 1024)" in out
    assert "FLOPs per token at context 64" in out


def test_summary_with_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SPECS / "shakespeare-char.yaml"), "--set", "model.n_layers=1"]) == 0
    assert "blocks.1" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    [[], ["validate"], ["summary"], ["train"], ["sample"], ["serve"], ["export-triton"], ["export-genai"]],
)
def test_help_on_every_command(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tfcompile", *command, "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "usage: tfcompile" in result.stdout


def test_console_script_is_installed() -> None:
    result = subprocess.run(["tfcompile", "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "tfcompile" in result.stdout


def test_train_then_sample_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    sets = [
        "model.n_layers=1",
        "model.d_model=32",
        "model.n_heads=2",
        "model.max_seq_len=32",
        "train.steps=4",
        "train.batch_size=4",
        "train.eval_interval=2",
        "train.eval_batches=1",
        f"train.runs_dir={runs}",
    ]
    train = ["train", str(SPECS / "shakespeare-char.yaml"), *(arg for s in sets for arg in ("--set", s))]
    assert main(train) == 0
    assert "finished at step 4, best val loss" in capsys.readouterr().out
    run_dir = runs / "shakespeare-char"
    assert {"spec.yaml", "tokenizer.json", "metrics.jsonl", "checkpoints"} <= {
        p.name for p in run_dir.iterdir()
    }

    assert main(train) == 1
    err = capsys.readouterr().err
    assert "already holds a run" in err and "Traceback" not in err

    assert main(["train", "--resume", str(run_dir), "--set", "train.steps=6"]) == 0
    assert "finished at step 6" in capsys.readouterr().out

    sample = ["sample", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "3"]
    assert main(sample) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out) >= 26
    assert main(sample) == 0
    assert capsys.readouterr().out == out

    assert main([*sample[:3], "Ωmega"]) == 2
    assert "outside the tokenizer's vocabulary: ['Ω']" in capsys.readouterr().err


def test_generate_and_sample_take_a_repetition_penalty(
    char_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--repetition-penalty: the bundle's greedy text under it (the runtime's), which differs from
    the plain one; sample's from the run too."""
    from tfcompile.runtime import LanguageModel, load

    argv = ["--prompt", "ROMEO:", "--max-new-tokens", "24", "--temperature", "0"]
    assert main(["generate", str(char_bundle), *argv, "--repetition-penalty", "1.8"]) == 0
    penalised = capsys.readouterr().out
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    assert penalised == model.generate_text("ROMEO:", 24, temperature=0, repetition_penalty=1.8) + "\n"
    assert main(["generate", str(char_bundle), *argv]) == 0
    assert capsys.readouterr().out != penalised
    run = char_bundle.parent / "run"
    outputs = []
    for penalty in ([], ["--repetition-penalty", "1.8"]):
        assert main(["sample", str(run), *argv, *penalty]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] != outputs[1]


# ------------------------------------------------------------------ nobody waits in silence

TINY_RUN = [
    "model.n_layers=1",
    "model.d_model=16",
    "model.n_heads=2",
    "model.max_seq_len=16",
    "train.batch_size=2",
    "train.eval_batches=1",
]


def _tiny_spec(runs: Path, *overrides: str) -> Spec:
    sets = [*TINY_RUN, f"train.runs_dir={runs}", *overrides]
    return load_spec(SPECS / "shakespeare-char.yaml", sets)


def test_train_starts_with_a_banner_and_warns_of_a_warmup_longer_than_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _tiny_spec(tmp_path, "train.steps=3", "train.schedule={type: cosine, warmup_steps: 10}")
    trainer = Trainer(spec, tmp_path / "banner")
    trainer.train()
    err = capsys.readouterr().err
    params = sum(p.numel() for p in trainer.model.parameters())
    assert f"banner: {params:,} parameters on cpu (fp32), 2 x 16 = 32 tokens a step at most, 3 steps" in err
    assert f"checkpoints: {tmp_path / 'banner' / 'checkpoints'} (every 500 steps" in err
    assert "warning: train.schedule.warmup_steps (10) exceeds train.steps (3)" in err


def test_no_warmup_warning_when_the_warmup_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Trainer(_tiny_spec(tmp_path, "train.steps=2", "train.schedule={type: constant}"), tmp_path / "r").train()
    assert "warmup_steps" not in capsys.readouterr().err


def test_the_run_time_is_estimated_once_after_the_first_steps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = iter([10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0])  # each step's end: 0.5 s apart
    monkeypatch.setattr(progress_module, "perf_counter", lambda: next(clock))
    with Progress(total=1003, start=0) as progress:
        for step in range(1, 8):
            progress.advance(step)
    err = capsys.readouterr().err
    # Timed from the end of the first step (which compiles and warms up): 4 steps in 2 s, then
    # 0.5 s each for the 998 left.
    assert err.count("estimated time:") == 1
    assert "estimated time: about 8 min 19 s for the 998 steps left (0.5 s a step" in err


@pytest.mark.parametrize(
    ("seconds", "text"), [(41.4, "about 41 s"), (130, "about 2 min 10 s"), (65_100, "about 18 h 5 min")]
)
def test_durations_read_as_a_person_would_say_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def _wait_for(lines: queue.Queue[str], text: str) -> str:
    """The process's stderr up to the first line holding ``text`` (a minute at most)."""
    seen = ""
    while text not in seen:
        seen += lines.get(timeout=60)
    return seen


def _stderr_lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    stream = process.stderr
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


@pytest.mark.slow  # tests/test_train.py stops a run with one Ctrl-C in the default suite
def test_one_ctrl_c_saves_and_stops_with_130(tmp_path: Path) -> None:
    sets = [
        arg for s in [*TINY_RUN, "train.steps=100000", f"train.runs_dir={tmp_path}"] for arg in ("--set", s)
    ]
    command = [sys.executable, "-m", "tfcompile", "train", str(SPECS / "shakespeare-char.yaml"), *sets]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _stderr_lines(process)
    _wait_for(lines, "estimated time:")  # training is under way
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 130
    step = int(re.search(r"stopped at step (\d+)", out)[1])  # type: ignore[index]
    assert (tmp_path / "shakespeare-char" / "checkpoints" / f"step-{step:06d}").is_dir()


SLOW_STEP = """
import sys, time
from pathlib import Path
from tfcompile.spec import load_spec
from tfcompile.train import Trainer

spec = load_spec(sys.argv[1], sys.argv[3:])

def a_long_step(trainer, step):  # to a signal, a minute inside PyTorch looks the same
    time.sleep(60)

Trainer(spec, Path(sys.argv[2]), on_step=a_long_step).train()
"""


def test_a_second_ctrl_c_stops_at_once_even_inside_a_long_step(tmp_path: Path) -> None:
    sets = [*TINY_RUN, "train.steps=10"]
    command = [
        sys.executable,
        "-c",
        SLOW_STEP,
        str(SPECS / "shakespeare-char.yaml"),
        str(tmp_path / "r"),
        *sets,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _stderr_lines(process)
    _wait_for(lines, "Ctrl-C saves and stops")  # the banner: the loop has begun
    process.send_signal(signal.SIGINT)
    _wait_for(lines, "Ctrl-C again stops at once")
    process.send_signal(signal.SIGINT)
    # Killed by the signal, a minute before the step would have ended and the run saved.
    assert process.wait(timeout=30) == -signal.SIGINT


def test_export_and_verify_say_what_they_do_before_they_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tfcompile.export

    said: list[str] = []

    def record(*args: object, **kwargs: object) -> dict[str, object]:
        said.append(capsys.readouterr().err)  # what the screen showed while the work ran
        return {}

    monkeypatch.setattr(tfcompile.export, "export_bundle", record)
    monkeypatch.setattr(tfcompile.export, "verify_bundle", record)
    spec = SPECS / "quickstart.yaml"
    assert main(["export", str(spec), "--set", "model.vocab_size=65", "--out", str(tmp_path / "b")]) == 0
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifest.json").write_text("{}")
    assert main(["verify", str(tmp_path / "b")]) == 0
    assert (
        said[0]
        == f"exporting {spec} to {tmp_path / 'b'}: tracing each graph, then checking it against PyTorch ...\n"
    )
    assert said[1] == f"verifying {tmp_path / 'b'}: rerunning its parity check against PyTorch ...\n"


def test_serve_flags_set_every_limit_of_the_server(
    monkeypatch: pytest.MonkeyPatch, char_bundle: Path
) -> None:
    """Each request limit the server enforces has a flag, and the flag is the limit served."""
    import tfcompile.serve as serve_module

    served = {}
    monkeypatch.setattr(serve_module, "load_models", lambda bundles, threads=None: {})
    monkeypatch.setattr(serve_module, "serve", lambda models, settings, *a, **k: served.update(s=settings))
    flags = ["--max-n", "3", "--max-beam", "2", "--max-image-pixels", "1000", "--max-head-kb", "2"]
    flags += ["--head-timeout", "0.5", "--max-body-mb", "1", "--max-tokens", "7", "--max-prompt-tokens", "9"]
    flags += ["--keep-alive", "60"]
    assert main(["serve", str(char_bundle), "--port", "0", *flags]) == 0
    s = served["s"]
    assert (s.max_n, s.max_beam, s.max_image_pixels, s.max_head_bytes, s.head_timeout_s) == (
        3,
        2,
        1000,
        2048,
        0.5,
    )
    assert (s.max_body_bytes, s.max_tokens, s.max_prompt_tokens, s.keep_alive_s) == (1 << 20, 7, 9, 60)
    assert main(["serve", str(char_bundle), "--port", "0"]) == 0
    assert served["s"] == serve_module.Settings(), "the flags' defaults are the server's"


def test_serve_on_a_port_in_use_says_so_before_loading_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], char_bundle: Path
) -> None:
    """uvicorn logged "[Errno 98] address already in use" among its lines and exited 3, after the
    bundles had loaded."""
    import tfcompile.serve as serve_module

    monkeypatch.setattr(serve_module, "load_models", lambda *a, **k: pytest.fail("loaded before binding"))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", str(char_bundle), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}: " in err and "choose another --port" in err


def test_serve_refuses_connections_until_its_bundles_are_loaded() -> None:
    """Its port, bound before loading, accepted connections at once: a TCP readiness probe passed
    and clients waited for minutes instead of being refused."""
    from tfcompile.serve import listen

    with listen("127.0.0.1", 0) as sock, pytest.raises(ConnectionRefusedError):
        socket.create_connection(sock.getsockname()[:2], timeout=5)


@pytest.mark.parametrize("flag", ["--head-timeout=0", "--head-timeout=nan", "--max-head-kb=0", "--max-n=-1"])
def test_serve_refuses_a_limit_that_is_not_one(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "b", flag])
    assert "expected" in capsys.readouterr().err


def test_validate_warns_at_its_line_of_a_data_path_that_names_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """validate reads no data, but says where a path names nothing (train refuses it), and where
    a relative path is read from; the spec stays valid (a spec may be checked where its data is not)."""
    spec = tmp_path / "specs" / "s.yaml"
    spec.parent.mkdir()
    (tmp_path / "specs" / "val.txt").write_text("here\n")
    spec.write_text(MODEL_YAML + "data:\n  path: ../data/train.txt\n  tokenizer: char\n")
    assert main(["validate", str(spec)]) == 0
    err = capsys.readouterr().err
    missing = (tmp_path / "data" / "train.txt").resolve()
    assert f"{spec}:8:9: warning: data.path: no file or folder at {missing}" in err
    assert f"read from the spec's folder, {spec.parent.resolve()}" in err
    assert main(["validate", str(spec), "--set", "data.path=val.txt"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["validate", str(spec), "--set", "data.path=nope.txt"]) == 0
    assert "--set data.path=nope.txt: warning: data.path: no file or folder" in capsys.readouterr().err


def test_a_data_path_that_is_a_loop_of_links_is_named_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Path.resolve raised RuntimeError on a loop: validate and train ended in a traceback."""
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    spec = tmp_path / "s.yaml"
    spec.write_text(MODEL_YAML + "data:\n  path: a\n  tokenizer: char\n")
    assert main(["validate", str(spec)]) == 0
    assert f"warning: data.path: {tmp_path / 'a'} is a loop of symbolic links" in capsys.readouterr().err
    assert main(["train", str(spec), "--set", f"train.runs_dir={tmp_path / 'runs'}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "is a loop of symbolic links, not a regular file" in err.splitlines()[-1]


@pytest.mark.parametrize(
    ("command", "works"),
    [("translate", "use `tfcompile generate` or `classify`"), ("classify", "use `tfcompile generate`")],
)
def test_a_bundle_of_another_task_names_the_command_that_serves_it(
    command: str, works: str, char_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle of another task is a path of the wrong kind: exit 1, as export-genai's (it was 2,
    a command line to change, here and 1 there)."""
    assert main([command, str(char_bundle), "ROMEO"]) == 1
    assert works in capsys.readouterr().err


@pytest.mark.slow
def test_generate_without_a_prompt_names_its_default_where_the_tokenizer_reads_no_newline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A WordPiece tokenizer keeps no whitespace: the default prompt (a newline) encoded to nothing,
    and the error said "give at least one character" to a user who gave none."""
    overrides = [*TINY, "model.max_seq_len=16", "model.vocab_size=null", *ONE_STEP]
    overrides += ["data.tokenizer={type: wordpiece, vocab_size: 120}", f"train.runs_dir={tmp_path}"]
    Trainer(
        load_spec(SPECS / "shakespeare-char.yaml", overrides), tmp_path / "run", show_progress=False
    ).train()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "bundle")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "bundle"), "--max-new-tokens", "2"]) == 2
    assert "no --prompt given, and its default, a newline, is no token" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "bundle"), "--prompt", " ", "--max-new-tokens", "2"]) == 1
    assert "encodes to no tokens (its tokenizer keeps none of its characters" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "bundle"), "--prompt", "to be", "--max-new-tokens", "2"]) == 0


@pytest.mark.parametrize(
    ("command", "spec", "instead"),
    [
        ("generate", "", "generate(ids)"),
        ("classify", ", family: encoder}\ntask: {type: classification, labels: [a, b]", "infer(feed)"),
    ],
)
def test_a_text_command_on_a_bundle_without_a_tokenizer_says_to_give_it_token_ids(
    command: str, spec: str, instead: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle exported from a spec (a random run) has no tokenizer: the commands said
    "pass token ids instead", which no command takes."""
    run = random_run(
        tmp_path, f"model: {{vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8{spec}}}\n"
    )
    assert main(["export", str(run), "--out", str(tmp_path / "bundle")]) == 0
    capsys.readouterr()
    assert main([command, str(tmp_path / "bundle"), *(["a"] if command == "classify" else [])]) == 1
    error = capsys.readouterr().err
    assert "has no tokenizer (its run read no text)" in error and instead in error, error


def test_classify_prints_texts_and_labels_as_they_are_not_as_markup(
    classifier_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Brackets are shown, not read as Rich markup (a "[/]" failed with a traceback, a [link]
    made a hyperlink), and control characters are escaped (an escape sequence cleared the screen)."""
    text = "[/] \x1b[2J [bold]x[/bold]"
    assert main(["classify", str(classifier_bundle), text]) == 0
    out = capsys.readouterr().out
    assert "[/]" in out and "\\x1b[2J" in out and "[bold]x[/bold]" in out.replace("\n", "").replace("│", "")
    assert "\x1b" not in out


def test_sigterm_removes_what_ctrl_c_removes_and_exits_143(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stop by SIGTERM (a scheduler's) mid-optimize left the hidden staging folder beside --out:
    the default action ended the process before any cleanup."""
    import tfcompile.optimize as optimize

    transform = optimize._transform

    def stopped_midway(*args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        return transform(*args)

    monkeypatch.setattr(optimize, "_transform", stopped_midway)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["optimize", str(char_bundle), "--out", str(tmp_path / "fused"), "--fuse"]) == 143
    assert capsys.readouterr().err.splitlines()[-1] == "tfcompile optimize: stopped by SIGTERM"
    assert list(tmp_path.iterdir()) == []  # neither the bundle nor its staging folder
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_path_the_outputs_encoding_cannot_spell_is_escaped_not_a_traceback(tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii (or a terminal of another encoding): printing a spec's non-ASCII
    path ended validate in a UnicodeEncodeError traceback."""
    folder = tmp_path / "ünï"
    folder.mkdir()
    spec = folder / "spéc.yaml"
    spec.write_text((ROOT / "specs" / "quickstart.yaml").read_text())
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tfcompile", "validate", str(spec)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "sp\\xe9c.yaml: ok" in done.stdout


def test_a_dumb_terminal_is_told_what_a_long_command_is_doing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TERM=dumb: the spinner, which cannot redraw its line there, drew nothing at all."""
    from tfcompile.console import working

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")
    with working("exporting runs/x"):
        pass
    assert "exporting runs/x ..." in capsys.readouterr().err
