"""ffload.errors: one root, compatible bases, old names; the CLI's one-line reports and --debug;
library errors matched by class; one meaning of --num-workers."""

from __future__ import annotations

import errno
import os
import pickle
import re

import click
import numpy as np
import pytest
from click.testing import CliRunner

import ffload.convert
import ffload.convert.demo_data
import ffload.verify
from ffload import errors
from ffload.cli import main
from ffload.commands import FfloadGroup, error_line
from ffload.convert.sources import SOURCE_KINDS, ImageFolderSource, detect_kind
from ffload.formats import write_dataset
from ffload.formats.fields.image import RGBImageField
from ffload.formats.fields.ndarray import NDArrayField
from ffload.formats.fields.scalars import IntField

SPECIFIC = [
    errors.ConfigurationError,
    errors.PipelineError,
    errors.UnavailableError,
    errors.SourceError,
    errors.ImageDecodeError,
    errors.FormatError,
    errors.FieldError,
    errors.ConvertError,
    errors.LoaderError,
    errors.LoaderClosedError,
    errors.RecipeError,
]


# ---- the hierarchy ----------------------------------------------------------------------------


def test_every_error_has_one_root_and_a_one_line_docstring():
    for cls in SPECIFIC:
        assert issubclass(cls, errors.FfloadError)
        assert cls.__doc__ and cls.__doc__.strip().splitlines()[0].endswith("."), cls
    assert set(errors.__all__) >= {cls.__name__ for cls in SPECIFIC} | {"FfloadError", "DatasetError"}


def test_compatible_second_bases():
    for cls in (
        errors.ConfigurationError,
        errors.SourceError,
        errors.ImageDecodeError,
        errors.FormatError,
        errors.FieldError,
    ):
        assert issubclass(cls, ValueError), cls
    for cls in (errors.ConvertError, errors.LoaderError, errors.LoaderClosedError, errors.UnavailableError):
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(errors.PipelineError, TypeError)
    assert issubclass(errors.ImageDecodeError, errors.SourceError)
    for cls in (errors.PipelineError, errors.UnavailableError):  # configuration errors of another old builtin
        assert issubclass(cls, errors.ConfigurationError), cls


def test_the_hierarchy_diagram_names_every_class():
    diagram = errors.__doc__.split("FfloadError\n", 1)[1].split("\n\n", 1)[0]
    named = {re.search(r"\w+Error", line).group() for line in diagram.splitlines()}
    assert named == {name for name in errors.__all__ if name not in ("FfloadError", "DatasetError")}


def _bench_config(**kw):
    from ffload.bench.config import BenchConfig

    args = dict(kind="ffload", path="x.beton", pipeline="simple", batch_size=4, num_workers=1, epochs=1)
    return BenchConfig(**{**args, **kw})


def _quasi_random(window_size):
    from ffload.loaders.orders import QuasiRandom

    return QuasiRandom(np.arange(4), 0, np.zeros(4, np.int64), window_size)


def _resnet9(**kw):
    from ffload.recipes.resnet9 import resnet9

    return resnet9(**kw)


def _lr_schedule(**kw):
    from ffload.recipes.training import RecipeConfig, lr_schedule

    return lr_schedule(RecipeConfig(**kw), 10)


def _export(tmp_path, pattern, **kw):
    from ffload.convert.export import export_webdataset

    return export_webdataset(None, str(tmp_path / pattern), **kw)  # refused before the view is read


def _parse_order(name):
    from ffload.loaders.orders import parse_order

    return parse_order(name)


def _run_rounds(repeats):
    from ffload.bench.harness import run_rounds

    return run_rounds([], repeats=repeats)


def _ceiling(payloads, threads=1):
    from ffload.bench.peers.ceiling import measure_decode_ceiling

    return measure_decode_ceiling(payloads, threads, 1, lambda payload: None, names=["sample 2"])


