"""torchvision-style augmentations (ffload.loaders.transforms: flip, crop, erase, color, warp) against
independent references on real photos, with the parameters each operation drew: OpenCV and PIL for
colour and blur, ``scipy.ndimage.map_coordinates`` (exact float bilinear) for the warps, and
geometric identities for the matrices. torchvision itself does not import with the CPU torch of our machines."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from PIL import Image, ImageEnhance
from scipy import ndimage
from skimage import data
from test_transforms import context, run

import ffload
from ffload.formats import IntField, RGBImageField, write_dataset
from ffload.loaders import SimpleRGBImageDecoder, ToTensor
from ffload.loaders.rng import seed_state, uniform
from ffload.loaders.transforms.color import ColorJitter, GaussianBlur, RandomGrayscale
from ffload.loaders.transforms.crop import RandomCrop
from ffload.loaders.transforms.erase import RandomErasing
from ffload.loaders.transforms.flip import RandomVerticalFlip
from ffload.loaders.transforms.warp import RandomAffine, RandomPerspective, RandomRotation, _warp_rgb

H, W = 48, 55  # the photos' size


@pytest.fixture(scope="module")
def photos():
    """(16, H, W, 3) uint8 crops of real photos (astronaut, coffee, chelsea); W = 55 is not a
    multiple of 4, so the RGB kernels' 4-pixel shuffles (:mod:`ffload._jit.simd`) leave a
    per-pixel tail in every row."""
    sources = [data.astronaut(), data.coffee(), data.chelsea()]
    return np.stack([sources[k % 3][9 * k : 9 * k + H, 13 * k : 13 * k + W] for k in range(16)])


def _declared(op, x):
    run(op, x[:1], context(1))  # declare (sets the salt) on the same spec
    return op


# ---------------------------------------------------------------- flips, grayscale
def test_vertical_flip_flips_exactly_the_drawn_samples(photos):
    ctx = context(len(photos))
    op = _declared(RandomVerticalFlip(0.5), photos)
    out = run(op, photos, ctx)
    drawn = [uniform(np.uint64(seed_state(s, op.salt)))[0] < 0.5 for s in ctx.seeds]
    assert 0 < sum(drawn) < len(photos)
    for b, flipped in enumerate(drawn):
        np.testing.assert_array_equal(out[b], photos[b][::-1] if flipped else photos[b])


def test_grayscale_is_opencv_luma(photos):
    out = run(_declared(RandomGrayscale(1.0), photos), photos, context(len(photos)))
    for b in range(len(photos)):
        ref = cv2.cvtColor(photos[b], cv2.COLOR_RGB2GRAY).astype(int)
        assert np.all(out[b] == out[b][..., :1])  # three equal channels
        assert np.abs(out[b][..., 0].astype(int) - ref).max() <= 1  # 0.2989 vs 0.299, truncation


# ---------------------------------------------------------------- colour jitter
def _pil_reference(img: np.ndarray, order, factors) -> np.ndarray:
    """PIL's ImageEnhance (torchvision's PIL path) for brightness/contrast/saturation, OpenCV's float
    HSV for hue, applied in the drawn order."""
    for fn in order:
        f = factors[fn]
        if fn == 0:
            img = np.asarray(ImageEnhance.Brightness(Image.fromarray(img)).enhance(f))
        elif fn == 1:
            img = np.asarray(ImageEnhance.Contrast(Image.fromarray(img)).enhance(f))
        elif fn == 2:
            img = np.asarray(ImageEnhance.Color(Image.fromarray(img)).enhance(f))
        else:
            hsv = cv2.cvtColor(img.astype(np.float32) / 255, cv2.COLOR_RGB2HSV)
            hsv[..., 0] = (hsv[..., 0] + 360 * f) % 360
            img = (cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB) * 255).astype(np.uint8)
    return img


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(brightness=0.4),
        dict(contrast=0.4),
        dict(saturation=0.6),
        dict(hue=0.2),
        dict(brightness=0.2, contrast=0.2, saturation=0.2, hue=0.2),
    ],
)
def test_color_jitter_matches_pil_and_opencv_with_the_drawn_factors(photos, kwargs):
    ctx = context(len(photos))
    op = _declared(ColorJitter(**kwargs), photos)
    params = op.params(ctx.seeds)
    out = run(op, photos, ctx)
    for b in range(len(photos)):
        order = [int(v) for v in params[b, :4]]
        assert sorted(order) == [0, 1, 2, 3]
        enabled = [fn for fn in order if op.enabled[fn]]
        ref = _pil_reference(photos[b], enabled, params[b, 4:])
        diff = np.abs(out[b].astype(int) - ref.astype(int))
        assert diff.mean() <= 1.5 and np.percentile(diff, 99) <= 4, (kwargs, b, diff.mean())
    assert not np.array_equal(out, photos)


def test_color_jitter_ranges_follow_torchvision():
    op = ColorJitter(brightness=0.3, contrast=(0.5, 0.9), saturation=2.0, hue=0.1)
    np.testing.assert_allclose(op.ranges, [[0.7, 1.3], [0.5, 0.9], [0.0, 3.0], [-0.1, 0.1]])
    with pytest.raises(ValueError):
        ColorJitter(hue=0.7)
    with pytest.raises(ValueError):
        ColorJitter(brightness=-1)


# ---------------------------------------------------------------- blur, erasing, crop
def test_gaussian_blur_matches_opencv_separable_filter(photos):
    ctx = context(len(photos))
    op = _declared(GaussianBlur(7, sigma=(0.5, 3.0)), photos)
    sigmas = op.params(ctx.seeds)
    out = run(op, photos, ctx)
    assert len(set(np.round(sigmas, 6))) == len(photos)
    for b, sigma in enumerate(sigmas):
        x = np.arange(7, dtype=np.float32) - 3
        k = np.exp(-0.5 * (x / np.float32(sigma)) ** 2)
        k = (k / k.sum()).astype(np.float32)
        ref = cv2.sepFilter2D(photos[b].astype(np.float32), -1, k, k, borderType=cv2.BORDER_REFLECT_101)
        diff = np.abs(out[b].astype(int) - np.round(ref).astype(int))
        assert diff.max() <= 1


def test_random_erasing_paints_exactly_the_drawn_box(photos):
    ctx = context(len(photos))
    op = _declared(RandomErasing(p=0.75, scale=(0.05, 0.3), fill=(1, 2, 3)), photos)
    boxes = op.params(ctx.seeds, H, W)
    out = run(op, photos, ctx)
    erased = 0
    for b, (top, left, h, w) in enumerate(boxes):
        mask = np.zeros((H, W), bool)
        mask[top : top + h, left : left + w] = True
        np.testing.assert_array_equal(out[b][~mask], photos[b][~mask])
        assert np.all(out[b][mask] == (1, 2, 3))
        if h:
            erased += 1
            assert 0 <= top and top + h < H + 1 and left + w <= W and h < H and w < W
            assert 0.05 * H * W * 0.5 <= h * w <= 0.3 * H * W * 1.5  # area fraction, rounding of h and w
    assert 0 < erased < len(photos)


def test_random_crop_is_a_window_of_the_padded_image(photos):
    op = RandomCrop((40, 40), padding=4, fill=(7, 8, 9))
    out = run(op, photos, context(len(photos)))
    positions = set()
    for b in range(len(photos)):
        padded = np.pad(photos[b], ((4, 4), (4, 4), (0, 0)))
        padded[:4], padded[-4:], padded[:, :4], padded[:, -4:] = (7, 8, 9), (7, 8, 9), (7, 8, 9), (7, 8, 9)
        found = [
            (i, j)
            for i in range(padded.shape[0] - 39)
            for j in range(padded.shape[1] - 39)
            if np.array_equal(padded[i : i + 40, j : j + 40], out[b])
        ]
        assert found, b
        positions.add(found[0])
    assert len(positions) > len(photos) // 2


def test_random_crop_refuses_images_smaller_than_the_crop(photos):
    with pytest.raises(TypeError, match="pad_if_needed"):
        run(RandomCrop(64), photos, context(len(photos)))
    assert run(RandomCrop(64, pad_if_needed=True), photos, context(len(photos))).shape == (16, 64, 64, 3)


# ---------------------------------------------------------------- warps
def _bilinear_reference(img: np.ndarray, mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact float bilinear sampling at ``mat @ (x + .5, y + .5, 1) - .5``; returns the image, the
    mask of pixels whose four taps are all inside (where fill does not blend in) and the mask of
    pixels whose taps are all outside (pure fill)."""
    h, w = img.shape[:2]
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64) + 0.5
    den = mat[2, 0] * xs + mat[2, 1] * ys + mat[2, 2]
    sx = (mat[0, 0] * xs + mat[0, 1] * ys + mat[0, 2]) / den - 0.5
    sy = (mat[1, 0] * xs + mat[1, 1] * ys + mat[1, 2]) / den - 0.5
    ref = np.stack(
        [ndimage.map_coordinates(img[..., c].astype(np.float64), [sy, sx], order=1) for c in range(img.shape[2])],
        axis=-1,
    )
    inside = (sx >= 0) & (sx <= w - 1) & (sy >= 0) & (sy <= h - 1)
    outside = (sx <= -1) | (sx >= w) | (sy <= -1) | (sy >= h)
    return ref, inside, outside


