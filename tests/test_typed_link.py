"""Link prediction on typed graphs: the split, a step's two-type level 0, seed-pair
hiding, exact evaluation against the sampled forward, sampled inference and the exported
artifact against exact, learning, overflow recovery, checkpoints and the refused
options."""

import dataclasses
import re
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_grown_run_agrees, assert_same_runs, runs_rtol

import zerognn_jax as zg
from zerognn_jax._src.data.hetero_links import find_relation, relation_pairs, reverse_of
from zerognn_jax._src.data.shop import BUYS, make_shop
from zerognn_jax._src.sampling.typed_envelope import TypedEnvelope, typed_conservative
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.evaluate import Predictor
from zerognn_jax._src.training.tasks.link_metrics import roc_auc
from zerognn_jax._src.training.tasks.typed_link import TypedLinkTask
from zerognn_jax._src.training.trainer import same_level0

BASE = dict(task="link", dataset="shop", model="rsage", hidden=32, layers=2, fanouts=(5, 5),
            batch_size=64, lr=0.01, progress=False, multiple=8, sample_ahead=1,
            link_relation="buys")


def shop() -> zg.HeteroDataset:
    """Users (featureless) buy items (features: their group's centre plus noise), 90 %
    of the time in their own group; items are also `similar` to items of their group.
    A user's group shows only through the items it bought (data/shop.py)."""
    return make_shop(400, 300, 4, per_user=8, dim=8, name="shop")


@pytest.fixture(scope="module")
def data():
    return shop()


