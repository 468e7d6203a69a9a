"""ImageNet class-folder reader and ImageNet-Segmentation .mat reader on small written fixtures."""
import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.imagenet import ImageNetDataModule
from datamodules.imagenet_segmentation import ImageNetSegmentationDataModule

torch.set_num_threads(1)
WNIDS = ["n01440764", "n01443537", "n15075141"]  # class 0, 1 and 999 of ImageNet-1k


def _jpeg(path, colour, size=(40, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, "JPEG")


@pytest.fixture
def imagenet_root(tmp_path):
    root = tmp_path / "imagenet"
    for c, wnid in enumerate(WNIDS):
        for i in range(3 if c != 1 else 2):
            _jpeg(root / "val" / wnid / f"ILSVRC2012_val_{c}{i:04d}.JPEG", (200, 20 * c, 10 * i))
            _jpeg(root / "train" / wnid / f"{wnid}_{i}.JPEG", (10, 20, 30), size=(50, 60))
    return root


def test_folder_reader_labels_layout_and_batches(imagenet_root):
    dm = ImageNetDataModule(str(imagenet_root), image_size=32, batch_size=4)
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    assert batch["image"].shape == (4, 3, 32, 32) and batch["image"].dtype == torch.float32
    assert 0.0 <= float(batch["image"].min()) and float(batch["image"].max()) <= 1.0
    labels = [label for _, label in dm.dataset("eval").samples]
    assert labels == [0, 0, 0, 1, 1, 999, 999, 999]  # standard index of the wnid, sorted by class then file
    assert batch["index"].tolist() == [0, 1, 2, 3]
    # Resize((32, 32)) squash of a uniform image keeps its colour (JPEG error aside), not normalised
    assert float(batch["image"][0, 0].mean()) == pytest.approx(200 / 255, abs=0.02)


def test_fixed_subset_per_class_is_seeded(imagenet_root):
    a = ImageNetDataModule(str(imagenet_root), images_per_class=2, subset_seed=3, image_size=16).dataset("eval").samples
    b = ImageNetDataModule(str(imagenet_root), images_per_class=2, subset_seed=3, image_size=16).dataset("eval").samples
    assert a == b and len(a) == 6
    assert [label for _, label in a] == [0, 0, 1, 1, 999, 999]
    others = {tuple(ImageNetDataModule(str(imagenet_root), images_per_class=1, subset_seed=s).dataset("eval").samples)
              for s in range(8)}
    assert len(others) > 1  # the seed changes the subset


def test_timm_preprocessing_and_train_split(imagenet_root):
    cfg = {"input_size": (3, 24, 24), "interpolation": "bicubic", "crop_pct": 0.75, "crop_mode": "center"}
    dm = ImageNetDataModule(str(imagenet_root), preprocessing="timm", batch_size=2)
    with pytest.raises(ValueError, match="data config"):
        dm.dataset("eval")
    dm.set_model_data_config(cfg)
    assert dm.dataset("eval")[0]["image"].shape == (3, 24, 24)
    transform = dm.dataset("eval").transform
    assert transform.transforms[0].size == 32  # floor(24 / 0.75): shorter side, then the centre crop
    train = ImageNetDataModule(str(imagenet_root), image_size=20, batch_size=2)
    train.setup("fit")
    assert next(iter(train.train_dataloader()))["image"].shape == (2, 3, 20, 20)


def test_clear_errors(imagenet_root, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*<wnid>"):
        ImageNetDataModule(str(tmp_path / "nowhere")).setup("test")
    flat = tmp_path / "flat"
    _jpeg(flat / "val" / "ILSVRC2012_val_00000001.JPEG", (0, 0, 0))
    with pytest.raises(ValueError, match="class-folder layout"):
        ImageNetDataModule(str(flat)).setup("test")
    bad = tmp_path / "bad"
    _jpeg(bad / "val" / "cats" / "a.JPEG", (0, 0, 0))
    with pytest.raises(ValueError, match="not ImageNet-1k wnids"):
        ImageNetDataModule(str(bad)).setup("test")
    dm = ImageNetDataModule(str(imagenet_root), image_size=16)
    corrupt = dm.dataset("eval").samples[0][0]
    open(corrupt, "wb").write(b"not a jpeg")
    with pytest.raises(RuntimeError, match="cannot read image .*ILSVRC2012_val_00000.JPEG"):
        dm.dataset("eval")[0]


def _chars(text):
    return np.array([[ord(c)] for c in text], dtype=np.uint16)  # MATLAB char column


def write_gtsegs(path, images, masks, wnids):
    """A file with the layout of gtsegs_ijcv.mat: object references, the gt cell indirection, uint16 chars."""
    ref = h5py.special_dtype(ref=h5py.Reference)
    with h5py.File(path, "w") as f:
        refs = f.create_group("#refs#")
        value = f.create_group("value")
        n = len(images)
        for key in ("img", "gt", "target", "id"):
            value.create_dataset(key, (n, 1), dtype=ref)
        for i, (img, mask, wnid) in enumerate(zip(images, masks, wnids)):
            d_img = refs.create_dataset(f"img{i}", data=img.transpose(2, 1, 0))  # stored (3, W, H)
            d_mask = refs.create_dataset(f"mask{i}", data=mask.transpose(1, 0))  # stored (W, H)
            cell = refs.create_dataset(f"cell{i}", (1, 1), dtype=ref)
            cell[0, 0] = d_mask.ref
            value["img"][i, 0] = d_img.ref
            value["gt"][i, 0] = cell.ref
            value["target"][i, 0] = refs.create_dataset(f"target{i}", data=_chars(wnid)).ref
            value["id"][i, 0] = refs.create_dataset(f"id{i}", data=_chars(f"img_{i}")).ref


def test_mat_reader(tmp_path):
    rng = np.random.default_rng(0)
    h, w = 6, 10  # non-square: a wrong transpose cannot pass
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(3)]
    masks = [np.zeros((h, w), np.uint8) for _ in range(3)]
    for i, m in enumerate(masks):
        m[:, : 3 + i] = 1  # left columns are the object
    path = tmp_path / "gtsegs_ijcv.mat"
    write_gtsegs(path, images, masks, [WNIDS[0], WNIDS[2], WNIDS[1]])
    dm = ImageNetSegmentationDataModule(str(path), image_size=20, batch_size=3)
    dm.setup("test")
    raw_img, raw_mask, wnid, image_id = dm.dataset().raw(1)
    assert np.array_equal(raw_img, images[1]) and np.array_equal(raw_mask, masks[1])
    assert (wnid, image_id) == (WNIDS[2], "img_1")
    batch = next(iter(dm.test_dataloader()))
    assert batch["image"].shape == (3, 3, 20, 20) and batch["mask"].shape == (3, 20, 20)
    assert batch["label"].tolist() == [0, 999, 1]
    assert set(batch["mask"].unique().tolist()) <= {0.0, 1.0}
    # NEAREST resize of "first 3 of 10 columns" to 20 columns: columns 0..5 are foreground, every row
    assert batch["mask"][0, :, :6].min() == 1 and batch["mask"][0, :, 6:].max() == 0
    assert ImageNetSegmentationDataModule(str(path), limit=2).dataset().__len__() == 2


def test_mat_reader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.mat"):
        ImageNetSegmentationDataModule(str(tmp_path / "missing.mat")).setup("test")
    wrong = tmp_path / "wrong.mat"
    with h5py.File(wrong, "w") as f:
        f.create_dataset("value/img", data=np.zeros((1, 1)))
    with pytest.raises(ValueError, match="lacks /value/gt"):
        ImageNetSegmentationDataModule(str(wrong)).setup("test")
    text = tmp_path / "text.mat"
    text.write_text("MATLAB 5.0 MAT-file")
    with pytest.raises(ValueError, match="not an HDF5"):
        ImageNetSegmentationDataModule(str(text)).setup("test")
