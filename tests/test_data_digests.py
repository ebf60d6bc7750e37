"""A data file edited in place keeps its name, so the spec alone cannot tell: a run records the
sha256 of what it read (RUN/data.json), a resume refuses data that changed since, and a study
neither reuses nor reports a finished trial whose data changed."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from helpers import ROOT, SHARED_DATA
from test_study import write_study
from test_study_robustness import run_cli
from test_train_robustness import small_spec, trainer

from tfcompile.data import DataError
from tfcompile.data.corpus import corpus_files
from tfcompile.data.digest import DATA_FILE, changed_data, data_digests, path_digest
from tfcompile.data.images import image_files
from tfcompile.spec import load_spec
from tfcompile.study.runs import read_run, trained_otherwise
from tfcompile.train import TrainError

TEXT = (SHARED_DATA / "tinyshakespeare.txt").read_text()[:20_000]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_translators_digests_are_of_each_side_by_field_and_file_name() -> None:
    spec = load_spec(ROOT / "specs" / "multi30k-de-en.yaml")
    digests = data_digests(spec)
    folder = SHARED_DATA / "multi30k"
    assert digests == {
        f"data.{field} ({side}): {name}.{side}.gz": sha256(
            gzip.decompress((folder / f"{name}.{side}.gz").read_bytes())
        )
        for field, name in (("path", "train"), ("val_path", "val"), ("test_path", "test_2016_flickr"))
        for side in ("de", "en")
    }


def test_each_side_of_a_translation_is_its_own_even_under_one_file_name(tmp_path: Path) -> None:
    """mt/{lang}/train.txt: both sides are train.txt, and the German one was never checked."""
    for side in ("de", "en"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "train.txt").write_text(f"{side}\n")
    spec = load_spec(
        ROOT / "specs" / "multi30k-de-en.yaml",
        [f"data.path={tmp_path}/{{lang}}/train.txt", "data.val_path=null", "data.test_path=null"],
    )
    digests = data_digests(spec)
    assert list(digests) == ["data.path (de): train.txt", "data.path (en): train.txt"]
    (tmp_path / "de" / "train.txt").write_text("DE\n")
    now, then = sha256(b"DE\n")[:12], digests["data.path (de): train.txt"][:12]
    assert changed_data(digests, spec) == [
        f"data.path (de): train.txt (sha256 {now}..., the run's {then}...)"
    ]


def test_gzip_data_compressed_again_is_the_same_data(tmp_path: Path) -> None:
    """Its header's time differs, not its text: a resume was refused with advice no one could follow."""
    path = tmp_path / "c.txt.gz"
    path.write_bytes(gzip.compress(b"text\n", mtime=1))
    digest = path_digest(path, corpus_files)
    path.write_bytes(gzip.compress(b"text\n", mtime=2, compresslevel=1))
    assert path_digest(path, corpus_files) == digest == sha256(b"text\n")
    path.write_bytes(gzip.compress(b"text!\n", mtime=1))
    assert path_digest(path, corpus_files) != digest
    path.write_bytes(gzip.compress(b"text\n")[:-6])  # damaged: the reader names it
    assert path_digest(path, corpus_files) is None


def test_an_image_folders_digest_follows_the_images_its_task_reads(tmp_path: Path) -> None:
    """Hidden files, files of no image suffix and a class folder's own subfolders are not read;
    a class folder that is a link is."""
    for place in ("a", "b"):
        (tmp_path / place / "cat").mkdir(parents=True)
        (tmp_path / place / "cat" / "1.png").write_bytes(b"one")
    (tmp_path / "store" / "dog").mkdir(parents=True)
    (tmp_path / "store" / "dog" / "2.png").write_bytes(b"two")
    for place in ("a", "b"):
        (tmp_path / place / "dog").symlink_to(tmp_path / "store" / "dog")
    (tmp_path / "b" / ".cache").mkdir()
    (tmp_path / "b" / ".cache" / "x.png").write_bytes(b"ignored")
    (tmp_path / "b" / "cat" / ".DS_Store").write_bytes(b"ignored")
    (tmp_path / "b" / "cat" / "notes.txt").write_bytes(b"ignored")
    (tmp_path / "b" / "cat" / "more").mkdir()
    (tmp_path / "b" / "cat" / "more" / "3.png").write_bytes(b"ignored")
    digest = path_digest(tmp_path / "a", image_files)
    assert digest is not None and digest == path_digest(tmp_path / "b", image_files)
    (tmp_path / "store" / "dog" / "2.png").write_bytes(b"Two")  # read through the link
    assert path_digest(tmp_path / "a", image_files) != digest
    (tmp_path / "store" / "dog" / "2.png").write_bytes(b"two")
    (tmp_path / "b" / "cat" / "2.png").write_bytes(b"")  # an image added counts, even an empty one
    assert path_digest(tmp_path / "b", image_files) != digest


