"""SNLI: the windowed Plücker op against its reference, the heads (mixing features real and
order-sensitive, padding-invariant, sizes), the frozen backbone, data stages, training with resume,
and evaluation — offline, with synthetic pairs and a random tiny DistilBERT."""

import json
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grassflow.checkpoint import load_weights
from grassflow.data import DataError
from grassflow.ops.plucker.windowed import windowed_plucker_mix, windowed_plucker_mix_reference
from grassflow.snli.config import HeadConfig
from grassflow.snli.data import download, read_token_pairs, tokenize_split
from grassflow.snli.evaluate import evaluate_snli_run
from grassflow.snli.heads import WindowedGrassmannMixer
from grassflow.snli.model import ScratchEmbedding, SNLIClassifier
from grassflow.snli.synthetic import generate_pairs
from grassflow.snli.train import train_snli
from helpers.procs import HANG, _wait_for, stop_then_signal
from helpers.specs import RANDOM_BACKBONE, SNLI_TINY_HEAD, snli_spec

F64 = torch.float64
TINY = SNLI_TINY_HEAD


# --- the windowed op ------------------------------------------------------------------------
SHAPES = [  # B, T, r, d, window, stride, pairs, empty
    (2, 13, 5, 7, 4, 4, "bidirectional", "zero"),
    (1, 9, 4, 3, 4, 2, "causal", "bias"),  # overlapping windows
    (3, 5, 6, 4, 8, 8, "bidirectional", "bias"),  # T < window
    (2, 17, 3, 5, 3, 1, "bidirectional", "zero"),  # stride 1
    (1, 1, 4, 2, 8, 8, "causal", "zero"),  # T = 1: nobody has a partner
    (2, 48, 16, 8, 8, 8, "bidirectional", "zero"),  # the paper's window, r of one mixing head
]


@pytest.mark.parametrize("B, T, r, d, window, stride, pairs, empty", SHAPES)
def test_windowed_op_matches_reference_outputs_and_every_gradient(
    B, T, r, d, window, stride, pairs, empty, gen
):
    z = torch.randn(B, T, r, dtype=F64, generator=gen).requires_grad_()
    w = torch.randn(d, r * (r - 1) // 2, dtype=F64, generator=gen).requires_grad_()
    b = torch.randn(d, dtype=F64, generator=gen).requires_grad_()
    mask = torch.rand(B, T, generator=gen) > 0.3
    kw = dict(window=window, stride=stride, pairs=pairs, empty=empty)
    fast = windowed_plucker_mix(z, mask, w, b, backend="fast", **kw)
    ref = windowed_plucker_mix_reference(z, mask, w, b, **kw)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)
    dg = torch.randn(fast.shape, dtype=F64, generator=gen)
    inputs = (z, w, b)
    got = torch.autograd.grad(fast, inputs, dg, allow_unused=True)
    want = torch.autograd.grad(ref, inputs, dg, allow_unused=True)  # T=1: no pair uses z or W
    for x, g1, g2 in zip(inputs, got, want):
        zero = torch.zeros_like(x)
        torch.testing.assert_close(
            zero if g1 is None else g1, zero if g2 is None else g2, rtol=1e-10, atol=1e-12
        )


def test_windowed_op_bf16_accumulates_in_fp32(gen):
    z = torch.randn(2, 48, 16, dtype=F64, generator=gen)
    w = torch.randn(8, 120, dtype=F64, generator=gen) / 10
    mask = torch.rand(2, 48, generator=gen) > 0.1
    g = windowed_plucker_mix(z.bfloat16(), mask, w.bfloat16(), backend="fast")
    ref = windowed_plucker_mix_reference(z, mask, w)
    assert g.dtype == torch.float32
    assert ((g.double() - ref).abs().max() / ref.abs().max()).item() < 3e-2


