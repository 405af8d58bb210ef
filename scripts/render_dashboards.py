#!/usr/bin/env python3
"""Renders the OPS-2 dashboard (grafana/dashboards/msgexchange.json) as PNG pictures, one per
row, from the Prometheus query_range data of a scenario run (docs/img/scenario.json, written by
the ignored test `scenario_for_pictures` in tests/observability.rs). Panels, legends, units and
thresholds come from the dashboard itself; the scenario's moments are drawn as vertical lines.
Writes docs/img/rendered.json: the SHA-256 of what the pictures were drawn from (dashboard,
scenario, this script) and of each picture, which the unit test
`rendered_docs::dashboard_pictures_are_current` compares with the files (a stale picture fails
the test run). `scripts/render-docs.sh` runs this with every other generated section.

    pip install matplotlib
    cargo test -p msgx-actors --test observability -- --ignored scenario_for_pictures --nocapture
    python3 scripts/render_dashboards.py            # docs/img/scenario.json -> docs/img/*.png
"""
import argparse
import hashlib
import json
import math
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
UNITS = {"s": "seconds", "ops": "per second", "short": "", "none": ""}
EVENT_COLOR = "#555555"


def slug(title):
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def legend(fmt, metric, expr):
    if not fmt:
        return metric.get("__name__", expr)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip()


def query(target):
    """The scenario's key for a panel target: its expression with the dashboard's `instance`
    variable set to "All", as `scenario_for_pictures` queried it."""
    return target["expr"].replace("$instance", ".+")


def panels_of(panels):
    """Every panel, the ones inside collapsed rows too, in dashboard order."""
    for p in panels:
        if p.get("type") == "row":
            yield from panels_of(p.get("panels", []))
        else:
            yield p


