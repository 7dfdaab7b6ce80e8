"""The benchmarks still run against the current API: each in its smoke mode, as a real process."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from archsearch.search.promotion import PromoteSettings

ROOT = Path(__file__).resolve().parents[1]


def _smoke(
    script: str, *args: str, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`benchmarks/SCRIPT --smoke ARGS` as a real process; it must exit 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--smoke", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_query_speed_smoke(tmp_path):
    done = _smoke("query_speed.py", "--keep", str(tmp_path), timeout=300)
    assert "database: 300 trials" in done.stdout, done.stdout
    assert "trials on the front of" in done.stdout, done.stdout
    assert "python -m archsearch pareto" in done.stdout, done.stdout


def test_proxy_fidelity_smoke():
    done = _smoke("proxy_fidelity.py", "--variants", "reference,tokens2x-constant", timeout=600)
    table, with_size, fixed_beta, cost_curve = done.stdout.split("\n\n")
    lines = table.splitlines()
    assert lines[0].startswith("3 shapes; long-run reference: recorded 10x runs"), done.stdout
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"params", "forward", "reference", "tokens2x-constant"}, done.stdout
    assert rows["tokens2x-constant"][1] == "0.07x", done.stdout  # 2 x 4,096 smoke tokens of 120k
    # The proxy beside params, the size-adjusted loss and the rank sum: a beta, 8 correlations,
    # two iso-pair and two shared-front counts per variant.
    lines = with_size.splitlines()
    assert lines[3].split()[:5] == ["variant", "beta", "proxy", "params", "adjusted"], done.stdout
    rows = {line.split()[0]: line.split() for line in lines[4:]}
    assert set(rows) == {"reference", "tokens2x-constant"}, done.stdout
    assert all(len(row) == 1 + 1 + 8 + 4 * 3 for row in rows.values()), done.stdout
    # The size-adjusted loss at each fixed beta (`--betas`): Spearman and "k of front/10x front".
    lines = fixed_beta.splitlines()
    assert lines[2].split()[:3] == ["variant", "beta", "0"], done.stdout
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert set(rows) == {"reference", "tokens2x-constant"}, done.stdout
    assert all(len(row) == 1 + 7 * 4 for row in rows.values()), done.stdout  # 7 default betas
    # Fidelity against cost from the recorded long runs' own evaluations: the 5x run's 4, the 10x
    # run's first 3 (its last is the reference), each at beta 0 and 0.15.
    lines = cost_curve.splitlines()
    assert lines[1].split() == ["prefix", "of", "10x", "beta", "0", "beta", "0.15"], done.stdout
    assert [line.split()[0] for line in lines[2:]] == ["x5"] * 4 + ["x10"] * 3, done.stdout
    assert lines[-1].split()[5] == "0.751", done.stdout  # 901,120 of the 10x run's 1,200,128 tokens


def test_proxy_fidelity_scores_the_searchs_retry_of_stalled_runs():
    done = _smoke("proxy_fidelity.py", "--variants", "tokens2x-constant-retry", timeout=600)
    # Smoke runs are too short to be judged stalled: the first variant's runs stand, and the
    # derived variant is scored beside them with its two sources trained.
    assert "tokens2x-constant-retry: no run of tokens2x-constant stalled" in done.stdout, done.stdout
    table = done.stdout.split("\n\n")[0].splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("predictor"))
    rows = [line.split()[0] for line in table[header + 1 :]]
    assert rows == ["params", "forward", "tokens2x-constant-retry"], done.stdout


def test_step_time_accuracy_smoke():
    done = _smoke("step_time_accuracy.py", timeout=600)
    assert "stored/trainer" in done.stdout, done.stdout


def test_threads_smoke():
    done = _smoke("threads.py", timeout=300)
    lines = done.stdout.splitlines()
    assert "tok/s @1" in lines[2] and "tok/s @2" in lines[2] and "2/1" in lines[2], done.stdout
    assert lines[3].startswith("d64 L1 ff128 mha"), done.stdout  # the tiny space's smallest shape


@pytest.mark.long
def test_search_quality_smoke(tmp_path, ray_session):
    import ray

    cache = tmp_path / "outcomes.jsonl"
    join = ("--address", ray.get_runtime_context().gcs_address)  # the tests' Ray, not one of its own
    done = _smoke("search_quality.py", "--samplers", "tpe,random", "--cache", str(cache), *join, timeout=600)
    out = done.stdout
    assert "2 searches of examples/tiny.toml at 1,024 proxy tokens, no pruning" in out, out
    lines = out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("  tpe ", "  random "))}
    assert rows["tpe"][1] == rows["random"][1] == "1", out  # one seed each in the smoke run
    assert rows["tpe"][-1] == "-" and rows["random"][-1] != "-", out  # only random runs to 2N
    assert "random needs" in out and "mean hypervolume at 2" in out, out
    assert "front, pruning" in out, out
    # Each distinct shape trained once, whichever search met it first.
    keys = [json.loads(line)["key"] for line in cache.read_text().splitlines()]
    assert keys and len(keys) == len(set(keys)), keys


# benchmark -> lines its smoke run must print (the numbers vary; the report's shape does not)
SMOKES = {
    "cost_model": ["cost model, 50 random configs:", "build + FlopCounterMode on meta"],
    "profiler_accuracy": ["fitting set: 8 GEMMs", "held-out:", "median relative error"],
    "gpu_model_accuracy": ["measured on NVIDIA H100 80GB HBM3"],
    "public_runs": [
        "1. ranking from a short run: 22 Gemstones shapes",
        "objective ",
        # Each term of the loss objective alone, beside the free baselines.
        "extrapolation only ",
        "size credit only ",
        "-FLOPs ",
        "2. pruning",
        "front members pruned per order: mean",
        "proxy compute saved: mean",
        "190M-760M at 0.5x-10x -> 1.28B, 3.17B at each: L(N, D)",
        "all parameters, at 350B tokens: L(N)",
        # Porian et al.'s iso-FLOP runs: the joint law from the smaller budgets to the larger.
        "6. Porian et al. 2024, iso-FLOP runs on RefinedWeb and OpenWebText2",
        "RefinedWeb, short warmup, a cosine ending at each budget:",
        "(up to 16x the compute): L(N, D)",
        "the best run at each of the 4 budgets: median |error|",
        "5. the loss objective's constants: size_beta [0.0, 0.15] x extrapolate [0.0, 2.0]",
        "by the rule: ",
    ],
    "serve_accuracy": [
        "serve accuracy on",
        "d128-L4-gqa",
        "decode: median |error|",
        "prefill: median |error|",
    ],
}


# The same for the benchmarks that run searches on Ray: they join the tests' Ray (`--address`)
# rather than start one each, a start being much of a smoke run's time.
RAY_SMOKES = {
    "pruning": ["2 trials of examples/tiny.toml", "front, pruning"],
    "search_overhead": ["1. overhead: 3 no-work trials", "speed-up of 2 workers over 1"],
}


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(SMOKES))
def test_every_benchmark_runs_in_smoke_mode(name):
    done = _smoke(f"{name}.py", timeout=600)
    for line in SMOKES[name]:
        assert line in done.stdout, done.stdout[-3000:]


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(RAY_SMOKES))
def test_every_ray_benchmark_runs_in_smoke_mode_on_the_tests_ray(name, ray_session):
    import ray

    done = _smoke(f"{name}.py", "--address", ray.get_runtime_context().gcs_address, timeout=600)
    for line in RAY_SMOKES[name]:
        assert line in done.stdout, done.stdout[-3000:]


def test_promotion_replay_smoke_costs_between_no_promotion_and_all_at_the_cap():
    done = _smoke("promotion_replay.py", timeout=120)
    out = done.stdout
    assert out.startswith("promotion replayed on 22 Gemstones shapes"), out
    # plan -> (tokens in billions, x over no promotion, Spearman, its interval, iso right, counted)
    row = re.compile(
        r"^    (?P<plan>\(a\).*|\(b\).*|\(c\).*|promoted.*?)\s+(?P<tokens>[\d,]+)B\s+(?P<x>[\d.]+)x\s+"
        r"(?P<rho>[\d.]+) \[(?P<low>[\d.]+), (?P<high>[\d.]+)\]\s+(?P<iso>\d+)/37\s+\d+/\d+\s+[\d.]+$",
        re.M,
    )
    rows = {m["plan"].split(",")[0].split()[0]: m for m in row.finditer(out)}
    assert set(rows) == {"(a)", "(b)", "(c)", "promoted"}, out
    tokens = {k: float(m["tokens"].replace(",", "")) for k, m in rows.items()}
    assert tokens["(a)"] == 176  # 22 shapes x 8B, the smoke's first pass
    assert tokens["(a)"] < tokens["promoted"] <= tokens["(b)"] == 8 * tokens["(a)"], out
    assert float(rows["(a)"]["x"]) == 1.0 and float(rows["(b)"]["x"]) == 8.0, out
    for m in rows.values():
        assert float(m["low"]) <= float(m["rho"]) <= float(m["high"]) <= 1, out
    assert re.search(r"\n      \d+ contenders \(shapes [\d, ]+\); rungs [\d,]+B, (held|capped)", out), out
    # One replay at the default bound on contenders, one without: 19 of the 22 contend at 8B.
    counts = [int(c) for c in re.findall(r"\n      (\d+) contenders", out)]
    assert min(counts) <= PromoteSettings().max_contenders < max(counts), out


def test_trainer_throughput_smoke_trains_in_the_precision_auto_resolves_to(cpu_bf16):
    # "auto" is fp32 on a CPU without native bf16 and bf16 with it: the benchmark names the one it
    # trained and took the GEMM peak in, on any host, under either setting of the switch.
    done = _smoke("trainer_throughput.py", timeout=600)
    assert f"precision {cpu_bf16}" in done.stdout, done.stdout[-3000:]
    assert f"GEMM peak ({cpu_bf16}): " in done.stdout, done.stdout[-3000:]
    assert "d128 L4" in done.stdout, done.stdout[-3000:]


def test_promotion_cal3_smoke_resumes_a_chain_and_replays_the_committed_record():
    done = _smoke("promotion_cal3.py", timeout=300)
    out = done.stdout
    assert re.search(r"^smoke: trial \d+ at 1x [\d.]+, 2x resumed [\d.]+$", out, re.M), out
    assert "promotion on calibration set 3 (tiny CPU regime), replayed from resumed runs" in out, out
    # The record holds every shape's first pass at 3 seeds: no promotion is scored in both blocks.
    none = re.search(r"^  no promotion \(margin 0.063\): front recall, blocks together, (\d+)/45", out, re.M)
    assert none, out
    blocks = re.findall(
        r"^    (tiny|wide): front recall (\d+)/(\d+); knee regret by seed ([\d.]+)/([\d.]+)/([\d.]+)",
        out,
        re.M,
    )
    assert [b[0] for b in blocks[:2]] == ["tiny", "wide"], out
    assert int(blocks[0][1]) + int(blocks[1][1]) == int(none[1]), out


def test_every_benchmark_has_a_smoke_test():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    tested = (
        set(SMOKES) | set(RAY_SMOKES) | {"query_speed", "proxy_fidelity", "step_time_accuracy", "threads"}
    )
    tested |= {"search_quality", "trainer_throughput", "calibration", "gpu_campaign", "ladder_accuracy"}
    tested |= {"gpu_campaign_serve"}  # gpu_campaign's part 3, run by its smoke test
    tested |= {"gpu_campaign_fidelity", "gpu_campaign_plan", "gpu_corpus"}  # part 5, its --dry-run, corpus
    tested |= {"promotion_replay", "promotion_cal3"}
    assert scripts == tested


@pytest.mark.long
def test_calibration_smoke_records_every_stage_and_resumes_without_training_again(tmp_path, ray_session):
    import os

    import ray

    out, snap = tmp_path / "set.json", tmp_path / "set.sqlite"
    env = {**os.environ, "ARCHSEARCH_CALIBRATION_DIR": str(tmp_path / "work")}
    args = ("--out", str(out), "--snapshot", str(snap))
    # The fresh run's steps join the tests' Ray rather than start one: a start is seconds of CPU.
    join = ("--address", ray.get_runtime_context().gcs_address)
    done = _smoke("calibration.py", *args, *join, timeout=900, env=env)
    data = json.loads(out.read_text())
    shapes = data["shapes"]
    assert len(shapes) == 4 and {s["block"] for s in shapes} == {"tiny"}, done.stdout[-3000:]
    # Each shape: the proxy at 2 seeds (the smoke run's), the 2x reference at seeds 0 and 1.
    assert all(sorted(p["seed"] for p in s["proxies"]) == [0, 1] for s in shapes), shapes
    assert all(sorted(r["seed"] for r in s["references"]) == [0, 1] for s in shapes), shapes
    # The smoke's proxy: 1,024 tokens (two steps of 4 sequences of 128), its long runs 2x that.
    assert all(r["multiplier"] == 2 and r["tokens"] > 2 * 1024 * 0.9 for s in shapes for r in s["references"])
    assert "archsearch validate --study cal3-tiny-p0" in "\n".join(data["commands"])
    # Promotion: the first seed's study resumed with the tiny example's settings (the smoke run
    # promotes one seed's; a full run every seed's); its contenders' runs at 2x the proxy recorded,
    # and every proxy of it ranked as the promoted front ranks it; the other seed's left as it was.
    commands = "\n".join(data["commands"])
    assert "tiny-p0-promote.toml --study cal3-tiny-p0" in commands and "tiny-p1-promote" not in commands
    proxies = [next(p for p in s["proxies"] if p["seed"] == 0) for s in shapes]
    promoted = [p for p in proxies if p.get("promotions")]
    assert len(promoted) >= 2, proxies
    assert all(q["tokens"] == 2 * 1024 for p in promoted for q in p["promotions"]), promoted
    assert all(p["ranked"]["estimated"] == (p not in promoted) for p in proxies), proxies
    assert {p["ranked"]["tokens"] for p in proxies} == {2 * 1024}
    assert not any("ranked" in p or "promotions" in p for s in shapes for p in s["proxies"] if p["seed"] == 1)
    assert snap.exists()
    # Again on the same database: every search resumes a finished study, validate finds every
    # long run stored; nothing is trained, the records are the same.
    again = _smoke("calibration.py", *args, "--db", str(tmp_path / "work" / "cal3.db"), timeout=900, env=env)
    assert again.stderr.count("0 long runs trained") == 2, again.stderr[-3000:]  # validate's summary
    assert json.loads(out.read_text())["shapes"] == shapes
    # A checkpoint of the working database (what a stopped session keeps) writes both records again.
    out.unlink()
    snap.unlink()
    work_db = str(tmp_path / "work" / "cal3.db")
    kept = _smoke("calibration.py", *args, "--db", work_db, "--checkpoint", timeout=300, env=env)
    assert "checkpoint: 4 shapes, 8 long runs" in kept.stdout and snap.exists(), kept.stdout
    assert json.loads(out.read_text())["shapes"] == shapes
    # Scored: every predictor with its intervals, pairs, front recall and knee regret.
    scored = _smoke("calibration.py", *args, "--report", "--json", timeout=300, env=env)
    report = json.loads(scored.stdout)
    assert report["shapes"] == 4 and report["proxy_seeds"] == [0, 1] and report["second_seed_shapes"] == 4
    assert set(report["predictors"]) >= {"params", "flops", "proxy loss"}
    measures = {"spearman", "vs_params", "front_recall", "knee_regret"}
    assert all(measures <= set(p) for p in report["predictors"].values())
    assert set(report["blocks"]) == {"tiny"} and set(report["blocks"]["tiny"]) == set(report["predictors"])
    promotion = report["promotion"]["tiny"]
    for when in ("before", "after"):
        assert len(promotion[when]["front_recall"]) == len(promotion[when]["knee_regret"]) == 1, promotion
    assert promotion["after"]["reference_tokens"] == sum(
        r["tokens"] for s in shapes for r in s["references"] if r["seed"] == 0
    )
    # Seed repeats replayed: every seed's study, with and without the example's extrapolation; at
    # seed 0 without it, the first pass is the one the promotion lines start from.
    repeats = report["seed_repeats"]
    assert set(repeats) == {"0", "2"}, repeats
    for rows in repeats.values():
        row = rows["tiny"]
        assert len(row["before"]) == len(row["after"]) == len(row["regret_after"]) == 2, row
        assert all(1 <= c <= 4 for c in row["contenders"]), row
    assert repeats["0"]["tiny"]["before"][0] == promotion["before"]["front_recall"][0]
    assert repeats["0"]["tiny"]["regret_before"][0] == promotion["before"]["knee_regret"][0]


def _bad_set(tmp_path, shapes: list[dict], *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "set.json"
    path.write_text(json.dumps({"shapes": shapes}))
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "calibration.py"), "--report", *args, "--out", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _shape(trial: int, references: tuple[int, ...] = (0,)) -> dict:
    loss = 2.0 + trial / 10
    proxy = {"seed": 0, "val_loss": loss, "val_curve": [[1, 2.5], [2, loss]], "retried": False}
    return {
        "block": "tiny", "trial": trial, "params_total": 1e5 * (trial + 1), "flops_forward_per_token": 1e6,
        "proxies": [proxy], "references": [{"seed": s, "val_loss": 1.5, "tokens": 20} for s in references],
    }  # fmt: skip


def test_a_set_too_small_or_missing_a_reference_is_refused_in_one_line(tmp_path):
    few = _bad_set(tmp_path, [_shape(i) for i in range(3)])
    assert few.returncode == 2 and few.stdout == "", few.stderr
    assert few.stderr.strip().endswith("3 complete shapes; a set needs at least 10 to be scored"), few.stderr
    assert len(few.stderr.strip().splitlines()) == 1
    gap = _bad_set(tmp_path, [_shape(i) for i in range(12)] + [_shape(12, references=())])
    assert gap.returncode == 2 and len(gap.stderr.strip().splitlines()) == 1, gap.stderr
    assert "1 of 13 shapes lack a seed-0 reference or a proxy repeat (first: block tiny trial 12)" in (
        gap.stderr
    )


def test_the_calibration_sweep_scores_every_pair_of_constants_against_the_shipped_one(tmp_path):
    # The same run as a refused set's, on a set that can be scored: references that differ.
    shapes = [_shape(i) for i in range(12)]
    for i, shape in enumerate(shapes):
        shape["references"][0]["val_loss"] = 1.5 + (i % 5) / 10
    done = _bad_set(tmp_path, shapes, "--sweep")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert len(rows) == 24 and {(r[0], r[1]) for r in rows} >= {("0.00", "0"), ("0.15", "2"), ("0.30", "3")}
    shipped = next(r for r in rows if r[:2] == ["0.15", "2"])
    assert shipped[-3:] == ["+0.000", "0", "0"], shipped
    few = _bad_set(tmp_path, [_shape(i) for i in range(3)], "--sweep")
    assert few.returncode == 2 and few.stderr.strip().endswith("a set needs at least 10 to be scored")


def test_the_calibration_sets_tiny_block_is_the_tiny_example():
    # benchmarks/calibration.py's first block must calibrate the example users run: the same
    # space, budget, proxy and objective (only the profile and sampler differ, and only losses
    # are calibrated).
    import tomllib

    example = tomllib.loads((ROOT / "examples" / "tiny.toml").read_text())
    block = tomllib.loads((ROOT / "benchmarks" / "spaces" / "cal-tiny.toml").read_text())
    for table in ("model", "rules", "budget"):
        assert block[table] == example[table], table
    # The example fixes its warm-up in tokens for promotion (12,000, the 5% default of its 240,000);
    # the block's recorded runs ramped over the same 5% as a fraction, and its study must resume.
    proxy = {**example["proxy"]}
    assert proxy.pop("warmup_tokens") == 0.05 * block["proxy"]["tokens"] and "warmup" not in block["proxy"]
    assert block["proxy"] == proxy
    assert block["search"]["sampler"] == "random" and block["search"]["prune"] is False
    # The loss objective decides nothing in a random search without pruning, and the block's
    # recorded study must resume (its fingerprint): the example's extrapolation, chosen on the
    # development sets, is the one the set's report scores (`calibration.EXTRAPOLATE`).
    calibration = (ROOT / "benchmarks" / "calibration.py").read_text()
    objectives = {**example["objectives"]}
    assert f"EXTRAPOLATE = {objectives.pop('extrapolate')!r}\n" in calibration
    assert f"SIZE_BETA = {objectives['size_beta']!r}\n" in calibration
    assert block["objectives"] == objectives


def _campaign_here(campaign, capsys, *args: str) -> str:
    """`benchmarks/gpu_campaign.py ARGS` in this process (the `campaign` fixture's module), its
    stdout: for the runs that resume or report records, whose checks are not about the process
    (each smoke test runs its campaign once as a real process); a process of their own imported
    torch and counted the shapes' kernels again."""
    capsys.readouterr()
    campaign.main(list(args))
    return capsys.readouterr().out


def _campaign(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_campaign.py"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.long
def test_gpu_campaign_smoke_records_every_part_and_a_second_run_resumes_measuring_nothing(
    tmp_path, ray_session, campaign, capsys
):
    import ray

    out = tmp_path / "records"
    # Cut off: a budget spent before the first shape stops part 1 cleanly, with the fit set kept.
    cut = _campaign_here(campaign, capsys, "--smoke", "--out", str(out), "--part", "1", "--budget-s", "0.001")
    assert "part 1: budget spent" in cut, cut
    assert "7 shapes left, run again to resume" in cut, cut
    (steps_file,) = out.glob("gpu_campaign_*_steps.json")
    cut_run = json.loads(steps_file.read_text())
    assert cut_run["shapes"] == [] and len(cut_run["fit_gemms"]) == 5
    # The whole campaign resumes it: the fit set is not timed again, every shape is measured once.
    # Part 2's search joins the tests' Ray rather than start one (the command shown leaves it out).
    join = ("--address", ray.get_runtime_context().gcs_address)
    done = _smoke("gpu_campaign.py", "--out", str(out), *join, timeout=900)
    assert "part 1: resumed" in done.stdout, done.stdout
    assert "0 of 7 shapes recorded, 7 to measure" in done.stdout, done.stdout
    run = json.loads(steps_file.read_text())
    assert run["fit_gemms"] == cut_run["fit_gemms"]
    labels = ["t-d64", "t-d64-ff196", "t-d128-mqa", "t-d64-b8", "t-d64-s128", "t-v250", "fresh-t-d128"]
    assert [s["label"] for s in run["shapes"]] == labels
    assert all(s["train_step_s"] > 0 and s["report"]["kernels"] for s in run["shapes"])
    # Each real step timed twice (the smoke's --step-rounds), in a second pass: the step is their median.
    assert all(len(s["train_step_rounds_s"]) == 2 for s in run["shapes"])
    assert all(s["train_step_s"] == statistics.median(s["train_step_rounds_s"]) for s in run["shapes"])
    assert "real steps timed 2 times each, in separate passes" in done.stdout, done.stdout
    assert "fitting h100-sxm on 4 as `archsearch fit-device` does, scoring it on 3 held out" in done.stdout
    assert re.search(r"held out in advance: median \|error\| [\d.]+%, worst [\d.]+% \(t-", done.stdout)
    fresh = (
        r"fresh \(measured after the refit\): median \|error\| [\d.]+%, worst [\d.]+% \(fresh-t-d128\) over 1"
    )
    assert re.search(fresh, done.stdout), done.stdout
    # Part 2: the generated space searched end to end on the database kept beside the records.
    search = json.loads(next(out.glob("gpu_campaign_*_search.json")).read_text())
    counts = search["counts"]
    assert counts.get("complete", 0) + counts.get("pruned", 0) == 3 and not counts.get("failed"), counts
    assert all(t["profiles"].get("local") and t["profiles"].get("h100-sxm") for t in search["trials"]
               if t["status"] == "complete")  # fmt: skip
    database = next(out.glob("gpu_campaign_*_search.sqlite"))
    assert not list(out.glob("*.sqlite-wal")), "the database record is one self-contained file"
    trials = _campaign_trials(database)
    assert len(trials) == len(search["trials"])
    # Part 3: every shape at every scenario, measured and scored against the model (no CUDA graph
    # on a CPU: eager calls only).
    serve = json.loads(next(out.glob("gpu_campaign_*_serve.json")).read_text())
    points = [(p["label"], p["batch"], p["context"]) for p in serve["points"]]
    assert points == [(s, b, c) for s in ("t-d64", "t-d128-mqa") for b, c in ((1, 32), (2, 64))], points
    assert all(p["prefill_time_s"] > 0 and p["decode_ops"] > 0 and p["decode_graph_time_s"] is None
               for p in serve["points"])  # fmt: skip
    # Each point measured twice (the smoke's --serve-rounds), in a second pass: each call's the median.
    assert all(p["rounds"] == 2 and len(p["prefill_time_rounds_s"]) == 2 for p in serve["points"])
    assert all(p["decode_time_s"] == statistics.median(p["decode_time_rounds_s"]) for p in serve["points"])
    assert "part 3: prefill_time_s measured in 2 passes: spread" in done.stdout, done.stdout
    assert re.search(r"part 3: decode against h100-sxm: median \|error\| [\d.]+%", done.stdout), done.stdout
    # Part 4: the traced steps, each with its launches and the operators that took longest.
    trace = json.loads(next(out.glob("gpu_campaign_*_trace.json")).read_text())
    assert list(trace["shapes"]) == ["t-d64", "t-d128-mqa"], trace["shapes"].keys()
    for entry in trace["shapes"].values():
        assert entry["steps"] == 3 and entry["wall_s"] > 0 and entry["calls"] > 0 and entry["top"]
        assert sum(k["seconds"] for k in entry["top"]) <= entry["device_s"] * (1 + 1e-9)
    assert re.search(r"part 4: t-d64 \(batch 4\): [\d.]+ ms a step .* launches \(the model counts \d+\)",
                     done.stdout), done.stdout  # fmt: skip
    # The recorded run is what fit-device reads (in process: the entry point is not what this checks).
    from typer.testing import CliRunner

    from archsearch.cli import app

    fitted = CliRunner().invoke(app, ["fit-device", str(steps_file), "--no-holdout", "--json"])
    assert fitted.exit_code == 0 and len(json.loads(fitted.stdout)["shapes"]) == 7, fitted.output
    # Again: nothing is measured or trained; the records are the same bytes.
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix != ".jsonl"}
    again = _campaign_here(campaign, capsys, "--smoke", "--out", str(out))
    assert "part 1: resumed" in again and "7 of 7 shapes recorded, 0 to measure" in again
    assert "part 2: resumed" in again and "3 of 3 trials finished" in again, again
    assert "part 2: nothing to run" in again and "+ archsearch search" not in again
    assert "part 3: 4 of 4 points recorded, 0 to measure" in again, again
    assert "part 4: 2 shapes traced, 0 to trace" in again, again
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.suffix != ".jsonl"} == before
    events = [json.loads(line)["event"] for line in next(out.glob("*.jsonl")).read_text().splitlines()]
    assert events.count("start") == 3 and events.count("part 1 scored") == 2, events