# (call with tmp_path, the specific class, a key part of the message): one configuration mistake each
FUNCTION_ERRORS = [
    pytest.param(
        lambda tmp: _parse_order("shuffle"), errors.ConfigurationError, "unknown order 'shuffle'", id="order-unknown"
    ),
    pytest.param(
        lambda tmp: _quasi_random(0),
        errors.ConfigurationError,
        "window_size must be >= 1, got 0",
        id="quasi_random-window",
    ),
    pytest.param(
        lambda tmp: _bench_config(kind="torch"),
        errors.ConfigurationError,
        "unknown loader kind 'torch'",
        id="bench-kind",
    ),
    pytest.param(
        lambda tmp: _bench_config(epochs=0),
        errors.ConfigurationError,
        "epochs must be an integer >= 1",
        id="bench-epochs",
    ),
    pytest.param(
        lambda tmp: _run_rounds(0), errors.ConfigurationError, "repeats must be >= 1, got 0", id="bench-repeats"
    ),
    pytest.param(lambda tmp: _ceiling([]), errors.ConfigurationError, "payloads is empty", id="ceiling-no-payload"),
    pytest.param(
        lambda tmp: _ceiling([np.zeros(4, np.uint8)], threads=0),
        errors.ConfigurationError,
        "num_threads and passes must be >= 1",
        id="ceiling-threads",
    ),
    pytest.param(
        lambda tmp: _ceiling([np.zeros(4, np.uint8)]),
        errors.FormatError,
        "sample 2: the JPEG payload does not decode",
        id="ceiling-payload-does-not-decode",
    ),
    pytest.param(
        lambda tmp: _resnet9(width=0), errors.ConfigurationError, "resnet9 width must be > 0", id="resnet9-width"
    ),
    pytest.param(
        lambda tmp: _resnet9(num_classes=0),
        errors.ConfigurationError,
        "resnet9 num_classes must be >= 1",
        id="resnet9-classes",
    ),
    pytest.param(
        lambda tmp: _lr_schedule(epochs=4, lr_peak_epoch=30),
        errors.ConfigurationError,
        "lr_peak_epoch=30 puts the learning-rate peak",
        id="recipe-lr-peak",
    ),
    pytest.param(
        lambda tmp: _export(tmp, "shard.tar"),
        errors.ConfigurationError,
        "needs one %d-style field",
        id="export-pattern-without-field",
    ),
    pytest.param(
        lambda tmp: _export(tmp, "s-%d.tar", maxcount=0),
        errors.ConfigurationError,
        "limits must be >= 1",
        id="export-limits",
    ),
]


@pytest.mark.parametrize("call,error,match", FUNCTION_ERRORS)
def test_function_arguments_are_configuration_errors(tmp_path, call, error, match):
    with pytest.raises(error, match=match):
        call(tmp_path)


def _declare(op, spec_args, field=None):
    """``op.declare`` on a one-field view (``field`` named 'x'), a ``Spec(*spec_args)`` input or ``None``."""
    from types import SimpleNamespace

    from ffload.loaders.pipeline.operation import Spec

    field = IntField() if field is None else field
    return op.declare(None if spec_args is None else Spec(*spec_args), field, SimpleNamespace(fields={"x": field}))


def _op(name, *args, **kw):
    import ffload.loaders.decoders
    import ffload.loaders.transforms

    module = ffload.loaders.transforms if hasattr(ffload.loaders.transforms, name) else ffload.loaders.decoders
    return getattr(module, name)(*args, **kw)


def _torch_spec(*shape):
    import torch

    return (shape, torch.uint8, True)


