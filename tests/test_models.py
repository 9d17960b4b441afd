"""The papers' models have the parameter counts their architectures give, and run on their datasets' shapes."""

import pytest
import torch

from normfl import models

CASES = [  # (builder, kwargs, input shape, d: the parameter count of the papers' model)
    (models.resnet20, {}, (3, 32, 32), 269_722),                          # NORMEC §6, App. I.1 (Idelbayev's)
    (models.resnet20, {"norm": "group"}, (3, 32, 32), 269_722),
    (models.mlp, {"hidden": [300, 300]}, (1, 28, 28), 328_810),           # NFA Sec. 6: hidden layers of 300 / 600
    (models.mlp, {"hidden": [600, 600]}, (3, 32, 32), 2_210_410),
    (models.cnn, {}, (1, 28, 28), 582_026),                               # ALI: the authors' CNN (reading C-A6)
    (models.cnn, {}, (3, 32, 32), 878_538),
    (models.logreg, {}, (1, 28, 28), 7_850),
]


@pytest.mark.parametrize("builder, kw, shape, d", CASES)
def test_parameter_count_and_forward(builder, kw, shape, d):
    model = builder(shape, 10, **kw)
    assert sum(p.numel() for p in model.parameters()) == d
    assert model(torch.zeros(2, *shape)).shape == (2, 10)


def test_logreg_zero_init_and_bad_options():
    model = models.logreg((1, 4, 4), 3, init="zeros")
    assert all((p == 0).all() for p in model.parameters())
    with pytest.raises(ValueError, match="model.init"):
        models.logreg((1, 4, 4), 3, init="ones")
    with pytest.raises(ValueError, match="model.norm"):
        models.resnet20((3, 32, 32), 10, norm="layer")
