"""Model directories: what loads, what is refused and why, and that weights are not copied."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from basal.core.errors import ModelDirError
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import SYSTEM, USER
from basal.core.model.safetensors_io import read_header


@pytest.fixture
def model_copy(demo_dir, tmp_path):
    path = tmp_path / "model"
    shutil.copytree(demo_dir, path)
    return path


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data))


def test_demo_directory_loads(demo_model):
    assert demo_model.synthetic and demo_model.name == "basal-synthetic-demo"
    assert demo_model.calibration.temperature("noul") == pytest.approx(1.3939382634489992)
    assert demo_model.calibration.temperature("weird") == 1.0
    assert demo_model.bos == "<s>"


def test_weights_are_memory_mapped_not_copied(demo_model):
    weights = demo_model.open_weights()
    f, name = weights["lm_head.weight"]
    dtype, array = f.tensor(name)
    assert dtype == "BF16" and array.shape == (demo_model.config.vocab_size, demo_model.config.hidden_size)
    assert isinstance(array.base, np.memmap) or isinstance(array, np.memmap)
    assert not array.flags.writeable


@pytest.mark.parametrize(
    ("file", "changes", "message"),
    [
        ("config.json", {"model_type": "mistral"}, "model_type"),
        ("config.json", {"tie_word_embeddings": True}, "tie_word_embeddings"),
        ("config.json", {"hidden_act": "gelu"}, "hidden_act"),
        ("config.json", {"rope_parameters": None, "rope_theta": 10000.0}, "rope_parameters"),
        ("config.json", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ("config.json", {"attention_bias": True, "mlp_bias": False}, "bias"),
        ("basal.json", {"readout": {"kind": "generate", "letters": "ABCDEFGHIJ", "prefill": '{"answer": "'}}, "kind"),
        (
            "basal.json",
            {
                "readout": {
                    "kind": "letter logits",
                    "letters": "ABCD",
                    "prefill": '{"answer": "',
                    "templates": "basal-1.0 (unchanged prompt contract)",
                }
            },
            "letters",
        ),
        (
            "basal.json",
            {
                "readout": {
                    "kind": "letter logits",
                    "letters": "ABCDEFGHIJ",
                    "prefill": '{"answer": "',
                    "templates": {"pl": {"system": "Inny", "user": "x"}},
                }
            },
            "prompt contract",
        ),
        ("basal.json", {"readout": None}, "readout"),
    ],
)
def test_refused_with_a_reason(model_copy, file, changes, message):
    _edit_json(model_copy / file, **changes)
    with pytest.raises(ModelDirError, match=message):
        ModelDir.load(model_copy)


def test_basal_1_0_templates_object_is_accepted(model_copy):
    templates = {lang: {"system": SYSTEM[lang], "user": USER[lang]} for lang in ("pl", "en")}
    readout = {"kind": "letter logits", "letters": "ABCDEFGHIJ", "prefill": '{"answer": "', "templates": templates}
    _edit_json(model_copy / "basal.json", readout=readout)
    assert ModelDir.load(model_copy).name == "basal-synthetic-demo"


def test_chat_template_must_match(model_copy):
    (model_copy / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(ModelDirError, match="chat template"):
        ModelDir.load(model_copy)


def test_missing_files_are_named(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelDirError, match=r"model\.safetensors"):
        ModelDir.load(model_copy)
    with pytest.raises(ModelDirError, match="no such model directory"):
        ModelDir.load(model_copy / "nope")


def test_missing_calibration_means_t_1(model_copy):
    (model_copy / "CALIBRATION.json").unlink()
    assert ModelDir.load(model_copy).calibration.temperature("choice") == 1.0


def test_sharded_index_and_shape_check(model_copy):
    (model_copy / "model.safetensors").rename(model_copy / "model-00001-of-00001.safetensors")
    tensors, _, _ = read_header(model_copy / "model-00001-of-00001.safetensors")
    (model_copy / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": dict.fromkeys(tensors, "model-00001-of-00001.safetensors")})
    )
    model = ModelDir.load(model_copy)
    assert len(model.open_weights()) == len(tensors)
    _edit_json(model_copy / "config.json", intermediate_size=64)
    with pytest.raises(ModelDirError, match="shape"):
        ModelDir.load(model_copy).open_weights()
