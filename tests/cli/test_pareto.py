"""`archsearch pareto` on studies built through the storage API (no Ray needed)."""

from __future__ import annotations

import hashlib
import json
import math
import statistics

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.search.pareto import pareto_front
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.helpers import store_promotions

SHAPES = [  # (d_model, n_layers, loss): losses fall with size, one shape is dominated
    (64, 1, 2.6), (128, 2, 2.4), (192, 3, 2.45), (256, 4, 2.2), (256, 8, 2.25),
]  # fmt: skip


def _study(
    db: Storage, name: str, shift: float = 0.0, size_beta: float | None = None, tokens: int | None = None
) -> None:
    spec = {} if size_beta is None else {"size_beta": size_beta}  # [objectives].size_beta
    if tokens is not None:
        spec["proxy"] = {"tokens": tokens}  # [proxy].tokens, which promotion multiplies
    db.create_study(name, spec_fingerprint="f", spec_source="", spec=spec, objectives=("loss", "flops"))
    for number, (d_model, layers, loss) in enumerate(SHAPES):
        cfg = config_from_knobs(d_model=d_model, n_layers=layers, head_dim=32, vocab_size=256, seq_len=64)
        slot = db.claim_trial(name, 100, 60)
        db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=cfg)
        profile = dict(device="local", modelled=False, dtype="bf16", batch=4, step_time_s=0.01,
                       tokens_per_second=1e4 / (number + 1), report={})  # fmt: skip
        db.finish_trial(
            slot, TrialOutcome(status="complete", train={"val_loss": loss + shift}, profiles=(profile,))
        )
    slot = db.claim_trial(name, 100, 60)
    db.finish_trial(slot, TrialOutcome(status="failed", reason="boom"))


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        _study(db, "a")
        _study(db, "b", shift=-0.1)
        _study(db, "c", size_beta=0.2)  # a's trials, its loss objective credited for size
    return url


def _run(*args: str):
    return CliRunner().invoke(app, ["pareto", *args])


def test_the_front_table_marks_the_knee_and_states_the_hypervolume(url):
    result = _run("--study", "a", "--storage", url)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "3 of 5 complete trials" in out and "knee" in out
    assert "hypervolume" in out and "against reference" in out
    assert "tok/s local" in out


def test_json_lists_the_front_along_the_loss_axis(url):
    result = _run("--study", "a", "--storage", url, "--json")
    [front] = json.loads(result.stdout)
    assert [r["number"] for r in front["front"]] == [3, 1, 0]  # 2 and 4 are dominated
    assert sum(r["knee"] for r in front["front"]) == 1 and front["hypervolume"] > 0


def test_the_size_adjusted_front_credits_size_and_keeps_the_proxy_loss(url):
    result = _run("--study", "a", "--storage", url, "--loss", "adjusted", "--json")
    assert result.exit_code == 0, result.output
    [front] = json.loads(result.stdout)
    rows = {r["number"]: r for r in front["front"]}
    # Every shape is on it: crediting size moves the big shapes 3 and 4 ahead of the small ones,
    # so loss now falls with FLOPs all along.
    assert list(rows) == [4, 3, 2, 1, 0] and front["loss"] == "adjusted"
    assert [rows[n]["loss"] for n in range(5)] == [loss for _, _, loss in SHAPES]  # as stored
    # beta = sd(loss) / sd(ln params) over the study's 5 complete trials (the failed one is out).
    sizes = [math.log(rows[n]["params_total"]) for n in range(5)]
    beta = statistics.pstdev(r["loss"] for r in rows.values()) / statistics.pstdev(sizes)
    assert front["size_beta"] == pytest.approx(beta)
    for n, size in enumerate(sizes):
        assert rows[n]["adjusted_loss"] == pytest.approx(rows[n]["loss"] - beta * (size - math.log(1e6)))
    table = _run("--study", "a", "--storage", url, "--loss", "adjusted").stdout
    assert "adjusted" in table and "2.2500" in table and f"{rows[4]['adjusted_loss']:.4f}" in table
    assert f"adjusted loss = loss - {beta:.4f} ln(params / 1M)" in table
    assert "in (adjusted loss, flops)" in table


def test_the_proxy_loss_is_the_default(url):
    [front] = json.loads(_run("--study", "a", "--storage", url, "--json").stdout)
    assert front["loss"] == "proxy" and front["size_beta"] is None
    assert all("adjusted_loss" not in r for r in front["front"])
    assert "adjusted" not in _run("--study", "a", "--storage", url).stdout


