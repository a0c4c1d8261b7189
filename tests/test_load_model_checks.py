"""``load_model`` on edited or wrongly typed options: checked against the stored shapes before building (on the
meta device only), refused in one line (issue 35).
"""
import pytest
import torch
from training_runs import network_checkpoint

import encoding


def test_load_model_checks_edited_options_against_the_stored_shapes_before_building(tmp_path, monkeypatch):
    from encoding import load_model
    from encoding.models.network import NetworkSpec
    from encoding.utils.checkpoint import CheckpointError

    path = network_checkpoint(tmp_path / "model_best.pth", "deeplabv3plus", head_channels=16)
    data = torch.load(path, weights_only=True)
    data["args"]["head_channels"] = 10 ** 7  # the edit: a network of tens of GB
    torch.save(data, path)
    built = []
    real = NetworkSpec.build
    monkeypatch.setattr(NetworkSpec, "build", lambda spec, device=None: built.append(str(torch.get_default_device()))
                        or real(spec, device))
    with pytest.raises(CheckpointError, match="shape mismatch") as err:
        load_model(path)
    assert "\n" not in str(err.value) and "model_best.pth" in str(err.value)
    assert built == ["meta"]  # only the meta twin was built: no memory asked for


@pytest.mark.parametrize("options", [dict(model=3), dict(backbone=["vgg_tiny"]), dict(dataset=None, aux="yes"),
                                     dict(head_channels=-4), dict(crop_size=True), dict(output_stride=8.0)])
def test_load_model_refuses_options_of_the_wrong_type_in_one_line(options, tmp_path):
    from encoding import load_model

    path = network_checkpoint(tmp_path / "model_best.pth", "fcn")
    with pytest.raises(ValueError, match="network option") as err:
        load_model(path, **options)
    assert "\n" not in str(err.value)


def test_load_model_refuses_edited_recorded_options_in_one_line(tmp_path):
    from encoding import load_model

    path = network_checkpoint(tmp_path / "model_best.pth", "fcn")
    data = torch.load(path, weights_only=True)
    data["args"]["model"] = {"name": "fcn"}
    torch.save(data, path)
    with pytest.raises(ValueError, match="network option 'model' must be a name") as err:
        load_model(path)
    assert "model_best.pth" in str(err.value)
    with pytest.raises(ValueError, match="source must be"):
        load_model(3)


def test_load_model_refuses_a_backbone_for_a_spec_network_and_a_dataset_of_other_classes(tmp_path):
    """Both were accepted and ignored: the spec network was built without the backbone, and the recorded classes
    were kept under another dataset's name; each was written on into the model's info (export metadata,
    save_pretrained's config)."""
    from encoding import load_model
    from encoding.datasets.shapes import SHAPES_CLASSES
    from encoding.errors import UsageError

    path = network_checkpoint(tmp_path / "model_best.pth", "fcn")
    data = torch.load(path, weights_only=True)
    data["args"]["classes"] = list(SHAPES_CLASSES)
    torch.save(data, path)
    with pytest.raises(UsageError, match=r"dataset='pascal_voc'\): the network was trained on 'shapes' and outputs "
                                         r"its 7 classes, not pascal_voc's 21"):
        load_model(path, dataset="pascal_voc")
    assert load_model(path, dataset="shapes").info.classes == tuple(SHAPES_CLASSES)
    data["args"]["model"] = "torchvision:lraspp_mobilenet_v3_large"
    torch.save(data, path)
    with pytest.raises(UsageError, match=r"backbone='resnet50'\): the model spec "
                                         r"torchvision:lraspp_mobilenet_v3_large has no backbone"):
        load_model(path, backbone="resnet50")


@pytest.mark.parametrize("field,value", [("threshold", "0.3"), ("threshold", 0), ("ignore_index", "x"),
                                         ("classes", 5), ("classes", [1, 2]), ("palette", [[1, 2]] * 7),
                                         ("palette", [[0, 0, 0]] * 3), ("palette", [[2.7, 0, 0]] * 7)])
def test_load_model_refuses_a_recorded_label_field_of_the_wrong_value_naming_the_file(field, value, tmp_path):
    """Before: a threshold of "0.3" was read as 0.3, one of 0 as 0.5, a palette's 2.7 as 2 and a palette of 3 colours
    for 7 classes loaded; the other edits failed with a message (or a TypeError) that named no file."""
    from encoding import load_model
    from encoding.errors import UsageError

    path = network_checkpoint(tmp_path / "model_best.pth", "fcn")
    data = torch.load(path, weights_only=True)
    data["args"].update(binary=field == "threshold", **{field: value})
    torch.save(data, path)
    with pytest.raises(UsageError) as err:
        load_model(path)
    message = str(err.value)
    assert "\n" not in message and "model_best.pth" in message and field in message


def test_the_offline_weights_message_names_options_that_exist(monkeypatch):
    """Before: it said ``pretrained='path/to/weights.pth'``, which ``load_model`` refuses as an unknown option."""
    import torchvision

    from encoding.models.weights import WeightsUnavailable, fetch_torchvision_weights

    def offline(self, *args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(torchvision.models.WeightsEnum, "get_state_dict", offline)
    with pytest.raises(WeightsUnavailable) as caught:
        fetch_torchvision_weights(torchvision.models.ResNet18_Weights.IMAGENET1K_V1)
    message = str(caught.value)
    assert "pretrained=" not in message.replace("pretrained_backbone=", "")
    assert "--pretrained-backbone FILE" in message and "encoding.load_model(name, weights='FILE')" in message
    with pytest.raises(FileNotFoundError, match="weights file not found"):  # the keyword it names is load_model's
        encoding.load_model("fcn_resnet50_voc", weights="/nonexistent/weights.pth")