def test_windowed_op_gradcheck(gen):
    z = torch.randn(2, 7, 4, dtype=F64, generator=gen).requires_grad_()
    w = torch.randn(3, 6, dtype=F64, generator=gen).requires_grad_()
    b = torch.randn(3, dtype=F64, generator=gen).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    torch.autograd.gradcheck(
        lambda z, w, b: windowed_plucker_mix(z, mask, w, b, window=4, stride=3, backend="fast"),
        (z, w, b),
    )


@pytest.mark.parametrize("backend", ["kernel-cpu", "fused-cpu"])
def test_windowed_op_kernel_backends_match(backend, gen):
    z = torch.randn(2, 19, 6, dtype=F64, generator=gen)
    w = torch.randn(5, 15, dtype=F64, generator=gen)
    mask = torch.rand(2, 19, generator=gen) > 0.2
    k = windowed_plucker_mix(z, mask, w, backend=backend)
    torch.testing.assert_close(
        k, windowed_plucker_mix_reference(z, mask, w), rtol=1e-10, atol=1e-12
    )


# --- the heads --------------------------------------------------------------------------------
def _mixing_features_are_real(features, h, mask):
    """The check a collapsed head fails: mixing features not identically zero, and not a per-token
    (or bag-of-tokens) function: reordering the tokens changes them beyond reordering."""
    g = features(h, mask)
    assert g.abs().amax() > 1e-3, "mixing features are identically zero"
    perm = torch.randperm(h.shape[1], generator=torch.Generator().manual_seed(0))
    g_perm = features(h[:, perm], mask[:, perm])
    assert not torch.allclose(g_perm, g[:, perm], atol=1e-5), "mixing features ignore token order"


@pytest.mark.parametrize("pairs", ["bidirectional", "causal"])
def test_grassmann_head_mixing_features_are_nonzero_and_order_sensitive(pairs, gen):
    mixer = WindowedGrassmannMixer(HeadConfig(**{**TINY, "pairs": pairs}, plucker_backend="fast"))
    h = torch.randn(3, 24, 16, generator=gen)
    mask = torch.ones(3, 24, dtype=torch.bool)
    _mixing_features_are_real(mixer.features, h, mask)
    # even swapping two tokens inside one window changes them: the oriented wedge carries order
    swapped = h.clone()
    swapped[:, [2, 5]] = h[:, [5, 2]]
    g, gs = mixer.features(h, mask), mixer.features(swapped, mask)
    assert not torch.allclose(gs[:, [5, 2]], g[:, [2, 5]], atol=1e-5)


def test_the_order_check_fails_a_head_that_collapsed_to_an_mlp(gen):
    """The failure of earlier reproductions: one pooled vector per sentence, so the Plücker
    coordinates are of a vector with itself (zero); and a per-token MLP, blind to order."""
    mixer = WindowedGrassmannMixer(HeadConfig(**TINY, plucker_backend="fast"))
    h = torch.randn(3, 24, 16, generator=gen)
    mask = torch.ones(3, 24, dtype=torch.bool)
    pooled = h.mean(1, keepdim=True)
    assert mixer.features(pooled, mask[:, :1]).abs().amax() == 0
    with pytest.raises(AssertionError, match="identically zero"):
        _mixing_features_are_real(mixer.features, pooled, mask[:, :1])
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    with pytest.raises(AssertionError, match="ignore token order"):
        _mixing_features_are_real(lambda x, m: mlp(x), h, mask)


