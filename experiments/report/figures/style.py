"""One look for every figure the harness draws (plots.py, hybrid_plots.py, paper_figures.py), so that a figure
goes into a paper unchanged.

Conventions (stated once in every run's plots/FIGURES.md, the captions index):
- sizes for a two-column paper: ONE_COLUMN (3.4 in wide) and TWO_COLUMN (7.0 in); 8 pt text, 7 pt legends;
  a legend sits below the axes, never on the data; saved with a tight bounding box, so no text is clipped;
- a PNG (300 dpi) and a vector PDF (TrueType fonts embedded) of every figure, same name;
- short titles (what and which model); the configuration is the caption, in FIGURES.md beside the figure;
- Okabe-Ito colours (colour-blind safe), one fixed colour per method / serving mode across all figures;
- human names for methods, routes, modes and models (NAMES, model_name);
- lines are medians; shaded bands span p20-p80 of the timed samples (BAND_NOTE);
- a hollow marker is a flagged point: timed from a cache-resident stack, or a speedup more than 10% above
  its byte-model bound ("not bandwidth-bound"); it is drawn but never quoted as a speedup (HOLLOW_NOTE);
- the byte-model bound (replayssm.traffic: the partner's bytes / the method's bytes, the speedup a purely
  bandwidth-bound method reaches) is a thin dotted line in the series' colour (BOUND_NOTE);
- series with identical values are not hidden: the later one is drawn with a hollow marker and its legend
  says "= <other>" (`coincide`), and the caption says so;
- published values are black-edged stars labelled with their hardware and source (paper_figures.py).

A figure of another script (e.g. a tokens/s vs tree-shape figure) gets the same look with `apply_style()`,
`color()`, `figsize()` and a `FigureSet` to save it with its caption.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ONE_COLUMN = 3.4     # inches: one column of a two-column paper (ACM / IEEE / NeurIPS two-column ~3.3-3.5)
TWO_COLUMN = 7.0     # inches: the full text width
DPI = 300

# Okabe & Ito (2008), the colour-blind-safe qualitative palette.
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
             "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "grey": "#999999"}
CYCLE = [OKABE_ITO[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky", "yellow", "black")]
COLORS = {
    "baseline_ar": OKABE_ITO["grey"], "replay_ar": OKABE_ITO["blue"],
    "baseline_spec": OKABE_ITO["orange"], "commit_replay_spec": OKABE_ITO["green"],
    "replay_spec": OKABE_ITO["vermillion"],
    "ar": OKABE_ITO["grey"], "native": OKABE_ITO["orange"], "commit_replay": OKABE_ITO["green"],
    "replayssm": OKABE_ITO["vermillion"], "standard": OKABE_ITO["grey"], "native_spec": OKABE_ITO["orange"],
    "replayssm_spec": OKABE_ITO["vermillion"], "replayssm_ar": OKABE_ITO["blue"],
}
L_COLORS = [OKABE_ITO[k] for k in ("blue", "sky", "purple", "black")]   # ReplaySSM AR at several L
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">"]

NAMES = {
    # methods (experiments/harness/methods.py)
    "baseline_ar": "Baseline (state cache)", "replay_ar": "ReplaySSM",
    "baseline_spec": "Native spec (state per draft)", "commit_replay_spec": "Commit-replay spec",
    "replay_spec": "ReplaySSM spec",
    # replay routes
    "output_only": "output-only", "state_and_output": "state-and-output",
    # whole-model serving modes (experiments/serving.py) and engine modes (experiments/vllm_bench.py)
    "ar": "Standard decode", "native": "Native spec", "commit_replay": "Commit-replay spec",
    "replayssm": "ReplaySSM spec", "standard": "Standard decode", "native_spec": "Native spec",
    "replayssm_ar": "ReplaySSM", "replayssm_spec": "ReplaySSM spec",
}
MODEL_NAMES = {
    "nemotron3_nano_4b": "Nemotron-3-Nano-4B", "nemotron3_super_120b": "Nemotron-3-Super-120B",
    "nemotron3_ultra_550b": "Nemotron-3-Ultra-550B", "qwen35_4b": "Qwen3.5-4B",
    "qwen35_122b_a10b": "Qwen3.5-122B-A10B", "tiny_mamba2": "tiny Mamba-2", "tiny_gdn": "tiny GDN",
}

BAND_NOTE = "Lines are medians; shaded bands span the p20-p80 of the timed samples."
HOLLOW_NOTE = ("Hollow markers: cache-resident points (the stack fits the last-level cache / L2) or speedups more "
               "than 10% above their byte-model bound (not bandwidth-bound); drawn, never quoted as speedups.")
BOUND_NOTE = ("Dotted lines with dash markers: the byte-model bound (the partner's modelled bytes / the method's, "
              "replayssm/traffic.py), the speedup of a purely bandwidth-bound kernel; a bound shared by series of "
              "different colours is drawn once, in black.")
PUBLISHED_NOTE = "Stars: published values (hardware and source in the legend; experiments/report/figures/published.py)."


def apply_style() -> None:
    plt.rcParams.update({
        "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
        "ytick.labelsize": 7, "axes.prop_cycle": matplotlib.cycler(color=CYCLE), "lines.linewidth": 1.2,
        "lines.markersize": 4, "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5,
        "legend.frameon": False, "pdf.fonttype": 42, "ps.fonttype": 42, "savefig.dpi": DPI,
        "figure.constrained_layout.use": True,
    })


def figsize(columns: int = 1, aspect: float = 0.75) -> tuple[float, float]:
    """(width, height) inches: one or two columns wide, height = width x aspect (two columns: per panel row)."""
    width = ONE_COLUMN if columns == 1 else TWO_COLUMN
    return width, (ONE_COLUMN * aspect if columns == 2 else width * aspect)


def name(key) -> str:
    return NAMES.get(str(key), str(key))


def short_name(key) -> str:
    """The name without its parenthesis ("Native spec (state per draft)" -> "Native spec")."""
    return name(key).split(" (")[0]


def model_name(model, tp=None) -> str:
    text = MODEL_NAMES.get(str(model), str(model))
    try:
        tp = int(tp)
    except (TypeError, ValueError):
        tp = 1
    return f"{text} (TP{tp})" if tp > 1 else text


def color(key, i: int = 0) -> str:
    return COLORS.get(str(key), CYCLE[i % len(CYCLE)])


def integer(v) -> str:
    """4.0 -> "4" (T, L, B and batch are integers; a float in a label is a bug)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return str(int(f)) if np.isfinite(f) and f.is_integer() else f"{f:g}"


