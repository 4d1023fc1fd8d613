"""bench/RESULTS.md is what bench/results.py writes from bench/results/*.json, so the page cannot
drift from its records; the records carry their provenance, and a malformed one is refused by name."""
import copy
import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import results  # noqa: E402


def test_committed_page_is_the_render():
    with open(results.PAGE) as f:
        page = f.read()
    assert page == results.render_page(), "run: python3 bench/results.py render"
    assert results.main(["check"]) == 0


def test_page_stays_short():
    # A page a user reads in two minutes: the passes live in docs/notes/.
    with open(results.PAGE) as f:
        assert len(f.read().splitlines()) <= 225


def test_every_record_has_its_fields():
    tables = results.load_tables()
    assert len(tables) >= 8
    n = 0
    for path, table in tables:
        for rec in table["records"]:
            n += 1
            for key in results.REQUIRED:
                assert key in rec, (path, key)
            assert rec["date"].startswith("20") and rec["commit"] and rec["command"] and rec["gpu"]
            assert rec["ratio"] is not None or rec["ours"] is not None
    assert n > 50


def test_each_table_is_one_op_or_client():
    seen = set()
    for _, table in results.load_tables():
        key = (table["op"], table["client"])
        assert key not in seen
        seen.add(key)
        assert {(r["op"], r["client"]) for r in table["records"]} <= {key}


def test_unmeasured_tables_say_so_and_hold_no_figures():
    by_op = {t["op"]: t for _, t in results.load_tables()}
    pending = [op for op, t in by_op.items() if "pending" in t]
    for op in pending:
        assert by_op[op]["records"] == [] and by_op[op]["pending"]
    page = results.render_page()
    assert page.count("Not measured yet") == len(pending)


def _copy_tables(tmp_path):
    d = tmp_path / "results"
    shutil.copytree(results.TABLES, d)
    return d


def _edit(d, name, fn):
    p = d / name
    table = json.loads(p.read_text())
    fn(table)
    p.write_text(json.dumps(table))


@pytest.mark.parametrize("change, message", [
    (lambda t: t["records"][0].pop("commit"), "selective_scan_fwd.json: record 0: missing field(s) commit"),
    (lambda t: t["records"][1].update(ratio_kind="faster"), "record 1: field 'ratio_kind' must be one of"),
    (lambda t: t["records"][0].update(ours="fast"), "record 0: field 'ours' must be a number"),
    (lambda t: t["records"][0].update(ratio="1.2x"), "record 0: field 'ratio' must be a number or null"),
    (lambda t: t["records"][0].update(date=""), "record 0: field 'date' must be a non-empty string"),
    (lambda t: t["records"][0].update(speed=1), "record 0: unknown field(s) speed"),
    (lambda t: t["records"][0].update(interval=[1]), "record 0: field 'interval' must be [low, high]"),
    (lambda t: t["records"][0].update(op="selective_scan bwd"), "record 0: op 'selective_scan bwd' is not"),
    (lambda t: t["records"][0].update(ours=None, ratio=None), "record 0: a record needs a figure or a ratio"),
    (lambda t: t.pop("title"), "missing table field(s) title"),
    (lambda t: t.update(records=[]), "a table without records says why in 'pending'"),
])
def test_malformed_records_are_refused_by_name(tmp_path, change, message):
    d = _copy_tables(tmp_path)
    _edit(d, "selective_scan_fwd.json", change)
    with pytest.raises(results.RecordError) as e:
        results.render_page(str(d))
    assert message in str(e.value)


def test_a_file_that_is_not_json_is_named(tmp_path):
    d = _copy_tables(tmp_path)
    (d / "build.json").write_text("{not json")
    with pytest.raises(results.RecordError, match="build.json: not JSON"):
        results.load_tables(str(d))


def test_cli_fails_clearly_on_a_malformed_record(tmp_path, monkeypatch, capsys):
    d = _copy_tables(tmp_path)
    _edit(d, "build.json", lambda t: t["records"][0].pop("gpu"))
    monkeypatch.setattr(results, "TABLES", str(d))
    monkeypatch.setattr(results, "PAGE", str(tmp_path / "RESULTS.md"))
    assert results.main(["render"]) == 2
    assert "build.json: record 0: missing field(s) gpu" in capsys.readouterr().err
    assert not (tmp_path / "RESULTS.md").exists()


def test_check_says_when_the_page_differs(tmp_path, monkeypatch, capsys):
    page = tmp_path / "RESULTS.md"
    page.write_text("# edited by hand\n")
    monkeypatch.setattr(results, "PAGE", str(page))
    assert results.main(["check"]) == 1
    assert "run python3 bench/results.py render" in capsys.readouterr().err
    assert results.main(["render"]) == 0
    assert results.main(["check"]) == 0


def _new_record(**over):
    fields = dict(op="selective_scan fwd", client=None, shape="(8, 2048, 2048, 16)",
                  variant="call from Python", dtype="bf16", ours=0.3, original=0.6, unit="ms", ratio=2.0,
                  ratio_kind="speedup",
                  gpu="a GPU", date="2026-12-07 08:00 UTC", commit="abc1234", command="python3 bench/x.py")
    fields.update(over)
    return results.record(**fields)