# (call, the specific class, a key part of the message): transforms, decoders, demo data, verify
PIPELINE_ERRORS = [
    pytest.param(
        lambda: _op("RandomHorizontalFlip", 2.0), errors.ConfigurationError, "flip_prob must be in", id="flip-prob"
    ),
    pytest.param(lambda: _op("ColorJitter", hue=0.7), errors.ConfigurationError, "hue must lie in", id="jitter-hue"),
    pytest.param(
        lambda: _op("PythonTransform", abs, (1,), input_type="x"),
        errors.ConfigurationError,
        "input_type must be one of",
        id="python-input-type",
    ),
    pytest.param(
        lambda: _op("RandomResizedCropRGBImageDecoder", 32, scale=(0, 1)),
        errors.ConfigurationError,
        "scale must be",
        id="rrc-scale",
    ),
    pytest.param(
        lambda: _op("RaggedArrayDecoder", max_length=-1),
        errors.ConfigurationError,
        "max_length must be >= 0",
        id="ragged-max-length",
    ),
    pytest.param(
        lambda: _declare(_op("Squeeze", 1), ((3,), np.uint8)),
        errors.ConfigurationError,
        "must name size-1",
        id="squeeze-dims",
    ),
    pytest.param(
        lambda: ffload.convert.demo_data.digits_images(4),
        errors.ConfigurationError,
        "size must be >= 8",
        id="demo-size",
    ),
    pytest.param(
        lambda: _declare(_op("RandomHorizontalFlip"), ((), np.int64)),
        errors.PipelineError,
        "field 'x'.*works on numpy or torch \\(H, W, C\\)",
        id="flip-on-labels",
    ),
    pytest.param(
        lambda: _declare(_op("GaussianBlur", 5), ((8, 8, 3), np.float32)),
        errors.PipelineError,
        "needs uint8 images",
        id="blur-float",
    ),
    pytest.param(
        lambda: _declare(_op("ToTensor"), _torch_spec(4, 4, 3)),
        errors.PipelineError,
        "needs a numpy array",
        id="to-tensor-twice",
    ),
    pytest.param(
        lambda: _declare(_op("IntDecoder"), None, RGBImageField("raw")),
        errors.PipelineError,
        "IntDecoder decodes IntField fields; field 'x' is a RGBImageField",
        id="decoder-field-type",
    ),
    pytest.param(
        lambda: ffload.verify._parse_json(b"{}"), errors.FormatError, "lacks its NUL terminator", id="verify-json"
    ),
]