@pytest.fixture(scope="module")
def whole(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("typed_link")
    return zg.train(zg.TrainConfig(**BASE, epochs=3, checkpoint_dir=str(root / "whole")), data)


@pytest.fixture(scope="module")
def stopped(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("typed_link")
    cfg = zg.TrainConfig(**BASE, epochs=1, eval_mode="none", checkpoint_dir=str(root / "ckpt"))
    return zg.train(cfg, data), root / "ckpt"


def _keys(pairs, n_dst, unordered=False):
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    if unordered:
        pairs = np.sort(pairs, axis=1)
    return set((pairs[:, 0] * n_dst + pairs[:, 1]).tolist())


@pytest.mark.parametrize("relation", [BUYS, ("item", "similar", "item")])
def test_split_holds_out_pairs_from_the_relation_and_its_reverse(data, relation):
    graph = data.graph
    split = zg.typed_link_split(graph, relation, seed=3, mrr_negatives=5)
    n_dst, same = graph.num_nodes[relation[2]], relation[0] == relation[2]
    # one type: {u, v} is one pair, so (u, v) and (v, u) land in one split together
    every = _keys(relation_pairs(graph[relation]), n_dst, same)
    train, val, test = (_keys(p, n_dst, same)
                        for p in (split.train, split.val.pos, split.test.pos))
    assert len(train) == len(split.train) and len(test) == len(split.test.pos)
    assert train | val | test == every and not (train & val or train & test or val & test)
    assert len(val) == int(0.05 * len(every)) and len(test) == int(0.10 * len(every))
    held = val | test
    if same:  # the other direction leaves the graph too
        held |= {(k % n_dst) * n_dst + k // n_dst for k in held}
    kept = _keys(relation_pairs(split.graph[relation]), n_dst)
    assert not kept & held and kept | held >= every
    reverse = reverse_of(graph, relation)
    if reverse is not None:
        back = relation_pairs(split.graph[reverse])[:, ::-1]
        assert not _keys(back, n_dst) & held
        before = relation_pairs(graph[reverse])[:, ::-1]  # repeated pairs: every copy goes
        gone = np.isin(before[:, 0] * n_dst + before[:, 1], list(held))
        assert len(back) == len(before) - gone.sum() and gone.any()
    for part in (split.val, split.test):
        negatives = _keys(part.neg, n_dst, same)
        assert not negatives & every and len(negatives) == len(part.neg)
        assert (part.neg_dst != part.pos[:, 1:2]).all()
        assert not same or (part.neg[:, 0] != part.neg[:, 1]).all()
    others = [r for r in graph.relations if r not in (relation, reverse)]
    for r in others:
        np.testing.assert_array_equal(split.graph[r].indices, graph[r].indices)
    again = zg.typed_link_split(graph, relation, seed=3, mrr_negatives=5)
    np.testing.assert_array_equal(again.train, split.train)
    np.testing.assert_array_equal(again.test.neg, split.test.neg)
    named = zg.typed_link_split(graph, "__".join(relation), seed=3, mrr_negatives=5)
    np.testing.assert_array_equal(named.train, split.train)  # the name the library prints
    with pytest.raises(ValueError, match=r"relation \('a', 'gone', 'b'\) is not one of the "
                                         r"graph's"):
        zg.typed_link_split(graph, ("a", "gone", "b"))


@pytest.mark.parametrize("relation", [BUYS, ("item", "similar", "item")])
def test_a_saved_split_loads_back_over_its_graph(data, relation, tmp_path):
    """The split file holds pairs and negatives; the graph given at load (the one split,
    or the split's own) loses the held-out pairs again, as the split removed them."""
    split = zg.typed_link_split(data.graph, relation, seed=3, mrr_negatives=4)
    split.save(tmp_path / "s")  # writes s.npz
    for graph in (data.graph, split.graph):
        back = zg.TypedLinkSplit.load(tmp_path / "s", graph)
        assert back.relation == split.relation
        for name in ("train", "val", "test"):
            want, got = getattr(split, name), getattr(back, name)
            for a, b in (zip(dataclasses.astuple(want), dataclasses.astuple(got))
                         if name != "train" else [(want, got)]):
                np.testing.assert_array_equal(a, b)
        for rel in data.graph.relations:
            for key in ("indptr", "indices"):
                np.testing.assert_array_equal(getattr(back.graph[rel], key),
                                              getattr(split.graph[rel], key))


def test_a_split_file_read_against_another_graph_or_damaged_is_one_line(data, tmp_path):
    split = zg.typed_link_split(data.graph, BUYS, seed=1)
    split.save(tmp_path / "s.npz")
    at = re.escape(str(tmp_path / "s.npz"))
    other = make_shop(401, 300, 4, per_user=8, dim=8).graph
    with pytest.raises(ValueError, match=rf"^{at}: it was split from a graph of 400 user "
                                         rf"nodes; this one has 401$"):
        zg.TypedLinkSplit.load(tmp_path / "s.npz", other)
    # a graph of the same counts and relations whose pairs are others
    same_sizes = make_shop(400, 300, 4, per_user=8, dim=8, seed=5).graph
    with pytest.raises(ValueError, match=rf"^{at}: \d+ of its {len(split.train)} training "
                                         rf"pairs are no edges of user__buys__item in this "
                                         rf"graph \(the first: \(\d+, \d+\)\): it was split "
                                         rf"from another graph$"):
        zg.TypedLinkSplit.load(tmp_path / "s.npz", same_sizes)
    lone = zg.hetero_graph({"user": 400, "item": 300}, {("user", "rates", "item"): ([0], [0])})
    with pytest.raises(ValueError, match=rf"^{at}: it splits user__buys__item, which the graph "
                                         rf"lacks \(it has user__rates__item\)$"):
        zg.TypedLinkSplit.load(tmp_path / "s.npz", lone)
    with pytest.raises(TypeError, match="TypedLinkSplit.load takes a HeteroGraph as graph, "
                                        "got HeteroDataset: pass dataset.graph"):
        zg.TypedLinkSplit.load(tmp_path / "s.npz", data)
    good = dict(np.load(tmp_path / "s.npz"))
    bad = np.where(np.arange(good["test_neg"].size).reshape(-1, 2) == 1, 300,
                   good["test_neg"])
    np.savez(tmp_path / "bad.npz", **{**good, "test_neg": bad})
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'bad.npz'))}: test_neg "
                                         rf"holds item ids outside \[0, 300\): 300 "
                                         rf"\(the first of 1\)$"):
        zg.TypedLinkSplit.load(tmp_path / "bad.npz", data.graph)
    # each kind of split names the other's reader
    homogeneous = zg.random_link_split(zg.load_dataset("tiny").graph, seed=0)
    homogeneous.save(tmp_path / "h.npz")
    with pytest.raises(ValueError, match=r"h\.npz is not a typed link split written by "
                                         r"TypedLinkSplit\.save: it holds a link split "
                                         r"\(LinkSplit.save's\); read it with zg.LinkSplit.load"):
        zg.TypedLinkSplit.load(tmp_path / "h.npz", data.graph)
    with pytest.raises(ValueError, match=r"s\.npz is not a link split written by "
                                         r"LinkSplit\.save: it holds a typed graph's link "
                                         r"split \(TypedLinkSplit.save's\); read it with "
                                         r"zg.TypedLinkSplit.load"):
        zg.LinkSplit.load(tmp_path / "s.npz")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_split_keeps_the_edge_features_of_kept_edges():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 30, 200), rng.integers(0, 20, 200)
    feats = np.stack([src, dst], 1).astype(np.float32)  # each row names its own edge
    graph = zg.hetero_graph({"a": 30, "b": 20}, {("a", "r", "b"): (src, dst)},
                            edge_features={("a", "r", "b"): feats}, add_reverse=True)
    split = zg.typed_link_split(graph, ("a", "r", "b"), seed=1)
    for rel, flip in ((("a", "r", "b"), False), (("b", "rev_r", "a"), True)):
        g = split.graph[rel]
        pairs = relation_pairs(g)
        pairs = pairs[:, ::-1] if flip else pairs
        np.testing.assert_array_equal(np.asarray(g.edge_features), pairs.astype(np.float32))