def test_update_replaces_the_same_case_and_appends_new_ones(tmp_path, monkeypatch):
    d = _copy_tables(tmp_path)
    monkeypatch.setattr(results, "PAGE", str(tmp_path / "RESULTS.md"))
    before = json.loads((d / "selective_scan_fwd.json").read_text())["records"]
    new = tmp_path / "new.json"
    results.write_records(str(new), [_new_record(), _new_record(shape="(3, 3, 3, 3)")])
    written = results.update([str(new)], str(d))
    assert [os.path.basename(p) for p in written] == ["selective_scan_fwd.json"]
    after = json.loads((d / "selective_scan_fwd.json").read_text())["records"]
    assert len(after) == len(before) + 1
    assert after[0]["commit"] == "abc1234" and after[0]["ours"] == 0.3
    assert after[1:-1] == before[1:] and after[-1]["shape"] == "(3, 3, 3, 3)"
    page = results.render_page(str(d))
    assert "| (8, 2048, 2048, 16), call from Python | bf16 | 0.3 ms | 0.6 ms | 2x |" in page


def test_update_fills_a_pending_table(tmp_path):
    d = _copy_tables(tmp_path)
    table = json.loads((d / "layernorm_gated.json").read_text())
    table["records"], table["pending"] = [], "not timed yet"  # as a new op's table starts
    (d / "layernorm_gated.json").write_text(json.dumps(table))
    assert results.render_page(str(d)).count("Not measured yet") == 1
    new = tmp_path / "new.json"
    results.write_records(str(new), [_new_record(op="layernorm_gated", variant="forward")])
    results.update([str(new)], str(d))
    table = json.loads((d / "layernorm_gated.json").read_text())
    assert "pending" not in table and len(table["records"]) == 1
    assert results.render_page(str(d)).count("Not measured yet") == 0


def test_update_refuses_a_record_without_a_table(tmp_path):
    d = _copy_tables(tmp_path)
    new = tmp_path / "new.json"
    results.write_records(str(new), [_new_record(op="something else")])
    with pytest.raises(results.RecordError, match="no table .* for op 'something else'"):
        results.update([str(new)], str(d))


def test_record_refuses_what_the_schema_does_not_know():
    with pytest.raises(results.RecordError, match="unknown field"):
        _new_record(speedup=2)
    with pytest.raises(results.RecordError, match="missing field"):
        fields = dict(op="ssd", client=None)
        results.record(**fields)
    rec = _new_record(interval=None)
    assert "interval" not in rec  # optional fields left out when not measured


def test_render_does_not_change_the_tables():
    tables = results.load_tables()
    frozen = copy.deepcopy(tables)
    results.render(tables)
    assert tables == frozen


def test_links_to_the_page_and_the_notes_resolve():
    for path in ("bench/RESULTS.md", "docs/notes/bench-passes.md", "bench/README.md"):
        assert os.path.isfile(os.path.join(ROOT, path)), path
    with open(os.path.join(ROOT, "README.md")) as f:
        assert "(bench/RESULTS.md)" in f.read()


# The benchmarks' --json writers, fed synthetic timings (the benchmarks themselves need a GPU).
CONTEXT = {"gpu": "a GPU", "date": "2026-12-07 08:00 UTC", "commit": "abc1234",
           "command": "python3 bench/b.py"}


def _merged_page(tmp_path, recs):
    d = _copy_tables(tmp_path)
    new = tmp_path / "new.json"
    results.write_records(str(new), recs)
    results.update([str(new)], str(d))
    return d, results.render_page(str(d))


def test_conv_json_records_replace_the_cases_they_measured(tmp_path):
    import bench_causal_conv1d as b
    import torch

    res = {"ours": {"fwd_graph": 0.08, "fwdbwd_graph": 0.2},
           "original": {"fwd_graph": 0.1, "fwdbwd_graph": None}}
    rows = [{"shape": (8, 5120, 2048, 4), "dtype": torch.bfloat16, "layout": "channel-first", "res": res}]
    dec = [{"batch": 64, "dim": 5120, "res": {"ours": {"graph": 0.004}, "original": {"graph": 0.005}}},
           {"batch": 128, "dim": 5120, "res": {"ours": {"graph": None}}}]  # a failed timing writes nothing
    recs = b.json_records(rows, dec, CONTEXT)
    assert [(r["op"], r["ratio"]) for r in recs] == [
        ("causal_conv1d fwd", 1.25), ("causal_conv1d fwd+bwd", None), ("causal_conv1d update", 1.25)]
    d, page = _merged_page(tmp_path, recs)
    fwd = json.loads((d / "causal_conv1d_fwd.json").read_text())["records"]
    assert len(fwd) == 8 and fwd[0]["commit"] == "abc1234" and fwd[0]["dtype"] == "bfloat16"
    assert "| (8, 5120, 2048, 4), channel-first, graph | bfloat16 | 0.08 ms | 0.1 ms | 1.25x |" in page


