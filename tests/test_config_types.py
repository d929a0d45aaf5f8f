"""TrainConfig checks every value's type when it is built, one line per error, and its
fields come in the parts of `GROUPS`."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import zerognn_jax as zg
from zerognn_jax._src.training.config import GROUPS
from zerognn_jax._src.training.config_types import ConfigTypeError

FIELDS = dataclasses.fields(zg.TrainConfig)

# Wrong values per annotation: for ints a float, a numeric string and a bool.
WRONG = {
    "int": (64.0, "64", True),
    "float": ("0.1", True, None),
    "str": (3, b"sage", None),
    "bool": (1, "yes", None),
    "str | None": (3, ["a"]),
    "int | None": (16.0, "16", True),
    "bool | None": (0, "false"),
    "float | None": ("0.1", True),
    "tuple[int, ...]": ("15", (15, 2.0), 15, (True,)),
    "dict[str, tuple[int, ...]] | None": ("cites=25", {"cites": 25}, {3: (25,)},
                                          {"cites": ("25",)}, [("cites", (25,))]),
}


def _cases():
    for field in FIELDS:
        for value in WRONG[str(field.type)]:
            yield pytest.param(field.name, value, id=f"{field.name}={value!r}")


def test_every_annotation_has_wrong_values():
    assert {str(f.type) for f in FIELDS} <= set(WRONG)


@pytest.mark.parametrize("name, value", list(_cases()))
def test_a_value_of_the_wrong_type_fails_in_one_line(name, value):
    with pytest.raises(ConfigTypeError) as err:
        zg.TrainConfig(**{name: value})
    message = str(err.value)
    assert "\n" not in message
    assert f"TrainConfig.{name} must " in message and repr(value) in message
    assert isinstance(err.value, ValueError)  # the CLI reports ValueErrors in one line


def test_lists_and_numpy_scalars_conform():
    cfg = zg.TrainConfig(fanouts=[5, np.int64(3)], layers=np.int32(2), lr=1,
                         dropout=np.float32(0.25), replace=np.bool_(False))
    assert cfg.fanouts == (5, 3) and type(cfg.fanouts[1]) is int
    assert type(cfg.layers) is int and cfg.layers == 2
    assert cfg.lr == 1 and cfg.replace is False
    assert type(cfg.lr) is float and type(cfg.dropout) is float  # JSON-ready (checkpoints)
    assert cfg.dropout == 0.25


def test_relations_given_as_triples_are_kept_as_their_names():
    """As PyG writes edge types; a config holds text (its JSON record, the flags)."""
    cfg = zg.TrainConfig(link_relation=("user", "buys", "item"),
                         relation_fanouts={("paper", "cites", "paper"): [10, 5], "writes": (5,)})
    assert cfg.link_relation == "user__buys__item"
    assert cfg.relation_fanouts == {"paper__cites__paper": (10, 5), "writes": (5,)}
    with pytest.raises(ValueError, match=r"^relation_fanouts give a__to__b twice, as a "
                                         r"triple and by its name: keep one$"):
        zg.TrainConfig(relation_fanouts={("a", "to", "b"): (3,), "a__to__b": (2,)})
    with pytest.raises(ConfigTypeError, match=r"link_relation must be a str or None, got "
                                              r"\('user', 'buys'\)"):
        zg.TrainConfig(link_relation=("user", "buys"))


@pytest.mark.parametrize(("options", "message"), [
    (dict(fanouts={("a", "to", "b"): (5, 5)}),
     r"^TrainConfig.fanouts must be one fanout per layer \(a typed graph's for every "
     r"relation\), e.g. \(15, 10\); fanouts per relation go in relation_fanouts \(the "
     r"relations it leaves out take fanouts\), got \{\('a', 'to', 'b'\): \(5, 5\)\}$"),
    (dict(fanouts=5), r"^TrainConfig.fanouts must be one fanout per layer, e.g. \(5, 5, 5\) "
                      r"for 3 layers, got 5 \(int\)$"),
    (dict(fanouts=np.int64(5), layers=1), r"^TrainConfig.fanouts must be one fanout per "
                                          r"layer, e.g. \(5,\) for 1 layer, got 5 \(int64\)$"),
    (dict(relation_fanouts={("a", "to", "b"): 4}, layers=2),
     r"^TrainConfig.relation_fanouts must give each relation one fanout per layer, e.g. "
     r"\{'a__to__b': \(4, 4\)\} for 2 layers, got \{'a__to__b': 4\}$"),
])
def test_fanouts_in_other_libraries_forms_are_told_where_they_go(options, message):
    with pytest.raises(ConfigTypeError, match=message):
        zg.TrainConfig(**options)


def test_paths_are_kept_as_their_text(tmp_path):
    cfg = zg.TrainConfig(checkpoint_dir=tmp_path / "ck", metrics_out=tmp_path / "m.jsonl")
    assert cfg.checkpoint_dir == str(tmp_path / "ck") and type(cfg.checkpoint_dir) is str
    assert cfg.metrics_out == str(tmp_path / "m.jsonl")


def test_a_leading_tilde_names_the_home_folder(tmp_path, monkeypatch):
    """As a shell reads it: `--checkpoint-dir=~/ck` reaches the program unexpanded, and
    "~" was made as a folder of that name in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = zg.TrainConfig(checkpoint_dir="~/ck", metrics_out="~/m.jsonl", root="~/data",
                         tensorboard_dir="~/tb", dataset="~/graph.npz")
    assert cfg.checkpoint_dir == str(tmp_path / "ck")
    assert (cfg.metrics_out, cfg.root) == (str(tmp_path / "m.jsonl"), str(tmp_path / "data"))
    assert (cfg.tensorboard_dir, cfg.dataset) == (str(tmp_path / "tb"),
                                                  str(tmp_path / "graph.npz"))
    assert zg.TrainConfig(dataset="cora").dataset == "cora"
    assert dataclasses.replace(cfg, epochs=2).checkpoint_dir == str(tmp_path / "ck")
    with pytest.raises(FileNotFoundError, match=f"no checkpoint folder {tmp_path}/ck"):
        zg.restore("~/ck")