def test_split_warns_of_held_out_pairs_other_relations_keep():
    """A reverse not named as `reverse_of` finds it, or a relation beside the predicted
    one holding its pairs (views that include purchases), keeps held-out pairs where
    message passing reads them: each such relation is warned of with its count."""
    every = (np.repeat(np.arange(4), 3), np.tile(np.arange(3), 4))
    graph = zg.hetero_graph({"a": 4, "b": 3}, {
        ("a", "r", "b"): every, ("b", "back", "a"): every[::-1], ("a", "saw", "b"): every,
        ("a", "other", "a"): ([0, 1], [1, 2])})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="only 0 pairs are not edges"):
            zg.typed_link_split(graph, ("a", "r", "b"), val=0.2, test=0.2)
    told = sorted(str(w.message) for w in seen)
    assert [t.split(" edges of ")[1].split(" ")[0] for t in told] == ["a__saw__b",
                                                                      "b__back__a"]
    assert all(t.startswith("link split of a__r__b: 4 edges of ") for t in told), told
    assert all(w.filename == __file__ for w in seen)
    # where the other relation holds none of them, or a split holds nothing out: no word
    some = zg.hetero_graph({"a": 40, "b": 30}, {
        ("a", "r", "b"): (np.arange(40), np.arange(40) % 30), ("a", "saw", "b"): ([0], [29])})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", zg.EmptySplitWarning)
        zg.typed_link_split(some, ("a", "r", "b"), val=0.1, test=0.1)
    # an edgeless such relation, or a split that holds nothing out, keeps no held-out pair
    edgeless = zg.hetero_graph({"a": 4, "b": 3}, {
        ("a", "r", "b"): ([0, 0, 1, 2], [0, 1, 2, 0]), ("b", "back", "a"): ([], [])})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", zg.EmptySplitWarning)
        zg.typed_link_split(edgeless, ("a", "r", "b"), val=0.25, test=0.0)
        zg.typed_link_split(graph, ("a", "r", "b"), val=0.0, test=0.0)


def test_a_nodes_pair_with_itself_is_no_pair_to_predict():
    """They were positives, against negatives that are never (u, u); the homogeneous
    split drops them."""
    src, dst = np.r_[np.arange(10), [0, 1, 2, 3, 4]], np.r_[np.arange(10), [5, 6, 7, 8, 9]]
    graph = zg.hetero_graph({"paper": 10}, {("paper", "cites", "paper"): (src, dst)},
                            add_reverse=True)
    with pytest.warns(zg.EmptySplitWarning, match=r"^the link split of 5 distinct pairs of "
                                                  r"paper__cites__paper leaves val and test "
                                                  r"empty \(val 0.05 x 5 and test 0.1 x 5"):
        split = zg.typed_link_split(graph, "cites", seed=0)
    pairs = np.r_[split.train, split.val.pos, split.test.pos]
    assert len(pairs) == 5 and not (pairs[:, 0] == pairs[:, 1]).any()


def test_an_envelope_of_one_type_takes_one_capacity():
    with pytest.raises(ValueError, match="one seed type takes one capacity"):
        TypedEnvelope("user", (4, 8), ())
    with pytest.raises(ValueError, match="distinct, one capacity each"):
        TypedEnvelope(("user", "user"), (4, 8), ())
    assert TypedEnvelope(("user", "item"), [4, 8], ()).level(0) == {"user": 4, "item": 8}


