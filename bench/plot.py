"""Charts of one `herald-bench` result: bench/plot.py RESULT.json OUT_DIR.

Writes OUT_DIR/<date>-ingest.png, -delivery.png and -growth.png (and latest-*.png copies
that BENCHMARKS.md embeds)."""
import json
import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bars(ax, figures, names, title, unit):
    picked = [f for f in figures if f["name"] in names]
    labels = [f["name"] for f in picked]
    med = [f["median"] for f in picked]
    lo = [f["median"] - f["min"] for f in picked]
    hi = [f["max"] - f["median"] for f in picked]
    ax.bar(labels, med, yerr=[lo, hi], capsize=4, color="#4878a8")
    for i, v in enumerate(med):
        ax.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(unit)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)


def main():
    result = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    date = result["date"]
    figs = result["figures"]
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars(ax, figs, ["limit_kafka", "limit_pg", "floor_pg", "naive", "herald ingest", "herald ingest x2"],
         f"Ingest, {result['workload']['events']:,} events (median, min-max)", "events/s")
    fig.tight_layout()
    written.append(("ingest", fig))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    d = result["delivery"]
    x = [str(r["in_flight"]) for r in d]
    ax.bar(x, [r["limit"] for r in d], color="#d0d0d0", label="Little's-law limit")
    ax.bar(x, [r["median"] for r in d],
           yerr=[[r["median"] - r["min"] for r in d], [r["max"] - r["median"] for r in d]],
           capsize=4, color="#4878a8", label="herald (median, min-max)")
    for i, r in enumerate(d):
        ax.annotate(f"{r['median']:,.0f} ({100 * r['median'] / r['limit']:.0f}%)", (i, r["median"]),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("attempts in flight")
    ax.set_ylabel("sends/s")
    ax.set_title(f"Delivery against a {result['provider_latency_ms']} ms provider")
    ax.legend()
    fig.tight_layout()
    written.append(("delivery", fig))

    g = result["growth"]
    if g:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot([r["events"] for r in g], [r["events_per_s"] for r in g], marker="o")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("events on the topic (log scale)")
        ax.set_ylabel("events/s")
        ax.set_title("Ingest rate as the intents table grows")
        fig.tight_layout()
        written.append(("growth", fig))

    storage = [s for s in result.get("storage", []) if s["items_per_order"] > 0]
    if storage:
        # The month projected from the 6 KB e-mail run, stacked by table, beside the naive design.
        p = storage[-1]["projection"]
        cases = [("settled", p["settled"]), ("compact", p["compact"])]
        if p.get("after_retention_compact"):
            cases.append(("after retention", p["after_retention_compact"]))
        fig, ax = plt.subplots(figsize=(8, 4.5))
        labels = [c[0] for c in cases] + ["naive"]
        bottom = [0.0] * len(labels)
        for part, per, color in [("intent", lambda c: c["intent"], "#4878a8"),
                                 ("payloads", lambda c: c["payloads_per_intent"] * c["payload"], "#e49444"),
                                 ("attempts", lambda c: c["attempts_per_intent"] * c["attempt"], "#6a9f58"),
                                 ("conflicts", lambda c: c["conflicts_per_intent"] * c["conflict"], "#d1615d")]:
            gb = [per(c) * p["month_intents"] / 1e9 for _, c in cases] + [0.0]
            ax.bar(labels, gb, bottom=bottom, color=color, label=part)
            bottom = [b + g for b, g in zip(bottom, gb)]
        ax.bar(labels, [0.0] * len(cases) + [p["naive_bytes"] / 1e9], color="#b0b0b0",
               label="naive (6 KB x 4 attempts)")
        for i, total in enumerate(bottom[:-1] + [p["naive_bytes"] / 1e9]):
            ax.annotate(f"{total:,.1f} GB", (i, total), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("GB per month")
        ax.set_title(f"PostgreSQL storage, {p['month_intents']:,.0f} intents a month, "
                     f"{p['settled']['attempts_per_intent']} attempts each, 6 KB e-mail")
        ax.legend()
        fig.tight_layout()
        written.append(("storage", fig))

    for name, fig in written:
        path = out / f"{date}-{name}.png"
        fig.savefig(path, dpi=110)
        shutil.copyfile(path, out / f"latest-{name}.png")
        print(f"plot: wrote {path}")


if __name__ == "__main__":
    main()