def slug(*parts) -> str:
    text = "_".join(integer(p) for p in parts if p is not None and str(p) not in ("", "nan", "<NA>", "None"))
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", text).strip("-") or "all"


def batch_axis(ax, batches, log: bool = True) -> None:
    """Ticks at exactly the measured batch sizes (no unmeasured 2 between 1 and 4); log2 when they span >2x."""
    values = sorted({float(b) for b in batches if b == b})
    if log and values and values[-1] / max(values[0], 1e-9) > 2:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(values))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: integer(v)))
    if len(values) == 1:
        ax.set_xlim(values[0] / 2, values[0] * 2) if log else ax.set_xlim(values[0] - 1, values[0] + 1)


def series(ax, x, y, lo=None, hi=None, *, label: str, color: str, flagged=None, marker: str = "o",
           linestyle: str = "-", hollow_all: bool = False):
    """A median line with markers (hollow where `flagged`) and its p20-p80 band. Returns the legend handle."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    flagged = np.zeros(len(x), bool) if flagged is None else np.asarray(flagged, bool)[order]
    if hollow_all:
        flagged = np.ones(len(x), bool)
    ax.plot(x, y, color=color, linestyle=linestyle, linewidth=1.2, zorder=2)
    if lo is not None and hi is not None:
        lo, hi = np.asarray(lo, float)[order], np.asarray(hi, float)[order]
        ax.fill_between(x, lo, hi, color=color, alpha=0.18, linewidth=0, zorder=1)
    ax.plot(x[~flagged], y[~flagged], linestyle="none", marker=marker, color=color, zorder=3)
    ax.plot(x[flagged], y[flagged], linestyle="none", marker=marker, markerfacecolor="white",
            markeredgecolor=color, zorder=3)
    return Line2D([], [], color=color, linestyle=linestyle, marker=marker,
                  markerfacecolor="white" if hollow_all else color, label=label)


def bound(ax, x, y, *, color: str):
    """The byte-model bound of a series: thin dotted line with a dash marker at each point, same colour. A
    bound identical to one already drawn on these axes (the bound often depends on L only, not on batch) is
    not drawn again: a curve shared by series of different colours turns black, so no series' bound hides
    under another's in the wrong colour."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(y)
    if not keep.any():
        return
    order = np.argsort(x[keep])
    x, y = x[keep][order], y[keep][order]
    drawn = ax.__dict__.setdefault("_byte_model_bounds", [])
    for bx, by, line in drawn:
        if len(bx) == len(x) and np.allclose(bx, x) and np.allclose(by, y):
            if matplotlib.colors.to_hex(line.get_color()) != matplotlib.colors.to_hex(color):
                line.set_color("black")        # shared by series of different colours
            return
    (line,) = ax.plot(x, y, color=color, linestyle=":", linewidth=1.0, marker="_", markersize=9, zorder=2)
    drawn.append((x, y, line))