@pytest.mark.parametrize(
    "op",
    [
        RandomAffine(20),
        RandomAffine(10, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=8),
        RandomRotation(30),
        RandomPerspective(0.5, p=1.0),
    ],
    ids=["affine20", "affine-all", "rotation", "perspective"],
)
def test_warps_match_exact_bilinear_sampling(photos, op):
    ctx = context(len(photos))
    _declared(op, photos)
    mats = op.params(ctx.seeds, H, W)
    out = run(op, photos, ctx)
    for b in range(len(photos)):
        ref, inside, outside = _bilinear_reference(photos[b], mats[b])
        assert inside.mean() > 0.25
        diff = np.abs(out[b].astype(float) - ref)[inside]
        assert diff.max() <= 0.5 + 1e-4  # rounding only (of a float32 blend, torchvision's precision)
        assert np.all(out[b][outside] == 0)  # the fill


@pytest.mark.parametrize("channels", [3, 1, 4])
def test_warps_blend_the_fill_by_coverage(photos, channels):
    """Every pixel, partly covered ones included: torchvision's ``v * m + (1 - m) * fill`` with
    ``v`` the zero-padded bilinear sample and ``m`` the sampled coverage, rounded (the RGB kernel
    and the generic one)."""
    fill = (10, 200, 30, 77)[:channels]
    images = np.ascontiguousarray(np.concatenate([photos, photos[..., :1]], axis=-1)[..., :channels])
    ctx = context(len(images))
    for op in (RandomAffine(25, translate=(0.2, 0.2), scale=(0.7, 1.3), fill=fill), RandomPerspective(0.7, 1.0, fill)):
        _declared(op, images)
        mats = op.params(ctx.seeds, H, W)
        out = run(op, images, ctx)
        partial = outside = 0
        for b in range(len(images)):
            ys, xs = np.mgrid[0:H, 0:W].astype(np.float64) + 0.5
            m = mats[b]
            den = m[2, 0] * xs + m[2, 1] * ys + m[2, 2]
            sx = (m[0, 0] * xs + m[0, 1] * ys + m[0, 2]) / den - 0.5
            sy = (m[1, 0] * xs + m[1, 1] * ys + m[1, 2]) / den - 0.5
            planes = [np.ones((H, W))] + [images[b, ..., c].astype(np.float64) for c in range(channels)]
            cover, *values = [
                ndimage.map_coordinates(p, [sy, sx], order=1, mode="grid-constant", cval=0.0) for p in planes
            ]
            ref = np.stack([v * cover + (1 - cover) * f for v, f in zip(values, fill)], axis=-1)
            partial += np.count_nonzero((cover > 1e-9) & (cover < 1 - 1e-9))
            outside += np.count_nonzero(cover <= 1e-9)
            assert np.abs(out[b].astype(float) - ref).max() <= 0.5 + 1e-4  # a float32 blend, rounded
        assert partial > 100 and outside > 1000  # partly covered pixels and pure fill occur