def test_relation_is_found_by_name_or_refused(data):
    assert find_relation(data.graph, "buys") == BUYS
    assert find_relation(data.graph, "user__buys__item") == BUYS
    for key, message in ((None, "needs the relation to predict"),
                         ("nope", "names no relation"), ("sells", "names no relation")):
        with pytest.raises(ValueError, match=message):
            find_relation(data.graph, key)


def _envelope(task, data, batch_size: int = 64) -> TypedEnvelope:
    """The always-safe envelope of `batch_size` positives."""
    return typed_conservative(task.sampler, task.seed_type, task.seed_capacities(batch_size),
                              data.graph.num_nodes)


def _task(whole) -> TypedLinkTask:
    task = whole.program.task
    assert isinstance(task, TypedLinkTask) and task.seed_type == ("user", "item")
    return task


def test_level0_holds_each_end_once_and_the_pairs_point_at_them(whole):
    task = _task(whole)
    items = jnp.asarray(task.split.train[:64])
    valid = jnp.arange(64) < 50
    env = TypedEnvelope(("user", "item"), task.seed_capacities(64), ())
    assert task.seed_capacities(64) == (64, 128)
    seeds, live, local, pair_valid = task.level0(items, valid, jnp.uint32(7), env,
                                                 whole.program.kernels)
    assert pair_valid.shape == (128,) and int(pair_valid.sum()) == 100
    for j, t in enumerate(("user", "item")):
        ids = np.asarray(seeds[t])[np.asarray(live[t])]
        assert len(set(ids.tolist())) == ids.size  # distinct
        pairs, _ = task.pairs(items, valid, jnp.uint32(7))
        got = np.asarray(seeds[t])[np.asarray(local[:, j])]
        np.testing.assert_array_equal(got[np.asarray(pair_valid)],
                                      np.asarray(pairs[:, j])[np.asarray(pair_valid)])
    negatives = np.asarray(pairs[64:])[np.asarray(pair_valid[64:])]
    assert (negatives[:, 0] == np.asarray(items[:50, 0])).all()  # destinations corrupted


def _check_hidden(result) -> None:
    """A step's sample with its positives hidden (`hide_positives`) differs from the
    sample without in exactly the slots of the relation and its reverse that join a
    positive's ends (unordered where both are one type), and some slot was hidden."""
    task = dataclasses.replace(result.program.task, exclude_seed_edges=False)
    relation, data = task.split.relation, result.data
    reverse, same = reverse_of(task.split.graph, relation), relation[0] == relation[2]
    n_dst = data.graph.num_nodes[relation[2]]
    perm = jnp.asarray(task.split.train[:64])  # the positives of step 0
    _, sample, _ = task.sample_batch(result.program, data, perm, 0, 0, _envelope(task, data))
    mb = sample.typed
    hidden = task.hide_positives(mb, perm, jnp.ones(64, bool))
    positives = _keys(task.split.train[:64], n_dst, same)
    seen = 0
    for hop, level in enumerate(mb.blocks):
        for rel, block in level.items():
            rows = np.asarray(mb.nodes[hop][rel[2]])[:, None]
            nbrs = np.asarray(mb.nodes[hop + 1][rel[0]])[np.asarray(block.nbr)]
            u, v = (nbrs, rows) if rel == relation else (rows, nbrs)
            if same:
                u, v = np.minimum(u, v), np.maximum(u, v)
            joins = np.isin(u * n_dst + v, list(positives)) & np.asarray(block.mask)
            after = np.asarray(hidden.blocks[hop][rel].mask)
            if rel in (relation, reverse):
                seen += int(joins.sum())
                np.testing.assert_array_equal(after, np.asarray(block.mask) & ~joins)
            else:
                np.testing.assert_array_equal(after, np.asarray(block.mask))
    assert seen > 0  # the step's sample did read some of its own positives


