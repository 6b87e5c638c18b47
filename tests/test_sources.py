"""ffload.convert.sources and ffload.convert.cifar: labels, order, pixels and errors of every source kind."""

from __future__ import annotations

import os
import pickle
import pickletools
import warnings

import numpy as np
import pytest
from cifar_fixture import CIFAR10_LABEL_NAMES, py2_pickle, write_cifar10_folder, write_cifar100_folder

from ffload.convert.images import ImageDecodeError, ImageUnsupportedError
from ffload.convert.sources import ArraySource, ImageFolderSource, IndexableSource, Source, SourceError, detect_source
from ffload.convert.sources.cifar import CIFARSource, find_cifar_folder, is_cifar_folder, read_cifar_pickle

Image = pytest.importorskip("PIL.Image")
skdata = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def photos():
    return [skdata.astronaut(), skdata.coffee(), skdata.chelsea()]


def crops(photos, n, size, seed):
    """``n`` distinct real-photo crops ``(n, size, size, 3) uint8`` drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        photo = photos[k % len(photos)]
        y, x = rng.integers(0, photo.shape[0] - size), rng.integers(0, photo.shape[1] - size)
        out.append(photo[y : y + size, x : x + size])
    return np.stack(out)


# -- ImageFolderSource --------------------------------------------------------------------------------------------


@pytest.fixture()
def image_folder(tmp_path, photos):
    """A folder exercising class sorting, nesting, extension case, hidden entries and ignored files.

    Returns (root, expected): (relative path, label, pixels as Pillow decodes them, lossless) in torchvision's order.
    """
    root = tmp_path / "data"
    images = iter(crops(photos, 20, 24, seed=0))
    written = {}

    def put(rel, fmt="PNG"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(next(images)).save(path, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        written[rel] = np.asarray(Image.open(path).convert("RGB"))

    put("Cat/x.Png")
    put("bird/sub/w.jpeg", "JPEG")
    put("bird/z.TIFF", "TIFF")
    put("dog/a.JPG", "JPEG")
    put("dog/b.png")
    put("dog/e.png")
    put("dog/a/p.png")
    put("dog/a b/q.png")
    put("dog/a/x/r.png")
    put("dog/.hidden.png")
    put("dog/.cache/f.png")
    put("dog/anim.gif", "GIF")
    put(".ipynb_checkpoints/y.png")
    put("stray.png")
    (root / "dog" / "._b.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble resource fork")
    (root / "dog" / "notes.txt").write_text("not an image")
    # Classes sort as sorted(): 'Cat' < 'bird' < 'dog' ('.ipynb_checkpoints' is hidden). Inside a class, directories
    # sort by path ('bird' < 'bird/sub'; 'dog/a' < 'dog/a b' < 'dog/a/x'), then file names within a directory.
    order = [
        ("Cat/x.Png", 0),
        ("bird/z.TIFF", 1),
        ("bird/sub/w.jpeg", 1),
        ("dog/a.JPG", 2),
        ("dog/b.png", 2),
        ("dog/e.png", 2),
        ("dog/a/p.png", 2),
        ("dog/a b/q.png", 2),
        ("dog/a/x/r.png", 2),
    ]
    return root, [(rel, label, written[rel], not rel.lower().endswith(("jpg", "jpeg"))) for rel, label in order]


def test_image_folder_classes_labels_and_order(image_folder, caplog):
    root, expected = image_folder
    with caplog.at_level("WARNING"):
        src = ImageFolderSource(root)
    assert "directly in the root are ignored" in caplog.text
    assert isinstance(src, Source)
    assert src.classes == ["Cat", "bird", "dog"]
    assert src.name == "data"
    assert len(src) == len(expected)
    assert [os.path.relpath(src.describe(i), root) for i in range(len(src))] == [e[0] for e in expected]
    np.testing.assert_array_equal(src.labels, [e[1] for e in expected])
    assert src.labels.dtype == np.int64
    for i, (_rel, label, pixels, exact) in enumerate(expected):
        image, got_label = src[i]
        assert got_label == label and isinstance(got_label, int)
        assert image.dtype == np.uint8 and image.shape == (24, 24, 3)
        if exact:
            np.testing.assert_array_equal(image, pixels)
        else:
            assert np.abs(image.astype(int) - pixels).max() <= 1


def test_image_folder_indexing_and_pickle(image_folder):
    root, _ = image_folder
    src = ImageFolderSource(root)
    np.testing.assert_array_equal(src[-1][0], src[len(src) - 1][0])
    assert src[np.int64(2)][1] == src[2][1]
    with pytest.raises(IndexError):
        src[len(src)]
    with pytest.raises(IndexError):
        src[-len(src) - 1]
    clone = pickle.loads(pickle.dumps(src))
    assert clone.classes == src.classes and len(clone) == len(src)
    for i in range(len(src)):
        assert clone.describe(i) == src.describe(i)
        np.testing.assert_array_equal(clone[i][0], src[i][0])


def test_image_folder_bad_image_names_file(tmp_path, photos):
    (tmp_path / "cls").mkdir()
    Image.fromarray(crops(photos, 1, 16, 1)[0]).save(tmp_path / "cls" / "good.png")
    (tmp_path / "cls" / "zbad.jpg").write_bytes(b"")
    src = ImageFolderSource(tmp_path)
    assert src[0][0].shape == (16, 16, 3)
    with pytest.raises(ImageDecodeError, match="zbad.jpg: empty file"):
        src[1]


def test_image_folder_errors(tmp_path, photos):
    with pytest.raises(SourceError, match="no such folder"):
        ImageFolderSource(tmp_path / "missing")
    a_file = tmp_path / "file.png"
    a_file.write_bytes(b"x")
    with pytest.raises(SourceError, match="is a file"):
        ImageFolderSource(a_file)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="empty folder"):
        ImageFolderSource(tmp_path / "empty")
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.fromarray(crops(photos, 1, 16, 2)[0]).save(flat / "img.png")
    with pytest.raises(SourceError, match="no class subfolders"):
        ImageFolderSource(flat)
    ok = tmp_path / "ok"
    (ok / "full").mkdir(parents=True)
    Image.fromarray(crops(photos, 1, 16, 3)[0]).save(ok / "full" / "img.png")
    (ok / "void" / "deeper").mkdir(parents=True)
    (ok / "void" / "readme.txt").write_text("no pictures")
    with pytest.raises(SourceError, match=r"class folder 'void' holds no images \(1 files with other extensions\)"):
        ImageFolderSource(ok)


# -- ArraySource / IndexableSource --------------------------------------------------------------------------------


def test_array_source(photos):
    images = crops(photos, 6, 20, seed=4)
    labels = np.array([0, 1, 2, 0, 1, 2])
    src = ArraySource(images, labels, classes=["a", "b", "c"], name="toy")
    assert isinstance(src, Source) and len(src) == 6 and src.classes == ["a", "b", "c"]
    np.testing.assert_array_equal(src.labels, labels)
    image, label = src[3]
    assert label == 0 and np.shares_memory(image, images)
    np.testing.assert_array_equal(image, images[3])
    assert src.describe(3) == "sample 3 of toy"
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone[5][0], images[5])


def test_array_source_normalises_each_item(photos):
    rgb = crops(photos, 1, 10, seed=5)[0]
    items = [rgb, rgb[..., 0], np.dstack([rgb, rgb[..., :1]]), rgb.astype(np.uint16) * 257, rgb / 255.0]
    src = ArraySource(items, np.arange(5))
    np.testing.assert_array_equal(src[0][0], rgb)
    np.testing.assert_array_equal(src[1][0], np.repeat(rgb[..., :1], 3, axis=2))
    for i in (2, 3, 4):
        np.testing.assert_array_equal(src[i][0], rgb)
    gray_stack = ArraySource(crops(photos, 3, 10, seed=6)[..., 0], [0, 0, 1])
    assert gray_stack[2][0].shape == (10, 10, 3)
    bad = ArraySource([np.zeros((4, 4), np.int32)], [0], name="ints")
    with pytest.raises(ImageUnsupportedError, match="sample 0 of ints: unsupported: sample type int32"):
        bad[0]


def test_array_source_errors(photos):
    images = crops(photos, 3, 8, seed=7)
    with pytest.raises(SourceError, match="length 3"):
        ArraySource(images, [0, 1])
    with pytest.raises(SourceError, match="integer"):
        ArraySource(images, [0.0, 1.0, 2.0])
    with pytest.raises(SourceError, match=r"outside \[0, 2\)"):
        ArraySource(images, [0, 1, 2], classes=["a", "b"])
    with pytest.raises(SourceError, match="shape"):
        ArraySource(np.zeros((3, 8), np.uint8), [0, 1, 2])


class ToyDataset:
    """A torchvision-like dataset: PIL images or arrays, ``classes`` and optionally ``targets``."""

    def __init__(self, items, classes=None, targets=None):
        self.items, self.classes = items, classes
        if targets is not None:
            self.targets = targets

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_indexable_source_pil_and_arrays(photos):
    rgb = crops(photos, 1, 16, seed=8)[0]
    palette_image = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette = np.array(palette_image.getpalette(), np.uint8).reshape(-1, 3)
    cmyk = np.random.default_rng(9).integers(0, 256, (16, 16, 4), dtype=np.uint8)
    items = [
        (Image.fromarray(rgb), 0),
        (palette_image, 1),
        (Image.fromarray(cmyk, "CMYK"), 2),
        (Image.fromarray(rgb[..., 1]), np.int64(1)),
        (rgb, 0),
        (Image.fromarray(rgb).convert("RGBA"), 2),
    ]
    dataset = ToyDataset(items, classes=["a", "b", "c"], targets=[0, 1, 2, 1, 0, 2])
    src = IndexableSource(dataset)
    assert isinstance(src, Source)
    assert src.name == "ToyDataset" and src.classes == ["a", "b", "c"] and len(src) == 6
    np.testing.assert_array_equal(src.labels, [0, 1, 2, 1, 0, 2])
    np.testing.assert_array_equal(src[0][0], rgb)
    np.testing.assert_array_equal(src[1][0], palette[np.asarray(palette_image)])
    np.testing.assert_array_equal(src[2][0], np.asarray(Image.fromarray(cmyk, "CMYK").convert("RGB")))
    np.testing.assert_array_equal(src[3][0], np.repeat(rgb[..., 1:2], 3, axis=2))
    assert src[3][1] == 1 and type(src[3][1]) is int
    np.testing.assert_array_equal(src[4][0], rgb)
    np.testing.assert_array_equal(src[5][0], rgb)


def test_indexable_source_labels_without_targets(photos):
    images = crops(photos, 4, 8, seed=10)
    src = IndexableSource(ToyDataset([(images[i], 3 - i) for i in range(4)]), name="plain")
    assert src.classes is None
    np.testing.assert_array_equal(src.labels, [3, 2, 1, 0])


def test_indexable_source_errors(photos):
    image = crops(photos, 1, 8, seed=11)[0]
    src = IndexableSource(ToyDataset([image, (image, 1.5), ("not an image", 0), (image, 0, 1)]), name="broken")
    with pytest.raises(SourceError, match="sample 0 of broken: expected an \\(image, label\\) pair"):
        src[0]
    with pytest.raises(SourceError, match="sample 1 of broken: the label must be an integer"):
        src[1]
    with pytest.raises(SourceError, match="sample 2 of broken: the image is a str"):
        src[2]
    with pytest.raises(SourceError, match="sample 3 of broken"):
        src[3]
    torch = pytest.importorskip("torch")
    tensors = IndexableSource(ToyDataset([(torch.zeros(3, 8, 8), 0)]))
    with pytest.raises(SourceError, match="torch tensor"):
        tensors[0]


# -- CIFAR --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cifar_arrays(photos):
    """Real-photo 32x32 crops: 53 train (uneven batches), 11 test."""
    rng = np.random.default_rng(12)
    return {
        "train_images": crops(photos, 53, 32, seed=13),
        "test_images": crops(photos, 11, 32, seed=14),
        "train_labels": rng.integers(0, 10, 53),
        "test_labels": rng.integers(0, 10, 11),
        "train_fine": rng.integers(0, 100, 53),
        "test_fine": rng.integers(0, 100, 11),
        "train_coarse": rng.integers(0, 20, 53),
        "test_coarse": rng.integers(0, 20, 11),
    }


@pytest.fixture()
def cifar10(tmp_path, cifar_arrays):
    a = cifar_arrays
    return write_cifar10_folder(
        tmp_path / "cifar-10-batches-py", a["train_images"], a["train_labels"], a["test_images"], a["test_labels"]
    )


@pytest.fixture()
def cifar100(tmp_path, cifar_arrays):
    a = cifar_arrays
    return write_cifar100_folder(
        tmp_path / "cifar-100-python",
        a["train_images"],
        a["train_fine"],
        a["train_coarse"],
        a["test_images"],
        a["test_fine"],
        a["test_coarse"],
    )


def test_fixture_has_the_official_pickle_structure(cifar10, cifar_arrays):
    """What the dataset page's ``pickle.load(f, encoding='bytes')`` and torchvision's ``encoding='latin1'`` see."""
    assert sorted(os.listdir(cifar10)) == [
        "batches.meta",
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "readme.html",
        "test_batch",
    ]
    raw = open(os.path.join(cifar10, "data_batch_1"), "rb").read()
    ops = list(pickletools.genops(raw))
    assert ops[0][0].name == "PROTO" and ops[0][1] == 2
    assert {arg for op, arg, _ in ops if op.name == "GLOBAL"} == {
        "numpy.core.multiarray _reconstruct",
        "numpy ndarray",
        "numpy dtype",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy 2 warns on the numpy.core name
        as_bytes = pickle.loads(raw, encoding="bytes")
        as_latin1 = pickle.loads(raw, encoding="latin1")
    assert list(as_bytes) == [b"batch_label", b"labels", b"data", b"filenames"]
    assert as_bytes[b"batch_label"] == b"training batch 1 of 5"
    assert as_bytes[b"data"].dtype == np.uint8 and as_bytes[b"data"].shape == (11, 3072)
    first = cifar_arrays["train_images"][0]
    np.testing.assert_array_equal(as_bytes[b"data"][0, :1024].reshape(32, 32), first[..., 0])  # red plane first
    np.testing.assert_array_equal(as_bytes[b"data"][0, 2048:].reshape(32, 32), first[..., 2])
    assert as_bytes[b"labels"] == list(cifar_arrays["train_labels"][:11])
    np.testing.assert_array_equal(as_latin1["data"], as_bytes[b"data"])
    meta = read_cifar_pickle(os.path.join(cifar10, "batches.meta"))
    assert meta == {
        "num_cases_per_batch": 11,
        "label_names": [n.encode() for n in CIFAR10_LABEL_NAMES],
        "num_vis": 3072,
    }


@pytest.mark.parametrize("train", [True, False])
def test_cifar10_round_trip(cifar10, cifar_arrays, train):
    split = "train" if train else "test"
    src = CIFARSource(cifar10, train=train)
    assert isinstance(src, Source) and src.variant == "cifar10" and src.name == f"cifar10-{split}"
    assert src.classes == list(CIFAR10_LABEL_NAMES)
    images, labels = cifar_arrays[f"{split}_images"], cifar_arrays[f"{split}_labels"]
    assert len(src) == len(images)
    np.testing.assert_array_equal(src.labels, labels)
    for i in range(len(src)):
        image, label = src[i]
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and image.flags.c_contiguous
        np.testing.assert_array_equal(image, images[i])
        assert label == labels[i]
    assert "sample 4 of cifar10-" in src.describe(4)


def test_cifar_class_names_reach_the_dataset(tmp_path, cifar10):
    from ffload.convert import convert_dataset
    from ffload.formats import open_dataset

    dst = convert_dataset(CIFARSource(cifar10, train=False), str(tmp_path / "c.beton"), progress=False).dst
    assert open_dataset(dst).info["classes"] == list(CIFAR10_LABEL_NAMES)


@pytest.mark.parametrize("label_kind", ["fine", "coarse"])
def test_cifar100_round_trip(cifar100, cifar_arrays, label_kind):
    for train, split in ((True, "train"), (False, "test")):
        src = CIFARSource(cifar100, train=train, label_kind=label_kind)
        assert src.variant == "cifar100"
        assert len(src.classes) == (100 if label_kind == "fine" else 20)
        np.testing.assert_array_equal(src.labels, cifar_arrays[f"{split}_{label_kind}"])
        np.testing.assert_array_equal(np.stack([src[i][0] for i in range(len(src))]), cifar_arrays[f"{split}_images"])


def test_cifar_source_pickles_without_pixels(cifar10, cifar_arrays):
    src = CIFARSource(cifar10)
    payload = pickle.dumps(src)
    assert len(payload) < cifar_arrays["train_images"].nbytes // 10
    clone = pickle.loads(payload)
    np.testing.assert_array_equal(clone[52][0], cifar_arrays["train_images"][52])
    np.testing.assert_array_equal(clone.labels, src.labels)


def test_cifar_folder_detection(tmp_path, cifar10, cifar100):
    assert find_cifar_folder(cifar10) == (cifar10, "cifar10")
    assert find_cifar_folder(cifar100) == (cifar100, "cifar100")
    assert is_cifar_folder(tmp_path)  # torchvision's root, holding cifar-10-batches-py
    assert not is_cifar_folder(tmp_path / "cifar-10-batches-py" / "data_batch_1")
    (tmp_path / "images").mkdir()
    assert not is_cifar_folder(tmp_path / "images")


def test_cifar_missing_batch_named(cifar10):
    os.remove(os.path.join(cifar10, "data_batch_3"))
    with pytest.raises(SourceError, match=r"data_batch_3: CIFAR file is missing"):
        CIFARSource(cifar10)
    assert len(CIFARSource(cifar10, train=False)) == 11  # the test split is intact


def test_cifar_corrupt_batch_named(cifar10):
    path = os.path.join(cifar10, "data_batch_2")
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[: len(raw) // 2])
    with pytest.raises(SourceError, match=r"data_batch_2: corrupt CIFAR file"):
        CIFARSource(cifar10)


@pytest.mark.parametrize(
    "content,fragment",
    [
        ({b"labels": [0, 1], b"data": np.zeros((2, 100), np.uint8)}, "(N, 3072) uint8"),
        ({b"labels": [0], b"data": np.zeros((2, 3072), np.uint8)}, "must hold 2 integers"),
        ({b"labels": [0, 10], b"data": np.zeros((2, 3072), np.uint8)}, "outside [0, 10)"),
        ({b"labels": [0, 1]}, "expected 'data' and 'labels'"),
        ([1, 2, 3], "expected a pickled dict"),
    ],
)
def test_cifar_malformed_batch(cifar10, content, fragment):
    with open(os.path.join(cifar10, "test_batch"), "wb") as f:
        f.write(py2_pickle(content))
    with pytest.raises(SourceError) as info:
        CIFARSource(cifar10, train=False)
    assert "test_batch" in str(info.value) and fragment in str(info.value)


class _Exploit:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize(
    "make",
    [
        lambda marker: _Exploit(os.system, f"touch {marker}"),
        lambda marker: {b"data": _Exploit(eval, f"open({str(marker)!r}, 'w')"), b"labels": []},
        lambda marker: _Exploit(np.save, str(marker), np.zeros(1)),
    ],
)
def test_cifar_malicious_pickle_refused(tmp_path, cifar10, make):
    marker = tmp_path / "pwned"
    with open(os.path.join(cifar10, "data_batch_1"), "wb") as f:
        pickle.dump(make(marker), f, protocol=2)
    with pytest.raises(SourceError, match=r"data_batch_1: refusing to unpickle"):
        CIFARSource(cifar10)
    assert not marker.exists() and not (tmp_path / "pwned.npy").exists()


def test_cifar_label_kind_checked(cifar10, cifar100):
    with pytest.raises(SourceError, match="label_kind"):
        CIFARSource(cifar10, label_kind="coarse")
    with pytest.raises(SourceError, match="label_kind"):
        CIFARSource(cifar100, label_kind="medium")
    with pytest.raises(SourceError, match="not a CIFAR python folder"):
        CIFARSource(os.path.dirname(os.path.dirname(cifar10)))


# -- detect_source ------------------------------------------------------------------------------------------------


def test_detect_source(tmp_path, cifar10, cifar100, image_folder, cifar_arrays):
    src = detect_source(cifar10)
    assert isinstance(src, CIFARSource) and src.variant == "cifar10" and len(src) == 53
    test = detect_source(tmp_path, split="test")  # torchvision root: cifar-10-batches-py found first
    assert test.variant == "cifar10" and len(test) == 11
    coarse = detect_source(cifar100, kind="cifar100", split="test", label_kind="coarse")
    np.testing.assert_array_equal(coarse.labels, cifar_arrays["test_coarse"])
    root, expected = image_folder
    folder = detect_source(root)
    assert isinstance(folder, ImageFolderSource) and len(folder) == len(expected)


def test_detect_source_image_folder_splits(tmp_path, photos, caplog):
    pixels = iter(crops(photos, 4, 12, seed=15))
    for split in ("train", "val"):
        for cls in ("x", "y"):
            (tmp_path / split / cls).mkdir(parents=True)
            Image.fromarray(next(pixels)).save(tmp_path / split / cls / "0.png")
    with caplog.at_level("WARNING"):
        whole = detect_source(tmp_path)
    assert whole.classes == ["train", "val"] and "look like dataset splits" in caplog.text
    val = detect_source(tmp_path, split="val")
    assert val.classes == ["x", "y"] and val.root == str(tmp_path / "val")
    with pytest.raises(SourceError, match="no split folder 'test'"):
        detect_source(tmp_path, split="test")


def test_detect_source_errors(tmp_path, cifar10, cifar100):
    with pytest.raises(SourceError, match="no such file or folder"):
        detect_source(tmp_path / "missing")
    with pytest.raises(SourceError, match="unknown dataset kind"):
        detect_source(cifar10, kind="mnist")
    with pytest.raises(SourceError, match="asked for cifar100, but this is a cifar10 folder"):
        detect_source(cifar10, kind="cifar100")
    with pytest.raises(SourceError, match="split must be 'train' or 'test'"):
        detect_source(cifar100, split="val")
    with pytest.raises(SourceError, match="no class subfolders"):
        detect_source(cifar10, kind="imagefolder")  # forced: the batch files are not class folders


def test_cifar_repickled_by_numpy2_is_read(tmp_path):
    """Archives re-pickled under numpy 2 name numpy._core.multiarray._reconstruct: admitted too."""
    import pickle

    from ffload.convert.sources.cifar import read_cifar_pickle

    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    path = tmp_path / "data_batch_1"
    with open(path, "wb") as f:
        pickle.dump({b"data": data, b"labels": [3, 4]}, f, protocol=4)
    assert b"numpy._core" in path.read_bytes()
    batch = read_cifar_pickle(str(path))
    np.testing.assert_array_equal(batch["data"], data)