def _scratch_model(kind, **head):
    cfg = HeadConfig(**{**TINY, **head}, plucker_backend="fast")
    return SNLIClassifier(
        kind, cfg, embedding=ScratchEmbedding(50, 16, 96, 0.0), feat_dim=16
    ).eval()


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
@pytest.mark.parametrize(
    "pair_input, pool", [("joint", "mean"), ("separate", "mean"), ("joint", "cls")]
)
def test_heads_ignore_padding(kind, pair_input, pool, gen):
    model = _scratch_model(kind, pair_input=pair_input, pool=pool)
    ids = torch.randint(1, 50, (2, 11), generator=gen)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    padded_ids = torch.cat([ids, torch.zeros(2, 13, dtype=torch.long)], 1)
    padded_mask = torch.cat([mask, torch.zeros(2, 13, dtype=torch.bool)], 1)
    if pair_input == "joint":
        a, b = {"ids": ids, "mask": mask}, {"ids": padded_ids, "mask": padded_mask}
    else:
        a = {
            "premise_ids": ids,
            "premise_mask": mask,
            "hypothesis_ids": ids.flip(1),
            "hypothesis_mask": mask,
        }
        b = {
            "premise_ids": padded_ids,
            "premise_mask": padded_mask,
            "hypothesis_ids": torch.cat([ids.flip(1), torch.zeros(2, 13, dtype=torch.long)], 1),
            "hypothesis_mask": padded_mask,
        }
    with torch.no_grad():
        torch.testing.assert_close(model(a), model(b), rtol=1e-5, atol=1e-5)


def test_paper_sized_heads_have_about_the_same_size():
    """Frozen 768-d features, d_model 256, 2 layers, d_ff 512, joint pairs. Per layer: Transformer
    4·(256² + 256) + FFN 262,912 + 2 LN 1,024 = 527,104; Grassmann W_red 16,448 + 4 heads · (120·64
    + 64) + gate 131,328 + FFN + LN = 442,688. Shared: input projection 196,864 and classifier
    66,563."""
    sizes = {
        kind: SNLIClassifier(
            kind, HeadConfig(), backbone=torch.nn.Identity(), feat_dim=768
        ).num_params()
        for kind in ("transformer", "grassmann")
    }
    assert sizes == {
        "transformer": 196_864 + 2 * 527_104 + 66_563,
        "grassmann": 196_864 + 2 * 442_688 + 66_563,
    }
    assert 0.8 < sizes["grassmann"] / sizes["transformer"] < 1.0


# --- data, backbone, training, evaluation ---------------------------------------------------
def test_synthetic_pairs_are_deterministic_and_need_the_premise_and_word_order():
    """Each label follows from the premise and the hypothesis together (the rule below); a swap of
    roles with the same words contradicts; and the hypothesis alone says nothing of the label: the
    majority label of each hypothesis in one sample predicts another sample at chance."""
    from collections import Counter, defaultdict

    from grassflow.snli.synthetic import AGENTS

    a, b = generate_pairs(300, seed=5), generate_pairs(300, seed=5)
    assert a == b and set(a["label"]) == {0, 1, 2}
    swapped = 0
    for p, h, y in zip(a["premise"], a["hypothesis"], a["label"]):
        # "a <adj> <n1> is <verb> a <adj> <n2> [<place>] .", "a <n1> is <verb> a <n2> <place> ."
        w, v = (
            p.split(),
            h.split(),
        )
        place, hyp_place = " ".join(w[8:-1]), " ".join(v[6:-1])
        names = lambda n: {n, AGENTS[n]}  # noqa: E731
        forward = v[1] in names(w[2]) and v[5] in names(w[7])
        backward = v[1] in names(w[7]) and v[5] in names(w[2])
        assert v[3] == w[4] and hyp_place  # the premise's verb; a place, always
        if not place:
            assert y == 1 and forward
        elif backward:
            assert y == 2 and place == hyp_place
            swapped += 1
        else:
            assert forward and y == (0 if place == hyp_place else 2)
    assert swapped > 10, "no contradiction that differs from an entailment only in word order"
    train, test = generate_pairs(6000, seed=1), generate_pairs(3000, seed=2)
    seen = defaultdict(Counter)
    for h, y in zip(train["hypothesis"], train["label"]):
        seen[h][y] += 1
    hits = sum(
        seen[h].most_common(1)[0][0] == y
        for h, y in zip(test["hypothesis"], test["label"])
        if h in seen
    )
    n = sum(h in seen for h in test["hypothesis"])
    assert n > 1000 and hits / n < 0.40, (hits, n)  # chance: 1/3