def test_rgb_warp_samples_the_fill_where_the_homography_divides_by_zero(photos):
    """A homography whose denominator is exactly 0 on output column 24 (and negative left of
    it): that column is the fill, not an error, and the pixels whose source point is finite match
    the coverage reference as everywhere else."""
    fill = (10, 200, 30)
    mat = np.array([[0.25, 0.0, 0.0], [0.0, 0.5, 0.0], [1 / 32, 0.0, -24.5 / 32]])  # w = (x + .5 - 24.5) / 32
    out = np.zeros_like(photos[:1])
    _warp_rgb(photos[:1], out, mat[None], np.array(fill, np.float64))
    assert np.all(out[0, :, 24] == fill)
    ys, xs = np.mgrid[0:H, 0:W].astype(np.float64) + 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        den = mat[2, 0] * xs + mat[2, 2]
        sx, sy = 0.25 * xs / den - 0.5, 0.5 * ys / den - 0.5
    finite = np.isfinite(sx) & np.isfinite(sy) & (np.abs(sx) < 1e6) & (np.abs(sy) < 1e6)
    planes = [np.ones((H, W))] + [photos[0, ..., c].astype(np.float64) for c in range(3)]
    cover, *values = [
        ndimage.map_coordinates(
            p, [np.where(finite, sy, -9), np.where(finite, sx, -9)], order=1, mode="grid-constant", cval=0.0
        )
        for p in planes
    ]
    ref = np.stack([v * cover + (1 - cover) * f for v, f in zip(values, fill)], axis=-1)
    assert finite.sum() > H * W // 2 and np.count_nonzero(cover[finite] == 1) > 100
    assert np.abs(out[0].astype(float) - ref)[finite].max() <= 0.5 + 1e-4


