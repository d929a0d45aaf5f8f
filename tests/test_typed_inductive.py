"""A typed graph's node run predicts another typed graph of its node types, relations
and feature widths (`zg.predict(..., dataset=...)`, `zerognn predict --graph`): a copy
of its own graph with nodes renumbered, or grown by nodes apart from it, gives the rows
its own graph gives; what the model did not train on is refused by name."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import assert_same_runs

import zerognn_jax as zg
from zerognn_jax._src.data.hetero_links import relation_pairs
from zerognn_jax.cli import main

CONFIG = dict(model="rsage", hidden=8, layers=2, fanouts=(3, 3), batch_size=16, epochs=1,
              eval_mode="none", progress=False)
BUYS, REV = ("user", "buys", "item"), ("item", "rev_buys", "user")


def _shop(rs, users: int, items: int, *, labelled: bool = True, user_width: int = 3):
    """(users, items, buys pairs, user features, item features, item labels) of a random
    shop whose items' labels follow their buyers' first feature."""
    u, i = rs.integers(0, users, 4 * items), rs.integers(0, items, 4 * items)
    xu = rs.normal(size=(users, user_width)).astype(np.float32)
    xi = rs.normal(size=(items, 2)).astype(np.float32)
    buyers = np.bincount(i, xu[u, 0], minlength=items)
    return u, i, xu, xi, (buyers > 0).astype(np.int64) if labelled else None


def _dataset(name, u, i, xu, xi, labels, counts=None, relations_reversed=False):
    users, items = counts or (xu.shape[0], xi.shape[0])
    edges = {BUYS: (u, i), REV: (i, u)}
    if relations_reversed:
        edges = {REV: (i, u), BUYS: (u, i)}
    split = {}
    if labels is not None:
        order = np.random.default_rng(1).permutation(items)
        split = dict(labels=labels, train_idx=order[:items // 2],
                     val_idx=order[items // 2:3 * items // 4], test_idx=order[3 * items // 4:])
    return zg.make_hetero_dataset(name, {"user": users, "item": items}, edges,
                                  target_type="item", features={"user": xu, "item": xi},
                                  **split)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    rs = np.random.default_rng(0)
    parts = _shop(rs, 40, 60)
    folder = tmp_path_factory.mktemp("typed-inductive")
    cfg = zg.TrainConfig(**CONFIG, checkpoint_dir=str(folder / "ck"))
    zg.train(cfg, _dataset("shop", *parts))
    return folder, parts, zg.restore(str(folder / "ck"), for_inference=True,
                                     dataset=_dataset("shop", *parts))


def test_a_renumbered_copy_and_a_grown_graph_give_the_rows_of_its_own_graph(run):
    _, (u, i, xu, xi, labels), result = run
    items = np.arange(xi.shape[0])
    own = np.asarray(zg.predict(result, items))
    # the same graph again, given as another: the very same rows
    same = _dataset("again", u, i, xu, xi, None)
    assert_same_runs(zg.predict(result, items, dataset=same), own)
    # nodes of each type renumbered: node k is node pu[k] (pi[k]) of the copy
    rs = np.random.default_rng(2)
    pu, pi = rs.permutation(xu.shape[0]), rs.permutation(xi.shape[0])
    inv_u, inv_i = np.argsort(pu), np.argsort(pi)
    copy = _dataset("renumbered", inv_u[u], inv_i[i], xu[pu], xi[pi], None)
    got = np.asarray(zg.predict(result, inv_i[items], dataset=copy))
    np.testing.assert_allclose(got, own, rtol=1e-5, atol=1e-5)
    # grown by users and items of their own, each type's new nodes after the old
    gu, gi, gxu, gxi, _ = _shop(rs, 30, 50, labelled=False)
    grown = _dataset("grown", np.concatenate([u, gu + xu.shape[0]]),
                     np.concatenate([i, gi + xi.shape[0]]), np.concatenate([xu, gxu]),
                     np.concatenate([xi, gxi]), None)
    got = np.asarray(zg.predict(result, items, dataset=grown))
    np.testing.assert_allclose(got, own, rtol=1e-5, atol=1e-5)
    sampled = zg.predict(result, np.arange(110), dataset=grown, mode="sampled", seed=4)
    again = zg.predict(result, np.arange(110), dataset=grown, mode="sampled", seed=4)
    assert sampled.shape == (110, 2) and np.isfinite(np.asarray(sampled)).all()
    np.testing.assert_array_equal(np.asarray(sampled), np.asarray(again))
    with pytest.raises(ValueError, match=r"nodes must lie in \[0, 110\)"):
        zg.predict(result, [110], dataset=grown)


@pytest.mark.parametrize(("change", "message"), [
    ("homogeneous", r"^dataset must be a HeteroDataset of the typed graph to predict "
                    r"\(zg.make_hetero_dataset; its labels and splits are not read\), got "
                    r"Dataset$"),
    ("order", r"^the model trained on the relations user__buys__item, item__rev_buys__user; "
              r"dataset 'other' has item__rev_buys__user, user__buys__item \(the same, in "
              r"the same order, are needed\)$"),
    ("width", r"^the model trained on feature columns 'user' 3, 'item' 2; dataset 'other' "
              r"has 'user' 5, 'item' 2$"),
    ("target", r"^the run predicts 'item' nodes; dataset 'other' has target type 'user', "
               r"which its split ids are of$"),
])
def test_a_graph_the_model_did_not_train_on_is_refused_by_name(run, change, message):
    _, _, result = run
    rs = np.random.default_rng(3)
    parts = _shop(rs, 10, 12, labelled=False, user_width=5 if change == "width" else 3)
    other = (zg.load_dataset("tiny") if change == "homogeneous" else
             _dataset("other", *parts, relations_reversed=change == "order"))
    if change == "target":
        other = dataclasses.replace(other, target_type="user", labels=np.full(10, -1))
    with pytest.raises(ValueError, match=message):
        zg.predict(result, [0], dataset=other)


def test_a_run_that_learned_rows_of_its_own_nodes_is_refused():
    rs = np.random.default_rng(4)
    u, i, xu, xi, labels = _shop(rs, 20, 30)
    order = rs.permutation(30)
    bare = zg.make_hetero_dataset("bare", {"user": 20, "item": 30}, {BUYS: (u, i), REV: (i, u)},
                                  target_type="item", features={"item": xi}, labels=labels,
                                  train_idx=order[:20], val_idx=order[20:25],
                                  test_idx=order[25:])
    result = zg.train(zg.TrainConfig(**CONFIG), bare)
    with pytest.raises(ValueError, match=r"^the run learned a row per node of its own graph "
                                         r"for type\(s\) 'user' \(featureless, or "
                                         r"embedding_dim\), which the nodes of dataset 'bare' "
                                         r"lack"):
        zg.predict(result, [0], dataset=bare)


def test_a_weighted_samplers_run_predicts_a_graph_without_weights_exactly():
    """Exact rows read no weights (as a one-type run's); sampled ones are refused."""
    rs = np.random.default_rng(5)
    u, i, xu, xi, labels = _shop(rs, 20, 30)
    weights = {BUYS: rs.random(u.size) + 0.1, REV: rs.random(u.size) + 0.1}
    order = rs.permutation(30)
    weighed = zg.make_hetero_dataset(
        "weighed", {"user": 20, "item": 30}, {BUYS: (u, i), REV: (i, u)}, target_type="item",
        features={"user": xu, "item": xi}, weights=weights, labels=labels,
        train_idx=order[:20], val_idx=order[20:25], test_idx=order[25:])
    result = zg.train(zg.TrainConfig(**CONFIG, sampler="weighted"), weighed)
    bare = _dataset("bare", u, i, xu, xi, None)
    assert_same_runs(zg.predict(result, np.arange(30), dataset=bare),
                     zg.predict(result, np.arange(30)))
    with pytest.raises(ValueError, match=r"^the run samples neighbours by edge weight "
                                         r"\(sampler 'weighted'\), and relation "
                                         r"user__buys__item of dataset 'bare' has no weights: "
                                         r"give it weights, or predict exactly"):
        zg.predict(result, [0], dataset=bare, mode="sampled")


def test_the_command_predicts_a_saved_typed_graph(run, capsys):
    folder, (u, i, xu, xi, labels), result = run
    other = _dataset("saved", u[::2], i[::2], xu, xi, None)
    zg.save_hetero_npz(other, folder / "other.npz")
    zg.save_hetero_npz(_dataset("shop", u, i, xu, xi, labels), folder / "shop.npz")
    out = folder / "p.npz"
    assert main(["predict", str(folder / "ck"), "--out", str(out), "--dataset",
                 str(folder / "shop.npz"), "--graph", str(folder / "other.npz"), "--nodes",
                 "all", "--no-progress"]) == 0
    with np.load(out) as saved:
        ids, outputs, meta = saved["ids"], saved["outputs"], json.loads(str(saved["meta"]))
    np.testing.assert_array_equal(ids, np.arange(xi.shape[0]))
    assert_same_runs(outputs, zg.predict(result, ids, dataset=other))
    assert meta["graph"] == str(folder / "other.npz") and meta["node_type"] == "item"
    zg.save_npz(zg.load_dataset("tiny"), folder / "tiny.npz")
    assert main(["predict", str(folder / "ck"), "--out", str(folder / "q.npz"), "--dataset",
                 str(folder / "shop.npz"), "--graph", str(folder / "tiny.npz"),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"zerognn: error: --graph {folder / 'tiny.npz'} holds "
                                       f"a graph of one node type, and the run predicts a "
                                       f"typed graph (node types)\n")
    assert not (folder / "q.npz").exists()
    # its default split, test, of a graph without splits: refused, not an empty file
    assert main(["predict", str(folder / "ck"), "--out", str(folder / "q.npz"), "--dataset",
                 str(folder / "shop.npz"), "--graph", str(folder / "other.npz"),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err == ("zerognn: error: --nodes test (the default): the "
                                       "graph of --graph has no test nodes; give all, "
                                       "another split or a file of ids\n")
    assert not (folder / "q.npz").exists()


def test_a_link_run_embeds_scores_and_ranks_a_renumbered_copy_as_its_own_graph(tmp_path,
                                                                                capsys):
    """A typed link run over a per-type renumbered copy of its message-passing graph:
    the same embeddings, scores and rankings ("train": the copy's purchases, which are
    the run's training pairs), the copy's target type not read; the command line's
    top k equals the function's."""
    rs = np.random.default_rng(3)
    u, i, xu, xi, _ = _shop(rs, 30, 40, labelled=False)
    shop = _dataset("shop", u, i, xu, xi, None)
    result = zg.train(zg.TrainConfig(**CONFIG, task="link", link_relation="buys",
                                     checkpoint_dir=str(tmp_path / "ck")), shop)
    kept_u, kept_i = relation_pairs(result.dataset.graph[BUYS]).T  # the run's purchases
    pu, pi = rs.permutation(30), rs.permutation(40)
    inv_u, inv_i = np.argsort(pu), np.argsort(pi)
    copy = zg.make_hetero_dataset(
        "copy", {"user": 30, "item": 40},
        {BUYS: (inv_u[kept_u], inv_i[kept_i]), REV: (inv_i[kept_i], inv_u[kept_u])},
        target_type="user", features={"user": xu[pu], "item": xi[pi]})
    users, items = np.arange(30), np.arange(40)
    own = np.asarray(zg.predict(result, items, node_type="item"))
    got = np.asarray(zg.predict(result, inv_i[items], node_type="item", dataset=copy))
    np.testing.assert_allclose(got, own, rtol=1e-5, atol=1e-5)
    pairs = np.stack([rs.integers(0, 30, 20), rs.integers(0, 40, 20)], 1)
    np.testing.assert_allclose(
        zg.score_pairs(result, np.stack([inv_u[pairs[:, 0]], inv_i[pairs[:, 1]]], 1),
                       dataset=copy), zg.score_pairs(result, pairs), rtol=1e-5, atol=1e-5)
    best, scores = zg.recommend(result, users, 5)
    there, there_scores = zg.recommend(result, inv_u[users], 5, dataset=copy)
    np.testing.assert_allclose(there_scores, scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(there, np.where(best >= 0, inv_i[best], -1))
    saved = zg.save_hetero_npz(copy, tmp_path / "copy.npz")
    out = tmp_path / "top.npz"
    assert main(["predict", str(tmp_path / "ck"), "--out", str(out), "--graph", str(saved),
                 "--top-k", "5", "--dataset", str(zg.save_hetero_npz(shop, tmp_path / "s.npz"))
                 ]) == 0
    with np.load(out) as written:
        np.testing.assert_array_equal(written["destinations"][inv_u], there)  # all users