@pytest.mark.parametrize("call,error,match", PIPELINE_ERRORS)
def test_pipeline_and_decoder_errors_name_their_class(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_to_device_without_cuda_is_unavailable():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(errors.UnavailableError, match="CUDA is not available"):
        _declare(_op("ToDevice", "cuda:0"), _torch_spec(4, 4, 3))


def test_old_names_are_the_new_classes():
    from ffload.convert import ConvertError
    from ffload.convert.images import ImageDecodeError
    from ffload.convert.sources import SourceError
    from ffload.formats import DatasetError, FieldError
    from ffload.formats.view import DatasetError as ViewDatasetError
    from ffload.loaders import LoaderError
    from ffload.recipes.data import RecipeError

    assert DatasetError is ViewDatasetError is errors.FormatError
    assert (FieldError, ConvertError, ImageDecodeError, SourceError, LoaderError, RecipeError) == (
        errors.FieldError,
        errors.ConvertError,
        errors.ImageDecodeError,
        errors.SourceError,
        errors.LoaderError,
        errors.RecipeError,
    )


def test_structured_attributes_hint_and_pickle():
    e = errors.FormatError("a.beton: truncated", path="a.beton", field="image", sample=3, hint="convert it again")
    assert str(e) == "a.beton: truncated (convert it again)"
    assert (e.message, e.path, e.field, e.sample, e.hint) == (
        "a.beton: truncated",
        "a.beton",
        "image",
        3,
        "convert it again",
    )
    assert str(errors.SourceError("x: bad")) == "x: bad"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is errors.FormatError and str(back) == str(e) and back.sample == 3 and back.path == "a.beton"
    loader = errors.LoaderError("sample 7, field 'image': bad JPEG", epoch=1, batch=2, field="image", sample_index=7)
    assert str(loader) == "sample 7, field 'image': bad JPEG"
    assert (loader.epoch, loader.batch, loader.field, loader.sample_index, loader.sample) == (1, 2, "image", 7, 7)
    back = pickle.loads(pickle.dumps(loader))
    assert str(back) == str(loader) and (back.epoch, back.batch, back.sample_index) == (1, 2, 7)


def test_field_arguments_vs_field_values():
    with pytest.raises(errors.ConfigurationError, match="jpeg_quality"):
        RGBImageField("jpg", jpeg_quality=0)
    with pytest.raises(errors.ConfigurationError, match="shape"):
        NDArrayField(np.float32, (0, 3))
    with pytest.raises(errors.FieldError, match="IntField expects an integer") as info:
        IntField().encode("seven", 0)
    assert not isinstance(info.value, errors.ConfigurationError)
    with pytest.raises(ValueError):  # still a ValueError, as before
        RGBImageField("bmp")


def test_writer_arguments_are_configuration_errors(tmp_path):
    with pytest.raises(errors.ConfigurationError, match="must be ASCII") as info:
        write_dataset(str(tmp_path / "a.beton"), {"étiquette": IntField()}, [(1,)], 1)
    assert info.value.field == "étiquette"
    with pytest.raises(errors.ConfigurationError, match="1..16 ASCII characters"):
        write_dataset(str(tmp_path / "b.beton"), {"x" * 17: IntField()}, [(1,)], 1)
    with pytest.raises(errors.ConfigurationError, match="num_samples=3 but 2 samples were given"):
        write_dataset(str(tmp_path / "c.beton"), {"label": IntField()}, [(1,), (2,)], 3)
    assert not any(p.name.startswith(("a.beton", "b.beton", "c.beton")) for p in tmp_path.iterdir())


def test_dataset_errors_carry_the_path(tmp_path):
    from ffload.formats import open_dataset

    junk = tmp_path / "junk.beton"
    junk.write_bytes(b"\0" * 100)
    with pytest.raises(errors.FormatError) as info:
        open_dataset(str(junk))
    assert info.value.path == str(junk)


# ---- library errors matched by class, not by message ------------------------------------------


def test_disk_full_is_recognised_by_class_and_errno():
    import lmdb

    from ffload.convert.conversion import _disk_full

    assert _disk_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert _disk_full(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    assert _disk_full(lmdb.DiskError("mdb_txn_commit", errno.ENOSPC))
    quota = lmdb.Error("mdb_txn_commit")
    quota.code = errno.EDQUOT  # py-lmdb has no class for EDQUOT: the plain Error carries the errno
    assert _disk_full(quota)
    assert not _disk_full(lmdb.Error("mdb_put: " + os.strerror(errno.ENOSPC)))  # text alone is not enough
    assert not _disk_full(OSError(errno.EIO, os.strerror(errno.EIO)))
    assert not _disk_full(ValueError("No space left on device"))


def _lmdb_dataset(tmp_path):
    path = str(tmp_path / "d.lmdb")
    write_dataset(path, {"label": IntField()}, [(i,) for i in range(3)], 3)
    return path


@pytest.mark.parametrize(
    "make_error",
    [
        lambda lmdb: lmdb.ReadonlyError("mdb_env_open", errno.EACCES),
        lambda lmdb: _with_code(lmdb.Error("mdb_env_open"), errno.EROFS),
    ],
)
def test_lmdb_without_a_writable_lock_opens_without_it(tmp_path, monkeypatch, make_error):
    """Read-only media: opening with the lock fails with py-lmdb's ReadonlyError (EACCES) or an Error
    whose code is EROFS; the view is then opened without the lock."""
    import lmdb

    from ffload.formats import open_dataset

    path = _lmdb_dataset(tmp_path)
    real_open, calls = lmdb.open, []

    def fake_open(p, **kwargs):
        calls.append(kwargs["lock"])
        if kwargs["lock"]:
            raise make_error(lmdb)
        return real_open(p, **kwargs)

    monkeypatch.setattr(lmdb, "open", fake_open)
    view = open_dataset(path)
    assert view.num_samples == 3 and calls == [True, False]


def _with_code(error, code):
    error.code = code
    return error


def test_other_lmdb_errors_are_not_retried_without_the_lock(tmp_path, monkeypatch):
    import lmdb

    from ffload.formats import open_dataset

    path = _lmdb_dataset(tmp_path)
    calls = []

    def fake_open(p, **kwargs):
        calls.append(kwargs["lock"])
        raise lmdb.Error(f"{p}: Permission denied (just the text)")  # no class, no code: not read-only

    monkeypatch.setattr(lmdb, "open", fake_open)
    with pytest.raises(errors.FormatError, match="not a readable LMDB database"):
        open_dataset(path)
    assert calls == [True]


# ---- the command line -------------------------------------------------------------------------


@pytest.fixture
def image_root(tmp_path):
    """``tmp_path/src``: an ImageFolder of one 4x4 PNG in class ``a``."""
    import cv2

    (tmp_path / "src" / "a").mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "src" / "a" / "0.png"), np.zeros((4, 4, 3), np.uint8))
    return tmp_path / "src"


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_error_line(result, *fragments):
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ffload: error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_cli_reports_an_ffload_error_in_one_line(tmp_path, image_root):
    result = run_cli("convert", tmp_path / "missing", tmp_path / "x.beton")  # SourceError
    assert_one_error_line(result, "missing", "no such file or folder")
    result = run_cli("convert", image_root, tmp_path / "x.zip")  # ConfigurationError from the suffix
    assert_one_error_line(result, "x.zip", "suffix")
    junk = tmp_path / "junk.beton"
    junk.write_bytes(os.urandom(5000))
    for command in ("inspect", "verify"):  # FormatError
        assert_one_error_line(run_cli(command, junk), "junk.beton")


