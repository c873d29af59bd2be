"""ChartSpec → PNG for papers, with matplotlib's object API on the Agg canvas (no
pyplot, no global backend switch: using this never changes a notebook's backend, and
it runs headless)."""

from __future__ import annotations

from pathlib import Path

from analysis.charts import ChartSpec, finite, legend_entries, small_multiples

DPI = 150


def render_png(spec: ChartSpec, path: Path) -> Path:
    return render_panels([spec], path)


def render_panels(specs: list[ChartSpec], path: Path, columns: int = 3) -> Path:
    """Several charts side by side in one PNG (one panel each, `columns` to a row; a chart
    of many series as small multiples on shared limits)."""
    # Imported here: matplotlib costs half a second, which a CLI that stops at a bad
    # experiment name should not pay.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = [small_multiples(spec) for spec in specs]
    panels = [panel for group in groups for panel in group]
    cols = min(columns, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(6.4 * cols, 4.2 * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    index = 0
    for group in groups:
        first = None  # one chart's panels share its first panel's axes, so that they compare
        for spec in group:
            index += 1
            ax = fig.add_subplot(rows, cols, index, sharex=first, sharey=first)
            first = first or ax
            _draw(ax, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def _draw(ax, spec: ChartSpec) -> None:
    for s in spec.series:
        xs = [p.x for p in s.points]
        ys = [p.y for p in s.points]
        if s.line:
            lx, ly = zip(*s.line)
            ax.plot(
                lx,
                ly,
                drawstyle="steps-post" if s.shape == "step" else "default",
                color=s.color,
                linestyle=":" if s.dotted else "--" if s.dashed else "-",
                linewidth=1.6,
                label=s.name,
            )
        low = [p.y - p.lo if p.lo is not None else 0.0 for p in s.points]
        high = [p.hi - p.y if p.hi is not None else 0.0 for p in s.points]
        if any(low) or any(high):
            ax.errorbar(xs, ys, yerr=[low, high], fmt="none", ecolor=s.color, alpha=0.5, capsize=2, linewidth=0.8)
        left = [p.x - p.x_lo if finite(p.x_lo) else 0.0 for p in s.points]
        right = [p.x_hi - p.x if finite(p.x_hi) else 0.0 for p in s.points]
        if any(left) or any(right):
            ax.errorbar(xs, ys, xerr=[left, right], fmt="none", ecolor=s.color, alpha=0.5, capsize=2, linewidth=0.8)
        ax.scatter(
            xs,
            ys,
            s=18,
            color=s.color,
            alpha=0.85,
            label=None if s.line else s.name,
            zorder=3,
            edgecolors=["black" if p.on_frontier else "none" for p in s.points],
            linewidths=0.6,
        )
    for y, text in spec.hlines:
        ax.axhline(y, color="grey", linestyle="--", linewidth=1.0)
        ax.annotate(text, (0.01, y), xycoords=("axes fraction", "data"), fontsize=7, color="grey", va="bottom")
    if spec.log_y:
        ax.set_yscale("log")
    if spec.log_x:
        ax.set_xscale("log")
    ax.set_xlabel(spec.x_label)
    ax.set_ylabel(spec.y_label)
    ax.set_title(spec.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if spec.x_ticks:
        ax.set_xticks([x for x, _ in spec.x_ticks], [label for _, label in spec.x_ticks])
        from matplotlib.ticker import NullFormatter

        # only these labels: a log axis would label minor ticks between them, over them
        ax.xaxis.set_minor_formatter(NullFormatter())
    entries = legend_entries(spec)
    if entries is not None:  # each colour and each line style once
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], color=e.color, linestyle=":" if e.dotted else "--" if e.dashed else "-", label=e.name)
            for e in entries
        ]
        ax.legend(handles=handles, fontsize=7, loc="best", title=spec.legend_title or None, title_fontsize=7)
    elif spec.series:  # a handful (small_multiples splits more)
        ax.legend(fontsize=7, loc="best", title=spec.legend_title or None, title_fontsize=7)