def test_a_study_with_a_size_beta_ranks_its_own_loss_objective(url):
    [front] = json.loads(_run("--study", "c", "--storage", url, "--json").stdout)
    rows = {r["number"]: r for r in front["front"]}
    assert front["loss"] == "adjusted" and front["size_beta"] == 0.2  # the study's, not sd / sd
    assert list(rows) == [4, 3, 2, 1, 0]
    for n, r in rows.items():
        assert r["loss"] == SHAPES[n][2]  # the proxy loss as stored
        assert r["adjusted_loss"] == pytest.approx(r["loss"] - 0.2 * math.log(r["params_total"] / 1e6))
    assert "beta: the study's [objectives].size_beta" in _run("--study", "c", "--storage", url).stdout
    [asked] = json.loads(_run("--study", "c", "--storage", url, "--loss", "adjusted", "--json").stdout)
    assert asked["size_beta"] == 0.2
    [proxy] = json.loads(_run("--study", "c", "--storage", url, "--loss", "proxy", "--json").stdout)
    assert [r["number"] for r in proxy["front"]] == [3, 1, 0] and proxy["size_beta"] is None


def test_export_selectors_rank_the_study_s_loss_objective(url):
    from archsearch.search.selection import Choice, select

    with Storage.open(url) as db:
        [front] = json.loads(_run("--study", "c", "--storage", url, "--json").stdout)
        assert select(db, "c", Choice("json", knee=True)).knee == front["knee"]
        # The lowest loss objective under a FLOPs limit no shape reaches: the deepest shape, whose
        # credit for size beats shape 3's lower proxy loss; study a (no beta) picks shape 3.
        [best] = select(db, "c", Choice("json", best_under_flops="1e12")).members
        [plain] = select(db, "a", Choice("json", best_under_flops="1e12")).members
        assert (best.number, plain.number) == (4, 3)


# Trials 1, 3 and 4 promoted to 2x the proxy's 2,048 tokens, where the deeper 4 overtakes 3: the
# first pass's front is 3, 1, 0; the promoted one 4, 3, 1, 0 (2, not promoted, placed there by the
# contenders' median change, stays behind 1).
PROMOTED = {1: 2.35, 3: 2.15, 4: 2.0}
LINE = (
    "ranked at 4,096 tokens (2x the proxy) for the 3 promoted contenders (trials 1, 3, 4); the other "
    "trials estimated there: their value at the proxy's 2,048 tokens plus the contenders' median change"
)


@pytest.fixture
def promoted_url(url):
    with Storage.open(url) as db:
        _study(db, "p", tokens=2048)
        store_promotions(db, "p", 4096, PROMOTED)
    return url


def test_the_front_ranks_promoted_contenders_at_their_largest_common_budget(promoted_url):
    url = promoted_url
    [front] = json.loads(_run("--study", "p", "--storage", url, "--json").stdout)
    rows = {r["number"]: r for r in front["front"]}
    assert list(rows) == [4, 3, 1, 0]
    # 0, not promoted, is placed at 4,096 tokens by the contenders' median change (-0.05; 4 fell 0.25).
    assert {n: r["loss"] for n, r in rows.items()} == pytest.approx({**PROMOTED, 0: SHAPES[0][2] - 0.05})
    assert {n: r["budget_tokens"] for n, r in rows.items()} == {4: 4096, 3: 4096, 1: 4096, 0: 4096}
    assert {n: r["estimated"] for n, r in rows.items()} == {4: False, 3: False, 1: False, 0: True}
    assert front["ranking"] == {"contenders": [1, 3, 4], "ranked_at": 4096, "proxy_tokens": 2048}
    listed = _all_rows(url)
    assert [r["estimated"] for r in listed] == [True, False, True, False, False]
    placed = [PROMOTED.get(n, SHAPES[n][2] - 0.05) for n in range(5)]
    assert [r["objective"] for r in listed] == pytest.approx(placed)
    assert {r["budget_tokens"] for r in listed} == {4096}  # what `trials --format json` ranks, as the front
    flops = [r["flops_forward_per_token"] for r in listed]
    expected = pareto_front(list(range(5)), [[placed[n], flops[n]] for n in range(5)], ("loss", "flops"))
    assert front["knee"] == expected.knee
    table = " ".join(_run("--study", "p", "--storage", url).stdout.split())  # rich wraps the line
    assert LINE in table and "ranked at" in table and "4,096 est." in table
    # --loss proxy ranks the measured loss: still each contender's at the budget it reached.
    [proxy] = json.loads(_run("--study", "p", "--storage", url, "--loss", "proxy", "--json").stdout)
    assert [r["number"] for r in proxy["front"]] == [4, 3, 1, 0]


def test_the_first_pass_front_promotion_chooses_from_ignores_the_promotions(promoted_url):
    from archsearch.search.pareto import study_front

    with Storage.open(promoted_url, read_only=True) as db:
        first = study_front(db, "p", first_pass=True)
        assert first.front.numbers == (3, 1, 0) and first.ranking is None
        assert study_front(db, "p").front.numbers == (4, 3, 1, 0)