def test_download_drops_unlabelled_pairs_and_checks_content(tmp_path):
    (tmp_path / "mirror").mkdir()
    pq.write_table(
        pa.table(
            {
                "premise": ["a b .", "c d .", "e f ."],
                "hypothesis": ["a .", "c .", "e ."],
                "label": [0, -1, 2],
            }
        ),
        tmp_path / "mirror/test.parquet",
    )
    cfg = {"source": "local", "local_dir": str(tmp_path / "mirror"), "name": "plain_text"}
    rec = download(cfg, "test", tmp_path / "raw.parquet")
    assert rec["pairs"] == 2 and pq.read_table(tmp_path / "raw.parquet").column(
        "label"
    ).to_pylist() == [0, 2]
    with pytest.raises(DataError, match="snli.data.expected_sha256.test"):
        download({**cfg, "expected_sha256": {"test": "0" * 64}}, "test", tmp_path / "other.parquet")
    assert not (tmp_path / "other.parquet").exists()
    with pytest.raises(DataError, match="snli.data.local_dir: no parquet file for split 'train'"):
        download(cfg, "train", tmp_path / "t.parquet")


def test_token_files_truncate_sentences_and_record_special_ids(snli_tokens):
    data, meta = read_token_pairs(snli_tokens / "train.parquet")
    assert meta["max_tokens"] == 12 and meta["truncated_sentences"] > 0
    assert max(len(s) for col in ("premise", "hypothesis") for s in data[col]) == 12 - 2
    assert (meta["pad_id"], meta["cls_id"], meta["sep_id"]) == (0, 2, 3)
    with pytest.raises(DataError, match="token id .* ≥ vocab_size 5"):
        read_token_pairs(snli_tokens / "train.parquet", vocab_size=5)


def test_backbone_tokenizer_from_a_local_directory(tmp_path):
    """The real-data path (tokenizer.path: a copy of DistilBERT's files) through BertTokenizerFast,
    with a small vocab.txt in BERT's format."""
    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "a",
        "man",
        "is",
        "play",
        "##ing",
        "guitar",
        ".",
    ]
    (tmp_path / "distilbert").mkdir()
    (tmp_path / "distilbert/vocab.txt").write_text("\n".join(words) + "\n")
    pq.write_table(
        pa.table(
            {
                "premise": ["A man is playing a guitar."],
                "hypothesis": ["A man is singing."],
                "label": pa.array([0], pa.int8()),
            }
        ),
        tmp_path / "raw.parquet",
    )
    meta = tokenize_split(
        {"name": "distilbert-base-uncased", "path": str(tmp_path / "distilbert"), "max_tokens": 48},
        tmp_path / "raw.parquet",
        tmp_path / "tok.parquet",
    )
    assert (meta["cls_id"], meta["sep_id"], meta["pad_id"], meta["vocab_size"]) == (
        2,
        3,
        0,
        len(words),
    )
    data, _ = read_token_pairs(tmp_path / "tok.parquet")
    assert data["premise"][0] == [
        words.index(w) for w in ("a", "man", "is", "play", "##ing", "a", "guitar", ".")
    ]
    assert data["hypothesis"][0] == [5, 6, 7, 1, 11]  # "singing" is unknown


def test_hub_source_fails_at_once_offline_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {"source": "hub", "dataset": "stanfordnlp/snli", "name": "plain_text", "revision": None}
    with pytest.raises(
        DataError,
        match=r"stanfordnlp/snli/plain_text split 'test'.*HF_HUB_OFFLINE(.|\n)*snli.data.source: "
        r"local",
    ):
        download(cfg, "test", tmp_path / "test.parquet")
    assert not (tmp_path / "test.parquet").exists()