@pytest.mark.parametrize("channels", [3, 1])
def test_warps_copy_the_samples_they_leave_alone(photos, channels):
    images = np.ascontiguousarray(photos[..., :channels])
    ctx = context(len(images))
    op = _declared(RandomPerspective(0.5, p=0.5, fill=(0,) * channels), images)
    mats = op.params(ctx.seeds, H, W)
    out = run(op, images, ctx)
    kept = [b for b in range(len(images)) if np.array_equal(mats[b], np.eye(3))]
    assert 0 < len(kept) < len(images)
    for b in range(len(images)):
        assert np.array_equal(out[b], images[b]) == (b in kept)


def test_affine_matrix_is_torchvisions_inverse():
    op = RandomAffine(0)
    op.salt = np.uint64(1)
    identity = op.params(np.arange(3, dtype=np.uint64), 48, 56)
    np.testing.assert_allclose(identity, np.broadcast_to(np.eye(3), (3, 3, 3)), atol=1e-12)
    rot = RandomAffine((30, 30))
    rot.salt = np.uint64(1)
    m = rot.params(np.arange(1, dtype=np.uint64), 48, 56)[0]
    np.testing.assert_allclose(m @ [28, 24, 1], [28, 24, 1], atol=1e-9)  # the centre is fixed
    # clockwise by 30 degrees on screen (y down): the inverse maps a point right of the centre up-right
    a = math.radians(30)
    np.testing.assert_allclose(m @ [38, 24, 1], [28 + 10 * math.cos(a), 24 - 10 * math.sin(a), 1], atol=1e-9)


def test_perspective_homography_maps_end_points_to_corners(photos):
    op = _declared(RandomPerspective(0.6, p=1.0), photos)
    seeds = context(8).seeds
    mats, corners = op.params(seeds, H, W), op.corners(seeds, H, W)
    start = np.array([[0, 0], [W - 1, 0], [W - 1, H - 1], [0, H - 1]], float)
    for m, ends in zip(mats, corners):
        for e, s in zip(ends, start):
            p = m @ [e[0], e[1], 1.0]
            np.testing.assert_allclose(p[:2] / p[2], s, atol=1e-7)
        assert np.all(np.abs(ends - start) <= [0.6 * (W // 2), 0.6 * (H // 2)])


# ---------------------------------------------------------------- in a loader
def test_deep_lake_complex_stack_in_a_loader_is_deterministic(tmp_path, photos):
    path = str(tmp_path / "p.beton")
    write_dataset(
        path,
        {"image": RGBImageField("raw"), "label": IntField()},
        [(photos[i], i) for i in range(len(photos))],
        len(photos),
    )

    def stack():
        return [
            SimpleRGBImageDecoder(),
            RandomAffine(20),
            RandomVerticalFlip(),
            RandomPerspective(0.5),
            ColorJitter(0.2, 0.2, 0.2, 0.2),
            ToTensor(),
        ]

    runs = []
    for workers in (1, 2):
        with ffload.Loader(
            path, batch_size=5, num_workers=workers, order="random", seed=3, pipelines={"image": stack()}
        ) as loader:
            runs.append([(im.numpy().copy(), lab.numpy().copy()) for im, lab in loader])
    assert len(runs[0]) == 4
    for (a, la), (b, lb) in zip(*runs):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(a, b)
    first = np.concatenate([im for im, _ in runs[0]])
    labels = np.concatenate([lab for _, lab in runs[0]])
    assert not any(np.array_equal(first[k], photos[labels[k]]) for k in range(len(labels)))


def test_declare_refuses_non_rgb_input():
    gray = np.zeros((2, 8, 8, 1), np.uint8)
    for op in (ColorJitter(0.1), RandomGrayscale()):
        with pytest.raises(TypeError, match="RGB"):
            run(op, gray, context(2))