def test_a_corpus_folders_digest_is_of_its_text_files_not_a_run_kept_in_it(tmp_path: Path) -> None:
    (tmp_path / "corpus" / "part").mkdir(parents=True)
    (tmp_path / "corpus" / "part" / "a.txt").write_text("text")
    digest = path_digest(tmp_path / "corpus", corpus_files)
    run = tmp_path / "corpus" / "runs" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "corpus" / "README.md").write_text("notes")
    assert path_digest(tmp_path / "corpus", corpus_files) == digest
    (tmp_path / "corpus" / "part" / "a.txt").write_text("Text")
    assert path_digest(tmp_path / "corpus", corpus_files) != digest


def test_what_is_not_a_file_or_folder_is_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening it to read would block
    assert path_digest(tmp_path / "fifo", corpus_files) is None
    assert path_digest(tmp_path / "missing", corpus_files) is None


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "corpus.txt"
    path.parent.mkdir()
    path.write_text(TEXT)
    return path


def test_a_resume_refuses_data_edited_in_place_since_the_run_started(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "run"
    spec = small_spec(tmp_path, f"data.path={corpus}", "train.steps=2")
    trainer(spec, run_dir).train()
    recorded = json.loads((run_dir / DATA_FILE).read_text())
    assert recorded == {"data.path: corpus.txt": sha256(corpus.read_bytes())}

    corpus.write_text(TEXT.replace("the", "teh"))  # same name, same place, same size
    with pytest.raises(TrainError) as refused:
        trainer(small_spec(tmp_path, f"data.path={corpus}"), run_dir, resume=True)
    assert str(refused.value).startswith(
        f"cannot resume {run_dir}: its data changed since it was trained (data.path: corpus.txt (sha256 "
        f"{sha256(corpus.read_bytes())[:12]}..., the run's {recorded['data.path: corpus.txt'][:12]}...);"
    )
    assert str(refused.value).endswith(
        "put the data back as it was, or train a new run on it with --set train.name=NAME"
    )

    corpus.write_text(TEXT)
    assert trainer(small_spec(tmp_path, f"data.path={corpus}"), run_dir, resume=True).train().step == 4
    assert json.loads((run_dir / DATA_FILE).read_text()) == recorded


@pytest.mark.parametrize(
    "damage", ['{"data.path: corpus.txt": "0e2f', "[]", '{"data.path: corpus.txt": 1}', "folder"]
)
def test_a_damaged_record_of_the_data_is_refused_not_replaced(
    corpus: Path, tmp_path: Path, damage: str
) -> None:
    run_dir = tmp_path / "runs" / "run"
    trainer(small_spec(tmp_path, f"data.path={corpus}", "train.steps=2"), run_dir).train()
    record = run_dir / DATA_FILE
    record.unlink()
    if damage == "folder":
        record.mkdir()
    else:
        record.write_text(damage)
    corpus.write_text(TEXT.replace("the", "teh"))
    with pytest.raises(DataError, match=rf"^{re.escape(str(record))} is damaged \(not the JSON object"):
        trainer(small_spec(tmp_path, f"data.path={corpus}"), run_dir, resume=True)
    assert record.is_dir() if damage == "folder" else record.read_text() == damage


def test_a_damaged_record_of_the_data_is_read_only_where_data_is_compared(
    corpus: Path, tmp_path: Path
) -> None:
    """Listing, plotting and comparing plain runs never compare data: they read the run as ever."""
    run_dir = tmp_path / "runs" / "run"
    spec = small_spec(tmp_path, f"data.path={corpus}", "train.steps=2")
    trainer(spec, run_dir).train()
    (run_dir / DATA_FILE).write_text("{")
    run = read_run(run_dir)
    assert run.state == "finished" and run.curve()
    with pytest.raises(DataError, match="is damaged"):
        trained_otherwise(run, spec)


def test_a_run_from_before_digests_records_its_data_at_its_resume(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "run"
    trainer(small_spec(tmp_path, f"data.path={corpus}", "train.steps=2"), run_dir).train()
    (run_dir / DATA_FILE).unlink()
    corpus.write_text(TEXT + "more\n")  # nothing tells what it read: it goes on, and from now on
    assert trainer(small_spec(tmp_path, f"data.path={corpus}"), run_dir, resume=True).train().step == 4
    assert json.loads((run_dir / DATA_FILE).read_text()) == {
        "data.path: corpus.txt": sha256(corpus.read_bytes())
    }


def test_a_study_neither_reuses_nor_reports_a_trial_whose_data_was_edited(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, steps=2, variants="  only: {}", seeds="[1]")
    path.write_text(path.read_text().replace("overrides:\n", f"overrides:\n  data.path: {corpus}\n"))
    status, _ = run_cli(["sweep", str(path)], capsys)
    assert status == 0
    corpus.write_text(TEXT.replace("the", "teh"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and "only-seed1 was trained otherwise than the study now gives it" in err
    assert "(data.path: corpus.txt (sha256 " in err and "edited since" in err
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and "only-seed1 was trained otherwise than the study gives it" in err
    corpus.write_text(TEXT)
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 0 and "finished already, skipped" in err