def test_pretrained_backbone_from_a_local_directory(tmp_path):
    """The real path (AutoModel.from_pretrained) on a local copy of a DistilBERT's files; a
    vocabulary that does not match the token files is an error naming both sizes."""
    from transformers import DistilBertConfig, DistilBertModel

    from grassflow.snli.backbone import load_backbone, weights_sha256

    DistilBertModel(
        DistilBertConfig(vocab_size=40, n_layers=1, dim=16, n_heads=2, hidden_dim=32)
    ).save_pretrained(tmp_path)
    cfg = {"name": "distilbert-base-uncased", "path": str(tmp_path), "revision": None}
    a, b = load_backbone(cfg, 40, 0), load_backbone(cfg, 40, 0)
    assert not a.training and not any(p.requires_grad for p in a.parameters())
    assert weights_sha256(a) == weights_sha256(b)
    with pytest.raises(
        DataError,
        match="vocabulary of 40 tokens, but the token files were made by a tokenizer of 30522",
    ):
        load_backbone(cfg, 30522, 0)
    with pytest.raises(DataError, match="could not load"):
        load_backbone({**cfg, "path": str(tmp_path / "missing")}, 40, 0)


_spec = snli_spec


def test_backbone_stays_frozen_and_out_of_checkpoints(snli_tokens, tmp_path):
    from grassflow.run_spec import RunSpec
    from grassflow.snli.backbone import weights_sha256
    from grassflow.snli.train import build_classifier

    _, meta = read_token_pairs(snli_tokens / "train.parquet")
    model, features = build_classifier(RunSpec.from_dict(_spec({"kind": "backbone"})), meta)
    before = weights_sha256(model.backbone)
    assert features["weights_sha256"] == before
    model.train()
    assert not model.backbone.training and model.training
    assert all(not p.requires_grad for p in model.backbone.parameters())
    rec = train_snli(
        _spec({"kind": "backbone"}, epochs=1),
        snli_tokens / "train.parquet",
        snli_tokens / "validation.parquet",
        tmp_path,
    )
    assert not any(k.startswith("backbone.") for k in load_weights(tmp_path / "model.safetensors"))
    assert rec["features"]["weights_sha256"] == before and rec["n_params"] == model.num_params()


def _cmd(tokens, out, spec):
    return [
        sys.executable,
        "-m",
        "grassflow.snli.train",
        "--spec",
        json.dumps(spec),
        "--train-tokens",
        str(tokens / "train.parquet"),
        "--val-tokens",
        str(tokens / "validation.parquet"),
        "--out-dir",
        str(out),
    ]