def _all_rows(url: str) -> list[dict]:
    listed = CliRunner().invoke(app, ["trials", "--study", "p", "--storage", url, "--format", "json"])
    return sorted(
        (r for r in json.loads(listed.stdout) if r["status"] == "complete"), key=lambda r: r["number"]
    )


def test_export_picks_by_the_promoted_order_and_says_at_which_budget(promoted_url, tmp_path):
    url = promoted_url
    [front] = json.loads(_run("--study", "p", "--storage", url, "--json").stdout)
    limit = str(_all_rows(url)[4]["flops_forward_per_token"])
    for args, expected in [(["--knee"], front["knee"]), (["--best-under-flops", limit], 4)]:
        out = tmp_path / "-".join(args)
        result = CliRunner().invoke(
            app, ["export", "--study", "p", *args, "--format", "json", "-o", str(out), "--storage", url]
        )
        assert result.exit_code == 0, result.output
        assert f"trial {expected} as" in result.stdout and f"note: {LINE}" in result.stderr
    # The same study without its promotions picks shape 3, the first pass's best: the flip is real.
    result = CliRunner().invoke(
        app, ["export", "--study", "a", "--best-under-flops", limit, "--format", "json", "-o",
              str(tmp_path / "a"), "--storage", url],
    )  # fmt: skip
    assert "trial 3 as" in result.stdout and "ranked at" not in result.output


def test_a_study_without_promotions_prints_what_it_printed_before(promoted_url):
    url = promoted_url
    table = _run("--study", "a", "--storage", url).stdout
    [front] = json.loads(_run("--study", "a", "--storage", url, "--json").stdout)
    assert "ranked at" not in table and "ranking" not in front
    assert set(front["front"][0]) == {
        "number", "knee", "loss", "flops", "params_total", "tokens_per_second", "throughput_device",
        "throughput_modelled", "config",
    }  # fmt: skip
    assert [r["loss"] for r in front["front"]] == [SHAPES[n][2] for n in (3, 1, 0)]


def test_studies_overlaid_share_one_beta(url, tmp_path):
    [alone] = json.loads(_run("--study", "a", "--storage", url, "--loss", "adjusted", "--json").stdout)
    result = _run(
        "--study", "a", "--study", "b", "--storage", url, "--loss", "adjusted", "--json",
        "--plot", str(tmp_path / "f.html"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    a, b = json.loads(result.stdout)
    # Pooled over both: b's losses are a's minus 0.1, which widens the losses' spread, not the sizes'.
    assert a["size_beta"] == b["size_beta"] > alone["size_beta"]
    assert a["reference"] == b["reference"] and b["hypervolume"] > a["hypervolume"]
    assert b"adjusted loss: loss - " in (tmp_path / "f.html").read_bytes()


def test_two_studies_share_one_reference_so_their_hypervolumes_compare(url, tmp_path):
    result = _run(
        "--study", "a", "--study", "b", "--storage", url, "--json", "--plot", str(tmp_path / "f.png")
    )
    a, b = json.loads(result.stdout)
    assert a["reference"] == b["reference"] and b["hypervolume"] > a["hypervolume"]  # b is lower everywhere
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_and_html_plots_are_written(url, tmp_path):
    for name in ("front.png", "front.html"):
        result = _run("--study", "a", "--storage", url, "--plot", str(tmp_path / name))
        assert result.exit_code == 0, result.output
    assert b"<html" in (tmp_path / "front.html").read_bytes()[:2000].lower()
    assert (tmp_path / "front.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--study", "nope"], "unknown study 'nope'"),
        (["--study", "a", "--objectives", "flops,loss"], "must be loss then"),
        (["--study", "a", "--objectives", "loss,speed"], "must be loss then"),
        (["--study", "a", "--objectives", "loss,step_time"], "no complete trial with every objective"),
        (["--study", "a", "--reference", "3.0"], "needs 2 values"),
        (["--study", "a", "--reference", "3.0,abc"], "numbers separated by commas"),
        (["--study", "a", "--plot", "front.svg"], "use a .png or .html file"),
        (["--study", "a", "--loss", "long"], "--loss must be one of proxy, adjusted, got 'long'"),
        (["--study", "a", "--study", "c"], "the studies rank different loss objectives: pass --loss"),
    ],
    ids=["unknown-study", "loss-not-first", "unknown-objective", "no-step-times", "short-reference",
         "bad-reference", "bad-plot-suffix", "unknown-loss", "mixed-loss-objectives"],
)  # fmt: skip
def test_bad_input_exits_2_and_leaves_the_database_alone(url, tmp_path, args, message):
    path = tmp_path / "t.db"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    result = _run(*args, "--storage", url)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not (tmp_path / "front.svg").exists()


def test_a_missing_database_is_an_error(tmp_path):
    result = _run("--study", "a", "--storage", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.exit_code == 2 and "no database at" in result.stderr