def test_groups_hold_every_field_once_in_declared_order():
    names = [f.name for f in FIELDS]
    assert [n for group in GROUPS.values() for n in group] == names
    cfg = zg.TrainConfig()
    assert cfg.group("optimizer") == {"lr": cfg.lr, "weight_decay": cfg.weight_decay,
                                      "decoupled_weight_decay": False,
                                      "lr_schedule": "constant", "warmup_epochs": 0,
                                      "grad_clip": 0.0}


def test_asdict_stays_flat():
    assert dataclasses.asdict(zg.TrainConfig(lr=0.01))["lr"] == 0.01


@pytest.mark.parametrize("options,message", [
    ({"epoch": 3}, r"no option 'epoch' \(did you mean 'epochs'\?\); the options"),
    ({"fanout": (5,), "lr_rate": 0.1},
     r"no option 'fanout' \(did you mean 'fanouts'\?\); no option 'lr_rate'; the options"),
    # other libraries' names, which no spelling distance leads to
    ({"learning_rate": 1e-3}, r"no option 'learning_rate' \(did you mean 'lr'\?\)"),
    ({"hidden_channels": 64, "num_neighbors": [10, 5]},
     r"no option 'hidden_channels' \(did you mean 'hidden'\?\); no option 'num_neighbors' "
     r"\(did you mean 'fanouts'\?\)"),
    ({"edge_dim": 8}, r"no option 'edge_dim' \(did you mean 'edge_features'\?\)"),
    # PyG's num_neighbors of a typed graph, a dict per edge type
    ({"num_neighbors": {("a", "to", "b"): [5]}},
     r"no option 'num_neighbors' \(did you mean 'relation_fanouts'\?\)"),
])
def test_an_unknown_option_names_the_closest_ones(options, message):
    cfg = zg.TrainConfig()
    for build in (lambda: zg.TrainConfig(**options),
                  lambda: dataclasses.replace(cfg, **options)):
        with pytest.raises(TypeError, match=message):
            build()
    assert "epochs: 'int'" in str(inspect.signature(zg.TrainConfig))  # help() still reads it


def test_other_libraries_names_lead_to_options_that_exist():
    from zerognn_jax._src.training.config import OTHER_NAMES
    names = {f.name for f in FIELDS}
    assert set(OTHER_NAMES.values()) <= names and not set(OTHER_NAMES) & names
