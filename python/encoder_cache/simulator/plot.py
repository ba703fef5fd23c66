"""The simulator's plot: encoded embeddings against encoder-cache size."""

from __future__ import annotations

from encoder_cache.simulator.report import Report, format_bytes

__all__ = ["plot"]


def plot(report: Report, path: str) -> None:
    """Encoded embeddings against encoder-cache size, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(8, 5), constrained_layout=True)
    sizes = report.sizes() or [report.default_size]
    styles = ["-", "--", "-.", ":"]
    for index, name in enumerate(report.sweep_variants()):
        points = [(s, report.sweep_run(name, s)) for s in sizes]
        xs = [s for s, r in points if r is not None]
        ys = [r.counters.encoded_embeds / 1e6 for _, r in points if r is not None]
        axes.plot(xs, ys, marker="o", linestyle=styles[index % len(styles)], label=name)
    if not report.sweep:
        for r in report.headline:
            axes.plot([r.encoder_cache_size], [r.counters.encoded_embeds / 1e6], marker="o", label=r.name)
    if report.unbounded is not None:
        axes.axhline(report.unbounded.counters.encoded_embeds / 1e6, color="0.4", linewidth=1, label="unbounded cache")
    top = axes.get_ylim()[1]
    axes.axvline(report.default_size, color="0.6", linestyle=":", linewidth=1)
    axes.annotate(" vLLM default", (report.default_size, top), fontsize=8, ha="left", va="top")
    rec = report.recommendation()
    if rec is not None and rec["found"]:
        axes.axvline(rec["size"], color="C2", linestyle=":", linewidth=1)
        axes.annotate("recommended ", (rec["size"], top * 0.94), fontsize=8, ha="right", va="top", color="C2")
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes)
    axes.set_xticklabels([f"{s:,}\n{format_bytes(s * report.bytes_per_embed)}" for s in sizes], fontsize=8)
    axes.set_xlabel(f"encoder cache size, embeddings (memory at {report.bytes_per_embed:,} bytes each)")
    axes.set_ylabel("embeddings encoded (millions)")
    axes.set_ylim(bottom=0)
    axes.set_title(report.description, fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(True, alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
