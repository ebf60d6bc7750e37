"""Image classification: digits and image folders, training, the bundle, and serving without torch."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, assert_follows_schema, png16
from PIL import Image
from sklearn.datasets import load_digits

from tfcompile.cli import main
from tfcompile.data import DataError
from tfcompile.data.images import read_image_folder, stratified_split
from tfcompile.export import Source, check_image_classifier_parity, export_bundle
from tfcompile.images import fit, read_image
from tfcompile.runtime import ImageClassifier, InputError, load
from tfcompile.spec import Spec, load_spec
from tfcompile.tasks.image_classification import ImageClassification
from tfcompile.train import Trainer, TrainResult, load_trained_model

SPEC = ROOT / "specs" / "vit-digits.yaml"
DIGITS = load_digits()
DIGITS_8BIT = (DIGITS.images * 255 / 16).round().astype(np.uint8)  # as an 8-bit image file holds them


def write_digit_folders(root: Path, rows: range | np.ndarray) -> None:
    for i in rows:
        folder = root / str(DIGITS.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(DIGITS_8BIT[i]).save(folder / f"{i}.png")


def digits_spec(tmp_path: Path, *overrides: str) -> Spec:
    return load_spec(SPEC, [f"train.runs_dir={tmp_path / 'runs'}", *overrides])


def test_held_out_splits_keep_each_class_share_and_a_fixed_draw() -> None:
    labels = [str(t) for t in DIGITS.target]
    kept, held = stratified_split(labels, 0.2)
    assert len(kept) + len(held) == len(labels) and not set(kept) & set(held)
    for digit in map(str, range(10)):
        n = labels.count(digit)
        assert sum(labels[i] == digit for i in held) == round(n * 0.2)
    assert np.array_equal(held, stratified_split(labels, 0.2)[1])


def test_the_digits_objective_splits_test_and_validation_and_normalises_with_training_statistics(
    tmp_path: Path,
) -> None:
    spec = digits_spec(tmp_path)
    assert spec.data is not None and spec.task.type == "image_classification" and spec.model.family == "vit"
    objective = ImageClassification(spec, tmp_path)
    sizes = {split: len(t) for split, t in objective.targets.items()}
    assert sizes["test"] == 359 and sum(sizes.values()) == 1797 and 140 <= sizes["val"] <= 146
    assert objective.labels == [str(d) for d in range(10)]
    train = objective.images["train"]
    assert train.shape[1:] == (1, 8, 8) and 0 <= train.min() and train.max() <= 1
    p = objective.preprocessing
    assert p.mean[0] == pytest.approx(train.mean().item(), abs=1e-6)
    assert p.std[0] == pytest.approx(train.std(unbiased=False).item(), abs=1e-5)
    batch = objective.batch("val", 32, torch.Generator().manual_seed(0))
    assert batch["pixel_values"].shape == (32, 1, 8, 8) and batch["labels"].shape == (32,)
    assert abs(objective._batch("train", torch.arange(1000))["pixel_values"].mean()) < 0.05
    assert json.loads(objective.run_files()["preprocessing.json"])["mean"] == list(p.mean)


def test_image_folders_are_read_by_class_and_bad_files_are_named(tmp_path: Path) -> None:
    write_digit_folders(tmp_path / "train", range(40))
    data = read_image_folder(tmp_path / "train", 1, 8)
    assert sorted(data.labels) == sorted(str(DIGITS.target[i]) for i in range(40))
    assert data.images.shape == (40, 1, 8, 8)
    first = data.labels.index(str(DIGITS.target[0]))  # sorted folders, then sorted file names
    np.testing.assert_allclose(data.images[first, 0], DIGITS.images[0] / 16, atol=0.5 / 255 + 1e-6)
    upscaled = read_image_folder(tmp_path / "train", 1, 4)  # resized to the model's size
    assert upscaled.images.shape == (40, 1, 4, 4)
    (tmp_path / "train" / "3" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"data\.path: cannot read the image .*broken\.png"):
        read_image_folder(tmp_path / "train", 1, 8)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="holds no images in class sub-folders"):
        read_image_folder(tmp_path / "empty", 1, 8)
    with pytest.raises(DataError, match="no folder at"):
        read_image_folder(tmp_path / "missing", 1, 8)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The committed recipe's model without its regularisation (which slows the first hundreds of
    steps down), 250 steps: a run that learns in seconds."""
    tmp = tmp_path_factory.mktemp("vit")
    dropout = [f"model.dropout.{part}=0" for part in ("embedding", "attention", "residual", "path")]
    augment = [f"task.augment.{change}=0" for change in ("rotate", "scale", "shift")]
    unregularised = [*dropout, *augment, "task.label_smoothing=0"]
    schedule = ["train.steps=250", "train.eval_interval=125", "train.schedule.warmup_steps=25"]
    spec = digits_spec(tmp, *unregularised, *schedule, "train.optimizer.lr=2e-3")
    return Trainer(spec, tmp / "runs" / "vit-digits", show_progress=False).train()