def test_scan_json_records_keep_the_paired_interval(tmp_path):
    import bench_selective_scan as b

    measured = [
        {"section": "fwd", "shape": "(8, 2048, 2048, 16)", "dtype": "bf16",
         "res": {"ours": (0.33, 0.32), "original": (0.6, 0.64)}},
        {"section": "bwd", "shape": "(8, 2048, 2048, 16)", "dtype": "bf16", "res": {"ours": (2.0, None)}},
        {"section": "decode", "shape": "batch 1, dim 5120, dstate 16",
         "dtype": "fp32 state, bf16 activations",
         "res": {"ours": (0.013, 0.0018), "original": (0.085, 0.0018)}, "paired": (1.0034, 1.0001, 1.0072)},
    ]
    recs = b.json_records(measured, CONTEXT)
    fwd, bwd, graph, call = recs
    assert fwd["ratio"] == 1.818 and fwd["ratio_graph"] == 2.0 and fwd["variant"] == "call from Python"
    assert bwd["op"] == "selective_scan fwd+bwd" and bwd["ratio"] is None and "ratio_graph" not in bwd
    assert graph["variant"] == "graph" and graph["ratio"] == 1.003 and graph["interval"] == [1.0, 1.007]
    assert call["variant"] == "call from Python" and call["ratio"] == 6.538
    d, page = _merged_page(tmp_path, recs)
    dec = json.loads((d / "selective_state_update.json").read_text())["records"]
    assert dec[0]["commit"] == "abc1234" and dec[1]["variant"] == "graph, second run"
    assert "| 0.0018 ms | 0.0018 ms | 1.003x (1-1.007) |" in page
    assert "| 0.33 ms | 0.6 ms | 1.818x, graph 2x |" in page


def test_ssd_and_norm_json_records_fill_their_pending_tables(tmp_path):
    import bench_layernorm_gated as norm
    import bench_ssd as ssd

    shape = (8, 2048, 80, 64, 128, 1, 256, "bfloat16")
    recs = ssd.json_records([("forward", shape, {"ours": 1.0, "triton": 1.3}),
                             ("forward + backward", shape, {"ours": 4.0, "triton": 4.6})], CONTEXT)
    assert [r["ratio"] for r in recs] == [1.3, 1.15]
    assert recs[0]["shape"] == "batch 8, seqlen 2048, nheads 80, headdim 64, dstate 128, ngroups 1, chunk 256"
    recs += norm.json_records([("16x2048x5120/640:bf16", {"fwd": 0.2, "fwd+bwd": 0.5},
                                {"fwd": 0.3, "fwd+bwd": None})], CONTEXT)
    assert [(r["op"], r["variant"], r["dtype"]) for r in recs[2:]] == [
        ("layernorm_gated", "forward", "bf16"), ("layernorm_gated", "forward + backward", "bf16")]
    _, page = _merged_page(tmp_path, recs)
    assert "Not measured yet" not in page


def test_transcribed_figures_are_in_the_notes():
    # Figures written as strings were copied from the passes; a benchmark's --json writes numbers.
    with open(os.path.join(ROOT, "docs", "notes", "bench-passes.md")) as f:
        notes = f.read()
    missing = []
    for path, table in results.load_tables():
        for i, rec in enumerate(table["records"]):
            fields = ["ours", "original"] + ([] if rec.get("computed") else ["ratio", "ratio_graph"])
            values = [rec.get(k) for k in fields] + list(rec.get("interval", []))
            missing += [f"{os.path.basename(path)}: record {i}: {v}" for v in values
                        if isinstance(v, str) and v not in notes]
            # commits the notes name otherwise: the one that wrote the conv section ("commit of this
            # section"), and the scan section's "selective_scan bwd: 16-byte shared reads..."
            named = {"5126de2": "Ours (commit of this section)",
                     "71f83bb": "selective_scan bwd: 16-byte shared reads"}
            transcribed = any(isinstance(rec.get(k), str) for k in ("ours", "original", "ratio"))
            commit = rec["commit"][:7]
            if transcribed and commit not in notes and named.get(commit, "\0") not in notes:
                missing.append(f"{os.path.basename(path)}: record {i}: commit {rec['commit']}")
    assert missing == []


def test_glance_ranges_each_tables_speedups():
    table = {"title": "An op, forward + backward", "records": [
        {"ratio": "0.5", "ratio_kind": "speedup", "date": "2026-12-01 10:00 UTC"},
        {"ratio": 1.25, "ratio_kind": "speedup", "date": "2026-12-03"},
        {"ratio": "0.9", "ratio_kind": "ours/original", "date": "2026-12-02"},
    ]}
    empty = {"title": "Later", "records": []}
    rows = results.glance([("a.json", table), ("b.json", empty)])
    assert "| [An op, forward + backward](#an-op-forward--backward) | 0.5x - 1.25x | 3 | 2026-12-03 |" in rows
    assert "| Later | not measured yet | 0 | - |" in rows