def _campaign_trials(database: Path) -> list[tuple]:
    import sqlite3

    with sqlite3.connect(database) as db:
        return db.execute("SELECT number, status FROM archsearch_trials").fetchall()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--part", "6"], "no part 6; parts: 1 steps, 2 search, 3 serve, 4 trace, 5 fidelity"),
        (["--sitting", "--part", "3"], "--sitting names its parts (1, 5, 3): leave out --part and --parts"),
        (["--parts", "1,x"], "--parts must be numbers"),
        (["--budget-s", "-5"], "--budget-s must be positive, got -5"),
        (["--budget-s", "soon"], "argument --budget-s: invalid float value: 'soon'"),
        (["--report", "--out", "/nonexistent/records"], "no campaign records in /nonexistent/records"),
    ],
    ids=["part-6", "parts", "sitting-parts", "budget", "budget-type", "no-records"],
)
def test_gpu_campaign_refuses_bad_input_in_one_line(args, message):
    done = _campaign(*args, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_campaign: ") and message in lines[0], done.stderr


def test_gpu_corpus_smoke_builds_a_bpe_corpus_that_loads_as_uint32():
    pytest.importorskip("tokenizers")
    done = _smoke("gpu_corpus.py", timeout=300)
    found = re.search(r"([\d,]+) train \+ ([\d,]+) val tokens, vocab 512 \(uint32", done.stdout)
    assert found and int(found[1].replace(",", "")) > 10 * int(found[2].replace(",", "")) > 0, done.stdout


@pytest.mark.long
def test_gpu_campaign_fidelity_smoke_runs_in_order_records_each_run_and_resumes_training_nothing(
    tmp_path, ray_session, campaign, capsys
):
    """Part 5 after part 1's --only shapes, whatever order they are named in; every run recorded
    and scored; again, nothing trained; --report scores the records."""
    import ray

    pytest.importorskip("tokenizers")
    out = tmp_path / "records"
    join = ("--address", ray.get_runtime_context().gcs_address)  # the tests' Ray, not one of its own
    done = _smoke(
        "gpu_campaign.py", "--out", str(out), "--parts", "5,1", "--only", "fresh-", *join, timeout=900
    )
    assert done.stdout.index("part 1:") < done.stdout.index("part 5:"), done.stdout
    steps = json.loads(next(out.glob("gpu_campaign_*_steps.json")).read_text())
    assert [s["label"] for s in steps["shapes"]] == ["fresh-t-d128"]
    assert "part 5: 4 shapes, 24 runs: 0 recorded, 24 to train" in done.stdout, done.stdout
    (record,) = out.glob("gpu_campaign_*_fidelity.jsonl")
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    plan, runs = lines[0], lines[1:]
    assert plan["kind"] == "plan" and len(plan["shapes"]) == 4 and plan["corpus"]["dtype"] == "uint32"
    assert sorted(r["key"] for r in runs) == sorted(plan["runs"]) and len(runs) == 24
    assert all(r["status"] == "complete" and r["val_loss"] > 0 for r in runs), runs
    # 4 shapes x (2 proxy seeds, the proxy at 2x and 4x, 2 long seeds); the long runs 10x the proxy.
    assert {(r["run"], r["tokens"]) for r in runs} == {
        ("proxy", 512), ("proxy2x", 1024), ("proxy4x", 2048), ("long", 5120)
    }  # fmt: skip
    assert sum(r["run"] == "long" and r["seed"] == 1 for r in runs) == 4
    assert re.search(r"the proxy at 4x its tokens: Spearman .*minus the proxy at seed 0", done.stdout)
    assert re.search(r"part 5: 4 shapes, the proxy \(2 seeds\) against 10x its tokens", done.stdout), (
        done.stdout
    )
    assert re.search(r"long: 5,120 tokens, [\d.]+-[\d.]+ tokens a parameter, [\d.]+ epochs", done.stdout)
    before = record.read_bytes()
    again = _campaign_here(campaign, capsys, "--smoke", "--out", str(out), "--part", "5")
    assert "part 5: 4 shapes, 24 runs: 24 recorded, 0 to train" in again, again
    assert record.read_bytes() == before
    report = _campaign_here(campaign, capsys, "--report", "--out", str(out))
    assert "proxy seed noise" in report, report


def test_gpu_campaign_dry_run_plans_the_sitting_within_the_device_time():
    done = _smoke("gpu_campaign.py", "--sitting", "--dry-run", timeout=300)
    assert "part 5: 4 shapes, 24 of 24 runs to train" in done.stdout, done.stdout
    assert re.search(r"total device time +\d+ s of 900 s: fits", done.stdout), done.stdout
    assert re.search(r"carried: working tree [\d.]+ MB \+ wheels", done.stdout), done.stdout


def test_gpu_campaign_fidelity_plan_grows_by_runs_added_and_refuses_one_that_drops_or_changes(
    tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_campaign_fidelity as fid

    path = tmp_path / "fidelity.jsonl"
    record = fid.Record(path, lambda p, data: p.write_bytes(data), "h200")
    plan = {"space": "s", "shapes": [{"label": "a"}], "corpus": {"fingerprint": "f"}, "runs": ["a/proxy/0"]}
    record.start(plan)
    record.start(plan)  # the same plan: nothing written
    assert len(record.lines()) == 1
    grown = plan | {"runs": ["a/proxy/0", "a/proxy2x/0"]}
    record.start(grown)
    assert len(record.lines()) == 2 and record.plan()["runs"] == grown["runs"]
    for other in (plan, grown | {"space": "t"}, grown | {"corpus": {"fingerprint": "g"}}):
        with pytest.raises(ValueError, match="records another plan"):
            record.start(other)


@pytest.fixture
def campaign(monkeypatch):
    """benchmarks/gpu_campaign.py as a module (it imports gpu_model_accuracy's shapes from beside it)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_campaign", ROOT / "benchmarks" / "gpu_campaign.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_campaign", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_gpu_campaign_shapes_vary_every_knob_the_issue_names_and_hold_a_fixed_third_out(campaign):
    import gpu_model_accuracy

    table = campaign.shapes()
    labels = [label for label, _, _ in table]
    assert len(labels) >= 30 and len(set(labels)) == len(labels)
    assert table[:8] == gpu_model_accuracy.shapes()  # the recorded H100 run's shapes, measured again
    planned = [label for label in labels if not campaign._fresh_group(label)]  # fresh ones: added later
    assert campaign.HELD_OUT < set(planned) and 0.2 < len(campaign.HELD_OUT) / len(planned) < 0.4
    assert {campaign._fresh_group(label) for label in labels} == {None, *campaign.FRESH_GROUPS}
    configs = [cfg for _, cfg, _ in table]
    # d_model and d_ff off the 64 elements and off the 16 bytes (8 bf16 elements), beside aligned ones.
    for widths in ([c.d_model for c in configs], [c.d_ff for c in configs]):
        assert {w % 64 == 0 for w in widths} == {True, False} and any(w % 8 for w in widths)
    assert len({c.head_dim for c in configs}) >= 5
    assert {c.n_heads // c.n_kv_heads for c in configs} >= {1, 4, 8, 16}
    assert len({c.seq_len for c in configs}) >= 5 and len({batch for _, _, batch in table}) >= 6
    assert {50257, 50304, 256} <= {c.vocab_size for c in configs}
    assert campaign.SMOKE_HELD_OUT < {label for label, _, _ in campaign.smoke_shapes()}
    assert set(campaign.TRACED) < set(labels) and campaign.HELD_OUT & set(campaign.TRACED)
    assert set(campaign.SMOKE_TRACED) < {label for label, _, _ in campaign.smoke_shapes()}


def test_gpu_campaign_searches_the_gpu_example_with_only_the_proxy_cut(campaign):
    import tomllib

    from archsearch.search.spec import parse_spec

    example = tomllib.loads((ROOT / "examples" / "gpu.toml").read_text())
    args = campaign.parse_args([])
    generated = tomllib.loads(campaign.to_toml(campaign.search_space(args, "h200")))
    for table in ("model", "rules", "budget", "objectives"):
        assert generated[table] == example[table], table
    assert generated["proxy"] == {**example["proxy"], "tokens": 3_000_000, "device": "cuda"}
    assert generated["profile"]["devices"] == [*example["profile"]["devices"], "h200"]
    assert generated["search"] == {**example["search"], "prune_min_trials": 2}
    assert parse_spec(campaign.to_toml(campaign.search_space(args, "h100-sxm"))).defaults.prune
    smoke = parse_spec(campaign.to_toml(campaign.search_space(campaign.parse_args(["--smoke"]), "h100-sxm")))
    smoke.space.check_feasible()  # raises when no tiny shape meets the budget


def test_gpu_campaign_records_a_failing_shape_and_measures_the_rest(campaign, monkeypatch, tmp_path, capsys):
    from archsearch.evaluators import step_record
    from archsearch.evaluators.device import detect_device

    measured, broken = [], {"t-d128-mqa"}

    def measure(label, cfg, batch, *args):
        measured.append(label)
        if label in broken:
            raise RuntimeError("no kernel for this shape")
        return {"label": label, "config": cfg.to_dict(), "batch": batch, "train_step_s": None, "measure_s": 0}

    monkeypatch.setattr(step_record, "measure_shape", measure)
    monkeypatch.setattr(step_record, "time_fit_gemms", lambda gemms, *a: [[*g, 1e-6] for g in gemms])
    info = detect_device("cpu")
    files = campaign.Files(tmp_path, "cpu")
    labels = [label for label, _, _ in campaign.smoke_shapes()]

    def run(*argv):
        measured.clear()
        campaign.part_steps(campaign.parse_args(["--smoke", *argv]), info, files, campaign.Budget(None))
        return json.loads(files.steps.read_text())

    first = run()
    assert measured == labels
    assert [s["label"] for s in first["shapes"]] == [x for x in labels if x != "t-d128-mqa"]
    assert first["failed"] == [{
        "label": "t-d128-mqa", "config": first["failed"][0]["config"], "batch": 2,
        "error": "RuntimeError: no kernel for this shape",
    }]  # fmt: skip
    assert "t-d128-mqa: not measured: RuntimeError: no kernel for this shape" in capsys.readouterr().out
    assert run()["shapes"] == first["shapes"] and measured == []  # recorded as failed: not tried again
    assert "6 of 7 shapes recorded (1 failed: --retry-failed measures them again), 0 to measure" in (
        capsys.readouterr().out
    )
    broken.clear()
    again = run("--retry-failed")
    assert measured == ["t-d128-mqa"] and again["failed"] == []
    assert sorted(s["label"] for s in again["shapes"]) == sorted(labels)
    # A record of a step the trainer no longer runs (other launches: its code changed) is measured again.
    assert all(s["launches"] > 0 for s in again["shapes"])
    again["shapes"][0]["launches"] += 1
    files.write_json(files.steps, again)
    assert [s["label"] for s in run()["shapes"]][-1] == again["shapes"][0]["label"] and len(measured) == 1
    assert f"dropped 1 record(s) whose shape or step changed: {again['shapes'][0]['label']}" in (
        capsys.readouterr().out
    )


def test_gpu_campaign_times_steps_again_in_passes_and_resumes_a_cut_pass(campaign, monkeypatch, tmp_path):
    from archsearch.evaluators import step_record
    from archsearch.evaluators.device import detect_device
    from archsearch.space.knobs import config_from_knobs

    cfg = config_from_knobs(vocab_size=256, seq_len=64, d_model=64, n_layers=2, head_dim=32, d_ff=256)
    entry = {"config": cfg.to_dict(), "batch": 4}
    raw = {"dtype": "fp32", "shapes": [
        {**entry, "label": "old", "train_step_s": 0.010},  # recorded before the rounds: one timing
        {**entry, "label": "new", "train_step_s": 0.020, "train_step_rounds_s": [0.020]},
        {**entry, "label": "oom", "train_step_s": None, "error": "real step out of memory"},
    ]}  # fmt: skip
    timings = iter([0.012, 0.030, 0.011, 0.040])
    timed = []

    def time_step(c, batch, info, dtype, steps, synchronize_each=True):
        if not synchronize_each:  # back to back, as the trainer runs them: recorded beside
            return 0.001
        timed.append((c, batch, dtype))
        return next(timings)

    monkeypatch.setattr(step_record, "time_train_step", time_step)
    files = campaign.Files(tmp_path, "cpu")
    info = detect_device("cpu")

    # A budget that allows one timing: the pass stops before the second shape.
    class OneTiming:
        asked = 0

        def allows(self, seconds):
            self.asked += 1
            return self.asked == 1

    campaign.step_rounds(campaign.parse_args(["--step-rounds", "3"]), info, raw, files, OneTiming())
    assert [s.get("train_step_rounds_s") for s in raw["shapes"]] == [[0.010, 0.012], [0.020], None]
    campaign.step_rounds(campaign.parse_args(["--step-rounds", "3"]), info, raw, files, campaign.Budget(None))
    assert [s.get("train_step_rounds_s") for s in raw["shapes"]] == [
        [0.010, 0.012, 0.011], [0.020, 0.030, 0.040], None,
    ]  # fmt: skip
    assert [s["train_step_s"] for s in raw["shapes"]] == [0.011, 0.030, None]  # the medians
    assert [s.get("train_step_back_to_back_s") for s in raw["shapes"]] == [[0.001] * 2, [0.001] * 2, None]
    assert timed == [(cfg, 4, "fp32")] * 4 and json.loads(files.steps.read_text()) == raw


@pytest.mark.long
def test_ladder_accuracy_smoke_predicts_the_real_runs_and_resumes_without_training_again(
    tmp_path, ray_session
):
    import os

    import ray

    env = {**os.environ, "ARCHSEARCH_LADDER_DIR": str(tmp_path)}
    out = tmp_path / "record.json"
    # Its three runs' searches and ladders join the tests' Ray rather than start one each: a start
    # is most of a step's time.
    join = ("--address", ray.get_runtime_context().gcs_address)
    done = _smoke("ladder_accuracy.py", "--out", str(out), *join, timeout=900, env=env)
    assert "3 designs; law: E " in done.stdout, done.stdout[-3000:]
    assert "median abs error" in done.stdout and "Spearman against the real ranking: ladder" in done.stdout
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert len(rows) == 3 and all(r["real"] is not None and len(r["rungs"]) == 3 for r in rows), rows
    assert all(r["low"] <= r["predicted"] <= r["high"] and r["distance"] > 1 for r in rows), rows
    assert any(c.startswith("archsearch ladder --study ladder-smoke") for c in record["commands"])
    assert set(record["measures"]["spearman"]) == {"ladder", "proxy", "proxy_adjusted"}
    # The smoke replicates its first design's real run with seed 1: a second loss, its difference.
    (noise,) = record["real_seed_noise"]
    assert noise["trial"] == rows[0]["trial"] and noise["seed_0"] == rows[0]["real"]
    assert noise["seed_1"] != noise["seed_0"] and noise["difference"] > 0
    assert f"trial {noise['trial']}: real runs with seeds 0 and 1" in done.stdout
    # Again: the ladder finds every rung stored and the real runs recorded; nothing is trained.
    again = _smoke("ladder_accuracy.py", "--out", str(out), *join, timeout=900, env=env)
    assert "real runs: 0 to train, 4 recorded" in again.stdout, again.stdout[-3000:]
    assert "0 rungs trained, 9 reused from earlier runs" in again.stderr, again.stderr[-3000:]
    assert [r["real"] for r in json.loads(out.read_text())["rows"]] == [r["real"] for r in rows]
    # Rungs at another batch than the real runs': a new ladder of each design predicts the same runs.
    other = _smoke(
        "ladder_accuracy.py",
        "--out",
        str(out),
        "--rung-batch-size",
        "2",
        "--recorded-only",
        *join,
        timeout=900,
        env=env,
    )
    assert "real runs: 0 left out, 4 recorded" in other.stdout, other.stdout[-3000:]
    assert "9 rungs trained, 0 reused from earlier runs" in other.stderr, other.stderr[-3000:]
    record = json.loads(out.read_text())
    assert "the rungs at batch 2, the real runs at 4" in record["what"], record["what"]
    assert [r["real"] for r in record["rows"]] == [r["real"] for r in rows]
    assert [r["predicted"] for r in record["rows"]] != [r["predicted"] for r in rows]
