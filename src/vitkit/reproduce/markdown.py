"""report.md from report.json (every number in it comes from the JSON)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from . import stats
from .claims import METRIC_LABELS, PERCENT, SPEED, lr_name

SHOWN = ("test_top1", "val_top1", "fewshot_5", "fewshot_10", "late_gain", SPEED)


def _num(v: Optional[float], metric: str, sign: bool = False) -> str:
    if v is None:
        return "-"
    s = "+" if sign else ""
    if metric in PERCENT:
        return f"{100 * v:{s}.2f}"
    return f"{v:{s},.0f}" if metric == SPEED else f"{v:{s}.3g}"


def _ci(s: Dict[str, Any], metric: str, sign: bool = False) -> str:
    if s.get("mean") is None and s.get("estimate") is None:
        return "-"
    mid = s["mean"] if "mean" in s else s["estimate"]
    ci = s.get("ci")
    rng = f" [{_num(ci[0], metric, sign)}, {_num(ci[1], metric, sign)}]" if ci else ""
    return _num(mid, metric, sign) + rng


def compute_line(c: Optional[Dict[str, Any]]) -> str:
    if not c:
        return ""
    did = c["this_invocation"]
    what = ", ".join(f"{n} {k}" for k, n in did.items()) if did else "report only, nothing trained"
    wall = (f"this command took {c['wall_s'] / 60:.1f} min wall for all of it" if c["complete"] else
            f"this invocation took {c['wall_s'] / 60:.1f} min wall ({what})")
    if c.get("jobs", 1) > 1:
        wall += f", {c['jobs']} runs at a time"
    line = f"Compute: {c['runs']} runs, {c['train_s_total'] / 60:.1f} min of training in all; {wall}."
    machines = c.get("machines") or {}
    known = [f"{m} ({n} run{'s' if n > 1 else ''})" for m, n in machines.items() if m]
    if known:
        line += " Trained on: " + "; ".join(known) + "."
    if machines.get(""):
        line += f" Not recorded for {machines['']} run{'s' if machines[''] > 1 else ''}."
    codes = c.get("code_versions") or {}
    if codes:
        line += " Code: " + "; ".join(f"{k} ({n} runs)" for k, n in codes.items()) + "."
    if c.get("backends"):
        line += " Kernels: " + "; ".join(f"{k} ({n} runs)" for k, n in c["backends"].items()) + "."
    return line


def _head(report: Dict[str, Any]) -> List[str]:
    m = report["margins"]
    lines = ["# vitkit reproduce: the paper's claims at laptop scale", "",
             f"Command: `{report['command']}`  ", f"{report['machine'][:1].upper()}{report['machine'][1:]}  ",
             f"Budget: **{report['budget']}**: {report['budget_note']}.  ", compute_line(report.get("compute")), "",
             f"Data: {report['data']}. The validation split ({report['validation']}) chooses everything that is "
             "chosen (learning rates, claim 2's read-out rates, raw or EMA weights) and is what the probes read; "
             f"the test split ({report.get('test', 'the whole test split')}) is read once per final model, by the "
             "trainer, with the exported weights. "
             "'Validation gain in the last quarter' (where shown) is the validation accuracy at the end of a run "
             "minus the best before its last quarter: clearly above zero, the arm was still improving when its "
             "schedule ended." + (f" Every curve: [{report['curves_file']}]({report['curves_file']})."
                                  if report.get("curves_file") else ""), "",
             f"**Verdict rule.** {report['rule']} Margins (the smallest difference that matters): accuracies "
             f"{100 * m['test_top1']:g} point; attention-distance ratios {m['l0_min_rel']:g}; distances "
             f"{m['dist_growth']:g} px; position-embedding similarity {m['posemb_rowcol']:g}; speed: none. "
             f"{report['tests_in_family']} p-values in the Holm family."]
    if report.get("missing_seeds"):
        lines += ["", "**Missing seeds** (compared unpaired only with --allow-missing-seeds): " + "; ".join(
            f"{a}: {s}" for a, s in report["missing_seeds"].items())]
    if report.get("sweeps") and "grid" in next(iter(report["sweeps"].values())):
        lines += sweep_table(report)
    elif report.get("sweeps"):
        lines += ["", "**Learning rates chosen on validation** (validation top-1 % at the sweep seeds):", "",
                  "| family | chosen | " + " | ".join(f"lr {float(k):.0e}".replace("e-0", "e-")
                                                   for k in next(iter(report["sweeps"].values()))["val_top1"]) + " |",
                  "|---" * (2 + len(next(iter(report["sweeps"].values()))["val_top1"])) + "|"]
        for f, s in report["sweeps"].items():
            mark = f" ({s['edge']} swept)" if s.get("edge") else ""
            lines.append(f"| {f} | {s['lr']:.0e}{mark} | ".replace("e-0", "e-") + " | ".join(
                "/".join(f"{100 * v:.2f}" for v in vals) for vals in s["val_top1"].values()) + " |")
        lines += sweep_edges(report["sweeps"])
    if report.get("plan"):
        return lines + primaries(report) + replan_table(report) + arm_check_lines(report)
    lines += ["", "| claim | verdict |", "|---|---|"] + [f"| {c['id']}. {c['title']} | {c['verdict']} |"
                                                        for c in report["claims"]]
    return lines


def primaries(report: Dict[str, Any]) -> List[str]:
    """The pre-registered primary hypotheses: one row per claim, with the interval at the level Holm used."""
    plan = report["plan"]
    lines = ["", f"**Analysis plan** ({plan['file']}, SHA-256 {plan['sha256'][:12]}, fixed before the first run; "
             f"every run records it). {plan['correction']}. {plan['secondary']}. Power and MDE: at "
             f"{float(plan['power']):.0%} power, level alpha / m (m = {report['tests_in_family']} primaries tested), "
             "as planned before training and with this campaign's own spread.", "",
             "| claim | primary hypothesis | effect of interest | seeds | estimate [interval] | interval level | "
             "p (Holm) | power / MDE planned | power / MDE here | verdict |", "|---" * 10 + "|"]
    for c in report["claims"]:
        t = next((t for t in c["tests"] if t.get("role") == "primary"), None)
        if t is None:
            continue
        m = t.get("metric", "slope")
        unit = " pt" if m in PERCENT else ""
        p = (t.get("p_adjusted") or {}).get("primary")
        lvl = f"{100 * t['ci_level']:.2f}%" if t.get("ci_level") else "-"
        eff = f"{'|d| < ' if t.get('expect') == '~' else ''}{_num(t.get('effect'), m)}{unit}"

        def pm(pw: Optional[float], md: Optional[float]) -> str:
            return "-" if pw is None else f"{pw:.0%} / {_num(md, m)}{unit}"
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(f"| {c['id']} | {t['text']} | {eff} | {t.get('n') or t.get('seeds_planned') or '-'} | "
                     f"{_ci(t, m, True) if t.get('estimate') is not None else '-'}{unit} | {lvl} | "
                     f"{'-' if p is None else f'{p:.3g}'} | {pm(t.get('power_planned'), t.get('mde_planned'))} | "
                     f"{pm(t.get('power'), t.get('mde'))} | {t['verdict']}{note} |")
    return lines


def replan_table(report: Dict[str, Any]) -> List[str]:
    """The seeds planned again once the sweep had chosen every rate and schedule: per claim, before and after."""
    rec = (report.get("design") or {}).get("replan")
    if not rec:
        return []
    lines = ["", f"**Seeds planned again after the sweep** (the same planner and planning SDs, the arms priced at "
             f"the schedules the sweep chose, within the hours the sweep left; about {rec['wall_hours']:.1f} h wall "
             f"at --jobs {rec['jobs']}):", "",
             "| claim | seeds (design) | power / MDE (design) | seeds (after the sweep) | power / MDE (after) |",
             "|---" * 5 + "|"]
    for c, r in rec["claims"].items():
        unit = "" if int(c) in (9, 10) else " pt"

        def cell(x: Dict[str, Any]) -> Tuple[str, str]:
            mde = "-" if x.get("mde") is None else (f"{x['mde']:.3g}" if not unit else f"{100 * x['mde']:.2f}")
            if not x.get("testable"):
                return f"not testable ({x.get('reason')})", f"- / {mde}{unit}"
            return str(x["seeds"]), f"{x['power']:.0%} / {mde}{unit}"
        lines.append(f"| {c} | {' | '.join(cell(r['before']))} | {' | '.join(cell(r['after']))} |")
    return lines


def arm_check_lines(report: Dict[str, Any]) -> List[str]:
    """The arm checks: how many arms converged by the plan's rule at an interior rate, and each that did not
    (an arm of a primary among them leaves its claim without a verdict)."""
    checks = report.get("arm_checks") or {}
    if not checks:
        return []
    bad = {a: c for a, c in checks.items() if c["failed"]}
    conv = (report.get("plan") or {}).get("convergence") or {}
    lines = ["", f"**Arm checks** ({conv.get('rule', 'the plan convergence rule')}): {len(checks) - len(bad)} of "
             f"{len(checks)} arms converged at an interior (or designed) rate."]
    if bad:
        lines += ["", "| arm | rate | what fails |", "|---|---|---|"] + [
            f"| {a} | {c['rate']} | {'; '.join(c['failed'])} |" for a, c in sorted(bad.items())]
    return lines + parent_check_lines(checks)


def parent_check_lines(checks: Dict[str, Any]) -> List[str]:
    """The fine-tunes against their parents (claim 5): each fine-tune's validation accuracy against its
    parent's at the parent's resolution (mean over their common seeds); one below it by more than the noise
    cannot carry a verdict."""
    rows = {a: c["parent_check"] for a, c in checks.items() if c.get("parent_check")}
    if not rows:
        return []
    z = next(iter(rows.values())).get("z")
    lines = ["", "**Fine-tunes against their parent** (validation top-1 %, the parent at its own resolution; a "
             f"fine-tune passes when it is at most {z:g} binomial standard errors of the parent's accuracy below "
             "it, and one that does not cannot carry a verdict):",
             "", "| fine-tune | parent | seeds | fine-tune | parent | difference | noise | passes |",
             "|---" * 8 + "|"]
    for a, r in sorted(rows.items()):
        size = f" ({r['parent_img_size']} px)" if r.get("parent_img_size") else ""
        if not r.get("seeds"):
            lines.append(f"| {a} | {r['parent']}{size} | 0 | - | - | - | - | no ({r['why']}) |")
            continue
        lines.append(f"| {a} | {r['parent']}{size} | {r['seeds']} | {100 * r['val']:.2f} | "
                     f"{100 * r['parent_val']:.2f} | {100 * r['gap']:+.2f} | {100 * r['noise']:.2f} | "
                     f"{'yes' if r['ok'] else 'no'} |")
    return lines


def sweep_table(report: Dict[str, Any]) -> List[str]:
    """v3: each family's grid (grown past an end its best rate sat at), schedule, whether its chosen point
    converged, and its validation top-1 per rate at the sweep seeds."""
    lines = ["", "**Learning rates chosen on validation** (each family's grid, grown by a factor of 2 past an end "
             "its best rate sat at; its schedule, doubled while the chosen point's validation curve had not "
             "converged; validation top-1 % per rate at the sweep seeds):", "",
             "| family | chosen | grid grown | schedule | converged | validation top-1 per rate |", "|---" * 6 + "|"]
    for f, s in report["sweeps"].items():
        per = "; ".join(f"{lr_name(float(k))}: " + "/".join("-" if v is None else f"{100 * v:.2f}" for v in vals)
                        for k, vals in s["val_top1"].items())
        per += " (fixed rate: its schedule only)" if s.get("fixed") else ""
        edge = f" ({s['edge']} of the grid)" if s.get("edge") else ""
        lines.append(f"| {f} | {lr_name(float(s['lr']))}{edge} | {s.get('extended', 0)} x | "
                     f"x{float(s.get('stretch') or 1):g} | {s.get('converged')} | {per} |")
    return lines


def sweep_edges(sweeps: Dict[str, Any]) -> List[str]:
    """A sentence on the families whose chosen rate is an end of the grid (the sweep cannot place their best)."""
    ends = {e: [f for f, s in sweeps.items() if s.get("edge") == e] for e in ("largest", "smallest")}
    said = [f"{len(fs)} of {len(sweeps)} families chose the {e} rate swept ({', '.join(fs)})"
            for e, fs in ends.items() if fs]
    if not said:
        return []
    return ["", "; ".join(said) + ": their best rate may lie beyond the grid, which the sweep cannot "
            "tell, so their arms ran at the best rate found, not necessarily the best rate. A comparison involving "
            "them may differ at the arms' best rates; the validation curves show whether each arm converged."]


def _arms(c: Dict[str, Any], report: Dict[str, Any]) -> List[str]:
    vals = report["values"]
    shown = SHOWN if any(t.get("metric") == SPEED for t in c["tests"]) else tuple(m for m in SHOWN if m != SPEED)
    summ = {r["arm"]: {m: stats.summary(list((vals.get(r["arm"]) or {}).get(m, {}).values()))
                       for m in shown + (c["metric"],)}
            for r in c["arms"]}
    metrics = [m for m in dict.fromkeys(shown + (c["metric"],)) if any(s[m]["mean"] is not None for s in summ.values())]
    lines = ["| arm | run | params | MACs | " + " | ".join(METRIC_LABELS.get(m, m) for m in metrics) + " | seeds |",
             "|---" * (5 + len(metrics)) + "|"]
    for r in c["arms"]:
        n = max((summ[r["arm"]][m]["n"] for m in metrics if m != SPEED), default=0)
        params = f"{r['params']:,}" if r.get("params") else "-"
        macs = f"{r['macs'] / 1e6:.2f} M" if r.get("macs") else "-"
        lines.append(f"| {r['label']} | {r['run']} | {params} | {macs} | "
                     + " | ".join(_ci(summ[r["arm"]][m], m) for m in metrics) + f" | {n} |")
    return lines


def _tests(c: Dict[str, Any]) -> List[str]:
    v3 = any("role" in t for t in c["tests"])
    head = ("| comparison | estimate [interval] | test | p (Holm for the primary; unadjusted for secondary ones) | "
            "reading |" if v3 else "| comparison | estimate [95% CI] | test | p (Holm) | verdict |")
    lines = [head, "|---|---|---|---|---|"]
    for t in c["tests"]:
        p = ", ".join(f"{k} {v:.3g}" for k, v in (t.get("p_adjusted") or {}).items()) or "-"
        if v3:
            p += " (primary)" if t.get("role") == "primary" else " (secondary, unadjusted)"
        if t.get("kind") == "correlation":
            est = "-" if t.get("rho") is None else f"rho = {t['rho']:.2f} ({t['n']} models)"
            lines.append(f"| {t['text']} | {est} | Spearman | {p} | {t['verdict']} |")
            continue
        if "error" in t:
            lines.append(f"| {t['text']} | {t['error']} | - | - | {t['verdict']} |")
            continue
        m = t["metric"]
        if "estimate" not in t:  # not trained: its claim is not testable at this budget
            lines.append(f"| {t['text']} | - | - | - | {t['verdict']} |")
            continue
        resolved = " ".join(f"{'+' if w > 0 else '-'} {a}" for a, w in t["weights"]) or "per-seed values"
        ref = f" vs {t['ref']:g}" if t["ref"] else ""
        unit = " pt" if m in PERCENT else ""
        df = t.get("df")
        design = ("-" if df is None else f"{t['design']}, df {df:.0f}" if float(df).is_integer()
                  else f"{t['design']}, df {df:.1f}")
        note = (f" ({t['note']})" if t.get("note") else
                f" (same contrast as '{t['duplicate_of']}')" if t.get("duplicate_of") else "")
        margin = f", margin {_num(t['margin'], m)}{unit}" if t.get("margin") is not None else ""
        level = f" ({100 * t['ci_level']:.2f}% interval)" if v3 and t.get("ci_level") else ""
        lines.append(f"| {t['text']} ({METRIC_LABELS.get(m, m)}: {resolved}{ref}{margin}) | {_ci(t, m, True)}{unit}"
                     f"{level} | "
                     f"{'TOST' if t['expect'] == '~' else 't'}, {design} | {p} | {t['verdict']}{note} |")
    return lines


def markdown(report: Dict[str, Any], figures: Dict[int, str]) -> str:
    lines = _head(report)
    for c in report["claims"]:
        lines += ["", f"## Claim {c['id']}: {c['title']}", "", f"**Paper.** {c['paper']}", "",
                  f"**Our set-up.** {c['setup']}", ""]
        if c["arms"]:
            lines += _arms(c, report)
        if c["id"] in figures:
            lines += ["", f"![claim {c['id']}]({figures[c['id']]})"]
        lines += [""] + _tests(c)
        lines += ["", f"**Verdict: {c['verdict']}.** This scale can test {c['can']} It cannot test {c['cannot']}"]
    return "\n".join(lines) + "\n"