def test_cli_debug_shows_the_traceback(tmp_path):
    result = run_cli("--debug", "convert", tmp_path / "missing", tmp_path / "x.beton")
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr and "SourceError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("ffload: error: ")


def test_cli_usage_errors_keep_status_2(tmp_path):
    result = run_cli("convert", tmp_path, tmp_path / "x.beton", "--write-mode", "gif")
    assert result.exit_code == 2 and "Traceback" not in result.output and "ffload: error" not in result.output


def test_cli_reports_os_errors_naming_the_path(image_root, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/data/out.beton")

    monkeypatch.setattr(ffload.convert, "convert_dataset", denied)
    result = run_cli("convert", image_root, "/data/out.beton")
    assert_one_error_line(result, "/data/out.beton: Permission denied")
    assert error_line(FileExistsError("x.beton already exists")) == "ffload: error: x.beton already exists"


def test_cli_unwritable_destination_is_one_line(tmp_path, image_root):
    """A real OSError: a folder where files cannot be created (read-only for a user; sysfs for root,
    which refuses new files even to root)."""
    if os.geteuid() == 0:
        if not os.path.isdir("/sys/kernel"):
            pytest.skip("no sysfs")
        out = "/sys/kernel"
    else:
        out = tmp_path / "ro"
        out.mkdir()
        out.chmod(0o555)
    for name in ("x.beton", "x.lmdb"):
        result = run_cli("convert", image_root, os.path.join(out, name), "--quiet")
        assert_one_error_line(result, str(out))
        assert not os.path.exists(os.path.join(out, name))


def test_plain_sub_commands_are_reported_by_the_group():
    @click.group(cls=FfloadGroup)
    def group():
        pass

    @click.command()
    def plain():
        raise errors.ConvertError("x.beton: stopped\n  at sample 3")

    group.add_command(plain)
    result = CliRunner().invoke(group, ["plain"])
    assert_one_error_line(result, "x.beton: stopped at sample 3")


def test_other_exceptions_keep_their_traceback():
    @click.group(cls=FfloadGroup)
    def group():
        pass

    @group.command()
    def bug():
        raise KeyError("a bug")

    result = CliRunner().invoke(group, ["bug"])
    assert isinstance(result.exception, KeyError)


def test_recipe_errors_are_one_line(tmp_path):
    from ffload.recipes.cifar10_resnet9 import recipe_command

    result = CliRunner().invoke(
        recipe_command, ["--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--device", "cpu"]
    )
    assert_one_error_line(result, "--data", "nope")


# ---- --num-workers: one spelling, one meaning ---------------------------------------------------


@pytest.fixture
def tiny_beton(tmp_path):
    path = str(tmp_path / "t.beton")
    write_dataset(
        path,
        {"image": RGBImageField("raw"), "label": IntField()},
        [(np.full((4, 4, 3), i, np.uint8), i) for i in range(3)],
        3,
    )
    return path


@pytest.mark.parametrize(
    "args,expected", [([], None), (["--num-workers", "0"], 1), (["--num-workers", "3"], 3), (["--workers", "2"], 2)]
)
def test_verify_num_workers(tiny_beton, monkeypatch, args, expected):
    from ffload.system import available_cpus

    seen = []
    real = ffload.verify.verify_dataset

    def spy(view, num_workers, progress, **remote):
        seen.append(num_workers)
        return real(view, num_workers=num_workers, progress=progress, **remote)

    monkeypatch.setattr(ffload.verify, "verify_dataset", spy)
    result = run_cli("verify", tiny_beton, "--quiet", *args)
    assert result.exit_code == 0, result.output
    assert seen == [available_cpus() if expected is None else expected]  # 0: one thread, in order
    assert ("deprecated" in result.stderr) == ("--workers" in args)


@pytest.mark.parametrize("args,expected", [([], None), (["--num-workers", "0"], 0), (["--workers", "2"], 2)])
def test_convert_num_workers(tmp_path, image_root, monkeypatch, args, expected):
    seen = []

    def spy(source, dst, **kwargs):
        seen.append(kwargs["num_workers"])
        raise errors.ConvertError("stop here")

    monkeypatch.setattr(ffload.convert, "convert_dataset", spy)
    result = run_cli("convert", image_root, tmp_path / "x.beton", *args)
    assert result.exit_code == 1 and seen == [expected]


def test_workers_alias_is_hidden_and_exclusive(tiny_beton):
    for command in ("convert", "verify"):
        help_text = " ".join(run_cli(command, "--help").output.split())
        assert "--num-workers" in help_text and "--workers" not in help_text
        assert "0: in this process" in help_text
    result = run_cli("verify", tiny_beton, "--workers", "1", "--num-workers", "1")
    assert result.exit_code == 2


def test_source_choices_come_from_the_kinds_table():
    help_text = run_cli("convert", "--help").output
    for name in ("auto", *SOURCE_KINDS):
        assert name in help_text
    assert list(SOURCE_KINDS) == ["cifar10", "cifar100", "webdataset", "hf", "imagefolder"]


# ---- sources: one ImageFolder definition, one detector ------------------------------------------


def test_image_folder_samples_and_classes(tmp_path):
    import cv2

    for cls, names in (("b", ["1.png", "sub/0.png"]), ("a", ["z.png", "y.PNG"])):
        for name in names:
            (tmp_path / cls / name).parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(tmp_path / cls / name), np.zeros((2, 2, 3), np.uint8))
    src = ImageFolderSource(tmp_path)
    assert src.classes == ["a", "b"]
    assert src.samples == [
        (str(tmp_path / "a" / "y.PNG"), 0),
        (str(tmp_path / "a" / "z.png"), 0),
        (str(tmp_path / "b" / "1.png"), 1),
        (str(tmp_path / "b" / "sub" / "0.png"), 1),
    ]
    assert src.samples == [(src.path(i), int(src.labels[i])) for i in range(len(src))]


def test_detect_kind_order(tmp_path):
    assert detect_kind(tmp_path)[0].name == "imagefolder"
    (tmp_path / "batches.meta").write_bytes(b"")
    (tmp_path / "test_batch").write_bytes(b"")
    kind, folder = detect_kind(tmp_path)
    assert kind.name == "cifar10" and folder == str(tmp_path)