@pytest.fixture(scope="module")
def digits_bundle(digits_run: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The short run exported once, from the command line, for every test of its bundle."""
    bundle = tmp_path_factory.mktemp("vit-bundle") / "bundle"
    assert main(["export", str(digits_run.run_dir), "--out", str(bundle)]) == 0
    return bundle


def test_a_short_digits_run_is_far_above_chance_on_the_held_out_test_split(digits_run: TrainResult) -> None:
    assert digits_run.metrics["test_accuracy"] > 0.7  # chance: 0.1
    assert digits_run.best is not None and digits_run.best > 0.6
    preprocessing = json.loads((digits_run.run_dir / "preprocessing.json").read_text())
    assert preprocessing["image_size"] == 8 and preprocessing["channels"] == 1


def test_the_log_ends_with_the_test_metrics_to_four_decimals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """359 test images: one of them is 0.28% of the accuracy, which two decimals would hide."""
    spec = digits_spec(tmp_path, "model.n_layers=1", "train.steps=2", "train.eval_interval=2")
    result = Trainer(spec, tmp_path / "runs" / "log").train()
    accuracy, loss = result.metrics["test_accuracy"], result.metrics["test_loss"]
    assert f"test accuracy {accuracy:.4f}, loss {loss:.4f}" in capsys.readouterr().err
    assert round(accuracy * 359) == pytest.approx(accuracy * 359)  # a count of the 359 images


@pytest.mark.slow  # a learning run from PNG folders: 1,200 steps
def test_an_image_folder_run_learns_and_resumes(tmp_path: Path) -> None:
    kept, held = stratified_split([str(t) for t in DIGITS.target], 0.2)
    write_digit_folders(tmp_path / "train", kept)
    write_digit_folders(tmp_path / "test", held)
    overrides = [
        "data.builtin=null",
        f"data.path={tmp_path / 'train'}",
        f"data.test_path={tmp_path / 'test'}",
    ]
    overrides += ["model.d_model=32", "model.n_layers=2", "train.steps=1200", "train.eval_interval=600"]
    overrides += ["model.dropout.path=0.0", "task.augment={shift: 1}"]  # a small model: light regularisation
    spec = digits_spec(tmp_path, *overrides, "data.test_fraction=null")
    run_dir = tmp_path / "runs" / "folder"
    result = Trainer(spec, run_dir, show_progress=False).train()
    assert result.metrics["test_accuracy"] > 0.5
    longer = digits_spec(tmp_path, *overrides, "data.test_fraction=null", "train.steps=1220")
    resumed = Trainer(longer, run_dir, resume=True, show_progress=False)
    assert resumed.step == 1200 and resumed.train().step == 1220


def test_the_bundle_holds_parity_and_serves_paths_and_arrays_as_pytorch_does(
    digits_run: TrainResult, digits_bundle: Path, tmp_path: Path
) -> None:
    bundle = digits_bundle
    parity = json.loads((bundle / "manifest.json").read_text())["parity"]["model"]
    assert parity["passed"] and [c["batch"] for c in parity["cases"]] == [1, 4, 16]
    _, model = load_trained_model(digits_run.run_dir)
    fresh = check_image_classifier_parity(model, bundle / "model.onnx", 1e-4, batches=(2, 7, 33), seed=5)
    assert fresh.passed, fresh.to_dict()
    assert_follows_schema(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["labels"] == [str(d) for d in range(10)]
    trained = json.loads((digits_run.run_dir / "preprocessing.json").read_text())
    image = manifest["image"]  # the preprocessing, as fields a client in any language reads
    assert (image["size"], image["channels"], image["channel_order"]) == (8, 1, "L")
    assert (image["mean"], image["std"]) == (trained["mean"], trained["std"])
    assert (image["resize"], image["crop"], image["layout"]) == ("shorter_side", "center", "NCHW")

    classifier = load(bundle)
    assert isinstance(classifier, ImageClassifier)
    rows = range(1700, 1720)
    # Float arrays in [0, 1] against PyTorch on the same normalised pixels.
    arrays = [DIGITS.images[i] / 16 for i in rows]
    served = classifier.classify_images(arrays)
    p = manifest["image"]
    pixels = (torch.tensor(np.stack(arrays), dtype=torch.float32)[:, None] - p["mean"][0]) / p["std"][0]
    with torch.no_grad():
        expected = model(pixels).softmax(-1).numpy()
    got = np.array([[pred.probabilities[label] for label in classifier.labels] for pred in served])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [pred.label for pred in served] == [str(i) for i in expected.argmax(1)]
    # PNG files and the same 8-bit arrays are one input.
    write_digit_folders(tmp_path / "png", rows)
    paths = [tmp_path / "png" / str(DIGITS.target[i]) / f"{i}.png" for i in rows]
    from_files = classifier.classify_images(paths)
    from_uint8 = classifier.classify_images(np.stack([DIGITS_8BIT[i][:, :, None] for i in rows]))
    assert from_files == from_uint8
    assert sum(a.label == b.label for a, b in zip(from_files, served, strict=True)) >= 19
    (alone,) = classifier.classify_images(paths[0])  # one image, as in a batch of 20
    assert alone.label == from_files[0].label
    assert alone.probabilities == pytest.approx(from_files[0].probabilities, abs=1e-6)


def test_the_runtime_refuses_inputs_that_do_not_fit_by_name(digits_bundle: Path, tmp_path: Path) -> None:
    classifier = load(digits_bundle)
    assert isinstance(classifier, ImageClassifier)
    with pytest.raises(
        InputError, match=r"pixel_values must have shape \(batch, 1, 8, 8\), got \(2, 3, 8, 8\)"
    ):
        classifier.logits(np.zeros((2, 3, 8, 8), dtype=np.float32))
    with pytest.raises(InputError, match="finite floats"):
        classifier.logits(np.zeros((2, 1, 8, 8), dtype=np.int64))
    with pytest.raises(InputError, match="finite floats within float32's range"):  # float64's, not float32's
        classifier.logits(np.full((1, 1, 8, 8), 1e300))
    with pytest.raises(InputError, match=r"values in \[0, 1\], found \[0, 15\]: divide by its maximum"):
        classifier.classify_images(DIGITS.images[0])
    with pytest.raises(InputError, match=r"shape \(height, width, 1\) or \(height, width\), got \(5, 8, 8\)"):
        classifier.classify_images(DIGITS.images[:5] / 16)
    with pytest.raises(InputError, match=r"cannot read the image .*missing\.png"):
        classifier.classify_images(tmp_path / "missing.png")
    with pytest.raises(InputError, match="at least one image"):
        classifier.classify_images([])


def test_the_cli_validates_summarises_and_classifies_image_files(
    digits_bundle: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert main(["validate", str(SPEC)]) == 0
    assert "vit, image_classification" in capsys.readouterr().out
    assert main(["summary", str(SPEC), "--set", "task.labels=[a, b]"]) == 0
    assert (
        "(batch 1, 1, 8, 8) pixel values, 4x4 patches of 2, sequence 16" in capsys.readouterr().out
    )  # no [CLS]
    bundle = digits_bundle
    for i in (1790, 1791):
        Image.fromarray(DIGITS_8BIT[i]).save(tmp_path / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["classify", str(bundle), "1790.png", "1791.png"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if ".png" in line]
    expected = load(bundle).classify_images([tmp_path / "1790.png", tmp_path / "1791.png"])
    assert [row.split("│")[1:3] for row in rows] == [
        [f" {name}.png ", f" {p.label:<5} "] for name, p in zip((1790, 1791), expected, strict=True)
    ]


def test_an_fp16_bundle_classifies_as_the_fp32_one(
    digits_run: TrainResult, digits_bundle: Path, tmp_path: Path
) -> None:
    reports = export_bundle(None, Source(run=digits_run.run_dir), tmp_path / "half", precision="fp16")
    assert reports["model"].relative and reports["model"].passed
    images = [DIGITS.images[i] / 16 for i in range(1700, 1740)]
    half, full = load(tmp_path / "half"), load(digits_bundle)
    assert isinstance(half, ImageClassifier) and isinstance(full, ImageClassifier)
    a, b = half.classify_images(images), full.classify_images(images)
    assert sum(x.label == y.label for x, y in zip(a, b, strict=True)) >= 39
    assert (
        max(
            abs(x.probabilities[k] - y.probabilities[k])
            for x, y in zip(a, b, strict=True)
            for k in x.probabilities
        )
        < 0.02
    )


def _resized_then_cropped(image: np.ndarray, size: int) -> np.ndarray:
    """The manifest's steps 3 and 4 as written: the shorter side to ``size``, then the centre."""
    H, W, _ = image.shape
    h, w = max(size, round(H * size / min(H, W))), max(size, round(W * size / min(H, W)))
    whole = [
        Image.fromarray(image[:, :, c]).resize((w, h), Image.Resampling.BILINEAR)
        for c in range(image.shape[2])
    ]
    top, left = (h - size) // 2, (w - size) // 2
    return np.stack([np.asarray(c) for c in whole], axis=-1)[top : top + size, left : left + size]


@pytest.mark.parametrize(("height", "width", "size"), [(13, 40, 8), (40, 13, 8), (7, 9, 16), (3, 100, 224)])
def test_fit_is_the_resize_then_the_centre_crop(height: int, width: int, size: int) -> None:
    image = np.random.default_rng(height * width).random((height, width, 3), dtype=np.float32)
    np.testing.assert_allclose(fit(image, size), _resized_then_cropped(image, size), rtol=0, atol=1e-6)


def test_a_long_thin_image_is_fitted_without_resizing_all_of_it() -> None:
    """1 x 2,000 pixels at size 224: resized whole, 224 x 448,000 float32 (400 MB) per channel."""
    image = np.random.default_rng(0).random((1, 2000, 1), dtype=np.float32)
    tracemalloc.start()
    fitted = fit(image, 224)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert fitted.shape == (224, 224, 1) and peak < 10 * 2**20


def test_bytes_that_are_no_image_are_named_without_python_internals() -> None:
    with pytest.raises(InputError, match=r"cannot read the uploaded image: it is not an image file") as e:
        read_image(b"hello", 1)
    assert "object at 0x" not in str(e.value)


def test_16_bit_samples_are_their_high_byte_and_32_bit_ones_are_refused() -> None:
    """Pillow decodes a 16-bit colour PNG to its high bytes but clips 16-bit grey at 255: both read
    as v >> 8, in grey and in colour, as the manifest tells every client."""
    values = np.array([[0, 255, 256, 0x80FF, 40000, 65535]], dtype=np.uint16)
    high = (values >> 8).astype(np.uint8)
    np.testing.assert_array_equal(read_image(png16(values), 1)[..., 0], high)
    np.testing.assert_array_equal(read_image(png16(values), 3), np.stack([high] * 3, axis=-1))
    colour = np.stack([values, values[:, ::-1], values // 3], axis=-1)
    np.testing.assert_array_equal(read_image(png16(colour), 3), (colour >> 8).astype(np.uint8))
    for mode, array in (("I", values.astype(np.int32)), ("F", values.astype(np.float32))):
        tiff = io.BytesIO()
        Image.fromarray(array, mode).save(tiff, format="TIFF")
        with pytest.raises(InputError, match="32-bit"):
            read_image(tiff.getvalue(), 1)