@pytest.mark.slow
def test_sigterm_then_rerun_resumes_bitwise(snli_tokens, tmp_path):
    spec = _spec({"kind": "backbone"})
    full, cut = tmp_path / "full", tmp_path / "cut"
    subprocess.run(_cmd(snli_tokens, full, spec), check=True, capture_output=True)
    proc = subprocess.Popen(
        _cmd(snli_tokens, cut, spec), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    _wait_for(cut / "last.pt", proc)
    stop_then_signal(proc, signal.SIGTERM)  # frozen first: the run cannot finish before it lands
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 75 and "checkpointed" in err and not (cut / "run.json").exists()
    res = subprocess.run(_cmd(snli_tokens, cut, spec), check=True, capture_output=True, text=True)
    assert "[train] resuming" in res.stderr

    def rows(d):
        return [
            {k: v for k, v in json.loads(line).items() if k not in ("seconds", "examples_per_s")}
            for line in (d / "metrics.jsonl").read_text().splitlines()
        ]

    assert rows(cut) == rows(full)
    a, b = (load_weights(d / "model.safetensors") for d in (full, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("features", [{"kind": "backbone"}, {"kind": "scratch", "embed_dim": 16}])
@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_train_and_evaluate_report_accuracy_per_class(features, kind, snli_tokens, tmp_path):
    rec = train_snli(
        _spec(features, kind, epochs=2),
        snli_tokens / "train.parquet",
        snli_tokens / "validation.parquet",
        tmp_path,
    )
    assert rec["status"] == {"state": "completed"} and rec["epochs_completed"] == 2
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rec["best_epoch"] == max(metrics, key=lambda m: m["val_acc"])["epoch"]
    ev = evaluate_snli_run(
        tmp_path / "model.safetensors",
        tmp_path / "run.json",
        snli_tokens / "validation.parquet",
        snli_tokens / "test.parquet",
        tmp_path / "eval.json",
    )
    assert ev["validation"]["accuracy"] == pytest.approx(rec["best_val_acc"], abs=1e-9)
    t = ev["test"]
    conf = torch.tensor(t["confusion"])
    assert conf.sum() == t["n"] == 64
    assert t["accuracy"] == pytest.approx(100 * conf.diag().sum().item() / 64)
    for i, name in enumerate(t["labels"]):
        assert t["per_class_accuracy"][name] == pytest.approx(
            100 * conf[i, i].item() / conf[i].sum().item()
        )


def test_pair_input_separate_end_to_end(snli_tokens, tmp_path):
    """`pair_input: separate` (premise and hypothesis encoded apart, [u; v; |u−v|; u⊙v]) through
    training and evaluation: the evaluation takes the run's own pair input, so its validation
    accuracy is the best epoch's, and its record says which input it had."""
    spec = _spec({"kind": "backbone"}, "grassmann", head={"pair_input": "separate"}, epochs=2)
    rec = train_snli(
        spec, snli_tokens / "train.parquet", snli_tokens / "validation.parquet", tmp_path
    )
    assert (
        rec["status"] == {"state": "completed"} and rec["spec"]["head"]["pair_input"] == "separate"
    )
    ev = evaluate_snli_run(
        tmp_path / "model.safetensors",
        tmp_path / "run.json",
        snli_tokens / "validation.parquet",
        snli_tokens / "test.parquet",
        tmp_path / "eval.json",
    )
    assert ev["validation"]["accuracy"] == pytest.approx(rec["best_val_acc"], abs=1e-9)
    assert ev["test"]["n"] == 64 and sum(map(sum, ev["test"]["confusion"])) == 64


def test_accuracy_report_on_known_answers():
    """Rows are gold, columns predicted; per-class accuracy is recall per gold class. Worked by hand
    (and gold and predicted swapped would give 50 / 50 / 66.7, so the order is checked)."""
    from grassflow.snli.evaluate import accuracy_report

    gold = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    pred = torch.tensor([0, 1, 2, 1, 1, 2, 2, 0, 1])
    r = accuracy_report(pred, gold)
    assert r["confusion"] == [[1, 1, 1], [0, 2, 0], [1, 1, 2]]
    assert r["n"] == 9 and r["accuracy"] == pytest.approx(500 / 9)
    assert list(r["per_class_accuracy"].values()) == pytest.approx([100 / 3, 100.0, 50.0])
    assert r["labels"] == ["entailment", "neutral", "contradiction"]
    none = accuracy_report(torch.tensor([0, 1]), torch.tensor([0, 0]))  # no gold example of 1 and 2
    assert none["per_class_accuracy"] == {
        "entailment": 50.0,
        "neutral": None,
        "contradiction": None,
    }


def test_evaluation_refuses_a_different_backbone(snli_tokens, tmp_path):
    spec = _spec({"kind": "backbone"}, epochs=1)
    train_snli(spec, snli_tokens / "train.parquet", snli_tokens / "validation.parquet", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["spec"]["backbone"] = {
        **RANDOM_BACKBONE,
        "random": {**RANDOM_BACKBONE["random"], "seed": 1},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="trained on backbone weights"):
        evaluate_snli_run(
            tmp_path / "model.safetensors",
            tmp_path / "run.json",
            snli_tokens / "validation.parquet",
            snli_tokens / "test.parquet",
            tmp_path / "eval.json",
        )
    assert not (tmp_path / "eval.json").exists()


# --- on a GPU (pytest -m gpu) ---------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_windowed_op_on_gpu_matches_reference(gen):
    from grassflow.ops.plucker.cupy_backend import cupy_available

    z = torch.randn(4, 48, 16, dtype=F64, generator=gen)
    w = torch.randn(64, 120, dtype=F64, generator=gen) / 10
    b = torch.randn(64, dtype=F64, generator=gen)
    mask = torch.rand(4, 48, generator=gen) > 0.2
    ref = windowed_plucker_mix_reference(z, mask, w, b)
    for backend in ["fast"] + (["cupy"] if cupy_available() else []):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
            g = windowed_plucker_mix(
                z.cuda().to(dtype),
                mask.cuda(),
                w.cuda().to(dtype),
                b.cuda().to(dtype),
                backend=backend,
            )
            err = ((g.double().cpu() - ref).abs().max() / ref.abs().max()).item()
            assert err < tol, f"{backend} {dtype}: {err:.3g}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_snli_trains_on_gpu_under_bf16_autocast(kind, snli_tokens, tmp_path):
    rec = train_snli(
        _spec({"kind": "backbone"}, kind, epochs=1, device="cuda"),
        snli_tokens / "train.parquet",
        snli_tokens / "validation.parquet",
        tmp_path,
    )
    assert rec["status"] == {"state": "completed"} and "CPU" not in rec["device"]
    ev = evaluate_snli_run(
        tmp_path / "model.safetensors",
        tmp_path / "run.json",
        snli_tokens / "validation.parquet",
        snli_tokens / "test.parquet",
        tmp_path / "eval.json",
    )
    assert 0 <= ev["test"]["accuracy"] <= 100


def test_snli_table_statistics_and_diverged_runs(tmp_path):
    import math

    import pandas as pd

    from grassflow.report.stats import diff_ci
    from grassflow.snli.aggregate import markdown_table, summarise

    d = diff_ci([86.0, 86.2, 85.9], [85.0, 85.1, 84.8])
    assert (
        d["diff"] == pytest.approx(86.0333 - 84.9667, abs=1e-3)
        and 0 < d["ci_low"] < d["diff"] < d["ci_high"]
    )
    assert math.isnan(diff_ci([86.0], [85.0])["ci_low"])
    rows = []
    for model, accs in (
        ("transformer", [85.0, 85.1, 84.8]),
        ("grassmann", [86.0, 86.2, 85.9, math.nan]),
    ):
        for seed, acc in enumerate(accs):
            ok = not math.isnan(acc)
            rows.append(
                {
                    "run_id": f"t-{model}-s{seed}",
                    "model": model,
                    "seed": seed,
                    "status": "completed" if ok else "diverged",
                    "val_acc": acc,
                    "test_acc": acc - 0.5,
                    "test_acc_entailment": acc,
                    "test_acc_neutral": acc,
                    "test_acc_contradiction": acc,
                    "n_params": 10,
                    "record": str(tmp_path / f"t-{model}-s{seed}" / "run.json"),
                }
            )
    exp = {
        "features": "backbone",
        "epochs": 20,
        "batch_size": 64,
        "paper_acc": {
            "transformer": {"validation": 85.45, "test": 85.11},
            "grassmann": {"validation": 85.5, "test": 85.38},
        },
    }
    s = summarise(pd.DataFrame(rows), exp)
    g = s["models"]["grassmann"]
    assert (g["n"], g["n_ok"], g["diverged"]) == (4, 3, ["t-grassmann-s3"])
    assert g["stats"]["val_acc"][0] == pytest.approx(86.0333, abs=1e-3)
    assert s["diff"]["val_acc"]["diff"] == pytest.approx(d["diff"]) and s[
        "paper_diff"
    ] == pytest.approx(0.27)
    md = markdown_table("table3", exp, s, tmp_path)
    assert "3/4 (1 diverged)" in md and "Grassmann head better at 95 %" in md and "85.50" in md
    # a preset of one head (tests/slurm/demo-small.yaml's), or a head whose every run diverged: no
    # difference, and why
    for keep, said in (
        ("grassmann", "no transformer runs in this table"),
        (None, "a head has no completed run"),
    ):
        sub = (
            [r for r in rows if r["model"] == keep]
            if keep
            else [{**r, "status": "diverged"} if r["model"] == "transformer" else r for r in rows]
        )
        md = markdown_table("table3", exp, summarise(pd.DataFrame(sub), exp), tmp_path)
        assert md.splitlines()[-1] == f"Difference not computed: {said}.", md


def test_fetched_tokenizer_and_backbone_equal_their_sources(tmp_path):
    """What the login-node stages save (fetch-tokenizer, snli-fetch-backbone) loads back to the same
    tokenizer and the same weights; here from local copies, on clusters from the hub."""
    from transformers import DistilBertConfig, DistilBertModel

    from grassflow.data.tokenizers import fetch_tokenizer, load_tokenizer, tokenizer_sha256
    from grassflow.snli.backbone import fetch_backbone, load_backbone, weights_sha256

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "is", "play", "##ing", "."]
    (tmp_path / "src").mkdir()
    (tmp_path / "src/vocab.txt").write_text("\n".join(words) + "\n")
    cfg = {"name": "distilbert-base-uncased", "path": str(tmp_path / "src")}
    fetch_tokenizer(cfg, tmp_path / "tokenizers/distilbert-base-uncased/tokenizer.json")
    direct, fetched = (
        load_tokenizer(cfg),
        load_tokenizer(cfg, tmp_path / "tokenizers/distilbert-base-uncased/tokenizer.json"),
    )
    assert tokenizer_sha256(direct) == tokenizer_sha256(fetched)
    assert fetched.encode("A man is playing.", add_special_tokens=False).ids == [5, 6, 7, 8, 9, 10]

    DistilBertModel(
        DistilBertConfig(vocab_size=11, n_layers=1, dim=16, n_heads=2, hidden_dim=32)
    ).save_pretrained(tmp_path / "hub")
    bcfg = {"name": "distilbert-base-uncased", "path": str(tmp_path / "hub"), "revision": None}
    out = tmp_path / "backbone/distilbert-base-uncased"
    fetch_backbone(bcfg, out)
    model = load_backbone({**bcfg, "path": None}, 11, 0, fetched=out)
    assert (
        weights_sha256(model)
        == weights_sha256(load_backbone(bcfg, 11, 0))
        == (out / "weights.sha256").read_text().strip()
    )
    with pytest.raises(DataError, match="could not load"):
        fetch_backbone({**bcfg, "path": str(tmp_path / "missing")}, tmp_path / "backbone/other")
    # nothing partial
    assert sorted(p.name for p in (tmp_path / "backbone").iterdir()) == ["distilbert-base-uncased"]


@pytest.mark.parametrize("pair_input", ["joint", "separate"])
@pytest.mark.parametrize("static", [False, True])
def test_a_batch_holds_each_pairs_premise_and_hypothesis_in_order(pair_input, static):
    """make_batch, the one way a pair reaches a model: "[CLS] premise [SEP] hypothesis [SEP]"
    (joint) or "[CLS] premise [SEP]" beside "[CLS] hypothesis [SEP]" (separate), padding masked
    out."""
    import numpy as np

    from grassflow.snli.model import make_batch

    meta = {"cls_id": 1, "sep_id": 2, "pad_id": 0, "max_tokens": 6}
    data = {
        "premise": [[10, 11, 12], [13], [14, 15]],
        "hypothesis": [[20], [21, 22, 23], [24]],
        "label": np.array([0, 1, 2]),
    }
    b = make_batch(data, [2, 0], meta, pair_input, "cpu", static=static)
    assert b["label"].tolist() == [2, 0]

    def rows(ids, mask):
        assert (ids[~mask] == meta["pad_id"]).all()
        return [ids[i][mask[i]].tolist() for i in range(len(ids))]

    if pair_input == "joint":
        assert rows(b["ids"], b["mask"]) == [[1, 14, 15, 2, 24, 2], [1, 10, 11, 12, 2, 20, 2]]
    else:
        assert rows(b["premise_ids"], b["premise_mask"]) == [[1, 14, 15, 2], [1, 10, 11, 12, 2]]
        assert rows(b["hypothesis_ids"], b["hypothesis_mask"]) == [[1, 24, 2], [1, 20, 2]]