def uncovered(dashboard, data):
    """(panel title, expression) of every panel target the scenario has no data for."""
    return [(p["title"], t["expr"]) for p in panels_of(dashboard["panels"])
            for t in p.get("targets", []) if query(t) not in data["results"]]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_manifest(out, sources, pictures):
    """docs/img/rendered.json: what the pictures were drawn from and what they are."""
    manifest = {
        "rendered_by": "scripts/render-docs.sh",
        "inputs": {os.path.relpath(p, ROOT): sha256(p) for p in sources},
        "pictures": {os.path.basename(p): sha256(p) for p in pictures},
    }
    with open(os.path.join(out, "rendered.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")


def value(v):
    f = float(v)
    return f if math.isfinite(f) else math.nan


def rows_of(dashboard):
    """[(row title, [panel, ...])] in dashboard order (collapsed rows keep theirs inside)."""
    rows, current = [], None
    for p in dashboard["panels"]:
        if p.get("type") == "row":
            current = (p["title"], list(p.get("panels", [])))
            rows.append(current)
        elif current is None:
            current = ("", [p])
            rows.append(current)
        else:
            current[1].append(p)
    return rows


def draw_panel(ax, panel, data, t0, events):
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    unit = defaults.get("unit", "short")
    ymax, inf_seen, hidden = 0.0, False, 0
    every = [(t, s) for t in panel.get("targets", []) for s in data["results"].get(query(t), [])]
    for target, series in every:
        # Counters exist from zero for every label combination: with many series, the ones
        # that stayed at 0 all run would only crowd the legend.
        if len(every) > 6 and all(float(v) == 0 for _, v in series["values"]):
            hidden += 1
            continue
        xs, ys, last = [], [], None
        for t, v in series["values"]:
            # A missing sample (target down, series gone) is a gap, as in Grafana.
            if last is not None and float(t) - last > 1.5 * data["step"]:
                xs.append((last - t0) / 60 + data["step"] / 120)
                ys.append(math.nan)
            xs.append((float(t) - t0) / 60)
            ys.append(value(v))
            last = float(t)
        inf_seen |= any(math.isinf(float(v)) for _, v in series["values"])
        finite = [y for y in ys if not math.isnan(y)]
        if finite:
            ymax = max(ymax, max(finite))
        ax.plot(xs, ys, linewidth=1.3,
                label=legend(target.get("legendFormat", ""), series["metric"], target["expr"]))
    # Thresholds as Grafana draws them (line + area above); off-scale ones noted, not drawn,
    # so that a healthy panel keeps its scale.
    steps = [s for s in defaults.get("thresholds", {}).get("steps", []) if s.get("value") is not None]
    notes = []
    top = ymax * 1.15 if ymax > 0 else 1.0
    for s in steps:
        color = {"yellow": "#e0b400", "red": "#d62728"}.get(s["color"], s["color"])
        if s["value"] <= top * 1.5:
            ax.axhline(s["value"], color=color, linestyle="--", linewidth=1)
            ax.axhspan(s["value"], max(top, s["value"]) * 1.2, color=color, alpha=0.06)
            top = max(top, s["value"] * 1.1)
        else:
            notes.append(f"{s['color']} ≥ {s['value']:g} (off scale)")
    ax.set_ylim(bottom=0, top=top)
    ax.set_xlim(0, (data["end"] - t0) / 60)
    for i, e in enumerate(events):
        ax.axvline((e["t"] - t0) / 60, color=EVENT_COLOR, linewidth=0.8, linestyle=":")
        ax.text((e["t"] - t0) / 60, 1.0, chr(65 + i), transform=ax.get_xaxis_transform(),
                fontsize=7, color=EVENT_COLOR, ha="center", va="bottom")
    title = panel["title"] + ("  [+Inf at times]" if inf_seen else "")
    ax.set_title(title, fontsize=9, loc="left", pad=10)
    ax.set_ylabel(UNITS.get(unit, unit), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda m, _: f"{int(m)}:{int(round((m % 1) * 60)):02d}"))
    ax.grid(alpha=0.25)
    if hidden:
        notes.append(f"{hidden} series at 0 throughout not drawn")
    if notes:
        ax.text(0.99, 0.97, "; ".join(notes), transform=ax.transAxes,
                fontsize=6.5, ha="right", va="top", color="#888888")
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles[:8], labels[:8], fontsize=6.5, loc="upper left", framealpha=0.7)
    else:
        ax.text(0.5, 0.5, "every series at 0" if hidden else "No data", transform=ax.transAxes,
                ha="center", color="#888888" if hidden else "#aa0000")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "docs/img/scenario.json"))
    ap.add_argument("--dashboard", default=os.path.join(ROOT, "grafana/dashboards/msgexchange.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/img"))
    args = ap.parse_args()
    data = json.load(open(args.data))
    dashboard = json.load(open(args.dashboard))
    missing = uncovered(dashboard, data)
    if missing:
        for title, expr in missing:
            print(f"no data in {args.data} for panel {title!r}: {expr}", file=sys.stderr)
        print("the dashboard asks what the scenario did not record: run it again (docs/dashboards.md, "
              "'Reproducing the pictures'), then scripts/render-docs.sh", file=sys.stderr)
        return 2
    t0, events = data["start"], [e for e in data["events"] if e["label"] != "end"]
    caption = "   ".join(f"{chr(65 + i)}: {e['label']}" for i, e in enumerate(events))
    os.makedirs(args.out, exist_ok=True)
    written = []
    for n, (title, panels) in enumerate(rows_of(dashboard), 1):
        cols = 3
        nrows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(15, 3.3 * nrows + 0.9), squeeze=False)
        for ax, panel in zip(axes.flat, panels):
            draw_panel(ax, panel, data, t0, events)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(f"msgexchange — {title}", fontsize=12, x=0.01, ha="left")
        fig.text(0.01, 0.005, "time since start (m:ss).  " + caption, fontsize=7.5, ha="left", va="bottom")
        fig.tight_layout(rect=(0, 0.03, 1, 0.97))
        path = os.path.join(args.out, f"dashboard-{n}-{slug(title)}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    # A row the dashboard no longer has leaves no picture behind.
    for name in os.listdir(args.out):
        path = os.path.join(args.out, name)
        if re.fullmatch(r"dashboard-.*\.png", name) and path not in written:
            os.remove(path)
    write_manifest(args.out, [args.dashboard, args.data, os.path.abspath(__file__)], written)
    for p in written:
        print(os.path.relpath(p, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