def _check_exact(result) -> None:
    """Step 0's pair scores (positives not hidden) equal the decoder on every node's
    exact embeddings, for a run that samples every neighbour without dropout."""
    task = dataclasses.replace(result.program.task, exclude_seed_edges=False)
    program = dataclasses.replace(result.program, task=task)
    perm = jnp.asarray(task.split.train[:64])
    batch, sample, _ = task.sample_batch(program, result.data, perm, 0, 0,
                                         _envelope(task, result.data))
    scores, _ = program.apply_model(result.variables, result.data, sample, train=False,
                                    inputs=batch.model_inputs)
    src, dst = task.split.ends
    seeds, local = sample.typed.nodes[0], batch.model_inputs["pairs"]
    # the exact embeddings as a user gets them (`zg.predict`: `exact_outputs` inside)
    h_src = zg.predict(result, seeds[src][local[:, 0]], node_type=src)
    h_dst = zg.predict(result, seeds[dst][local[:, 1]], node_type=dst)
    want = jnp.sum(h_src * h_dst, -1) * h_src.shape[-1] ** -0.5  # the scaled dot decoder
    live = np.asarray(batch.weight) > 0
    np.testing.assert_allclose(np.asarray(scores)[live], np.asarray(want)[live], rtol=2e-5,
                               atol=2e-5)


def test_hidden_pairs_leave_every_block_of_the_relation_and_its_reverse(whole):
    _task(whole)
    _check_hidden(whole)


def test_exact_scores_equal_the_sampled_forward_with_every_neighbour(data):
    # the equalities hold for any parameters: the initial ones (no step to compile) and
    # the conservative envelope (no calibration pass) check them as well as trained ones
    cfg = zg.TrainConfig(**{**BASE, "fanouts": (-1, -1)}, epochs=0, dropout=0.0,
                         eval_mode="none", envelope="conservative")
    result = zg.train(cfg, data)
    _check_exact(result)
    _check_sampled_inference(result)


def _check_sampled_inference(result) -> None:
    """With every neighbour sampled, each end's sampled embeddings (`zg.predict`, a
    batch smaller than the ids), the exported artifact's, the sampled evaluation's
    metrics and sampled pair scores equal the exact ones."""
    users, items = np.arange(0, 400, 7), np.arange(0, 300, 5)
    for t, ids in (("user", users), ("item", items)):
        exact = np.asarray(zg.predict(result, ids, node_type=t))
        sampled = zg.predict(result, ids, node_type=t, mode="sampled", batch_size=16)
        np.testing.assert_allclose(np.asarray(sampled), exact, rtol=2e-5, atol=2e-5)
        art = zg.export_model(result.program, result.variables, result.data, batch_size=8,
                              node_type=t)
        call = jax.export.deserialize(art.serialize()).call
        got = call(*art.data_arguments(result.data), jnp.asarray(ids[:8], jnp.int32),
                   jnp.ones(8, bool), jnp.uint32(0))
        np.testing.assert_allclose(np.asarray(got), exact[:8], rtol=2e-5, atol=2e-5)
    task, p = result.program.task, result.program
    metrics = [task.evaluate(Predictor(p, result.variables, result.data, mode, 64, 0), None)
               for mode in ("full", "sampled")]
    assert metrics[0].keys() == metrics[1].keys() and "test_auc" in metrics[0]
    for k in metrics[0]:
        assert metrics[1][k] == pytest.approx(metrics[0][k], abs=1e-6), k
    pairs = task.split.test.pos[:20]
    np.testing.assert_allclose(zg.score_pairs(result, pairs, mode="sampled", batch_size=32),
                               zg.score_pairs(result, pairs), rtol=2e-5, atol=2e-5)


def test_a_relation_of_one_type_trains_through_one_frontier(data):
    """`similar` (items to items, symmetric): level 0 is one frontier holding both ends,
    the hidden slots are those joining a positive in either direction, exact scores
    equal the sampled forward, and sampled embeddings the exact ones."""
    # one epoch: the relation trains; any envelope will do, so no calibration pass
    cfg = zg.TrainConfig(**{**BASE, "fanouts": (-1, -1), "link_relation": "similar"},
                         epochs=1, dropout=0.0, eval_mode="none", envelope="conservative")
    result = zg.train(cfg, data)
    task = result.program.task
    assert task.seed_type == "item" and task.seed_capacities(64) == 192
    items, valid = jnp.asarray(task.split.train[:64]), jnp.ones(64, bool)
    seeds, live, local, pair_valid = task.level0(items, valid, jnp.uint32(3),
                                                 _envelope(task, result.data),
                                                 result.program.kernels)
    ids = np.asarray(seeds["item"])[np.asarray(live["item"])]
    assert len(set(ids.tolist())) == ids.size
    pairs, _ = task.pairs(items, valid, jnp.uint32(3))
    np.testing.assert_array_equal(np.asarray(seeds["item"])[np.asarray(local)],
                                  np.asarray(pairs))
    _check_hidden(result)
    _check_exact(result)
    ids = np.arange(0, 300, 9)  # one end type: node_type may be left out
    np.testing.assert_allclose(np.asarray(zg.predict(result, ids, mode="sampled",
                                                     batch_size=16)),
                               np.asarray(zg.predict(result, ids)), rtol=2e-5, atol=2e-5)