def hollow_handle() -> Line2D:
    return Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="black",
                  label="hollow: cache-resident / not bw-bound")


def bound_handle() -> Line2D:
    return Line2D([], [], color="black", linestyle=":", linewidth=1.0, marker="_", markersize=9,
                  label="dotted: byte-model bound (black: shared)")


def legend_below(fig, handles: list, ncol: int | None = None) -> None:
    """The figure's legend under the axes (never over the data)."""
    handles = [h for h in handles if h is not None]
    if not handles:
        return
    # columns that fit the figure's width at 7 pt (~0.055 in per character, ~0.45 in per handle and gap), so
    # a one-column figure stays one column wide once saved with a tight bounding box
    longest = max(len(h.get_label()) for h in handles)
    fits = max(1, int(fig.get_figwidth() // (0.055 * longest + 0.45)))
    ncol = min(ncol or fits, fits, len(handles))
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, handlelength=2.2, columnspacing=1.0)


def coincide(values: dict[str, np.ndarray], rtol: float = 1e-9) -> dict[str, str]:
    """{later label: earlier label} for series whose values are identical (same length, equal to rtol)."""
    out, seen = {}, []
    for label, v in values.items():
        v = np.asarray(v, float)
        twin = next((s for s, w in seen if len(w) == len(v) and np.allclose(v, w, rtol=rtol, equal_nan=True)), None)
        if twin is not None:
            out[label] = twin
        else:
            seen.append((label, v))
    return out


@dataclass
class FigureSet:
    """Saves figures as PNG + PDF into `out_dir` and collects their captions for one index (FIGURES.md)."""

    out_dir: Path
    header: str = ""
    entries: list[tuple[str, str, str]] = field(default_factory=list)   # (file stem, title, caption)

    def save(self, fig, stem: str, title: str, caption: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        taken, base, n = {e[0] for e in self.entries}, stem, 1
        while stem in taken:                 # two settings with one name (e.g. two geometries of one model)
            n += 1
            stem = f"{base}-{n}"
        png = self.out_dir / f"{stem}.png"
        fig.savefig(png, dpi=DPI, bbox_inches="tight", pad_inches=0.02)
        fig.savefig(self.out_dir / f"{stem}.pdf", bbox_inches="tight", pad_inches=0.02)
        plt.close(fig)
        self.entries.append((stem, title, caption))
        return png

    def write_index(self, name: str = "FIGURES.md") -> Path:
        """The folder's captions index: FIGURES.md (readable) and figures.json (stem -> title, caption). Entries
        another script wrote into the same folder are kept while their PNG exists, so plots.py,
        hybrid_plots.py and paper_figures.py share one index per run."""
        sidecar = self.out_dir / "figures.json"
        known = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        known = {k: v for k, v in known.items() if (self.out_dir / f"{k}.png").is_file()}
        known.update({stem: {"title": title, "caption": caption} for stem, title, caption in self.entries})
        sidecar.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
        lines = ["# Figures", "", self.header, "",
                 "Conventions: " + " ".join([BAND_NOTE, HOLLOW_NOTE, BOUND_NOTE, PUBLISHED_NOTE]) +
                 " Colours: Okabe-Ito (colour-blind safe). Each figure exists as PNG (300 dpi) and vector PDF; "
                 f"widths {ONE_COLUMN} in (one column) or {TWO_COLUMN} in (two columns), 8 pt text.", ""]
        for stem, entry in sorted(known.items()):
            lines += [f"## {stem}", "", f"![{entry['title']}]({stem}.png) ([PDF]({stem}.pdf))", "",
                      f"**{entry['title']}.** {entry['caption']}", ""]
        path = self.out_dir / name
        path.write_text("\n".join(lines))
        return path


@dataclass
class InlineFigures(FigureSet):
    """A FigureSet that writes nothing: each figure is kept as PNG bytes with its title and caption, for a
    notebook to show inline (`figures`: (stem, title, caption, png) in drawing order). The same drawing code
    as the files of plots.py / paper.py, so the notebook shows exactly what they write."""

    out_dir: Path | None = None
    dpi: int = 110                           # screen resolution: the files keep DPI (300)
    figures: list[tuple[str, str, str, bytes]] = field(default_factory=list)

    def save(self, fig, stem: str, title: str, caption: str) -> Path:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=self.dpi, bbox_inches="tight", pad_inches=0.02)
        plt.close(fig)
        self.entries.append((stem, title, caption))
        self.figures.append((stem, title, caption, buf.getvalue()))
        return Path(f"{stem}.png")           # a name only: no file is written

    def write_index(self, name: str = "FIGURES.md") -> Path:
        raise NotImplementedError("InlineFigures writes no files: show self.figures instead")
