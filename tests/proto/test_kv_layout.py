import pytest
import torch

from radixmesh.proto.kv_layout import KVLayout


def _layout(**kw: object) -> KVLayout:
    base: dict[str, object] = {
        "model_id": "m", "num_layers": 2, "num_kv_heads": 4, "head_dim": 8, "dtype": "float16", "block_size": 16
    }
    base.update(kw)
    return KVLayout(**base)  # type: ignore[arg-type]


def test_block_bytes_counts_k_and_v_of_every_layer() -> None:
    assert _layout().block_bytes == 2 * 2 * 16 * 4 * 8 * 2


def test_cache_blocks_are_contiguous_across_layers() -> None:
    layout = _layout()
    kv = layout.new_cache(3)
    assert kv.shape == (3, 2, 2, 16, 4, 8)
    assert kv[1].is_contiguous() and kv[1].numel() * kv.element_size() == layout.block_bytes
    assert kv.dtype == torch.float16


def test_fingerprint_separates_layouts_and_is_stable() -> None:
    assert _layout().fingerprint() == _layout().fingerprint()
    assert _layout().fingerprint() != _layout(block_size=32).fingerprint()
    assert _layout().fingerprint() != _layout(model_id="other").fingerprint()


@pytest.mark.parametrize("field,value", [("dtype", "int8"), ("block_size", 0), ("num_layers", -1)])
def test_bad_layout_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        _layout(**{field: value})