def test_learns_the_groups_well_above_chance(whole):
    losses = [h["loss"] for h in whole.history]
    assert losses[-1] < losses[0]
    # a user's group shows only through its items: random scores give AUC 0.5, and
    # 0.82 to 0.83 were seen
    assert whole.summary["test_auc"] > 0.75 and whole.summary["val_auc"] > 0.75
    assert whole.summary["envelope_over_ideal"] >= 1.0


def test_small_envelope_overflows_and_matches_a_large_one(data, stopped, monkeypatch):
    big, _ = stopped
    real = TypedLinkTask.choose_envelope

    def tiny(self, program, device_data, dataset, cfg):
        env, cal = real(self, program, device_data, dataset, cfg)
        first = env.level(0)
        small = tuple(tuple((t, max(c // 4, first.get(t, 1))) for t, c in level)
                      for level in env.capacities)
        return TypedEnvelope(env.seed_type, env.batch_size, small), cal

    monkeypatch.setattr(TypedLinkTask, "choose_envelope", tiny)
    small = zg.train(zg.TrainConfig(**BASE, epochs=1, eval_mode="none"), data)
    assert_grown_run_agrees(small, big)


def test_resume_from_checkpoint(data, whole, stopped, tmp_path):
    shutil.copytree(stopped[1], tmp_path / "ckpt")
    cfg = zg.TrainConfig(**BASE, epochs=3, checkpoint_dir=str(tmp_path / "ckpt"))
    resumed = zg.train(cfg, data)
    assert resumed.summary["start_epoch"] == 1
    np.testing.assert_allclose([h["loss"] for h in resumed.history],
                               [h["loss"] for h in whole.history], rtol=runs_rtol())
    assert resumed.summary["test_auc"] == pytest.approx(whole.summary["test_auc"],
                                                        abs=runs_rtol())
    back = zg.restore(cfg.checkpoint_dir, cfg, data, for_inference=True)
    assert_same_runs(zg.predict(back, [0, 5], node_type="user"),
                     zg.predict(resumed, [0, 5], node_type="user"))
    # a checkpoint's two-type level 0 comes back from JSON as a list
    assert same_level0([64, 128], (64, 128)) and same_level0(64, 64)
    assert not same_level0([64, 128], 64) and not same_level0([64, 96], (64, 128))


@pytest.mark.parametrize("change, message", [
    (dict(link_relation=None), "needs the relation to predict"),
    (dict(link_relation="nope"), "link_relation 'nope' names no relation"),
    (dict(negative_mode="nope"), "negative_mode must be one of"),
])
def test_refused_options(data, change, message):
    with pytest.raises(ValueError) as err:
        zg.train(zg.TrainConfig(**{**BASE, **change}, epochs=1), data)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_best_metric_names_only_the_scored_splits_and_is_refused_before_training(data,
                                                                                  tmp_path):
    """Link tasks score validation and test pairs, not training pairs: train_auc is
    refused with the others listed, and the run leaves no folder behind."""
    ckpt = tmp_path / "ck"
    with pytest.raises(ValueError, match=r"best_metric 'train_auc' is not a metric this "
                                         r"task reports; choose one of val_auc, val_ap, "
                                         r"test_auc, test_ap$"):
        zg.train(zg.TrainConfig(**BASE, epochs=1, best_metric="train_auc",
                                checkpoint_dir=str(ckpt)), data)
    with pytest.raises(ValueError, match=r"best_metric 'auc' is not a metric"):  # no split
        zg.train(zg.TrainConfig(**BASE, epochs=1, best_metric="auc",
                                checkpoint_dir=str(ckpt)), data)
    assert not ckpt.exists()


def test_a_split_without_pairs_reports_none(whole):
    """Its metrics are there, as None (as a node task's empty split), not left out."""
    task = whole.program.task
    val = task.split.val
    empty = type(val)(val.pos[:0], val.neg[:0], val.neg_dst[:0])
    program = dataclasses.replace(whole.program,
                                  task=dataclasses.replace(task, split=dataclasses.replace(
                                      task.split, val=empty)))
    cfg = zg.TrainConfig(**BASE)
    got = trainer.evaluate(cfg, program, whole.variables, whole.data, whole.dataset)
    assert got["val_auc"] is None and got["val_ap"] is None
    assert got["test_auc"] == pytest.approx(whole.summary["test_auc"])


def test_link_relation_outside_a_typed_link_task_is_refused(data):
    with pytest.raises(ValueError, match="link_relation .* names the relation a typed"):
        zg.train(zg.TrainConfig(**{**BASE, "task": "node"}, epochs=1), data)
    with pytest.raises(ValueError, match="this run trains task 'link' on 'tiny'"):
        zg.train(zg.TrainConfig(task="link", link_relation="buys", epochs=1, progress=False))


def test_score_pairs_scores_the_relations_pairs(whole):
    """`zg.score_pairs` of a typed run: user and item ids; the test pairs' scores give
    the run's test AUC, and the scaled dot decoder's score is the product of the two ends'
    embeddings (`zg.predict`) over the square root of their width; ids past their end
    type refused."""
    split = whole.program.task.split
    pos, neg = zg.score_pairs(whole, split.test.pos), zg.score_pairs(whole, split.test.neg)
    assert roc_auc(pos, neg) == whole.summary["test_auc"]
    users, items = split.test.pos[:6, 0], split.test.pos[:6, 1]
    h_user = np.asarray(zg.predict(whole, users, node_type="user"))
    dot = np.sum(h_user * np.asarray(zg.predict(whole, items, node_type="item")), axis=1)
    dot = dot / np.sqrt(h_user.shape[1])
    np.testing.assert_allclose(pos[:6], dot, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"destination ids must lie in \[0, 300\) \('item' "
                                         r"ids\), found \[0, 300\]"):  # the type, as predict
        zg.score_pairs(whole, [[0, 0], [1, 300]])
    with pytest.raises(ValueError, match="source ids must lie in \\[0, 400\\) \\('user' ids"):
        zg.score_pairs(whole, [[400, 0]])
    assert zg.score_pairs(whole, []).shape == (0,)  # was "got float64[0]"
    for call in (zg.score_pairs, zg.predict):  # AttributeErrors before
        with pytest.raises(TypeError, match=rf"^{call.__name__} takes the TrainResult of "
                                            rf"zg.train or zg.restore, got dict$"):
            call(whole.variables, [[0, 0]] if call is zg.score_pairs else [0])


def test_predict_and_export_refuse_what_they_cannot_give(whole):
    """(Their outputs are checked in `_check_exact` and `_check_sampled_inference`.)"""
    missing = ("the relation user__buys__item has two end types, whose rows differ: set "
               "node_type to one of user, item")  # "set": the command line names its flag
    for kwargs, message in ((dict(), missing),
                            (dict(node_type="paper"), "node_type must be an end"),
                            (dict(node_type="item"), r"\('item' ids\)")):
        with pytest.raises(ValueError, match=message):
            zg.predict(whole, [300] if "item" in str(kwargs) else [0], **kwargs)
    for node_type, message in ((None, missing),
                               ("paper", "node_type must be an end of the relation "
                                         "user__buys__item \\(user, item\\), got 'paper'")):
        with pytest.raises(ValueError, match=message):
            zg.export_model(whole.program, whole.variables, whole.data, batch_size=4,
                            node_type=node_type)
    # the homogeneous graph's evaluation names predict as a link run takes it (it said
    # "zg.predict(result, nodes) gives ... logits", which node_type's refusal met)
    with pytest.raises(TypeError, match=r"node_embeddings evaluates a graph of one node "
                                        r"type; this run's graph is typed: zg\.predict\("
                                        r"result, nodes, node_type=T\) gives the embeddings "
                                        r"of its nodes of type T \('user' or 'item'\)$"):
        zg.node_embeddings(whole.program, whole.variables, whole.data)
